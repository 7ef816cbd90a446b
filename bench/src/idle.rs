//! Memory per idle loaded session: `queue` one message to each of N fresh sessions (each is loaded, idle,
//! holding one pending message) and read the resident set of `turnstile dev` before, once they have been
//! idle for `--idle-settle-ms` (past the worker's `park_after`, decision 0037), and, when the bench set
//! `passivate_after_ms`, once they have all passed it (passivated: nothing of them should stay).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use turnstile_proto::v1 as pb;

use crate::latency::text_message;
use crate::servers;

#[derive(Debug, Serialize)]
pub struct IdleReport {
    pub sessions: usize,
    pub rss_before_bytes: u64,
    /// Once every session has been idle for `settle_ms`.
    pub rss_after_bytes: u64,
    /// (after − before) / sessions.
    pub bytes_per_session: f64,
    /// Loading them (one `queue` each, `clients` at a time).
    pub elapsed_s: f64,
    /// How long the sessions were left idle before `rss_after_bytes`.
    pub settle_ms: u64,
    /// Once every session has been idle past the worker's `passivate_after_ms` (and one sweep).
    pub rss_passivated_bytes: Option<u64>,
    /// (passivated − before) / sessions; freed memory the allocator keeps counts here too.
    pub passivated_bytes_per_session: Option<f64>,
    /// After passivation, as many fresh sessions again, once idle: glibc keeps freed memory, so RSS
    /// hardly falls at passivation; what shows it was freed is that the second batch reuses it.
    pub rss_second_batch_bytes: Option<u64>,
    /// (second batch − passivated) / sessions: ~0 when passivated sessions left their memory free.
    pub second_batch_bytes_per_session: Option<f64>,
}

/// How the idle phase runs.
pub struct IdleOpts {
    pub sessions: usize,
    pub clients: usize,
    /// Idle time before the "after" reading.
    pub settle: Duration,
    /// The worker's `passivate_after`, when the bench set it: the phase waits it out and reads again.
    pub passivate_after: Option<Duration>,
}

/// The resident set of process `pid` (`VmRSS` of /proc/<pid>/status).
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmRSS in /proc/<pid>/status")?;
    Ok(kb * 1024)
}

pub async fn run(gateway_url: &str, pid: u32, run_id: &str, opts: &IdleOpts) -> Result<IdleReport> {
    let (sessions, clients) = (opts.sessions, opts.clients);
    // Let what earlier phases left settle (their sessions stay loaded: they are part of "before").
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_bytes(pid)?;
    let started = Instant::now();
    load(gateway_url, &format!("idle-{run_id}"), sessions, clients).await?;
    let elapsed = started.elapsed();
    let loaded_at = Instant::now();
    tokio::time::sleep(opts.settle).await;
    let after = rss_bytes(pid)?;
    let per = |bytes: u64| bytes.saturating_sub(before) as f64 / sessions.max(1) as f64;
    let mut passivated = None;
    let mut second = None;
    if let Some(passivate_after) = opts.passivate_after {
        // The worker sweeps parked sessions every eighth of `passivate_after`; the last one loaded was idle
        // from `loaded_at`.
        let due = loaded_at + passivate_after + passivate_after / 8 + Duration::from_secs(2);
        eprintln!(
            "idle sessions: waiting {:.0} s for passivation ...",
            due.saturating_duration_since(Instant::now()).as_secs_f64()
        );
        tokio::time::sleep_until(due.into()).await;
        passivated = Some(rss_bytes(pid)?);
        // As many fresh sessions again: if passivation released what the first ones held, they reuse it.
        load(gateway_url, &format!("idle2-{run_id}"), sessions, clients).await?;
        tokio::time::sleep(opts.settle).await;
        second = Some(rss_bytes(pid)?);
    }
    Ok(IdleReport {
        sessions,
        rss_before_bytes: before,
        rss_after_bytes: after,
        bytes_per_session: per(after),
        elapsed_s: elapsed.as_secs_f64(),
        settle_ms: opts.settle.as_millis() as u64,
        rss_passivated_bytes: passivated,
        passivated_bytes_per_session: passivated.map(per),
        rss_second_batch_bytes: second,
        second_batch_bytes_per_session: second
            .zip(passivated)
            .map(|(s, p)| s.saturating_sub(p) as f64 / sessions.max(1) as f64),
    })
}

/// `queue` one message to each of `sessions` fresh sessions `<prefix>-<i>`, `clients` at a time.
async fn load(gateway_url: &str, prefix: &str, sessions: usize, clients: usize) -> Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let mut client = servers::connect(gateway_url).await?;
        let (next, prefix) = (next.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= sessions {
                    return Ok::<_, anyhow::Error>(());
                }
                let session = pb::SessionRef { tenant: "bench".into(), id: format!("{prefix}-{i}") };
                let request = pb::DeliverRequest {
                    session: Some(session),
                    message: Some(text_message(format!("q-{prefix}-{i}"), "later")),
                    output_schema: None,
                };
                let reply = client.queue(request).await.with_context(|| format!("queue on idle session {i}"))?;
                if reply.get_ref().turn.is_some() {
                    bail!("a queued message opened a turn on idle session {i}");
                }
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}
