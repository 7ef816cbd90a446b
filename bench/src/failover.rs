//! `turnstile-bench failover`: how long a session is without an owner when its owner dies (issue 11,
//! docs/decisions/0019).
//!
//! The harness's real cluster (`turnstile_tests::Cluster`: one nats-server, `--workers` worker processes
//! and one gateway, every port picked by the kernel) with the workers' default lease timings unless
//! `--worker-arg` says otherwise. Each round starts a fresh session whose turn is inside a tool call
//! (`sleep`), signals the session's owner, and times signal → the next accepted followup through the
//! gateway (each followup retries inside the gateway's routing deadline; an UNAVAILABLE answer is tried
//! again at once). Then the victim is restarted (kill -9) or continued (SIGSTOP) and the shards settle
//! before the next round.
//!
//! - kill -9: the owner's sockets close with it; the figure is how fast the cluster notices.
//! - SIGSTOP (`--sigstop` rounds): the owner keeps its sockets, so only its lease running out can tell;
//!   the figure is bounded below by the lease TTL.
//!
//! The binary is the harness's: `TURNSTILE_BIN` (use the release build), else a debug build it makes.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use tonic::Code;
use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{Cluster, ClusterOptions, Session, WatchRecorder, user_msg};

use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Rounds that kill -9 the owner.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Rounds that SIGSTOP the owner (and SIGCONT it after the takeover).
    #[arg(long, default_value_t = 5)]
    sigstops: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Extra arguments of every `turnstile worker` (repeatable), e.g. `--worker-arg=--lease-ttl-ms=3000`.
    #[arg(long = "worker-arg", allow_hyphen_values = true)]
    worker_args: Vec<String>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
pub struct FailoverReport {
    pub workers: usize,
    pub worker_args: Vec<String>,
    pub turnstile_bin: String,
    pub nats_server_version: String,
    pub nproc: usize,
    pub cpu_model: String,
    /// kill -9 of the owner → next accepted followup.
    pub kill9: Percentiles,
    pub failover_kill9_p50_ms: f64,
    pub failover_kill9_p99_ms: f64,
    /// SIGSTOP of the owner → next accepted followup.
    pub sigstop: Percentiles,
    pub failover_sigstop_p50_ms: f64,
    pub kill9_samples_ms: Vec<u64>,
    pub sigstop_samples_ms: Vec<u64>,
    /// The first stage of each kill -9 round: the signal → the gateway reports another owner for the
    /// session (`GetSession.owner`, polled every 5 ms beside the followups): detection, lease acquisition
    /// and its propagation. The rest of the round (`kill9_samples_ms` − this) is the new owner's load of
    /// the session and the followup's way to it.
    pub kill9_owner_visible_samples_ms: Vec<u64>,
}

/// How a round takes the owner away.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill9,
    Sigstop,
}

/// A bound on any one wait of a round: far beyond any lease the bench runs with.
const ROUND_WAIT: Duration = Duration::from_secs(60);

