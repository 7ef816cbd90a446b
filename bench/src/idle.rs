//! Memory per idle loaded session: `queue` one message to each of N fresh sessions (each is loaded, idle,
//! holding one pending message) and read the resident set of `turnstile dev` before, once they have been
//! idle for `--idle-settle-ms` (past the worker's `park_after`, decision 0037), and, when the bench set
//! `passivate_after_ms`, once they have all passed it (passivated: nothing of them should stay).
//!
//! Followups to random sessions of the batch (issue 44, "one million"): `followups` of them timed one at a
//! time while the sessions are parked (the fold in memory, decision 0037), and as many others once they
//! have passivated (each loaded from its log on that followup), each turn waited out before the next.
//! The dev server's `turnstile_sessions_loaded` gauge is read beside each RSS reading, and the passivated
//! reading waits until it has fallen, so a reading says how many sessions it held.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use turnstile_proto::v1 as pb;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

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
    /// Sessions created per second (`sessions` / `elapsed_s`), `clients` at a time.
    pub sessions_per_s: f64,
    pub clients: usize,
    /// `turnstile_sessions_loaded` of the dev server beside `rss_before_bytes`, `rss_after_bytes` and
    /// `rss_passivated_bytes` (none without its `--http`).
    pub loaded_before: Option<f64>,
    pub loaded_after: Option<f64>,
    pub loaded_passivated: Option<f64>,
    /// A followup (timed to its acknowledgement) to each of `followups` random sessions of the batch while
    /// they are parked (their fold in memory), one at a time, each turn waited out before the next.
    pub parked_followup: Option<Percentiles>,
    /// The same to as many other random sessions once they have passivated: each is loaded from its log.
    pub passivated_followup: Option<Percentiles>,
    /// The seed of the random choice of sessions.
    pub followup_seed: u64,
}

/// How the idle phase runs.
pub struct IdleOpts {
    pub sessions: usize,
    /// Concurrent clients creating the sessions (one connection each).
    pub clients: usize,
    /// Idle time before the "after" reading.
    pub settle: Duration,
    /// The worker's `passivate_after`, when the bench set it: the phase waits it out and reads again.
    pub passivate_after: Option<Duration>,
    /// Followups timed to random parked sessions, and as many to passivated ones (0: none).
    pub followups: usize,
    /// After passivation, as many fresh sessions again (the memory reuse reading).
    pub second_batch: bool,
    /// The dev server's `--http` listener, for its `turnstile_sessions_loaded` gauge.
    pub metrics: Option<SocketAddr>,
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
    let (sessions, clients) = (opts.sessions, opts.clients.max(1));
    let prefix = format!("idle-{run_id}");
    let loaded = || sessions_loaded(opts.metrics);
    // Let what earlier phases left settle (their sessions stay loaded: they are part of "before").
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_bytes(pid)?;
    let loaded_before = loaded().await;
    let started = Instant::now();
    load(gateway_url, &prefix, sessions, clients).await?;
    let elapsed = started.elapsed();
    let mut last_touched = Instant::now();
    tokio::time::sleep(opts.settle).await;
    let after = rss_bytes(pid)?;
    let loaded_after = loaded().await;
    let per = |bytes: u64| bytes.saturating_sub(before) as f64 / sessions.max(1) as f64;

    let followup_seed = fastrand::u64(..);
    let mut chosen = sample_distinct(&mut fastrand::Rng::with_seed(followup_seed), sessions, 2 * opts.followups);
    let passivated_sample = chosen.split_off(chosen.len() / 2);
    let mut parked_followup = None;
    if !chosen.is_empty() {
        eprintln!("idle sessions: {} followups to random parked sessions ...", chosen.len());
        parked_followup = Some(followups(gateway_url, &prefix, &chosen, "parked").await?);
        last_touched = Instant::now();
    }

