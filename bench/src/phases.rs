//! The default mode's phases against one `turnstile dev --nats` (`measure`); the phases that run in a child
//! process of this binary are in [`crate::child`].

use std::time::Duration;

use anyhow::Result;

use crate::args::Args;
use crate::latency::{LatencyOpts, LatencyReport};
use crate::throughput::{ThroughputOpts, ThroughputReport};
use crate::{cluster, fanout, idle, latency, protocols, raw, resume, servers, steer, throughput};

/// What the phases of the default mode measured.
#[derive(Default)]
pub(crate) struct Phases {
    pub(crate) latency: Option<LatencyReport>,
    pub(crate) throughput: Option<ThroughputReport>,
    pub(crate) raw_async: Option<raw::RawReport>,
    pub(crate) idle: Option<idle::IdleReport>,
    pub(crate) fanout: Option<fanout::FanoutReport>,
    pub(crate) fanout_error: Option<String>,
    pub(crate) reads: Option<serde_json::Value>,
    pub(crate) failover: Option<serde_json::Value>,
    pub(crate) steer: Option<steer::SteerReport>,
    pub(crate) resume: Option<resume::ResumeReport>,
    pub(crate) protocols: Option<protocols::ProtocolsReport>,
    pub(crate) cluster: Option<serde_json::Value>,
    pub(crate) model: Option<serde_json::Value>,
    pub(crate) model_skipped: Option<String>,
}

pub(crate) async fn measure(
    args: &Args,
    dev: &servers::Dev,
    nats: async_nats::Client,
    run_id: &str,
    pids: &[(&str, Option<u32>)],
) -> Result<Phases> {
    let latency = if args.skip_latency {
        None
    } else {
        let opts = LatencyOpts {
            iterations: args.iterations,
            warmup: args.warmup,
            text: args.text.clone(),
            max_time: Duration::from_secs(600),
        };
        eprintln!("latency: {} rounds + {} warm-up ...", opts.iterations, opts.warmup);
        Some(latency::run(dev.channel(), nats.clone(), run_id, &opts).await?)
    };
    let steer = if args.steer_rounds > 0 {
        let opts =
            steer::SteerOpts { rounds: args.steer_rounds, warmup: (args.steer_rounds / 10).max(1), sleep_ms: 20 };
        eprintln!("steer: {} rounds + {} warm-up ...", opts.rounds, opts.warmup);
        Some(steer::run(&dev.url(), run_id, &opts).await?)
    } else {
        None
    };
    let resume = if args.resume_rounds > 0 {
        let opts = resume::ResumeOpts {
            rounds: args.resume_rounds,
            warmup: (args.resume_rounds / 10).max(1),
            delay_ms: resume::DEFAULT_DELAY_MS,
        };
        eprintln!("resume: {} rounds + {} warm-up ...", opts.rounds, opts.warmup);
        Some(resume::run(&dev.url(), &dev.url(), run_id, &opts).await?)
    } else {
        None
    };
    let protocols = match (args.protocols_rounds, dev.http()) {
        (0, _) => None,
        (rounds, Some(http)) => {
            let opts = protocols::ProtocolsOpts {
                rounds,
                warmup: (rounds / 10).max(1),
                delay_ms: protocols::DEFAULT_DELAY_MS,
            };
            eprintln!(
                "protocols: {} rounds + {} warm-up of /v1/responses beside a Watch ...",
                opts.rounds, opts.warmup
            );
            Some(protocols::run(&dev.url(), http, run_id, &opts).await?)
        }
        (_, None) => {
            anyhow::bail!("the protocols phase needs turnstile dev's --http address (its ready file has none)")
        }
    };
    let raw_async = if args.skip_raw {
        None
    } else {
        let opts = raw::RawOpts { count: args.raw_count, window: args.raw_window, body_bytes: args.raw_body_bytes };
        eprintln!("raw async publish: {} messages, {} acks in flight ...", opts.count, opts.window);
        Some(raw::run(nats.clone(), run_id, &opts).await?)
    };
    let throughput = if args.skip_throughput {
        None
    } else {
        let opts = ThroughputOpts {
            sessions: args.sessions,
            clients: args.clients,
            duration: Duration::from_secs_f64(args.duration.clamp(0.1, 3600.0)),
            count: args.count,
            text: args.text.clone(),
            drain_timeout: Duration::from_secs(60),
        };
        eprintln!("throughput: {} clients over {} sessions for {:?} ...", opts.clients, opts.sessions, opts.duration);
        // The same CPU reading as the cluster phase's, for its single-node anchor.
        let ticks = |pid: Option<u32>| cluster::cpu_ticks(&pid?.to_string());
        let before: Vec<Option<u64>> = pids.iter().map(|(_, pid)| ticks(*pid)).collect();
        let mut report = throughput::run(&[dev.url()], run_id, &opts).await?;
        let per_second = cluster::clk_tck() as f64;
        let mut cpu = std::collections::BTreeMap::new();
        for ((name, pid), before) in pids.iter().zip(before) {
            if let (Some(b), Some(a), true) = (before, ticks(*pid), report.accepted > 0) {
                let cpu_s = a.saturating_sub(b) as f64 / per_second;
                cpu.insert((*name).to_owned(), cpu_s * 1000.0 / report.accepted as f64);
            }
        }
        cpu.insert("total".to_owned(), cpu.values().sum());
        report.cpu_s_per_1k_followups = Some(cpu);
        Some(report)
    };
    let idle = match (args.skip_idle, dev.pid()) {
        (false, Some(pid)) => {
            eprintln!("idle sessions: {} with one queued message each ...", args.idle_sessions);
            let opts = idle::IdleOpts {
                sessions: args.idle_sessions,
                clients: args.idle_clients,
                settle: Duration::from_millis(args.idle_settle_ms),
                passivate_after: (args.passivate_after_ms > 0).then(|| Duration::from_millis(args.passivate_after_ms)),
                followups: args.idle_followups,
                second_batch: !args.idle_skip_second_batch,
                metrics: dev.http(),
            };
            Some(idle::run(&dev.url(), pid, run_id, &opts).await?)
        }
        _ => None,
    };
    // After the idle phase: its watchers must not be in the idle sessions' RSS.
    let mut fanout_error = None;
    let fanout = if args.fanout_watchers > 0 {
        eprintln!("watch fan-out: {} watchers of one session, {} rounds ...", args.fanout_watchers, args.fanout_rounds);
        // A failure here (the server's consumer limit) is a finding, not the end of the run.
        match fanout::run(&dev.url(), nats.clone(), run_id, args.fanout_watchers, args.fanout_rounds.max(1)).await {
            Ok(report) => Some(report),
            Err(e) => {
                eprintln!("watch fan-out failed: {e:#}");
                fanout_error = Some(format!("{e:#}"));
                None
            }
        }
    } else {
        None
    };
    Ok(Phases {
        latency,
        throughput,
        raw_async,
        idle,
        fanout,
        fanout_error,
        reads: None,
        failover: None,
        steer,
        resume,
        protocols,
        cluster: None,
        model: None,
        model_skipped: None,
    })
}
