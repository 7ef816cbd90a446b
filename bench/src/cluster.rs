//! `turnstile-bench cluster`: the throughput phase against a real cluster (issue 11 part 5, "the bench
//! covers the whole system"), with what each process spends on it.
//!
//! The harness's cluster (`turnstile_tests::Cluster`): `--nats-nodes` nats-servers clustered on loopback
//! (JetStream, the workers' streams with `--replicas` min(nodes, 3), so R3 with 3 nodes), `--workers`
//! worker processes and `--gateways` gateway processes of `TURNSTILE_BIN`, every port picked by the kernel.
//! The load is the throughput phase's: `--clients` clients round robin over `--sessions` sessions for
//! `--duration` seconds, client k on gateway k mod gateways, then the drain until every session is idle.
//!
//! Anchors, same run: a raw R3 publish-ack against the same nats cluster, sequential, before the load (what
//! one append costs there: the cluster's own ceiling for one session), and (in the main run) the
//! single-node throughput phase.
//!
//! CPU: each process's utime + stime from `/proc/<pid>/stat` before the load and after its drain (every
//! turn the load started has ended), in clock ticks, per 1,000 accepted followups.
//!
//! Replication apart (issue 44): with more than one replica the same load then runs again on a fresh
//! cluster of the same processes and flags with every stream and bucket at R1; the nats-servers' CPU per
//! 1,000 followups at R3 minus at R1 is what replicating those appends cost (see [`crate::replication`]
//! and decision 0189). `--sync-always` starts every nats-server with `sync_interval: always`
//! (`turnstile-bench sync --cluster` alternates it with the default).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use prost::Message as _;
use serde::Serialize;
use turnstile_proto::v1 as pb;
use turnstile_tests::cluster::{ClusterProcess, Role};
use turnstile_tests::{Cluster, ClusterOptions};

use crate::cpu::CpuPer1k;
use crate::latency::{RawStream, splice_event, text_message};
use crate::replication::Replication;
use crate::stats::Percentiles;
use crate::throughput::{self, ThroughputOpts, ThroughputReport};

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Length of the load, seconds.
    #[arg(long, default_value_t = 15.0)]
    duration: f64,
    /// Concurrent clients, spread over the gateways.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Sessions the clients cycle through.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// nats-servers (clustered; streams R3 from 3 on).
    #[arg(long, default_value_t = 3)]
    nats_nodes: usize,
    /// Sequential raw publish-acks on an R3 scratch stream before the load (0 skips), after 10% warm-up.
    #[arg(long, default_value_t = 500)]
    raw_rounds: usize,
    /// Rounds of a watcher dropped mid-reply on gateway 0 and resumed on gateway 1, after the load (0
    /// skips; needs 2 gateways).
    #[arg(long, default_value_t = 100)]
    resume_rounds: usize,
    /// The followup text (the scripted model answers `echo: <text>` at once).
    #[arg(long, default_value = "hello")]
    text: String,
    /// Replicas of every stream and bucket (the workers' `--replicas`; default min(nats-nodes, 3)).
    #[arg(long)]
    pub(crate) replicas: Option<usize>,
    /// Start every nats-server with `jetstream { sync_interval: always }` (an fsync before every
    /// acknowledgement) instead of the default (every 2 minutes).
    #[arg(long)]
    pub(crate) sync_always: bool,
    /// Skip the second run of the same load with every stream and bucket at R1 on as many nats-servers,
    /// which reports the replication cost of the same appends apart (`replication`).
    #[arg(long)]
    pub(crate) skip_r1: bool,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// The nats-server config line of `--sync-always`.
pub const SYNC_ALWAYS: &str = "jetstream { sync_interval: always }\n";

#[derive(Debug, Serialize)]
pub struct ProcessCpu {
    pub role: &'static str,
    pub name: String,
    pub pid: u32,
    /// utime + stime over the window, seconds.
    pub cpu_s: f64,
    pub cpu_s_per_1k_followups: f64,
}