pub async fn run(args: FailoverArgs) -> Result<()> {
    if args.workers < 2 {
        bail!("--workers {}: a failover needs a second worker", args.workers);
    }
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await??;
    let mut opts = ClusterOptions::new(args.workers, 1);
    opts.worker_args = args.worker_args.clone();
    eprintln!("starting nats-server, {} workers and a gateway ({}) ...", args.workers, bin.display());
    let mut cluster = Cluster::start_with(opts).await.context("starting the cluster")?;
    let version = nats_version(&cluster).await;

    let mut kill9 = Vec::new();
    let mut kill9_owner = Vec::new();
    let mut sigstop = Vec::new();
    let rounds =
        std::iter::repeat_n(Fault::Kill9, args.kills).chain(std::iter::repeat_n(Fault::Sigstop, args.sigstops));
    for (i, fault) in rounds.enumerate() {
        let took = round(&mut cluster, fault).await.with_context(|| format!("round {i} ({fault:?})"));
        let (took, owner_visible) = match took {
            Ok(took) => took,
            Err(e) => {
                eprintln!("{}", cluster.logs());
                return Err(e);
            }
        };
        eprintln!(
            "round {i} ({fault:?}): next followup accepted after {} ms (new owner visible after {:?} ms)",
            took.as_millis(),
            owner_visible.map(|d| d.as_millis())
        );
        match fault {
            Fault::Kill9 => {
                kill9.push(took);
                kill9_owner.extend(owner_visible);
            }
            Fault::Sigstop => sigstop.push(took),
        }
    }

    let ms = |v: &[Duration]| v.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>();
    let (k, s) = (Percentiles::of(&kill9), Percentiles::of(&sigstop));
    let report = FailoverReport {
        workers: args.workers,
        worker_args: args.worker_args.clone(),
        turnstile_bin: bin.display().to_string(),
        nats_server_version: version,
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        kill9: k,
        failover_kill9_p50_ms: k.p50_ms,
        failover_kill9_p99_ms: k.p99_ms,
        sigstop: s,
        failover_sigstop_p50_ms: s.p50_ms,
        kill9_samples_ms: ms(&kill9),
        sigstop_samples_ms: ms(&sigstop),
        kill9_owner_visible_samples_ms: ms(&kill9_owner),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// One round: a session mid-tool, its owner signalled, the time to the next accepted followup (and to
/// the gateway reporting another owner, when it did before the round ended); then the cluster is made
/// whole again and left to settle.
async fn round(cluster: &mut Cluster, fault: Fault) -> Result<(Duration, Option<Duration>)> {
    let s = cluster.session(0);
    let watch = s.watch().await?;
    s.followup(user_msg("A", "[[tool:sleep 500]] go")).await?;
    watch.wait_line("D tool/call 1.1 sleep *").await?;
    let owner = s.info().await?.owner;
    let victim = cluster.worker_index(&owner).with_context(|| format!("owner {owner:?} is not a worker"))?;

    match fault {
        Fault::Kill9 => cluster.kill9_worker(victim),
        Fault::Sigstop => cluster.sigstop_worker(victim),
    }
    let signalled = Instant::now();
    // Beside the followups: when the gateway first names another owner.
    let poller = {
        let (s, owner) = (s.clone(), owner.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(info) = s.info().await
                    && !info.owner.is_empty()
                    && info.owner != owner
                {
                    return Some(signalled.elapsed());
                }
                if signalled.elapsed() >= ROUND_WAIT {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let took = loop {
        match s.followup(user_msg("B", "bee")).await {
            Ok(_) => break signalled.elapsed(),
            Err(status) if status.code() == Code::Unavailable && signalled.elapsed() < ROUND_WAIT => {}
            Err(status) => bail!("followup after {fault:?} of {owner} failed: {status}"),
        }
    };
    match fault {
        Fault::Kill9 => cluster.restart_worker(victim).await?,
        Fault::Sigstop => cluster.sigcont_worker(victim),
    }
    let owner_visible = poller.await.ok().flatten();
    settle(&s, &watch).await?;
    cluster.wait_balanced().await?;
    Ok((took, owner_visible))
}

/// Waits (bounded) until the session is idle with B entered: the resumed turn and B's are done, so the
/// next round starts on a quiet cluster.
async fn settle(s: &Session, watch: &WatchRecorder) -> Result<()> {
    let deadline = Instant::now() + ROUND_WAIT;
    loop {
        match s.when_idle().await {
            Ok(info)
                if info.status == SessionStatus::Idle as i32
                    && watch.lines().iter().any(|l| l == "D user/message B") =>
            {
                return Ok(());
            }
            Ok(_) => {}
            Err(status) if status.code() == Code::Unavailable || status.code() == Code::DeadlineExceeded => {}
            Err(status) => bail!("waiting for the session to settle: {status}"),
        }
        if Instant::now() >= deadline {
            bail!("the session did not settle within {ROUND_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn nats_version(cluster: &Cluster) -> String {
    match async_nats::connect(cluster.nats_url()).await {
        Ok(client) => client.server_info().version,
        Err(_) => "unknown".into(),
    }
}

fn markdown(r: &FailoverReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "### Failover: owner signalled → next accepted followup\n");
    let _ = writeln!(
        out,
        "{} cores ({}), nats-server {}, {} workers + 1 gateway, worker args {:?} ({})\n",
        r.nproc, r.cpu_model, r.nats_server_version, r.workers, r.worker_args, r.turnstile_bin
    );
    let _ = writeln!(out, "| fault | rounds | p50 | p90 | p99 | max |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for (name, p) in [("kill -9", &r.kill9), ("SIGSTOP", &r.sigstop)] {
        let _ = writeln!(
            out,
            "| {name} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
        );
    }
    out
}
