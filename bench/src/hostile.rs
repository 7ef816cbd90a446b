//! `turnstile-bench hostile`: the other tenants' followup latency while one tenant is hostile, against a
//! quiet run (issue 37: "the other tenants' latency stays within 2× of a quiet run").
//!
//! The harness's cluster (`turnstile_tests::Cluster`: one nats-server, `--workers` workers, 2 gateways).
//! Rounds alternate, quiet first: in each, `--clients` clients of tenant `bench` send followups round robin
//! over `--sessions` sessions through both gateways for `--round-secs`, timing each; in the hostile rounds
//! the fault campaign's hostile tenant runs beside them (`turnstile_tests::campaign::hostile`: 2 MiB mime
//! types and 300,000 empty blocks, ten live watchers that never read while 256 KiB followups feed their
//! session, unfoldable imports). The figure is the ratio of the hostile rounds' p99 (and p50) to the quiet
//! rounds', with how the hostile calls were answered: each stuck watcher must end cut with the resumable
//! status and come back from the `after_seq` it names (read with the fault campaign's quiet time, 2 s).
//! The slowest followups of the hostile rounds are listed with the hostile calls in flight beside them,
//! so an outlier can be told from the load it met.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;
use turnstile_proto::v1 as pb;
use turnstile_tests::campaign::hostile;
use turnstile_tests::{Cluster, ClusterOptions};

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct HostileArgs {
    /// Rounds of each kind (quiet and hostile, alternating).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Length of one round, seconds.
    #[arg(long, default_value_t = 10.0)]
    round_secs: f64,
    /// The other tenant's concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// The other tenant's sessions.
    #[arg(long, default_value_t = 20)]
    sessions: usize,
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
pub struct HostileReport {
    pub workers: usize,
    pub clients: usize,
    pub sessions: usize,
    pub round_secs: f64,
    pub turnstile_bin: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub quiet: Percentiles,
    pub hostile: Percentiles,
    /// Hostile p99 / quiet p99 (goal ≤ 2).
    pub hostile_p99_ratio: f64,
    pub hostile_p50_ratio: f64,
    /// Each round's p99, in order (quiet, hostile, quiet, …).
    pub round_p99_ms: Vec<f64>,
    /// Followups of the other tenant that failed.
    pub errors: usize,
    /// How the hostile tenant's calls were answered.
    pub hostile_answers: String,
    /// Stuck watchers cut with a resumable status / that came back from its `after_seq` / read in all.
    pub watchers_cut: usize,
    pub watchers_resumed: usize,
    pub watchers: usize,
    /// The slowest followups of the hostile rounds, each with the hostile calls in flight beside it.
    pub slowest: Vec<Slow>,
}

/// One slow followup of a hostile round and what the hostile tenant was doing meanwhile.
#[derive(Debug, Serialize)]
pub struct Slow {
    pub round: usize,
    /// When it was sent, ms into its round, and how long it took.
    pub started_ms: u64,
    pub wait_ms: f64,
    pub gateway: usize,
    /// Hostile calls whose time overlapped it: `kind → code on gateway g, start..end ms`.
    pub beside: Vec<String>,
}

/// One followup of the other tenant.
#[derive(Clone, Copy, Debug)]
struct Sample {
    started: Duration,
    wait: Duration,
    gateway: usize,
}

/// How many slow followups the report lists.
const SLOWEST: usize = 3;
/// The stuck watchers' quiet time: the fault campaign's, so both read them alike.
const WATCHER_QUIET: Duration = Duration::from_secs(2);

pub async fn run(args: HostileArgs) -> Result<()> {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await??;
    let loadavg_start = crate::nats_loss::loadavg();
    eprintln!("starting a nats-server, {} workers and 2 gateways ({}) ...", args.workers, bin.display());
    let cluster =
        Cluster::start_with(ClusterOptions::new(args.workers.max(1), 2)).await.context("starting the cluster")?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let round = Duration::from_secs_f64(args.round_secs.clamp(1.0, 600.0));
    let (mut quiet, mut loud, mut p99s, mut errors, mut records) = (Vec::new(), Vec::new(), Vec::new(), 0, Vec::new());
    let mut slow: Vec<Slow> = Vec::new();
    for i in 0..args.rounds.max(1) * 2 {
        let hostile_round = i % 2 == 1;
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let hostile_task = hostile_round.then(|| {
            let gateway_urls = Arc::new(RwLock::new((0..2).map(|g| cluster.gateway_url(g)).collect()));
            let target = hostile::Target { gateway_urls, stop: stop.clone(), started };
            tokio::spawn(hostile::run(target, i as u64, round, format!("{run_id}-{i}")))
        });
        let (samples, failed) = load(&cluster, &args, &format!("{run_id}-{i}"), started, round).await?;
        stop.store(true, Ordering::Relaxed);
        if let Some(task) = hostile_task {
            let mut h = task.await?;
            h.read_watchers(started, WATCHER_QUIET).await;
            slow.extend(slowest(i, &samples, &h.records));
            records.extend(h.records);
        }
        let samples: Vec<Duration> = samples.iter().map(|s| s.wait).collect();
        let p = Percentiles::of(&samples);
        eprintln!(
            "round {i} ({}): {} followups, p50 {:.1} ms, p99 {:.1} ms, {failed} failed",
            if hostile_round { "hostile" } else { "quiet" },
            p.count,
            p.p50_ms,
            p.p99_ms
        );
        p99s.push(p.p99_ms);
        errors += failed;
        if hostile_round { loud.extend(samples) } else { quiet.extend(samples) }
    }
    let (q, h) = (Percentiles::of(&quiet), Percentiles::of(&loud));
    let watchers = records.iter().filter(|r| r.kind == "stuck watcher");
    slow.sort_by(|a, b| b.wait_ms.total_cmp(&a.wait_ms));
    slow.truncate(SLOWEST);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let report = HostileReport {
        workers: args.workers,
        clients: args.clients,
        sessions: args.sessions,
        round_secs: args.round_secs,
        turnstile_bin: bin.display().to_string(),
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        loadavg_start,
        loadavg_end: crate::nats_loss::loadavg(),
        quiet: q,
        hostile: h,
        hostile_p99_ratio: ratio(h.p99_ms, q.p99_ms),
        hostile_p50_ratio: ratio(h.p50_ms, q.p50_ms),
        round_p99_ms: p99s,
        errors,
        hostile_answers: hostile::summary(&records),
        watchers_cut: watchers.clone().filter(|r| r.code.is_some_and(|c| hostile::CUT_CODES.contains(&c))).count(),
        watchers_resumed: watchers.clone().filter(|r| r.resumed_after.is_some()).count(),
        watchers: watchers.count(),
        slowest: slow,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// The [`SLOWEST`] followups of hostile round `round`, each with the hostile calls that overlapped it.
fn slowest(round: usize, samples: &[Sample], records: &[hostile::HostileRecord]) -> Vec<Slow> {
    let mut by_wait: Vec<&Sample> = samples.iter().collect();
    by_wait.sort_by_key(|s| std::cmp::Reverse(s.wait));
    by_wait
        .into_iter()
        .take(SLOWEST)
        .map(|s| {
            let (from, to) = (s.started.as_millis() as u64, (s.started + s.wait).as_millis() as u64);
            let beside = records
                .iter()
                .filter(|r| r.sent_to.is_some() && r.at_ms >= from && r.at_ms.saturating_sub(r.took_ms) <= to)
                .map(|r| {
                    format!(
                        "{} → {} on gateway {}, {}..{} ms",
                        r.kind,
                        r.code.map_or_else(|| "OK".to_owned(), |c| format!("{c:?}")),
                        r.sent_to.unwrap_or_default(),
                        r.at_ms.saturating_sub(r.took_ms),
                        r.at_ms
                    )
                })
                .collect();
            Slow { round, started_ms: from, wait_ms: s.wait.as_secs_f64() * 1e3, gateway: s.gateway, beside }
        })
        .collect()
}

/// One round of the other tenant's load from `started`: each accepted followup, and how many failed.
async fn load(
    cluster: &Cluster,
    args: &HostileArgs,
    run_id: &str,
    started: Instant,
    round: Duration,
) -> Result<(Vec<Sample>, usize)> {
    let sessions: Arc<Vec<pb::SessionRef>> = Arc::new(
        (0..args.sessions.max(1))
            .map(|n| pb::SessionRef { tenant: "bench".into(), id: format!("quiet-{run_id}-{n}") })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let until = started + round;
    let mut tasks = Vec::new();
    for k in 0..args.clients.max(1) {
        let mut client = servers::connect(&cluster.gateway_url(k % 2)).await?;
        let (sessions, next, run_id) = (sessions.clone(), next.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut samples, mut failed) = (Vec::new(), 0);
            while Instant::now() < until {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let request = pb::DeliverRequest {
                    session: Some(sessions[i % sessions.len()].clone()),
                    message: Some(text_message(format!("q-{run_id}-{i}"), "hello")),
                    output_schema: None,
                };
                let t = Instant::now();
                match client.followup(request).await {
                    Ok(_) => samples.push(Sample { started: t - started, wait: t.elapsed(), gateway: k % 2 }),
                    Err(_) => failed += 1,
                }
            }
            (samples, failed)
        }));
    }
    let (mut samples, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (s, f) = task.await?;
        samples.extend(s);
        failed += f;
    }
    Ok((samples, failed))
}

fn markdown(r: &HostileReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "### Another tenant's followups beside a hostile tenant\n");
    let _ = writeln!(
        out,
        "{} cores ({}), load average {} → {}, 1 nats-server, {} workers + 2 gateways, {} clients over {} sessions, \
         {:.0} s rounds ({})\n",
        r.nproc,
        r.cpu_model,
        r.loadavg_start,
        r.loadavg_end,
        r.workers,
        r.clients,
        r.sessions,
        r.round_secs,
        r.turnstile_bin
    );
    let _ = writeln!(out, "| rounds | followups | p50 | p99 | max |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for (name, p) in [("quiet", &r.quiet), ("hostile", &r.hostile)] {
        let _ =
            writeln!(out, "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms |", p.count, p.p50_ms, p.p99_ms, p.max_ms);
    }
    let _ = writeln!(
        out,
        "\nhostile / quiet: p99 {:.2}×, p50 {:.2}× (goal ≤ 2×); {} failed; hostile calls: {}; stuck watchers: {} of \
         {} cut with a resumable status, {} came back from its after_seq\n",
        r.hostile_p99_ratio,
        r.hostile_p50_ratio,
        r.errors,
        r.hostile_answers,
        r.watchers_cut,
        r.watchers,
        r.watchers_resumed
    );
    let _ = writeln!(out, "The slowest followups of the hostile rounds, and the hostile calls beside them:\n");
    for s in &r.slowest {
        let beside = if s.beside.is_empty() { "none".to_owned() } else { s.beside.join("; ") };
        let _ = writeln!(
            out,
            "- round {}, {} ms in, gateway {}: {:.1} ms; beside: {beside}",
            s.round, s.started_ms, s.gateway, s.wait_ms
        );
    }
    let _ = writeln!(out);
    out
}