#[derive(Debug, Serialize)]
pub struct ClusterReport {
    pub workers: usize,
    pub gateways: usize,
    pub nats_nodes: usize,
    pub replicas: usize,
    /// `sync_interval: always` on every nats-server (`--sync-always`), else nats-server's default.
    pub sync_always: bool,
    pub turnstile_bin: String,
    pub nats_server_version: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub clk_tck: u64,
    pub cluster_followups_per_s: f64,
    pub cluster_followup_p50_ms: f64,
    pub cluster_followup_p99_ms: f64,
    pub cluster_raw_publish_ack_p50_ms: Option<f64>,
    pub cluster_raw_publish_ack: Option<Percentiles>,
    pub cluster_cpu_s_per_1k_followups: CpuPer1k,
    /// The CPU window: the load and its drain, seconds.
    pub cpu_window_s: f64,
    /// JetStream messages per accepted followup over the load and its drain, by stream (the event streams
    /// and the KV buckets' `KV_…` streams; `KV_turnstile_index` is the index puts) and `total`.
    pub messages_per_followup: BTreeMap<String, f64>,
    /// Cluster CPU-seconds per second of the window (2.0 = both cores of this machine).
    pub cluster_cores_busy: f64,
    pub processes: Vec<ProcessCpu>,
    pub throughput: ThroughputReport,
    /// A watcher dropped mid-reply on one gateway resumes on the other (SPEC §14), after the load.
    pub cluster_resume_first_delta_p50_ms: Option<f64>,
    pub cluster_resume_first_delta_p99_ms: Option<f64>,
    pub resume: Option<crate::resume::ResumeReport>,
    /// The same load at R1 on as many nats-servers, and what replication cost (with more than one replica,
    /// unless `--skip-r1`).
    pub replication: Option<Replication>,
}

