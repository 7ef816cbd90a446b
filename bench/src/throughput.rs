//! Sustained followups per second: K clients, round-robin over a fixed set of sessions, each client on one
//! of the given gateways in turn (one for `dev`, every gateway of a cluster).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use turnstile_proto::v1 as pb;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

#[derive(Clone, Debug)]
pub struct ThroughputOpts {
    pub sessions: usize,
    pub clients: usize,
    pub duration: Duration,
    /// Stop after this many followups even before `duration`.
    pub count: Option<usize>,
    pub text: String,
    /// Bound on the wait for every session to be idle after the load.
    pub drain_timeout: Duration,
}

#[derive(Debug, Serialize)]
pub struct ThroughputReport {
    pub sessions: usize,
    pub clients: usize,
    pub elapsed_s: f64,
    pub accepted: usize,
    pub errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub followups_per_s: f64,
    /// Accepted followups that found their session idle and opened a turn (the rest were queued behind
    /// a running turn).
    pub opened_turn: usize,
    pub latency: Percentiles,
    /// Time after the load until every session was idle again.
    pub drain_s: f64,
    pub drain_errors: usize,
    /// Durable events the load wrote (the sessions' last seqs once idle: 10 per followup that ran a turn).
    pub events: u64,
    /// `events` over the load and its drain.
    pub events_per_s: f64,
    /// CPU-seconds per 1,000 accepted followups of each server process over the load and its drain (the
    /// single-node anchor of the cluster phase's figure; filled in by the caller, which knows the pids).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_s_per_1k_followups: Option<BTreeMap<String, f64>>,
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    opened_turn: usize,
    errors: BTreeMap<String, usize>,
}

pub async fn run(gateway_urls: &[String], run_id: &str, opts: &ThroughputOpts) -> Result<ThroughputReport> {
    let Some(first_gateway) = gateway_urls.first() else { anyhow::bail!("no gateway to send followups to") };
    let sessions: Arc<Vec<pb::SessionRef>> = Arc::new(
        (0..opts.sessions.max(1))
            .map(|n| pb::SessionRef { tenant: "bench".into(), id: format!("tp-{run_id}-{n}") })
            .collect(),
    );
    let mut clients = Vec::with_capacity(opts.clients);
    for k in 0..opts.clients.max(1) {
        clients.push(servers::connect(&gateway_urls[k % gateway_urls.len()]).await?);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + opts.duration;
    let limit = opts.count.unwrap_or(usize::MAX);
    let mut tasks = Vec::with_capacity(clients.len());
    for mut client in clients {
        let (sessions, next, text, run_id) = (sessions.clone(), next.clone(), opts.text.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            // Bounded by the count and the deadline; each call by the channel's 30 s timeout.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= limit || Instant::now() >= deadline {
                    break;
                }
                let session = sessions[i % sessions.len()].clone();
                let request = pb::DeliverRequest {
                    session: Some(session),
                    message: Some(text_message(format!("m-{run_id}-{i}"), &text)),
                    output_schema: None,
                };
                let t = Instant::now();
                match client.followup(request).await {
                    Ok(reply) => {
                        tally.latencies.push(t.elapsed());
                        tally.opened_turn += usize::from(reply.get_ref().turn.is_some());
                    }
                    Err(status) => {
                        *tally.errors.entry(format!("{:?}: {}", status.code(), status.message())).or_default() += 1;
                    }
                }
            }
            tally
        }));
    }
    let mut all = Tally::default();
    for task in tasks {
        let tally = task.await?;
        all.latencies.extend(tally.latencies);
        all.opened_turn += tally.opened_turn;
        for (k, v) in tally.errors {
            *all.errors.entry(k).or_default() += v;
        }
    }
    let elapsed = started.elapsed();
    let (drain, drain_errors, events) = drain(first_gateway, &sessions, opts).await?;
    let accepted = all.latencies.len();
    let errors = all.errors.values().sum();
    Ok(ThroughputReport {
        sessions: sessions.len(),
        clients: opts.clients.max(1),
        elapsed_s: elapsed.as_secs_f64(),
        accepted,
        errors,
        error_kinds: all.errors,
        followups_per_s: accepted as f64 / elapsed.as_secs_f64(),
        opened_turn: all.opened_turn,
        latency: Percentiles::of(&all.latencies),
        drain_s: drain.as_secs_f64(),
        drain_errors,
        events,
        events_per_s: events as f64 / (elapsed + drain).as_secs_f64(),
        cpu_s_per_1k_followups: None,
    })
}

/// `WhenIdle` on every session, a few at a time: the load is over only when its turns are. Returns the time
/// it took, the sessions that did not become idle and the sum of the sessions' last seqs.
async fn drain(
    gateway_url: &str,
    sessions: &Arc<Vec<pb::SessionRef>>,
    opts: &ThroughputOpts,
) -> Result<(Duration, usize, u64)> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let timeout_ms = u64::try_from(opts.drain_timeout.as_millis()).unwrap_or(u64::MAX);
    let mut tasks = Vec::new();
    for _ in 0..opts.clients.clamp(1, 16) {
        let mut client = servers::connect(gateway_url).await?;
        let (sessions, next) = (sessions.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let (mut errors, mut events) = (0, 0);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(session) = sessions.get(i) else { break };
                let request = pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms };
                match client.when_idle(request).await {
                    Ok(info) => events += info.get_ref().last_seq,
                    // A session the load never reached has no events: NOT_FOUND is idle enough.
                    Err(status) if status.code() == tonic::Code::NotFound => {}
                    Err(_) => errors += 1,
                }
            }
            (errors, events)
        }));
    }
    let (mut errors, mut events) = (0, 0);
    for task in tasks {
        let (e, n) = task.await?;
        errors += e;
        events += n;
    }
    Ok((started.elapsed(), errors, events))
}
