//! The ceiling: raw JetStream async publishes (many acks in flight) on a scratch stream of the same storage
//! as the event streams, each a conditional append to a fresh subject as the journal makes it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use async_nats::HeaderMap;
use async_nats::jetstream;
use serde::Serialize;

#[derive(Clone, Debug)]
pub struct RawOpts {
    /// Messages published.
    pub count: usize,
    /// Acks awaited at most at once.
    pub window: usize,
    /// Body bytes of each message (about one append group of an idle followup).
    pub body_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct RawReport {
    pub count: usize,
    pub window: usize,
    pub body_bytes: usize,
    pub elapsed_s: f64,
    pub publishes_per_s: f64,
}

pub async fn run(client: async_nats::Client, run_id: &str, opts: &RawOpts) -> Result<RawReport> {
    let (js, name, prefix) = crate::latency::scratch_stream(client, "ASYNC", run_id, 1).await?;
    let result = publish(&js, &prefix, opts).await;
    if let Err(e) = js.delete_stream(&name).await {
        eprintln!("warning: could not delete the scratch stream {name}: {e}");
    }
    let elapsed = result?;
    Ok(RawReport {
        count: opts.count,
        window: opts.window,
        body_bytes: opts.body_bytes,
        elapsed_s: elapsed.as_secs_f64(),
        publishes_per_s: opts.count as f64 / elapsed.as_secs_f64().max(1e-9),
    })
}

async fn publish(js: &jetstream::Context, prefix: &str, opts: &RawOpts) -> Result<Duration> {
    let body = bytes_of(opts.body_bytes);
    let mut in_flight = VecDeque::with_capacity(opts.window);
    let started = Instant::now();
    for i in 0..opts.count {
        let mut headers = HeaderMap::new();
        headers.insert("Turnstile-Type", "agent/inbox/spliced,agent/status,turn/start,agent/inbox/spliced");
        headers.insert("Turnstile-Seq", "1");
        headers.insert("Turnstile-Last-Seq", "4");
        headers.insert("Turnstile-Epoch", "1");
        headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
        let ack = js.publish_with_headers(format!("{prefix}.{i}"), headers, body.clone()).await?;
        in_flight.push_back(ack);
        if in_flight.len() >= opts.window.max(1)
            && let Some(ack) = in_flight.pop_front()
        {
            ack.await.with_context(|| format!("raw async publish {i}"))?;
        }
    }
    while let Some(ack) = in_flight.pop_front() {
        ack.await.context("raw async publish")?;
    }
    Ok(started.elapsed())
}

fn bytes_of(n: usize) -> bytes::Bytes {
    bytes::Bytes::from(vec![b'x'; n])
}