    let (mut passivated, mut loaded_passivated, mut passivated_followup, mut second) = (None, None, None, None);
    if let Some(passivate_after) = opts.passivate_after {
        // The worker sweeps parked sessions every eighth of `passivate_after`; the last one touched was idle
        // from `last_touched`.
        let due = last_touched + passivate_after + passivate_after / 8 + Duration::from_secs(2);
        eprintln!(
            "idle sessions: waiting {:.0} s for passivation ...",
            due.saturating_duration_since(Instant::now()).as_secs_f64()
        );
        tokio::time::sleep_until(due.into()).await;
        // A crowd passivates a chunk at a time: wait (bounded) until the gauge no longer holds them.
        let unloaded_by = Instant::now() + passivate_after / 8 + Duration::from_secs(60);
        let mut now_loaded = loaded().await;
        while now_loaded.is_some_and(|n| n > loaded_before.unwrap_or(0.0) + sessions as f64 / 100.0)
            && Instant::now() < unloaded_by
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            now_loaded = loaded().await;
        }
        loaded_passivated = now_loaded;
        passivated = Some(rss_bytes(pid)?);
        if !passivated_sample.is_empty() {
            eprintln!("idle sessions: {} followups to random passivated sessions ...", passivated_sample.len());
            passivated_followup = Some(followups(gateway_url, &prefix, &passivated_sample, "passivated").await?);
        }
        if opts.second_batch {
            // As many fresh sessions again: if passivation released what the first ones held, they reuse it.
            load(gateway_url, &format!("idle2-{run_id}"), sessions, clients).await?;
            tokio::time::sleep(opts.settle).await;
            second = Some(rss_bytes(pid)?);
        }
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
        sessions_per_s: sessions as f64 / elapsed.as_secs_f64().max(1e-9),
        clients,
        loaded_before,
        loaded_after,
        loaded_passivated,
        parked_followup,
        passivated_followup,
        followup_seed,
    })
}

/// `turnstile_sessions_loaded` on the dev server's `/metrics`, when it can be read.
async fn sessions_loaded(metrics: Option<SocketAddr>) -> Option<f64> {
    let (status, body) = turnstile_tests::nats::http_get(metrics?, "/metrics").await?;
    (status == 200).then_some(())?;
    body.lines().find_map(|l| l.strip_prefix("turnstile_sessions_loaded ")?.trim().parse().ok())
}

/// `k` distinct indices below `n` (all of them when `k` ≥ `n`), in the order drawn.
fn sample_distinct(rng: &mut fastrand::Rng, n: usize, k: usize) -> Vec<usize> {
    if k >= n {
        let mut all: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut all);
        return all;
    }
    let mut seen = HashSet::with_capacity(k);
    let mut out = Vec::with_capacity(k);
    while out.len() < k {
        let i = rng.usize(..n);
        if seen.insert(i) {
            out.push(i);
        }
    }
    out
}

/// A followup to each session `<prefix>-<i>` of `indices`, one at a time, timed to its acknowledgement;
/// each turn is waited out (untimed) before the next followup.
async fn followups(gateway_url: &str, prefix: &str, indices: &[usize], what: &str) -> Result<Percentiles> {
    let mut client = servers::connect(gateway_url).await?;
    let mut samples = Vec::with_capacity(indices.len());
    for &i in indices {
        let session = pb::SessionRef { tenant: "bench".into(), id: format!("{prefix}-{i}") };
        let request = pb::DeliverRequest {
            session: Some(session.clone()),
            message: Some(text_message(format!("f-{what}-{prefix}-{i}"), "hello")),
            output_schema: None,
        };
        let started = Instant::now();
        let reply = client.followup(request).await.with_context(|| format!("followup to {what} session {i}"))?;
        samples.push(started.elapsed());
        if reply.get_ref().turn.is_none() {
            bail!("a followup to {what} idle session {i} opened no turn: {:?}", reply.get_ref());
        }
        client
            .when_idle(pb::WhenIdleRequest { session: Some(session), timeout_ms: 30_000 })
            .await
            .with_context(|| format!("waiting for {what} session {i} to be idle"))?;
    }
    Ok(Percentiles::of(&samples))
}

/// `queue` one message to each of `sessions` fresh sessions `<prefix>-<i>`, `clients` at a time; a large
/// batch prints its progress every tenth.
async fn load(gateway_url: &str, prefix: &str, sessions: usize, clients: usize) -> Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let tenth = if sessions >= 100_000 { sessions / 10 } else { usize::MAX };
    let started = Instant::now();
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
                if i > 0 && i % tenth == 0 {
                    let per_s = i as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    eprintln!("idle sessions: {i} of {sessions} created ({per_s:.0}/s) ...");
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

#[cfg(test)]
mod tests {
    use super::sample_distinct;

    #[test]
    fn a_sample_is_distinct_in_range_and_all_of_a_small_batch() {
        let mut rng = fastrand::Rng::with_seed(7);
        let sample = sample_distinct(&mut rng, 1_000_000, 600);
        assert_eq!(sample.len(), 600);
        assert!(sample.iter().all(|&i| i < 1_000_000));
        assert_eq!(sample.iter().collect::<std::collections::HashSet<_>>().len(), 600);
        let mut small = sample_distinct(&mut rng, 5, 600);
        small.sort_unstable();
        assert_eq!(small, vec![0, 1, 2, 3, 4]);
        assert!(sample_distinct(&mut rng, 0, 10).is_empty());
    }

    #[test]
    fn the_same_seed_draws_the_same_sessions() {
        let draw = || sample_distinct(&mut fastrand::Rng::with_seed(42), 1_000, 20);
        assert_eq!(draw(), draw());
    }
}
