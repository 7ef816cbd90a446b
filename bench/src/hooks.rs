//! `turnstile-bench hooks`: what one remote pre-step hook adds to a turn (docs/decisions/0014).
//!
//! One `turnstile dev --config FILE` (embedded journal, so the journal adds no noise) with two agents on
//! the scripted model: `hooked` lists one remote hook, a Rust `PreStepHook` server in this process that
//! enters the batch it is given unchanged, and `plain` lists none. Each round runs one idle followup on a
//! fresh session of each agent, in alternating order, and times followup → `WhenIdle` (the whole turn).
//! The figure is the difference of the medians.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use turnstile_proto::v1::InjectMode;
use turnstile_tests::{Behaviour, HookServer, Session, user_msg};

use crate::servers::{self, Dev};
use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct HookArgs {
    /// Measured rounds (one turn of each agent).
    #[arg(long, default_value_t = 500)]
    rounds: usize,
    /// Rounds run first and dropped (connections, first calls).
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// The `turnstile` binary to run as `turnstile dev --config FILE` (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<std::path::PathBuf>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
pub struct HookReport {
    pub rounds: usize,
    pub warmup: usize,
    pub turnstile_bin: String,
    pub nproc: usize,
    pub cpu_model: String,
    /// Followup → idle with no hook.
    pub plain: Percentiles,
    /// Followup → idle with one remote hook that passes the batch.
    pub hooked: Percentiles,
    /// `hooked.p50_ms - plain.p50_ms`.
    pub added_p50_ms: f64,
    /// The hook calls the server saw (one per hooked turn).
    pub hook_calls: usize,
}

pub async fn run(args: HookArgs) -> Result<()> {
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);
    let hook = HookServer::start(Behaviour::Pass).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        format!(
            "default_agent = \"hooked\"\n[agents.hooked]\nhooks = [{{ url = \"{}\", deadline_ms = 10000 }}]\n\
             [agents.plain]\n",
            hook.url()
        ),
    )?;
    let dev = Dev::start(&bin, None, &["--config".into(), config.display().to_string()]).await?;
    let outcome = measure(&args, &dev).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}", dev.log_tail());
    }
    dev.stop().await;
    let (plain, hooked) = outcome?;
    let (plain, hooked) = (Percentiles::of(&plain), Percentiles::of(&hooked));
    let report = HookReport {
        rounds: args.rounds,
        warmup: args.warmup,
        turnstile_bin: bin.display().to_string(),
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        added_p50_ms: hooked.p50_ms - plain.p50_ms,
        plain,
        hooked,
        hook_calls: hook.requests().len(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

async fn measure(args: &HookArgs, dev: &Dev) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let client = servers::connect(&dev.url()).await?;
    let (mut plain, mut hooked) = (Vec::new(), Vec::new());
    for round in 0..args.warmup + args.rounds {
        // Alternate the order so neither agent always runs right after the other.
        for hooked_first in [round % 2 == 0, round % 2 != 0] {
            let session = Session::new(client.clone());
            if !hooked_first {
                session.configure("plain", InjectMode::Pending).await.context("configure plain")?;
            }
            let started = Instant::now();
            session.followup(user_msg("m", "hello")).await.context("followup")?;
            session.when_idle().await.context("when_idle")?;
            let took = started.elapsed();
            let info = session.info().await?;
            // A turn that ran no step (a rejected or failed hook) would measure something else: a turn
            // with its step writes ten events (SPEC §5), plus `session/configured` for `plain`.
            if info.last_turn != 1 || info.last_seq < 10 {
                bail!("round {round}: the turn did not run ({info:?})");
            }
            if round >= args.warmup {
                if hooked_first { hooked.push(took) } else { plain.push(took) }
            }
        }
    }
    Ok((plain, hooked))
}

fn markdown(r: &HookReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### One remote pre-step hook vs none ({} rounds, {} warm-up, interleaved; {} cores, {})\n",
        r.rounds, r.warmup, r.nproc, r.cpu_model
    );
    let _ = writeln!(
        out,
        "Followup → `WhenIdle` of one scripted turn, `turnstile dev` on its embedded journal ({}).\n",
        r.turnstile_bin
    );
    let _ = writeln!(out, "| percentile | no hook | one remote hook (pass) | added |");
    let _ = writeln!(out, "|---|---:|---:|---:|");
    for (name, a, b) in [
        ("p50", r.plain.p50_ms, r.hooked.p50_ms),
        ("p90", r.plain.p90_ms, r.hooked.p90_ms),
        ("p99", r.plain.p99_ms, r.hooked.p99_ms),
        ("mean", r.plain.mean_ms, r.hooked.mean_ms),
    ] {
        let _ = writeln!(out, "| {name} | {a:.3} ms | {b:.3} ms | {:+.3} ms |", b - a);
    }
    let _ = writeln!(out, "\nHook calls seen by the hook server: {}.", r.hook_calls);
    out
}
