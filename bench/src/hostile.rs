//! `turnstile-bench hostile`: the other tenants' followup latency while one tenant is hostile, against a
//! quiet run (issue 37: "the other tenants' latency stays within 2× of a quiet run").
//!
//! The harness's cluster (`turnstile_tests::Cluster`: one nats-server, `--workers` workers, 2 gateways).
//! Rounds alternate, quiet first: in each, `--clients` clients of tenant `bench` send followups round robin
//! over `--sessions` sessions through both gateways for `--round-secs`, timing each; in the hostile rounds
//! the fault campaign's hostile tenant runs beside them (`turnstile_tests::campaign::hostile`: 2 MiB mime
//! types and 300,000 empty blocks, ten live watchers that never read while 256 KiB followups feed their
//! session, unfoldable imports). The figure is the ratio of the hostile rounds' p99 (and p50) to the quiet
//! rounds', with how the hostile calls were answered.

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
}

pub async fn run(args: HostileArgs) -> Result<()> {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await??;
    let loadavg_start = crate::nats_loss::loadavg();
    eprintln!("starting a nats-server, {} workers and 2 gateways ({}) ...", args.workers, bin.display());
    let cluster =
        Cluster::start_with(ClusterOptions::new(args.workers.max(1), 2)).await.context("starting the cluster")?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let round = Duration::from_secs_f64(args.round_secs.clamp(1.0, 600.0));
    let (mut quiet, mut loud, mut p99s, mut errors, mut records) = (Vec::new(), Vec::new(), Vec::new(), 0, Vec::new());
    for i in 0..args.rounds.max(1) * 2 {
        let hostile_round = i % 2 == 1;
        let stop = Arc::new(AtomicBool::new(false));
        let hostile_task = hostile_round.then(|| {
            let gateway_urls = Arc::new(RwLock::new((0..2).map(|g| cluster.gateway_url(g)).collect()));
            let target = hostile::Target { gateway_urls, stop: stop.clone(), started: Instant::now() };
            tokio::spawn(hostile::run(target, i as u64, round, format!("{run_id}-{i}")))
        });
        let (samples, failed) = load(&cluster, &args, &format!("{run_id}-{i}"), round).await?;
        stop.store(true, Ordering::Relaxed);
        if let Some(task) = hostile_task {
            let mut h = task.await?;
            h.read_watchers(Instant::now(), Duration::from_millis(500)).await;
            records.extend(h.records);
        }
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
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// One round of the other tenant's load: each accepted followup's latency, and how many failed.
async fn load(cluster: &Cluster, args: &HostileArgs, run_id: &str, round: Duration) -> Result<(Vec<Duration>, usize)> {
    let sessions: Arc<Vec<pb::SessionRef>> = Arc::new(
        (0..args.sessions.max(1))
            .map(|n| pb::SessionRef { tenant: "bench".into(), id: format!("quiet-{run_id}-{n}") })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + round;
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
                };
                let t = Instant::now();
                match client.followup(request).await {
                    Ok(_) => samples.push(t.elapsed()),
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
        "\nhostile / quiet: p99 {:.2}×, p50 {:.2}× (goal ≤ 2×); {} failed; hostile calls: {}\n",
        r.hostile_p99_ratio, r.hostile_p50_ratio, r.errors, r.hostile_answers
    );
    out
}
