//! Memory per idle loaded session: `queue` one message to each of N fresh sessions (each is loaded, idle,
//! holding one pending message) and read the resident set of `turnstile dev` before and after.

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
    pub rss_after_bytes: u64,
    /// (after − before) / sessions.
    pub bytes_per_session: f64,
    pub elapsed_s: f64,
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

pub async fn run(gateway_url: &str, pid: u32, run_id: &str, sessions: usize, clients: usize) -> Result<IdleReport> {
    // Let what earlier phases left settle (their sessions stay loaded: they are part of "before").
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_bytes(pid)?;
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let mut client = servers::connect(gateway_url).await?;
        let (next, run_id) = (next.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= sessions {
                    return Ok::<_, anyhow::Error>(());
                }
                let session = pb::SessionRef { tenant: "bench".into(), id: format!("idle-{run_id}-{i}") };
                let request = pb::DeliverRequest {
                    session: Some(session),
                    message: Some(text_message(format!("q-{run_id}-{i}"), "later")),
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
    let elapsed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_bytes(pid)?;
    Ok(IdleReport {
        sessions,
        rss_before_bytes: before,
        rss_after_bytes: after,
        bytes_per_session: after.saturating_sub(before) as f64 / sessions.max(1) as f64,
        elapsed_s: elapsed.as_secs_f64(),
    })
}
