//! `turnstile-bench nats-loss`: how long a followup waits when one nats-server of three dies under load
//! (issue 37 item 8, docs/decisions/0094).
//!
//! The harness's real cluster (`turnstile_tests::Cluster`): 3 nats-servers clustered on loopback with R3
//! streams and buckets, `--workers` worker processes and `--gateways` gateways, the workers' default lease
//! timings unless `--worker-arg` says otherwise. Each round runs the load (`--clients` clients, each round
//! robin over its own share of `--sessions` sessions, through every gateway), kills one member (`kill -9`,
//! or SIGTERM with `--sigterm`) `--before` seconds in, keeps the load `--after` seconds more, then restarts
//! the member and lets the cluster settle before the next round.
//!
//! A followup's *wait* is what its client sees: from its first attempt to the attempt that was accepted.
//! A client answered with anything that may be retried (UNAVAILABLE, DEADLINE_EXCEEDED, …) sends the same
//! MessageId again at once, as a client would. The figure is the max and p99 of the waits of the followups
//! that were in flight at the kill or started after it, beside the same figures before the kill.
//!
//! The victim of a round is chosen by what it leads when the round starts (`/jsz` of the members):
//! `events-leader` leads the sessions' event stream (`TURNSTILE_EVENTS_0`), `lease-leader` the shard-lease
//! bucket's stream (`KV_turnstile_shards`), `follower` neither; `rotate` (the default) takes them in turn.
//! Each round also reads every worker's lease-renewal failures and append conflicts (`/metrics`) across it.
//!
//! With `--partitions N` the sessions are spread over N event streams (`TURNSTILE_EVENTS_0..N`), whose
//! leaders nats-server places; a round then reports how many of them the victim led and the share of the
//! sessions that had a followup wait past the goal (a leader's death stalls only its streams' sessions).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tonic::Code;
use turnstile_proto::v1 as pb;
use turnstile_tests::{Cluster, ClusterOptions};

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

/// The sessions' event stream (one partition, the default layout).
const EVENTS_STREAM: &str = "TURNSTILE_EVENTS_0";
/// The shard-lease bucket's stream.
const LEASE_STREAM: &str = "KV_turnstile_shards";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Victim {
    /// The member leading the event stream.
    EventsLeader,
    /// The member leading the shard-lease bucket's stream.
    LeaseLeader,
    /// A member leading neither (else the one leading the fewer of the two).
    Follower,
    /// The three above in turn.
    Rotate,
}

