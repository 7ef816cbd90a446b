//! The OpenAI adapter against the gRPC API on the same turn (issue 39, SPEC §19).
//!
//! Each round: a conversation (`POST /v1/conversations`) whose session a gRPC `Watch` follows live; then
//! `POST /v1/responses` with `stream: true` delivers the turn into that conversation and streams it back as
//! server-sent events. Both paths carry the same reply (the scripted model, `[[delay:MS]]`, ten deltas), so
//! what differs is the adapter: its fold of the Watch into Responses events and the HTTP hop. Timed on this
//! process's clock, from the request sent:
//! - `sse_first_byte`: the SSE body's first byte (`response.created`: the delivery is durable);
//! - `sse_first_delta` and `watch_first_delta`: each path's first text delta of the reply;
//! - per round, deltas/s of each path over the same reply (deltas after the first / time since the first).
//!
//! Each round also checks that both paths deliver the whole reply.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;

use crate::servers;
use crate::stats::{Percentiles, median};

/// The reply's `[[delay:MS]]` by default: ten deltas 50 ms apart, long enough that both paths are past their
/// first delta well before the last (so the rates compare steady streams).
pub const DEFAULT_DELAY_MS: u64 = 500;

#[derive(Clone, Debug)]
pub struct ProtocolsOpts {
    pub rounds: usize,
    pub warmup: usize,
    pub delay_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct ProtocolsReport {
    pub rounds: usize,
    pub warmup: usize,
    pub delay_ms: u64,
    pub sse_first_byte: Percentiles,
    pub sse_first_delta: Percentiles,
    pub watch_first_delta: Percentiles,
    /// p50 of `sse_first_delta` − p50 of `watch_first_delta` (the goal: ≤ 1 ms).
    pub first_delta_added_p50_ms: f64,
    pub sse_deltas_per_s_p50: f64,
    pub watch_deltas_per_s_p50: f64,
    /// `sse_deltas_per_s_p50` / `watch_deltas_per_s_p50` (the goal: ≥ 0.95).
    pub deltas_per_s_ratio: f64,
}

pub async fn run(
    grpc_url: &str,
    http: std::net::SocketAddr,
    run_id: &str,
    opts: &ProtocolsOpts,
) -> Result<ProtocolsReport> {
    let mut grpc = servers::connect(grpc_url).await?;
    // reqwest needs a process-wide crypto provider even for plain HTTP; another caller may have set one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let base = format!("http://{http}/v1");
    let (mut first_byte, mut sse_delta, mut watch_delta) = (Vec::new(), Vec::new(), Vec::new());
    let (mut sse_rate, mut watch_rate) = (Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.rounds {
        let r =
            round(&mut grpc, &client, &base, run_id, i, opts.delay_ms).await.with_context(|| format!("round {i}"))?;
        if i >= opts.warmup {
            first_byte.push(r.sse_first_byte);
            sse_delta.push(r.sse.first);
            watch_delta.push(r.watch.first);
            sse_rate.push(r.sse.rate);
            watch_rate.push(r.watch.rate);
        }
    }
    let (sse_first_delta, watch_first_delta) = (Percentiles::of(&sse_delta), Percentiles::of(&watch_delta));
    let (sse_rate, watch_rate) = (median(sse_rate), median(watch_rate));
    Ok(ProtocolsReport {
        rounds: opts.rounds,
        warmup: opts.warmup,
        delay_ms: opts.delay_ms,
        sse_first_byte: Percentiles::of(&first_byte),
        first_delta_added_p50_ms: sse_first_delta.p50_ms - watch_first_delta.p50_ms,
        sse_first_delta,
        watch_first_delta,
        sse_deltas_per_s_p50: sse_rate,
        watch_deltas_per_s_p50: watch_rate,
        deltas_per_s_ratio: if watch_rate > 0.0 { sse_rate / watch_rate } else { 0.0 },
    })
}

/// One path's deltas: the first one's time since the request was sent, and the rate after it.
struct Deltas {
    first: Duration,
    rate: f64,
    text: String,
}

impl Deltas {
    fn of(times: &[Duration], text: String) -> Result<Self> {
        let (Some(&first), Some(&last)) = (times.first(), times.last()) else { bail!("no delta") };
        let span = (last - first).as_secs_f64();
        let rate = if times.len() > 1 && span > 0.0 { (times.len() - 1) as f64 / span } else { 0.0 };
        Ok(Self { first, rate, text })
    }
}

struct Round {
    sse_first_byte: Duration,
    sse: Deltas,
    watch: Deltas,
}

async fn round(
    grpc: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
    client: &reqwest::Client,
    base: &str,
    run_id: &str,
    i: usize,
    delay_ms: u64,
) -> Result<Round> {
    let conv: Value = client.post(format!("{base}/conversations")).json(&json!({})).send().await?.json().await?;
    let conv = conv["id"].as_str().context("the conversation has no id")?.to_owned();
    let session = pb::SessionRef { tenant: String::new(), id: conv.trim_start_matches("conv_").to_owned() };
    let mut watch = grpc
        .watch(pb::WatchRequest { session: Some(session), after_seq: 0, live: true, resume: None })
        .await?
        .into_inner();
    while !matches!(watch.message().await?.context("the watch ended")?.item, Some(Item::CaughtUp(_))) {}

    let text = format!("[[delay:{delay_ms}]] a reply of many words that streams in ten pieces, {run_id} round {i}");
    let body = json!({"model": "scripted", "input": text, "conversation": conv, "stream": true});
    let sent = Instant::now();
    let watcher = tokio::spawn(async move {
        let (mut times, mut text) = (Vec::new(), String::new());
        loop {
            let item = watch.message().await?.context("the watch ended before the reply")?;
            match item.item {
                Some(Item::Live(pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), .. })) if !d.reasoning => {
                    times.push(sent.elapsed());
                    text.push_str(&d.text);
                }
                Some(Item::Event(pb::SessionEvent { payload: Some(Durable::AssistantMessage(_)), .. })) => break,
                _ => {}
            }
        }
        anyhow::Ok((times, text))
    });
    let mut response = client.post(format!("{base}/responses")).json(&body).send().await?.error_for_status()?;
    let (mut first_byte, mut times, mut sse_text, mut buffer) = (None, Vec::new(), String::new(), String::new());
    'stream: while let Some(chunk) = response.chunk().await? {
        first_byte.get_or_insert_with(|| sent.elapsed());
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or_default();
            let event: Value = serde_json::from_str(data).unwrap_or_default();
            match event["type"].as_str() {
                Some("response.output_text.delta") => {
                    times.push(sent.elapsed());
                    sse_text.push_str(event["delta"].as_str().unwrap_or_default());
                }
                Some("response.completed" | "response.failed" | "response.incomplete") => break 'stream,
                _ => {}
            }
        }
    }
    let (watch_times, watch_text) = watcher.await??;
    let (sse, watch) = (Deltas::of(&times, sse_text)?, Deltas::of(&watch_times, watch_text)?);
    if sse.text != watch.text || !sse.text.starts_with("echo: ") {
        bail!("the paths disagree: SSE {:?}, Watch {:?}", sse.text, watch.text);
    }
    Ok(Round { sse_first_byte: first_byte.context("an empty SSE body")?, sse, watch })
}