pub async fn run(args: ClusterArgs) -> Result<()> {
    if args.gateways == 0 || args.workers == 0 {
        bail!("--workers and --gateways must be at least 1");
    }
    if args.replicas == Some(0) {
        bail!("--replicas must be at least 1");
    }
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await??;
    let mut report = one_cluster(&args, &bin).await?;
    let mut failed = report.throughput.errors + report.throughput.drain_errors;
    if report.replicas > 1 && !args.skip_r1 {
        // The same processes, flags and load; only the copies differ. No resume rounds: they are not
        // part of the CPU window.
        let r1_args = ClusterArgs { replicas: Some(1), resume_rounds: 0, ..args.clone() };
        eprintln!("the same load at R1 on {} nats-servers (the replication cost apart) ...", report.nats_nodes);
        let r1 = one_cluster(&r1_args, &bin).await?;
        failed += r1.throughput.errors + r1.throughput.drain_errors;
        report.replication = Some(Replication {
            r1_followups_per_s: r1.cluster_followups_per_s,
            r1_followup_p50_ms: r1.cluster_followup_p50_ms,
            r1_followup_p99_ms: r1.cluster_followup_p99_ms,
            r1_raw_publish_ack_p50_ms: r1.cluster_raw_publish_ack_p50_ms,
            ..Replication::of_cpu(&report.cluster_cpu_s_per_1k_followups, &r1.cluster_cpu_s_per_1k_followups)
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    if failed > 0 {
        bail!("some followups failed in the cluster (see error_kinds)");
    }
    Ok(())
}

/// Starts a cluster as `args` say, measures it and stops it.
async fn one_cluster(args: &ClusterArgs, bin: &std::path::Path) -> Result<ClusterReport> {
    let mut opts = ClusterOptions::new(args.workers, args.gateways);
    opts.nats_nodes = args.nats_nodes.max(1);
    opts.replicas = args.replicas;
    opts.bin = Some(bin.to_owned());
    if args.sync_always {
        opts.nats_config = SYNC_ALWAYS.to_owned();
    }
    eprintln!(
        "starting {} nats-servers{}, {} workers and {} gateways ({}) ...",
        opts.nats_nodes,
        if args.sync_always { " (sync_interval: always)" } else { "" },
        args.workers,
        args.gateways,
        bin.display()
    );
    // Dropping the cluster kills every process it started, on every path out of this function.
    let cluster = Cluster::start_with(opts).await.context("starting the cluster")?;
    match measure(&cluster, args, bin.display().to_string()).await {
        Ok(report) => Ok(report),
        Err(e) => {
            eprintln!("{}", cluster.logs());
            Err(e)
        }
    }
}

async fn measure(cluster: &Cluster, args: &ClusterArgs, turnstile_bin: String) -> Result<ClusterReport> {
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let replicas = cluster.replicas();
    // Every member's URL (async-nats does not split a comma-separated string).
    let urls: Vec<String> = cluster.nats_url().split(',').map(str::to_owned).collect();
    let nats = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(urls)
        .await
        .with_context(|| format!("connecting to {}", cluster.nats_url()))?;
    let nats_server_version = nats.server_info().version;
    let raw = if args.raw_rounds > 0 {
        eprintln!("raw R{replicas} publish-ack: {} sequential appends ...", args.raw_rounds);
        Some(raw_acks(nats.clone(), &run_id, replicas, args.raw_rounds).await?)
    } else {
        None
    };
    let seqs_before = crate::streams::last_seqs(&nats).await?;

    let ticks = clk_tck();
    let processes = cluster.processes();
    let before: Vec<Option<u64>> = processes.iter().map(|p| cpu_ticks(&p.pid.to_string())).collect();
    let self_before = cpu_ticks("self");
    let urls: Vec<String> = (0..cluster.gateways()).map(|g| cluster.gateway_url(g)).collect();
    let opts = ThroughputOpts {
        sessions: args.sessions,
        clients: args.clients,
        duration: Duration::from_secs_f64(args.duration.clamp(0.1, 3600.0)),
        count: None,
        text: args.text.clone(),
        drain_timeout: Duration::from_secs(60),
    };
    eprintln!(
        "cluster throughput: {} clients over {} sessions through {} gateways for {:?} ...",
        opts.clients,
        opts.sessions,
        urls.len(),
        opts.duration
    );
    let started = std::time::Instant::now();
    let throughput = throughput::run(&urls, &run_id, &opts).await?;
    let window = started.elapsed().as_secs_f64();
    let after: Vec<Option<u64>> = processes.iter().map(|p| cpu_ticks(&p.pid.to_string())).collect();
    let self_after = cpu_ticks("self");
    let messages_per_followup =
        crate::streams::per_followup(&seqs_before, &crate::streams::last_seqs(&nats).await?, throughput.accepted);

    let per_1k = |cpu_s: f64| if throughput.accepted > 0 { cpu_s * 1000.0 / throughput.accepted as f64 } else { 0.0 };
    let seconds = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / ticks as f64),
        _ => None,
    };
    let mut rows = Vec::with_capacity(processes.len());
    for (ClusterProcess { role, name, pid }, (b, a)) in processes.into_iter().zip(before.into_iter().zip(after)) {
        // A process that exited during the load has no second reading: the run is not what it claims.
        let cpu_s = seconds(b, a).with_context(|| format!("reading the CPU time of {name} (pid {pid})"))?;
        rows.push(ProcessCpu { role: role.as_str(), name, pid, cpu_s, cpu_s_per_1k_followups: per_1k(cpu_s) });
    }
    let mut per_role: BTreeMap<&'static str, f64> = BTreeMap::new();
    for role in [Role::Worker, Role::Gateway, Role::Nats] {
        per_role.insert(
            role.as_str(),
            rows.iter().filter(|r| r.role == role.as_str()).map(|r| r.cpu_s_per_1k_followups).sum(),
        );
    }
    let total_cpu: f64 = rows.iter().map(|r| r.cpu_s).sum();
    // After the CPU window: the resume rounds are not part of the per-followup CPU.
    let resume = if args.resume_rounds > 0 && urls.len() > 1 {
        let opts = crate::resume::ResumeOpts {
            rounds: args.resume_rounds,
            warmup: (args.resume_rounds / 10).max(1),
            delay_ms: crate::resume::DEFAULT_DELAY_MS,
        };
        eprintln!("cluster resume: {} rounds across gateways ...", opts.rounds);
        Some(crate::resume::run(&urls[0], &urls[1], &run_id, &opts).await?)
    } else {
        None
    };
    let cpu = CpuPer1k {
        per_process: rows.iter().map(|r| (r.name.clone(), r.cpu_s_per_1k_followups)).collect(),
        per_role,
        total: per_1k(total_cpu),
        bench_clients: seconds(self_before, self_after).map_or(0.0, per_1k),
    };
    Ok(ClusterReport {
        workers: cluster.workers(),
        gateways: cluster.gateways(),
        nats_nodes: cluster.nats_cluster().len(),
        replicas,
        sync_always: args.sync_always,
        turnstile_bin,
        nats_server_version,
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        clk_tck: ticks,
        cluster_followups_per_s: throughput.followups_per_s,
        cluster_followup_p50_ms: throughput.latency.p50_ms,
        cluster_followup_p99_ms: throughput.latency.p99_ms,
        cluster_raw_publish_ack_p50_ms: raw.map(|r| r.p50_ms),
        cluster_raw_publish_ack: raw,
        cluster_cpu_s_per_1k_followups: cpu,
        cpu_window_s: window,
        messages_per_followup,
        cluster_cores_busy: if window > 0.0 { total_cpu / window } else { 0.0 },
        processes: rows,
        throughput,
        cluster_resume_first_delta_p50_ms: resume.as_ref().map(|r| r.first_resumed_delta.p50_ms),
        cluster_resume_first_delta_p99_ms: resume.as_ref().map(|r| r.first_resumed_delta.p99_ms),
        resume,
        replication: None,
    })
}

/// Sequential conditional appends of a followup's first group's bytes on an R`replicas` scratch stream,
/// timed to each ack; the first tenth (at least one) is warm-up and dropped.
async fn raw_acks(nats: async_nats::Client, run_id: &str, replicas: usize, rounds: usize) -> Result<Percentiles> {
    let stream = RawStream::create(nats, "RAWR3", run_id, replicas).await?;
    let warmup = (rounds / 10).max(1);
    let mut samples = Vec::with_capacity(rounds);
    let mut outcome = Ok(());
    for i in 0..warmup + rounds {
        let session = pb::SessionRef { tenant: "bench".into(), id: format!("raw-{run_id}-{i}") };
        let body = splice_event(&session, text_message(format!("m-{run_id}-{i}"), "hello")).encode_to_vec();
        match stream.append(i, body).await {
            Ok(took) if i >= warmup => samples.push(took),
            Ok(_) => {}
            Err(e) => {
                outcome = Err(e.context(format!("raw R{replicas} append {i}")));
                break;
            }
        }
    }
    stream.delete().await;
    outcome?;
    Ok(Percentiles::of(&samples))
}

/// utime + stime of `/proc/<pid>/stat` (`pid` may be `self`), in clock ticks; `None` once it is gone.
pub(crate) fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// Fields 14 (utime) and 15 (stime) of a stat line; the command name (field 2) may hold spaces and
/// parentheses, so count from after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state): utime is the 12th field of it, stime the 13th.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; the crate has no libc binding): 100 on Linux when getconf
/// cannot answer.
pub(crate) fn clk_tck() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

fn markdown(r: &ClusterReport) -> String {
    use std::fmt::Write as _;
    let t = &r.throughput;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Cluster: {} workers, {} gateways, {} nats-servers (R{}{}), {} clients over {} sessions, {:.1} s\n",
        r.workers,
        r.gateways,
        r.nats_nodes,
        r.replicas,
        if r.sync_always { ", sync_interval: always" } else { "" },
        t.clients,
        t.sessions,
        t.elapsed_s
    );
    let _ = writeln!(
        out,
        "{} cores ({}), nats-server {}, {}\n",
        r.nproc, r.cpu_model, r.nats_server_version, r.turnstile_bin
    );
    let _ =
        writeln!(out, "| accepted | errors | followups/s | p50 | p99 | drain | raw R{} publish-ack p50 |", r.replicas);
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
    let raw = r.cluster_raw_publish_ack_p50_ms.map_or_else(|| "—".to_owned(), |v| format!("{v:.3} ms"));
    let _ = writeln!(
        out,
        "| {} | {} | {:.0} | {:.3} ms | {:.3} ms | {:.2} s | {raw} |\n",
        t.accepted, t.errors, t.followups_per_s, t.latency.p50_ms, t.latency.p99_ms, t.drain_s
    );
    for (kind, n) in &t.error_kinds {
        let _ = writeln!(out, "error ×{n}: {kind}\n");
    }
    let _ = writeln!(
        out,
        "CPU over the load and its drain ({:.1} s, {:.2} cores busy in the cluster's processes), seconds per 1,000 \
         accepted followups:\n",
        r.cpu_window_s, r.cluster_cores_busy
    );
    let _ = writeln!(out, "| process | role | CPU s | CPU s / 1k followups |");
    let _ = writeln!(out, "|---|---|---:|---:|");
    for p in &r.processes {
        let _ = writeln!(out, "| {} | {} | {:.2} | {:.3} |", p.name, p.role, p.cpu_s, p.cpu_s_per_1k_followups);
    }
    let c = &r.cluster_cpu_s_per_1k_followups;
    for (role, v) in &c.per_role {
        let _ = writeln!(out, "| all | {role} | | {v:.3} |");
    }
    let _ = writeln!(out, "| all | cluster | | {:.3} |", c.total);
    let _ = writeln!(out, "| bench | load clients | | {:.3} |\n", c.bench_clients);
    if let Some(total) = r.messages_per_followup.get("total") {
        let streams: Vec<String> = r
            .messages_per_followup
            .iter()
            .filter(|(name, _)| name.as_str() != "total")
            .map(|(name, v)| format!("{name} {v:.3}"))
            .collect();
        let _ = writeln!(out, "JetStream messages per followup: {total:.3} ({})\n", streams.join(", "));
    }
    if let Some(resume) = &r.resume {
        let (d, c) = (&resume.first_resumed_delta, &resume.caught_up);
        let _ = writeln!(
            out,
            "A watcher dropped mid-reply on gateway 0 resumes on gateway 1 ({} rounds, a {} ms reply): first resumed \
             delta p50 {:.3} ms, p99 {:.3} ms; caught_up p50 {:.3} ms\n",
            resume.rounds, resume.delay_ms, d.p50_ms, d.p99_ms, c.p50_ms
        );
    }
    if let Some(replication) = &r.replication {
        out.push_str(&replication.markdown(r.replicas, c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_ticks;

    #[test]
    fn stat_line_with_a_spaced_name() {
        let line = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 12345 0 0";
        assert_eq!(parse_cpu_ticks(line), Some(325));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }
}