#[derive(Args, Debug, Clone)]
pub struct NatsLossArgs {
    /// Rounds, each killing one nats-server under load.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Which member a round kills.
    #[arg(long, value_enum, default_value_t = Victim::Rotate)]
    victim: Victim,
    /// SIGTERM the member instead of kill -9 (nats-server hands its leaderships over as it stops).
    #[arg(long)]
    sigterm: bool,
    /// Concurrent clients, spread over the gateways.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Sessions the clients cycle through.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// Load before the kill, seconds.
    #[arg(long, default_value_t = 3.0)]
    before: f64,
    /// Load after the kill, seconds.
    #[arg(long, default_value_t = 12.0)]
    after: f64,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// Event streams (partitions) the sessions are spread over (`--partitions` of every worker and gateway).
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Extra arguments of every `turnstile worker` (repeatable), e.g. `--worker-arg=--lease-ttl-ms=3000`.
    #[arg(long = "worker-arg", allow_hyphen_values = true)]
    worker_args: Vec<String>,
    /// The goal the report compares the max wait with, ms.
    #[arg(long, default_value_t = 2000)]
    goal_ms: u64,
    /// Copy every process's log into this directory at the end (to study a round).
    #[arg(long)]
    logs: Option<std::path::PathBuf>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// One round's figures.
#[derive(Debug, Serialize)]
pub struct Round {
    pub victim: Victim,
    /// The member killed (`n1`…) and what it led when the round started.
    pub member: String,
    pub led_events: bool,
    pub led_leases: bool,
    /// Of the `partitions` event streams, how many the member led when the round started.
    pub led_event_streams: usize,
    /// Sessions that had a followup in flight at the kill or after it wait longer than the goal, of the
    /// sessions that had any.
    pub sessions_stalled: usize,
    pub sessions_after_kill: usize,
    /// Followups accepted before the kill, and their waits.
    pub quiet: Percentiles,
    /// Followups in flight at the kill or started after it, and their waits.
    pub after_kill: Percentiles,
    /// Attempts those followups needed beyond their first.
    pub retries: usize,
    /// Followups answered with an error no retry can fix (none expected).
    pub failed: usize,
    pub failures: BTreeMap<String, usize>,
    /// The slowest followup after the kill: when it started, ms after the kill (negative: before).
    pub slowest_started_ms: i64,
    /// Summed over the workers, across the round: lease renewals that failed (`error`: the store did not
    /// answer; `lost`: another worker held the lease) and append batches refused as conflicts.
    pub lease_renew_errors: u64,
    pub leases_lost: u64,
    pub append_conflicts: u64,
}

#[derive(Debug, Serialize)]
pub struct NatsLossReport {
    pub workers: usize,
    pub gateways: usize,
    pub clients: usize,
    pub sessions: usize,
    pub partitions: u32,
    pub signal: &'static str,
    pub worker_args: Vec<String>,
    pub turnstile_bin: String,
    pub nats_server_version: String,
    pub nproc: usize,
    pub cpu_model: String,
    /// The load average (1 min) when the run started and ended: the machine is shared.
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub goal_ms: u64,
    pub rounds: Vec<Round>,
    /// Every round's waits after the kill, together.
    pub nats_loss_followup_wait_max_ms: f64,
    pub nats_loss_followup_wait_p99_ms: f64,
    pub nats_loss_quiet_p99_ms: f64,
}

pub async fn run(args: NatsLossArgs) -> Result<()> {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await??;
    let mut opts = ClusterOptions::new(args.workers.max(1), args.gateways.max(1));
    opts.nats_nodes = 3;
    opts.worker_args = args.worker_args.clone();
    let partitions = format!("--partitions={}", args.partitions.max(1));
    opts.worker_args.push(partitions.clone());
    opts.gateway_args.push(partitions);
    eprintln!(
        "starting 3 nats-servers, {} workers and {} gateways ({}) ...",
        args.workers,
        args.gateways,
        bin.display()
    );
    let loadavg_start = loadavg();
    let mut cluster = Cluster::start_with(opts).await.context("starting the cluster")?;
    let version = nats_version(&cluster).await;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut rounds = Vec::new();
    for i in 0..args.rounds {
        let victim = match args.victim {
            Victim::Rotate => [Victim::EventsLeader, Victim::LeaseLeader, Victim::Follower][i % 3],
            v => v,
        };
        match round(&mut cluster, &args, victim, &format!("{run_id}-{i}")).await {
            Ok(r) => {
                eprintln!(
                    "round {i}: {} {} (events leader {}, lease leader {}): after the kill max {:.0} ms, p99 {:.0} ms \
                     over {} followups ({} retries); before it p99 {:.0} ms; lease errors {}, lost {}, conflicts {}",
                    if args.sigterm { "SIGTERM" } else { "kill -9" },
                    r.member,
                    r.led_events,
                    r.led_leases,
                    r.after_kill.max_ms,
                    r.after_kill.p99_ms,
                    r.after_kill.count,
                    r.retries,
                    r.quiet.p99_ms,
                    r.lease_renew_errors,
                    r.leases_lost,
                    r.append_conflicts
                );
                rounds.push(r);
            }
            Err(e) => {
                eprintln!("{}", cluster.logs());
                return Err(e.context(format!("round {i}")));
            }
        }
    }
    if let Some(dir) = &args.logs {
        cluster.save_logs(dir).with_context(|| format!("saving the logs to {}", dir.display()))?;
    }
    let all = |f: fn(&Round) -> &Percentiles| -> Vec<f64> { rounds.iter().map(|r| f(r).max_ms).collect() };
    let max_after = all(|r| &r.after_kill).into_iter().fold(0.0, f64::max);
    let report = NatsLossReport {
        workers: args.workers,
        gateways: args.gateways,
        clients: args.clients,
        sessions: args.sessions,
        partitions: args.partitions.max(1),
        signal: if args.sigterm { "SIGTERM" } else { "kill -9" },
        worker_args: args.worker_args.clone(),
        turnstile_bin: bin.display().to_string(),
        nats_server_version: version,
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        loadavg_start,
        loadavg_end: loadavg(),
        goal_ms: args.goal_ms,
        nats_loss_followup_wait_max_ms: max_after,
        nats_loss_followup_wait_p99_ms: rounds.iter().map(|r| r.after_kill.p99_ms).fold(0.0, f64::max),
        nats_loss_quiet_p99_ms: rounds.iter().map(|r| r.quiet.p99_ms).fold(0.0, f64::max),
        rounds,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    if report.rounds.iter().any(|r| r.failed > 0) {
        bail!("some followups failed with an error no retry fixes (see failures)");
    }
    Ok(())
}

/// One followup as its client saw it.
struct Sample {
    /// First attempt, and the accepted one's answer, from the round's start.
    started: Duration,
    wait: Duration,
    attempts: usize,
    /// Which of the round's sessions it went to.
    session: usize,
}

#[derive(Default)]
struct Tally {
    samples: Vec<Sample>,
    failures: BTreeMap<String, usize>,
}

/// Whether an answer may be retried with the same MessageId (it may not have been applied, or may have).
fn retryable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled | Code::Aborted)
}

