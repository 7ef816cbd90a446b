//! `turnstile-bench sync`: what `sync_interval: always` costs (SPEC §18, docs/OPERATIONS.md "What an
//! acknowledgement survives").
//!
//! nats-server acknowledges a publish once it is in the file store's write path and fsyncs every
//! `sync_interval` (2 minutes by default); with `sync_interval: always` it fsyncs before every
//! acknowledgement. Each round starts a fresh nats-server of each setting (the harness's, loopback) with
//! its own `turnstile dev --nats`, and runs the latency phase (fresh and warm followups against a raw
//! publish-ack, interleaved) and the throughput phase on it; the settings alternate round by round, so a
//! busy moment of the machine does not land on one of them only. The report gives the median over the
//! rounds of each figure, and the ratios always / default.
//!
//! `--cluster` runs the same comparison at R3 instead: each round is the cluster phase on a fresh cluster of
//! 3 nats-servers (see [`crate::sync_r3`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;
use turnstile_tests::nats::NatsServer;

use crate::latency::{self, LatencyOpts};
use crate::stats::median;
use crate::throughput::{self, ThroughputOpts};
use crate::{servers, sync_r3};

#[derive(Args, Debug)]
pub struct SyncArgs {
    /// Rounds of each setting (they alternate).
    #[arg(long, default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Measured followups of each round's latency phase (after a tenth as many for warm-up); with
    /// `--cluster`, the sequential raw R3 publish-acks of each round (`cluster --raw-rounds`).
    #[arg(long, default_value_t = 300)]
    iterations: usize,
    /// Seconds of each round's throughput phase.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Concurrent clients of the throughput phase.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Sessions the throughput phase cycles through.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// The `turnstile` binary (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<PathBuf>,
    /// At R3: each round is the cluster phase (3 nats-servers, 3 workers, 2 gateways; `turnstile-bench
    /// cluster` with `--duration`, `--clients`, `--sessions`) instead of one `turnstile dev` on one server.
    #[arg(long)]
    pub(crate) cluster: bool,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// One setting's figures: the median over its rounds.
#[derive(Debug, Default, Serialize)]
pub struct SyncFigures {
    /// The nats-server config line, or `default`.
    pub setting: String,
    pub followup_p50_ms: f64,
    pub followup_p99_ms: f64,
    pub followup_warm_p50_ms: f64,
    pub raw_publish_ack_p50_ms: f64,
    pub followups_per_s: f64,
    pub events_per_s: f64,
    /// The rounds' own figures, for the spread.
    pub rounds: Vec<RoundFigures>,
}

#[derive(Debug, Serialize)]
pub struct RoundFigures {
    pub followup_p50_ms: f64,
    pub followup_p99_ms: f64,
    pub followup_warm_p50_ms: f64,
    pub raw_publish_ack_p50_ms: f64,
    pub followups_per_s: f64,
    pub events_per_s: f64,
    pub errors: usize,
}

#[derive(Debug, Serialize)]
pub struct SyncReport {
    pub default: SyncFigures,
    pub always: SyncFigures,
    /// always / default.
    pub followup_p50_ratio: f64,
    pub followup_p99_ratio: f64,
    pub raw_publish_ack_p50_ratio: f64,
    pub followups_per_s_ratio: f64,
    pub nproc: usize,
    pub cpu_model: String,
    pub turnstile_bin: String,
}

const SETTINGS: [(&str, &str); 2] = [("default", ""), ("always", "jetstream { sync_interval: always }\n")];

pub async fn run(args: SyncArgs) -> Result<()> {
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);
    if args.cluster {
        let opts = sync_r3::ClusterSyncOpts {
            rounds: args.rounds,
            duration: args.duration,
            clients: args.clients,
            sessions: args.sessions,
            raw_rounds: args.iterations,
        };
        let report = sync_r3::run(&bin, &opts).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", sync_r3::markdown(&report));
        }
        let errors: u64 = report.default.rounds.iter().chain(&report.always.rounds).map(|r| r.errors).sum();
        if errors > 0 {
            anyhow::bail!("{errors} followups failed in the cluster rounds");
        }
        return Ok(());
    }
    let mut measured: [Vec<RoundFigures>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds.max(1) {
        for (i, (name, extra)) in SETTINGS.iter().enumerate() {
            eprintln!("sync: round {} of {}, sync_interval {name} ...", round + 1, args.rounds.max(1));
            measured[i].push(one_round(&bin, extra, &args, &format!("s{round}{i}")).await?);
        }
    }
    let [default, always] = measured;
    let (default, always) = (figures("default", default), figures("sync_interval: always", always));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let report = SyncReport {
        followup_p50_ratio: ratio(always.followup_p50_ms, default.followup_p50_ms),
        followup_p99_ratio: ratio(always.followup_p99_ms, default.followup_p99_ms),
        raw_publish_ack_p50_ratio: ratio(always.raw_publish_ack_p50_ms, default.raw_publish_ack_p50_ms),
        followups_per_s_ratio: ratio(always.followups_per_s, default.followups_per_s),
        default,
        always,
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        turnstile_bin: bin.display().to_string(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

async fn one_round(bin: &std::path::Path, extra: &str, args: &SyncArgs, run_id: &str) -> Result<RoundFigures> {
    let nats = NatsServer::start_with_config(extra).await.context("starting nats-server")?;
    let client = async_nats::connect(nats.url()).await.with_context(|| format!("connecting to {}", nats.url()))?;
    let dev = servers::Dev::start(bin, Some(&nats.url()), &[]).await?;
    let opts = LatencyOpts {
        iterations: args.iterations,
        warmup: (args.iterations / 10).max(1),
        text: "hello".into(),
        max_time: Duration::from_secs(600),
    };
    let latency = latency::run(dev.channel(), client, run_id, &opts).await;
    let opts = ThroughputOpts {
        sessions: args.sessions,
        clients: args.clients,
        duration: Duration::from_secs_f64(args.duration.clamp(0.1, 3600.0)),
        count: None,
        text: "hello".into(),
        drain_timeout: Duration::from_secs(60),
    };
    let throughput = throughput::run(&[dev.url()], run_id, &opts).await;
    dev.stop().await;
    drop(nats);
    let (latency, throughput) = (latency?, throughput?);
    Ok(RoundFigures {
        followup_p50_ms: latency.followup.p50_ms,
        followup_p99_ms: latency.followup.p99_ms,
        followup_warm_p50_ms: latency.followup_warm.p50_ms,
        raw_publish_ack_p50_ms: latency.raw.p50_ms,
        followups_per_s: throughput.followups_per_s,
        events_per_s: throughput.events_per_s,
        errors: throughput.errors + throughput.drain_errors,
    })
}

fn figures(setting: &str, rounds: Vec<RoundFigures>) -> SyncFigures {
    let of = |f: fn(&RoundFigures) -> f64| median(rounds.iter().map(f).collect());
    SyncFigures {
        setting: setting.to_owned(),
        followup_p50_ms: of(|r| r.followup_p50_ms),
        followup_p99_ms: of(|r| r.followup_p99_ms),
        followup_warm_p50_ms: of(|r| r.followup_warm_p50_ms),
        raw_publish_ack_p50_ms: of(|r| r.raw_publish_ack_p50_ms),
        followups_per_s: of(|r| r.followups_per_s),
        events_per_s: of(|r| r.events_per_s),
        rounds,
    }
}

fn markdown(r: &SyncReport) -> String {
    let row = |f: &SyncFigures| {
        format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |\n",
            f.setting,
            f.followup_p50_ms,
            f.followup_p99_ms,
            f.followup_warm_p50_ms,
            f.raw_publish_ack_p50_ms,
            f.followups_per_s,
            f.events_per_s
        )
    };
    let mut out = format!(
        "## sync_interval: default (2 min) against always\n\n{} cores, {}; medians of {} rounds each, alternating.\n\n",
        r.nproc,
        r.cpu_model,
        r.default.rounds.len()
    );
    out.push_str("| nats-server | followup p50 ms | p99 ms | warm followup p50 ms | raw publish-ack p50 ms | followups/s | events/s |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    out.push_str(&row(&r.default));
    out.push_str(&row(&r.always));
    out.push_str(&format!(
        "\nalways / default: followup p50 ×{:.2}, p99 ×{:.2}, raw publish-ack p50 ×{:.2}, followups/s ×{:.2}\n",
        r.followup_p50_ratio, r.followup_p99_ratio, r.raw_publish_ack_p50_ratio, r.followups_per_s_ratio
    ));
    out
}
