//! `turnstile-bench`: idle-followup latency through the gateway against one raw JetStream append, raw
//! JetStream async publishes per second (the ceiling), sustained followups and events per second over many
//! sessions, and the memory per idle loaded session, against `turnstile dev --nats` on loopback. `--json`
//! prints one object whose top-level keys are the headline figures beside their anchors
//! (`followup_p50_ms`, `raw_publish_ack_p50_ms`, the split by hop `followup_warm_p50_ms`,
//! `driver_roundtrip_p50_ms`, `grpc_floor_p50_ms`, `followups_per_s`, `raw_async_publish_per_s`,
//! `events_per_s`, `idle_session_bytes`, `idle_passivated_session_bytes`, `idle_second_batch_session_bytes`,
//! `watch_fanout_delta_p50_ms`, `watch_caught_up_100k_ms`, `get_inbox_ms`, `failover_kill9_p50_ms`,
//! `steer_to_message_p50_ms` / `_p99_ms`, `cluster_followups_per_s`, `cluster_followup_p50_ms`,
//! `cluster_cpu_s_per_1k_followups` (per process, per role, total) beside `cpu_s_per_1k_followups` (the
//! throughput phase's dev + nats-server), `cluster_replication_cpu_s_per_1k_followups` and
//! `cluster_cpu_s_per_1k_without_replication` (the same load at R1, decision 0189),
//! `idle_parked_followup_p99_ms` / `idle_passivated_followup_p99_ms`, `cluster_raw_publish_ack_p50_ms`,
//! and their ratios). The reads,
//! failover and cluster phases run as child processes of this binary (`reads`, `failover`, `cluster` modes) with `TURNSTILE_BIN` set to the binary under test; each phase has a flag to
//! size or skip it.
//!
//! The run starts a nats-server with the harness (`turnstile_tests::nats::NatsServer`) unless `--nats URL`
//! names one on loopback, starts the release `turnstile dev --nats URL --listen 127.0.0.1:<free port>`,
//! measures, prints a Markdown report (or `--json`) and stops what it started.
//!
//! `turnstile-bench tools` measures what Turnstile adds to a tool call of each kind (see [`tools`]).
//!
//! `turnstile-bench model` measures a real model instead: time to first token and streaming rate straight
//! from llama-server and through `turnstile dev --config` (see [`model`]); `turnstile-bench hooks` what one
//! remote pre-step hook adds to a turn (see [`hooks`]); `turnstile-bench reads` the reads of a long
//! session (see [`reads`]); `turnstile-bench failover` how long a session is without an owner after a
//! kill -9 or SIGSTOP of it (see [`failover`]); `turnstile-bench cluster` the throughput phase on a real
//! cluster (3 nats-servers with R3 streams, 3 workers, 2 gateways) and the CPU each process spends per
//! 1,000 followups (see [`cluster`]); `turnstile-bench sync` what nats-server's `sync_interval: always`
//! costs in followup latency and followups/s, on one node or at R3 with `--cluster` (see [`sync`]).

mod args;
mod child;
mod cluster;
mod cpu;
mod failover;
mod fanout;
mod goals;
mod hooks;
mod hostile;
mod idle;
mod latency;
mod memory;
mod model;
mod nats_loss;
mod phases;
mod protocols;
mod raw;
mod reads;
mod replication;
mod report;
mod resume;
mod search;
mod servers;
mod stats;
mod steer;
mod streams;
mod sync;
mod sync_r3;
mod throughput;
mod tools;

use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser as _;

use crate::args::{Args, Mode};
use crate::child::child_phase;
use crate::phases::measure;
use crate::report::{Machine, Report, Summary, markdown};

pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    match args.mode {
        Some(Mode::Model(model_args)) => return model::run(model_args).await,
        Some(Mode::Tools(tools_args)) => return tools::run(tools_args).await,
        Some(Mode::Hooks(hook_args)) => return hooks::run(hook_args).await,
        Some(Mode::Reads(reads_args)) => return reads::run(reads_args).await,
        Some(Mode::Failover(failover_args)) => return failover::run(failover_args).await,
        Some(Mode::Cluster(cluster_args)) => return cluster::run(cluster_args).await,
        Some(Mode::Search(search_args)) => return search::run(search_args).await,
        Some(Mode::Memory(memory_args)) => return memory::run(memory_args).await,
        Some(Mode::Sync(sync_args)) => return sync::run(sync_args).await,
        Some(Mode::NatsLoss(args)) => return nats_loss::run(args).await,
        Some(Mode::Hostile(args)) => return hostile::run(args).await,
        None => {}
    }
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);

    let nats = servers::Nats::start_or_use(args.nats.as_deref()).await?;
    let nats_url = nats.url();
    let nats_client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(&nats_url)
        .await
        .with_context(|| format!("connecting to {nats_url}"))?;
    let scratch = tempfile::Builder::new().prefix("turnstile-bench-config-").tempdir()?;
    let mut dev_args = args.dev_args.clone();
    if args.passivate_after_ms > 0 && !dev_args.iter().any(|a| a == "--config" || a.starts_with("--config=")) {
        let path = scratch.path().join("turnstile.toml");
        std::fs::write(&path, format!("[journal]\npassivate_after_ms = {}\n", args.passivate_after_ms))?;
        dev_args.extend(["--config".to_owned(), path.display().to_string()]);
    }
    let dev = servers::Dev::start(&bin, Some(&nats_url), &dev_args).await?;
    eprintln!("nats-server {nats_url}, turnstile dev {} ({})", dev.url(), bin.display());

    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: cpu_model(),
        nats_server_version: nats_client.server_info().version,
        nats_url: nats_url.clone(),
        turnstile_bin: bin.display().to_string(),
        nats_started_by_bench: matches!(nats, servers::Nats::Started(_)),
    };

    let pids = [("turnstile dev", dev.pid()), ("nats-server", nats.pid())];
    let outcome = measure(&args, &dev, nats_client, &run_id, &pids).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}", dev.log_tail());
    }
    dev.stop().await;
    drop(nats);
    let mut phases = outcome?;
    if args.reads_events > 0 {
        let events = args.reads_events.to_string();
        let rounds = args.reads_rounds.to_string();
        let mut child = vec!["reads", "--events", &events, "--rounds", &rounds, "--from-zero-rounds", "1"];
        let nats_arg;
        if let Some(url) = &args.nats {
            nats_arg = url.clone();
            child.extend(["--nats", &nats_arg]);
        }
        eprintln!("reads: a {events}-event session on its own nats-server and turnstile dev ...");
        phases.reads = Some(child_phase(&bin, &child).await?);
    }
    if args.failover_kills > 0 {
        let kills = args.failover_kills.to_string();
        eprintln!("failover: {kills} kill -9 rounds in a 3-worker cluster ...");
        phases.failover = Some(child_phase(&bin, &["failover", "--kills", &kills, "--sigstops", "0"]).await?);
    }
    if args.cluster_duration > 0.0 {
        let (duration, clients, sessions) =
            (args.cluster_duration.to_string(), args.clients.to_string(), args.sessions.to_string());
        eprintln!("cluster: 3 nats-servers (R3), 3 workers, 2 gateways, {clients} clients for {duration} s ...");
        let mut child = vec!["cluster", "--duration", &duration, "--clients", &clients, "--sessions", &sessions];
        if args.cluster_skip_r1 {
            child.push("--skip-r1");
        } else {
            eprintln!("cluster: then the same load at R1 (the replication cost apart) ...");
        }
        phases.cluster = Some(child_phase(&bin, &child).await?);
    }
    if args.model_runs > 0 {
        let installed = ["LLAMA_SERVER_BIN", "SMOLLM2_GGUF"]
            .iter()
            .all(|v| std::env::var_os(v).is_some_and(|p| std::path::Path::new(&p).is_file()));
        if installed {
            let runs = args.model_runs.to_string();
            eprintln!("model: {runs} rounds of llama-server (SmolLM2) straight and through turnstile dev ...");
            phases.model = Some(child_phase(&bin, &["model", "--runs", &runs]).await?);
        } else {
            let why = "LLAMA_SERVER_BIN or SMOLLM2_GGUF is not an installed file (run scripts/setup-test-deps and \
                       `source .ci/test-env.sh`)";
            eprintln!("model: skipped: {why}");
            phases.model_skipped = Some(why.to_owned());
        }
    }
    let summary = Summary::of(&phases);
    let report = Report {
        goals: goals::of(&summary.goal_figures(phases.failover.as_ref(), phases.reads.as_ref())),
        summary,
        machine,
        latency: phases.latency,
        throughput: phases.throughput,
        raw_async: phases.raw_async,
        idle: phases.idle,
        fanout: phases.fanout,
        fanout_error: phases.fanout_error,
        reads: phases.reads,
        failover: phases.failover,
        steer: phases.steer,
        resume: phases.resume,
        protocols: phases.protocols,
        cluster: phases.cluster,
        model: phases.model,
        model_skipped: phases.model_skipped,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report, &args));
    }
    if report.throughput.as_ref().is_some_and(|t| t.errors > 0 || t.drain_errors > 0) {
        anyhow::bail!("some followups failed (see error_kinds)");
    }
    Ok(())
}