async fn round(cluster: &mut Cluster, args: &NatsLossArgs, victim: Victim, run_id: &str) -> Result<Round> {
    let nats = cluster.nats_cluster();
    let events = nats.stream_leader(EVENTS_STREAM).await;
    let mut event_leaders = Vec::new();
    for p in 0..args.partitions.max(1) {
        event_leaders.push(nats.stream_leader(&format!("TURNSTILE_EVENTS_{p}")).await);
    }
    let leases = nats.stream_leader(LEASE_STREAM).await;
    let name = |i: usize| nats.node(i).name().map_or_else(|| format!("n{}", i + 1), str::to_owned);
    let index = |leader: &Option<String>| leader.as_deref().and_then(|l| nats.index_of(l));
    let target = match victim {
        Victim::EventsLeader => index(&events),
        Victim::LeaseLeader => index(&leases),
        _ => (0..nats.len())
            .find(|i| Some(*i) != index(&events) && Some(*i) != index(&leases))
            .or_else(|| (0..nats.len()).find(|i| Some(*i) != index(&events))),
    }
    .with_context(|| format!("no member to kill as {victim:?} (events leader {events:?}, lease leader {leases:?})"))?;
    let member = name(target);
    let (led_events, led_leases) = (index(&events) == Some(target), index(&leases) == Some(target));
    let led_event_streams = event_leaders.iter().filter(|l| index(l) == Some(target)).count();

    let before_metrics = worker_counters(cluster).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sessions: Arc<Vec<pb::SessionRef>> = Arc::new(
        (0..args.sessions.max(1))
            .map(|n| pb::SessionRef { tenant: "bench".into(), id: format!("nl-{run_id}-{n}") })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let clients = args.clients.max(1);
    for k in 0..clients {
        let mut client = servers::connect(&cluster.gateway_url(k % cluster.gateways())).await?;
        let (stop, sessions, next, run_id) = (stop.clone(), sessions.clone(), next.clone(), run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut owned = 0;
            while !stop.load(Ordering::Relaxed) {
                // Client k owns sessions k, k + clients, …: a stalled session holds up its own client only,
                // so the others go on measuring theirs (with a shared round robin every client would soon
                // wait on some stalled session, and the share of sessions stalled could not show).
                let i = next.fetch_add(1, Ordering::Relaxed);
                let session = (k + owned * clients) % sessions.len();
                owned = (owned + 1) % sessions.len().div_ceil(clients).max(1);
                let request = pb::DeliverRequest {
                    session: Some(sessions[session].clone()),
                    message: Some(text_message(format!("nl-{run_id}-{i}"), "hello")),
                    output_schema: None,
                };
                let first = started.elapsed();
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match client.followup(request.clone()).await {
                        Ok(_) => {
                            let wait = started.elapsed().saturating_sub(first);
                            tally.samples.push(Sample { started: first, wait, attempts, session });
                            break;
                        }
                        Err(status) if retryable(status.code()) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(status) => {
                            *tally.failures.entry(format!("{:?}: {}", status.code(), status.message())).or_default() +=
                                1;
                            break;
                        }
                    }
                }
            }
            tally
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(args.before.clamp(0.5, 600.0))).await;
    let killed_at = started.elapsed();
    if args.sigterm {
        cluster.sigterm_nats(target).await;
    } else {
        cluster.kill9_nats(target);
    }
    tokio::time::sleep(Duration::from_secs_f64(args.after.clamp(1.0, 600.0))).await;
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for task in tasks {
        let t = task.await?;
        tally.samples.extend(t.samples);
        for (k, v) in t.failures {
            *tally.failures.entry(k).or_default() += v;
        }
    }
    let after_metrics = worker_counters(cluster).await;
    cluster.restart_nats(target).await.context("restarting the killed member")?;
    cluster.nats_cluster().wait_meta_leader().await?;
    cluster.wait_balanced().await?;

    // In flight at the kill (ended after it) or started after it.
    let (after, quiet): (Vec<&Sample>, Vec<&Sample>) =
        tally.samples.iter().partition(|s| s.started + s.wait >= killed_at);
    let waits = |v: &[&Sample]| v.iter().map(|s| s.wait).collect::<Vec<_>>();
    let slowest = after.iter().max_by_key(|s| s.wait);
    let goal = Duration::from_millis(args.goal_ms);
    let touched: std::collections::BTreeSet<usize> = after.iter().map(|s| s.session).collect();
    let stalled: std::collections::BTreeSet<usize> =
        after.iter().filter(|s| s.wait > goal).map(|s| s.session).collect();
    let delta = |k: &str| {
        after_metrics.get(k).copied().unwrap_or(0).saturating_sub(before_metrics.get(k).copied().unwrap_or(0))
    };
    Ok(Round {
        victim,
        member,
        led_events,
        led_leases,
        led_event_streams,
        sessions_stalled: stalled.len(),
        sessions_after_kill: touched.len(),
        quiet: Percentiles::of(&waits(&quiet)),
        after_kill: Percentiles::of(&waits(&after)),
        retries: after.iter().map(|s| s.attempts - 1).sum(),
        failed: tally.failures.values().sum(),
        failures: tally.failures,
        slowest_started_ms: slowest.map_or(0, |s| s.started.as_millis() as i64 - killed_at.as_millis() as i64),
        lease_renew_errors: delta("lease_error"),
        leases_lost: delta("lease_lost"),
        append_conflicts: delta("append_conflict"),
    })
}

/// The workers' lease-renewal failures and append conflicts, summed (`lease_error`, `lease_lost`,
/// `append_conflict`); a worker whose `/metrics` does not answer counts nothing.
async fn worker_counters(cluster: &Cluster) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for w in 0..cluster.workers() {
        let Some(http) = cluster.worker_http(w) else { continue };
        let Some((200, body)) = turnstile_tests::nats::http_get(http, "/metrics").await else { continue };
        for line in body.lines() {
            let key = if line.starts_with("turnstile_lease_renew_failures_total{") && line.contains("reason=\"error\"")
            {
                "lease_error"
            } else if line.starts_with("turnstile_lease_renew_failures_total{") && line.contains("reason=\"lost\"") {
                "lease_lost"
            } else if line.starts_with("turnstile_appends_total{") && line.contains("outcome=\"conflict\"") {
                "append_conflict"
            } else {
                continue;
            };
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            *out.entry(key).or_default() += value as u64;
        }
    }
    out
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn nats_version(cluster: &Cluster) -> String {
    let urls: Vec<String> = cluster.nats_url().split(',').map(str::to_owned).collect();
    match async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5)).connect(urls).await {
        Ok(client) => client.server_info().version,
        Err(_) => "unknown".into(),
    }
}

fn markdown(r: &NatsLossReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "### One nats-server of three lost under load ({}): followup waits\n", r.signal);
    let _ = writeln!(
        out,
        "{} cores ({}), load average {} → {}, nats-server {}, {} workers + {} gateways, {} clients over {} \
         sessions in {} event streams, worker args {:?} ({})\n",
        r.nproc,
        r.cpu_model,
        r.loadavg_start,
        r.loadavg_end,
        r.nats_server_version,
        r.workers,
        r.gateways,
        r.clients,
        r.sessions,
        r.partitions,
        r.worker_args,
        r.turnstile_bin
    );
    let _ = writeln!(
        out,
        "| round | member (led) | event streams led | before: p99 | after: followups | p50 | p99 | max | sessions over the goal | retries | lease errors / lost | conflicts |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, x) in r.rounds.iter().enumerate() {
        let led = match (x.led_events, x.led_leases) {
            (true, true) => "events + leases",
            (true, false) => "events",
            (false, true) => "leases",
            (false, false) => "neither",
        };
        let _ = writeln!(
            out,
            "| {i} | {} ({led}) | {} of {} | {:.0} ms | {} | {:.0} ms | {:.0} ms | {:.0} ms | {} of {} | {} | {} / {} | {} |",
            x.member,
            x.led_event_streams,
            r.partitions,
            x.quiet.p99_ms,
            x.after_kill.count,
            x.after_kill.p50_ms,
            x.after_kill.p99_ms,
            x.after_kill.max_ms,
            x.sessions_stalled,
            x.sessions_after_kill,
            x.retries,
            x.lease_renew_errors,
            x.leases_lost,
            x.append_conflicts
        );
    }
    let verdict = if r.nats_loss_followup_wait_max_ms <= r.goal_ms as f64 { "within" } else { "over" };
    let _ = writeln!(
        out,
        "\nmax wait after a kill {:.0} ms ({verdict} the {} ms goal), p99 {:.0} ms; before the kills p99 {:.0} ms\n",
        r.nats_loss_followup_wait_max_ms, r.goal_ms, r.nats_loss_followup_wait_p99_ms, r.nats_loss_quiet_p99_ms
    );
    out
}
