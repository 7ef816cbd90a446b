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
//! throughput phase's dev + nats-server), `cluster_raw_publish_ack_p50_ms`, and their ratios). The reads,
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
//! costs in followup latency and followups/s (see [`sync`]).

mod cluster;
mod failover;
mod fanout;
mod goals;
mod hooks;
mod hostile;
mod idle;
mod latency;
mod model;
mod nats_loss;
mod protocols;
mod raw;
mod reads;
mod resume;
mod search;
mod servers;
mod stats;
mod steer;
mod sync;
mod throughput;
mod tools;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::latency::{LatencyOpts, LatencyReport};
use crate::throughput::{ThroughputOpts, ThroughputReport};

#[derive(Parser, Debug)]
#[command(name = "turnstile-bench", about = "Benchmarks Turnstile's followup path against raw JetStream")]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Use this nats-server (loopback only) instead of starting one with the harness.
    #[arg(long)]
    nats: Option<String>,
    /// The `turnstile` binary to run as `turnstile dev --nats URL` (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<PathBuf>,
    /// Extra arguments for `turnstile dev` (repeatable).
    #[arg(long = "dev-arg", allow_hyphen_values = true)]
    dev_args: Vec<String>,
    /// Measured rounds of the latency comparison (one followup and one raw append each).
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Rounds run first and dropped.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Concurrent clients of the throughput phase.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Sessions the throughput phase cycles through.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Length of the throughput phase, seconds.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Stop the throughput phase after this many followups (even before --duration).
    #[arg(long)]
    count: Option<usize>,
    /// The followup text (the scripted model answers `echo: <text>` at once).
    #[arg(long, default_value = "hello")]
    text: String,
    /// Skip the latency comparison.
    #[arg(long)]
    skip_latency: bool,
    /// Skip the throughput phase.
    #[arg(long)]
    skip_throughput: bool,
    /// Messages of the raw async publish phase (the ceiling: many acks in flight).
    #[arg(long, default_value_t = 20_000)]
    raw_count: usize,
    /// Acks in flight at most in the raw async publish phase.
    #[arg(long, default_value_t = 256)]
    raw_window: usize,
    /// Body bytes of each raw async publish (about an idle followup's first append group).
    #[arg(long, default_value_t = 400)]
    raw_body_bytes: usize,
    /// Skip the raw async publish phase.
    #[arg(long)]
    skip_raw: bool,
    /// Fresh sessions given one queued message each, for the memory per idle loaded session.
    #[arg(long, default_value_t = 100_000)]
    idle_sessions: usize,
    /// How long the idle sessions are left alone before the "after" RSS (past the worker's 1 s
    /// `park_after`, decision 0037).
    #[arg(long, default_value_t = 3_000)]
    idle_settle_ms: u64,
    /// `[journal] passivate_after_ms` of `turnstile dev` (a config file the bench writes; 0 leaves the
    /// default 300 s and skips the passivated reading of the idle phase).
    #[arg(long, default_value_t = 10_000)]
    passivate_after_ms: u64,
    /// Events of the long session of the reads phase (`turnstile-bench reads --events`, on its own
    /// nats-server and `turnstile dev`); 0 skips the phase.
    #[arg(long, default_value_t = 100_000)]
    reads_events: u64,
    /// Timed rounds of each read of the reads phase.
    #[arg(long, default_value_t = 20)]
    reads_rounds: usize,
    /// kill -9 rounds of the failover phase (`turnstile-bench failover`, a cluster of 3 worker processes
    /// of the same binary); 0 skips the phase.
    #[arg(long, default_value_t = 5)]
    failover_kills: usize,
    /// Live Watch streams of one session in the fan-out phase; 0 skips it. They share the gateway's one
    /// feed of the session (one JetStream consumer, decision 0039); before that each held its own and
    /// 1,000 reached the server's consumer limit (10026; see docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 1000)]
    fanout_watchers: usize,
    /// Followups (turns streaming a reply) of the fan-out phase, with one watcher and with all of them.
    #[arg(long, default_value_t = 20)]
    fanout_rounds: usize,
    /// Skip the idle-sessions phase.
    #[arg(long)]
    skip_idle: bool,
    /// Rounds of the steer phase (a steer into a running turn → its user/message at the next step); 0
    /// skips it.
    #[arg(long, default_value_t = 200)]
    steer_rounds: usize,
    /// Rounds of the resume phase (a watcher dropped mid-reply reconnects with its offsets → its first
    /// resumed delta; SPEC §14); 0 skips it. The cluster phase runs it across its two gateways too.
    #[arg(long, default_value_t = 100)]
    resume_rounds: usize,
    /// Rounds of the protocols phase (`POST /v1/responses` streamed against a gRPC Watch of the same turn:
    /// time to first SSE byte and delta, deltas/s; issue 39); 0 skips it.
    #[arg(long, default_value_t = 50)]
    protocols_rounds: usize,
    /// Seconds of load of the cluster phase (`turnstile-bench cluster`: 3 nats-servers with R3 streams,
    /// 3 workers and 2 gateways of `TURNSTILE_BIN`, `--clients` over `--sessions`); 0 skips the phase.
    #[arg(long, default_value_t = 15.0)]
    cluster_duration: f64,
    /// Measured rounds of the model phase (`turnstile-bench model`: llama-server on SmolLM2 straight and
    /// through `turnstile dev --config`, interleaved); 0 skips it, and so does a machine without
    /// `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (scripts/setup-test-deps installs both; the report says so).
    #[arg(long, default_value_t = 10)]
    model_runs: usize,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// A real model (llama-server on SmolLM2): time to first token and deltas/s straight from llama-server
    /// and through `turnstile dev --config`, same prompt, interleaved rounds.
    Model(model::ModelArgs),
    /// Tool calls: what Turnstile adds to one call of each kind of tool (built-in, MCP over stdio)
    /// against calling it directly, same run.
    Tools(tools::ToolsArgs),
    /// What one remote pre-step hook adds to a turn: followup → idle with and without a local Rust hook
    /// that passes the batch, interleaved.
    Hooks(hooks::HookArgs),
    /// Reads of a long session on `dev --nats`: Watch → caught-up resuming near the end and from 0, and
    /// GetInbox, on 100,000 events against a small session (decision 0020).
    Reads(reads::ReadsArgs),
    /// Failover: kill -9 (and SIGSTOP) the owner of a session in a real cluster of worker processes and
    /// time the signal → the next accepted followup.
    Failover(failover::FailoverArgs),
    /// The throughput phase on a real cluster (nats-servers with R3 streams, worker and gateway processes)
    /// and the CPU each process spends per 1,000 followups, beside a raw R3 publish-ack.
    Cluster(cluster::ClusterArgs),
    /// `ListSessions` with a label selector over 100,000 sessions of one tenant on `dev --nats` (SPEC §16).
    Search(search::SearchArgs),
    /// What nats-server's `sync_interval: always` (an fsync before every acknowledgement) costs against
    /// its default (every 2 minutes): followup latency and followups/s, alternating rounds.
    Sync(sync::SyncArgs),
    /// One nats-server of three killed under load: the max and p99 followup wait (issue 37 item 8).
    NatsLoss(nats_loss::NatsLossArgs),
    /// Another tenant's followup latency beside a hostile tenant, against quiet rounds (issue 37).
    Hostile(hostile::HostileArgs),
}

#[derive(Debug, Serialize)]
struct Machine {
    nproc: usize,
    cpu_model: String,
    nats_server_version: String,
    nats_url: String,
    turnstile_bin: String,
    nats_started_by_bench: bool,
}

/// The headline figures, each beside its anchor from the same run (issue 11 part 5); null when the phase
/// was skipped.
#[derive(Debug, Default, Serialize)]
struct Summary {
    followup_p50_ms: Option<f64>,
    raw_publish_ack_p50_ms: Option<f64>,
    /// followup_p50_ms / raw_publish_ack_p50_ms.
    followup_to_raw_p50: Option<f64>,
    /// The followup split by hop (latency phase): a followup on a loaded session (no session load) and
    /// its ratio to the raw publish-ack, and a `WhenIdle` of an idle loaded session (no journal IO).
    followup_warm_p50_ms: Option<f64>,
    followup_warm_to_raw_p50: Option<f64>,
    driver_roundtrip_p50_ms: Option<f64>,
    /// A gRPC health check on the same server and channel: the gRPC hop alone.
    grpc_floor_p50_ms: Option<f64>,
    followups_per_s: Option<f64>,
    raw_async_publish_per_s: Option<f64>,
    events_per_s: Option<f64>,
    /// events_per_s / raw_async_publish_per_s.
    events_to_raw_async: Option<f64>,
    /// Bytes per idle loaded session (RSS delta once they are idle, decision 0037).
    idle_session_bytes: Option<f64>,
    /// Bytes per session once they have passivated (RSS delta; freed memory glibc keeps counts too).
    idle_passivated_session_bytes: Option<f64>,
    /// RSS growth per session of as many fresh sessions loaded after the passivation (memory reused).
    idle_second_batch_session_bytes: Option<f64>,
    idle_sessions: Option<usize>,
    /// kill -9 of a session's owner → the next accepted followup, p50 (`failover` phase).
    failover_kill9_p50_ms: Option<f64>,
    /// Watch → caught-up resuming 10 events before the end of a 100,000-event session, p50 (`reads`).
    watch_caught_up_100k_ms: Option<f64>,
    /// Its anchor: the same read on a 1,000-event session, same run.
    watch_caught_up_1k_ms: Option<f64>,
    /// GetInbox on the long session, p50.
    get_inbox_ms: Option<f64>,
    /// Followup sent → each of `fanout_watchers` live watchers' first delta, p50 / p99.
    watch_fanout_delta_p50_ms: Option<f64>,
    watch_fanout_delta_p99_ms: Option<f64>,
    /// The same with one watcher, same run (the anchor).
    watch_fanout_one_watcher_p50_ms: Option<f64>,
    /// max(Steer ack, the running step's end) → the steer's `user/message` at a watcher, p50 / p99
    /// (`steer` phase; see its module for exactly what is timed).
    steer_to_message_p50_ms: Option<f64>,
    steer_to_message_p99_ms: Option<f64>,
    /// A watcher dropped mid-reply reconnects with its seq and offsets → its first resumed delta, p50 /
    /// p99, on `dev` (`resume` phase); its anchor, the same Watch's `caught_up`.
    resume_first_delta_p50_ms: Option<f64>,
    resume_first_delta_p99_ms: Option<f64>,
    resume_caught_up_p50_ms: Option<f64>,
    /// `POST /v1/responses` streamed beside a gRPC Watch of the same turn (`protocols` phase): the first
    /// text delta's p50 through the adapter minus through the Watch (goal ≤ 1 ms), and the ratio of their
    /// deltas/s p50 (goal ≥ 0.95).
    protocols_first_delta_added_p50_ms: Option<f64>,
    protocols_deltas_per_s_ratio: Option<f64>,
    /// The same through the cluster's other gateway (`cluster` phase).
    cluster_resume_first_delta_p50_ms: Option<f64>,
    cluster_resume_first_delta_p99_ms: Option<f64>,
    /// A real model (`model` phase): time to first token p50 and the delta rate p50, through Turnstile and
    /// straight from llama-server, same run; and the ratios (goals: TTFT within 2 ms, rate ≥ 0.95×).
    model_ttft_p50_ms: Option<f64>,
    model_direct_ttft_p50_ms: Option<f64>,
    model_ttft_added_ms: Option<f64>,
    model_deltas_per_s_p50: Option<f64>,
    model_direct_deltas_per_s_p50: Option<f64>,
    model_rate_to_direct: Option<f64>,
    /// Sustained followups/s through both gateways of the cluster (`cluster` phase); its anchor is
    /// `followups_per_s` (one `dev` process on one nats-server).
    cluster_followups_per_s: Option<f64>,
    /// cluster_followups_per_s / followups_per_s.
    cluster_to_single_node_followups: Option<f64>,
    cluster_followup_p50_ms: Option<f64>,
    cluster_followup_p99_ms: Option<f64>,
    /// CPU-seconds per 1,000 accepted followups: `per_process`, `per_role`, `total`, `bench_clients`.
    cluster_cpu_s_per_1k_followups: Option<serde_json::Value>,
    /// Sequential raw publish-ack on an R3 stream of the same nats cluster (its own ceiling per append).
    cluster_raw_publish_ack_p50_ms: Option<f64>,
    /// The anchor of `cluster_cpu_s_per_1k_followups`: the throughput phase's `turnstile dev` and
    /// nats-server, and their total.
    cpu_s_per_1k_followups: Option<std::collections::BTreeMap<String, f64>>,
}

#[derive(Debug, Serialize)]
struct Report {
    #[serde(flatten)]
    summary: Summary,
    /// Each goal of the round beside this run's figure (`goals.rs`).
    goals: Vec<goals::Goal>,
    machine: Machine,
    latency: Option<LatencyReport>,
    throughput: Option<ThroughputReport>,
    raw_async: Option<raw::RawReport>,
    idle: Option<idle::IdleReport>,
    fanout: Option<fanout::FanoutReport>,
    /// Why the fan-out phase failed, when it did.
    fanout_error: Option<String>,
    /// `turnstile-bench reads --json`, run as a child process.
    reads: Option<serde_json::Value>,
    /// `turnstile-bench failover --json`, run as a child process.
    failover: Option<serde_json::Value>,
    steer: Option<steer::SteerReport>,
    resume: Option<resume::ResumeReport>,
    protocols: Option<protocols::ProtocolsReport>,
    /// `turnstile-bench cluster --json`, run as a child process.
    cluster: Option<serde_json::Value>,
    /// `turnstile-bench model --json`, run as a child process.
    model: Option<serde_json::Value>,
    /// Why the model phase did not run, when it was asked for and could not.
    model_skipped: Option<String>,
}

impl Summary {
    /// The figures the round's goals are made of; `failover` and `reads` are the child phases' JSON.
    fn goal_figures(&self, failover: Option<&serde_json::Value>, reads: Option<&serde_json::Value>) -> goals::Figures {
        goals::Figures {
            followup_p50_ms: self.followup_p50_ms,
            grpc_floor_p50_ms: self.grpc_floor_p50_ms,
            raw_publish_ack_p50_ms: self.raw_publish_ack_p50_ms,
            followups_per_s: self.followups_per_s,
            cluster_to_single_node_followups: self.cluster_to_single_node_followups,
            cluster_cpu_s_per_1k: self.cluster_cpu_s_per_1k_followups.as_ref().and_then(|c| c["total"].as_f64()),
            single_node_cpu_s_per_1k: self.cpu_s_per_1k_followups.as_ref().and_then(|c| c.get("total").copied()),
            watch_from_0_100k_ms: reads.and_then(|r| r["watch_caught_up_100k_from_0_ms"].as_f64()),
            fanout_delta_p99_ms: self.watch_fanout_delta_p99_ms,
            steer_to_message_p99_ms: self.steer_to_message_p99_ms,
            failover_kill9_p99_ms: failover.and_then(|f| f["failover_kill9_p99_ms"].as_f64()),
            idle_session_bytes: self.idle_session_bytes,
            model_ttft_added_ms: self.model_ttft_added_ms,
            model_rate_to_direct: self.model_rate_to_direct,
        }
    }

    fn of(phases: &Phases) -> Self {
        let followup_p50_ms = phases.latency.as_ref().map(|l| l.followup.p50_ms);
        let raw_publish_ack_p50_ms = phases.latency.as_ref().map(|l| l.raw.p50_ms);
        let followup_warm_p50_ms = phases.latency.as_ref().map(|l| l.followup_warm.p50_ms);
        let events_per_s = phases.throughput.as_ref().map(|t| t.events_per_s);
        let raw_async_publish_per_s = phases.raw_async.as_ref().map(|r| r.publishes_per_s);
        let followups_per_s = phases.throughput.as_ref().map(|t| t.followups_per_s);
        let cluster_f64 = |key: &str| phases.cluster.as_ref().and_then(|c| c[key].as_f64());
        let cluster_followups_per_s = cluster_f64("cluster_followups_per_s");
        let model_f64 = |path: &str, key: &str| phases.model.as_ref().and_then(|m| m[path][key]["p50"].as_f64());
        Self {
            followup_p50_ms,
            raw_publish_ack_p50_ms,
            followup_to_raw_p50: ratio_of(followup_p50_ms, raw_publish_ack_p50_ms),
            followup_warm_p50_ms,
            followup_warm_to_raw_p50: ratio_of(followup_warm_p50_ms, raw_publish_ack_p50_ms),
            driver_roundtrip_p50_ms: phases.latency.as_ref().map(|l| l.driver_roundtrip.p50_ms),
            grpc_floor_p50_ms: phases.latency.as_ref().map(|l| l.grpc_floor.p50_ms),
            followups_per_s,
            raw_async_publish_per_s,
            events_per_s,
            events_to_raw_async: ratio_of(events_per_s, raw_async_publish_per_s),
            idle_session_bytes: phases.idle.as_ref().map(|i| i.bytes_per_session),
            idle_passivated_session_bytes: phases.idle.as_ref().and_then(|i| i.passivated_bytes_per_session),
            idle_second_batch_session_bytes: phases.idle.as_ref().and_then(|i| i.second_batch_bytes_per_session),
            idle_sessions: phases.idle.as_ref().map(|i| i.sessions),
            failover_kill9_p50_ms: phases.failover.as_ref().and_then(|f| f["failover_kill9_p50_ms"].as_f64()),
            watch_caught_up_100k_ms: phases.reads.as_ref().and_then(|r| r["watch_caught_up_100k_ms"].as_f64()),
            watch_caught_up_1k_ms: phases.reads.as_ref().and_then(|r| r["small"]["watch_10_back"]["p50_ms"].as_f64()),
            get_inbox_ms: phases.reads.as_ref().and_then(|r| r["get_inbox_ms"].as_f64()),
            watch_fanout_delta_p50_ms: phases.fanout.as_ref().map(|f| f.delta.p50_ms),
            watch_fanout_delta_p99_ms: phases.fanout.as_ref().map(|f| f.delta.p99_ms),
            watch_fanout_one_watcher_p50_ms: phases.fanout.as_ref().map(|f| f.delta_one_watcher.p50_ms),
            steer_to_message_p50_ms: phases.steer.as_ref().map(|s| s.steer_to_message.p50_ms),
            steer_to_message_p99_ms: phases.steer.as_ref().map(|s| s.steer_to_message.p99_ms),
            resume_first_delta_p50_ms: phases.resume.as_ref().map(|r| r.first_resumed_delta.p50_ms),
            resume_first_delta_p99_ms: phases.resume.as_ref().map(|r| r.first_resumed_delta.p99_ms),
            resume_caught_up_p50_ms: phases.resume.as_ref().map(|r| r.caught_up.p50_ms),
            protocols_first_delta_added_p50_ms: phases.protocols.as_ref().map(|p| p.first_delta_added_p50_ms),
            protocols_deltas_per_s_ratio: phases.protocols.as_ref().map(|p| p.deltas_per_s_ratio),
            cluster_resume_first_delta_p50_ms: cluster_f64("cluster_resume_first_delta_p50_ms"),
            cluster_resume_first_delta_p99_ms: cluster_f64("cluster_resume_first_delta_p99_ms"),
            model_ttft_p50_ms: model_f64("turnstile", "ttft_ms"),
            model_direct_ttft_p50_ms: model_f64("direct", "ttft_ms"),
            model_ttft_added_ms: model_f64("turnstile", "ttft_ms")
                .zip(model_f64("direct", "ttft_ms"))
                .map(|(through, direct)| through - direct),
            model_deltas_per_s_p50: model_f64("turnstile", "deltas_per_s"),
            model_direct_deltas_per_s_p50: model_f64("direct", "deltas_per_s"),
            model_rate_to_direct: ratio_of(model_f64("turnstile", "deltas_per_s"), model_f64("direct", "deltas_per_s")),
            cluster_followups_per_s,
            cluster_to_single_node_followups: ratio_of(cluster_followups_per_s, followups_per_s),
            cluster_followup_p50_ms: cluster_f64("cluster_followup_p50_ms"),
            cluster_followup_p99_ms: cluster_f64("cluster_followup_p99_ms"),
            cluster_cpu_s_per_1k_followups: phases
                .cluster
                .as_ref()
                .map(|c| c["cluster_cpu_s_per_1k_followups"].clone()),
            cluster_raw_publish_ack_p50_ms: cluster_f64("cluster_raw_publish_ack_p50_ms"),
            cpu_s_per_1k_followups: phases.throughput.as_ref().and_then(|t| t.cpu_s_per_1k_followups.clone()),
        }
    }
}

/// What the phases of the default mode measured.
#[derive(Default)]
struct Phases {
    latency: Option<LatencyReport>,
    throughput: Option<ThroughputReport>,
    raw_async: Option<raw::RawReport>,
    idle: Option<idle::IdleReport>,
    fanout: Option<fanout::FanoutReport>,
    fanout_error: Option<String>,
    reads: Option<serde_json::Value>,
    failover: Option<serde_json::Value>,
    steer: Option<steer::SteerReport>,
    resume: Option<resume::ResumeReport>,
    protocols: Option<protocols::ProtocolsReport>,
    cluster: Option<serde_json::Value>,
    model: Option<serde_json::Value>,
    model_skipped: Option<String>,
}

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
        let child = ["cluster", "--duration", &duration, "--clients", &clients, "--sessions", &sessions];
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

async fn measure(
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
                clients: args.clients,
                settle: Duration::from_millis(args.idle_settle_ms),
                passivate_after: (args.passivate_after_ms > 0).then(|| Duration::from_millis(args.passivate_after_ms)),
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

/// Runs `turnstile-bench <mode> … --json` (this executable) with `TURNSTILE_BIN` = `bin`, so the phase's
/// own servers (the failover cluster's harness included) run the binary under test; its JSON object.
async fn child_phase(bin: &std::path::Path, mode_args: &[&str]) -> Result<serde_json::Value> {
    let me = std::env::current_exe().context("locating turnstile-bench")?;
    let mut command = std::process::Command::new(&me);
    command.args(mode_args).arg("--json").env("TURNSTILE_BIN", bin).stderr(std::process::Stdio::inherit());
    if std::env::var_os("RUST_LOG").is_none() {
        // The harness's processes log at info unless told: a measured cluster must not measure its logger.
        command.env("RUST_LOG", "warn");
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await?
        .with_context(|| format!("running {} {}", me.display(), mode_args.join(" ")))?;
    if !output.status.success() {
        anyhow::bail!("`turnstile-bench {}` failed ({})", mode_args.join(" "), output.status);
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("the JSON of `turnstile-bench {}`", mode_args[0]))
}

/// `a / b`, when both were measured and `b` is positive.
fn ratio_of(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b.filter(|b| *b > 0.0)?)
}

fn markdown(report: &Report, args: &Args) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(out, "### Machine\n");
    let _ = writeln!(
        out,
        "{} cores ({}), nats-server {} ({}), `turnstile dev --nats` ({})\n",
        m.nproc,
        m.cpu_model,
        m.nats_server_version,
        if m.nats_started_by_bench { "started by the bench, file storage" } else { "given with --nats" },
        m.turnstile_bin
    );
    if let Some(l) = &report.latency {
        let _ = writeln!(
            out,
            "### Idle followup via gateway vs raw JetStream append ({} rounds, {} warm-up, interleaved)\n",
            l.iterations, l.warmup
        );
        let _ =
            writeln!(out, "| percentile | followup (gRPC, idle) | raw publish+ack ({} B) | ratio |", l.raw_body_bytes);
        let _ = writeln!(out, "|---|---:|---:|---:|");
        for (name, a, b, r) in [
            ("p50", l.followup.p50_ms, l.raw.p50_ms, l.ratio_p50),
            ("p90", l.followup.p90_ms, l.raw.p90_ms, l.ratio_p90),
            ("p99", l.followup.p99_ms, l.raw.p99_ms, l.ratio_p99),
        ] {
            let _ = writeln!(out, "| {name} | {a:.3} ms | {b:.3} ms | {r:.2}× |");
        }
        let _ = writeln!(
            out,
            "| mean / max | {:.3} / {:.3} ms | {:.3} / {:.3} ms | |\n",
            l.followup.mean_ms, l.followup.max_ms, l.raw.mean_ms, l.raw.max_ms
        );
    }
    if let Some(t) = &report.throughput {
        let bound = args.count.map_or_else(String::new, |c| format!(", at most {c} followups"));
        let _ = writeln!(
            out,
            "### Sustained followups ({} clients, round-robin over {} sessions, {:.1} s{bound})\n",
            t.clients, t.sessions, t.elapsed_s
        );
        let _ = writeln!(out, "| accepted | errors | followups/s | opened a turn | p50 | p99 | drain to idle |");
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {:.3} ms | {:.3} ms | {:.2} s |",
            t.accepted, t.errors, t.followups_per_s, t.opened_turn, t.latency.p50_ms, t.latency.p99_ms, t.drain_s
        );
        for (kind, n) in &t.error_kinds {
            let _ = writeln!(out, "\nerror ×{n}: {kind}");
        }
        if t.drain_errors > 0 {
            let _ = writeln!(out, "\n{} sessions did not become idle within the drain timeout", t.drain_errors);
        }
        let _ = writeln!(out, "\n{} durable events, {:.0} events/s (load and drain)\n", t.events, t.events_per_s);
    }
    if let Some(r) = &report.raw_async {
        let _ = writeln!(
            out,
            "### Raw JetStream async publish (the ceiling: {} messages of {} B, {} acks in flight)\n\n\
             {:.0} publishes/s ({:.2} s)\n",
            r.count, r.body_bytes, r.window, r.publishes_per_s, r.elapsed_s
        );
    }
    if let Some(i) = &report.idle {
        let _ = writeln!(
            out,
            "### Idle loaded sessions ({} with one queued message each)\n\n\
             RSS {} → {} bytes after {} ms idle: {:.0} bytes per session ({:.1} s to load)\n",
            i.sessions, i.rss_before_bytes, i.rss_after_bytes, i.settle_ms, i.bytes_per_session, i.elapsed_s
        );
        if let (Some(rss), Some(per)) = (i.rss_passivated_bytes, i.passivated_bytes_per_session) {
            let _ = writeln!(out, "After passivation: RSS {rss} bytes, {per:.0} bytes per session\n");
        }
        if let (Some(rss), Some(per)) = (i.rss_second_batch_bytes, i.second_batch_bytes_per_session) {
            let _ =
                writeln!(out, "As many fresh sessions again, idle: RSS {rss} bytes, {per:.0} bytes per session more\n");
        }
    }
    if let Some(r) = &report.resume {
        let _ = writeln!(
            out,
            "### A watcher dropped mid-reply resumes with its offsets ({} rounds, a {} ms reply, {})\n",
            r.rounds,
            r.delay_ms,
            if r.across_gateways { "through the other gateway" } else { "through the same gateway" }
        );
        let _ = writeln!(out, "| measured | p50 | p90 | p99 | max |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, p) in
            [("new Watch → first resumed delta", &r.first_resumed_delta), ("new Watch → caught_up", &r.caught_up)]
        {
            let _ = writeln!(
                out,
                "| {name} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
            );
        }
        let _ = writeln!(out);
    }
    if let Some(p) = &report.protocols {
        let _ = writeln!(
            out,
            "### `POST /v1/responses` (stream) beside a gRPC Watch of the same turn ({} rounds, a {} ms reply)\n",
            p.rounds, p.delay_ms
        );
        let _ = writeln!(out, "| measured (from the request sent) | p50 | p90 | p99 | max |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, q) in [
            ("first SSE byte", &p.sse_first_byte),
            ("first SSE text delta", &p.sse_first_delta),
            ("first Watch text delta", &p.watch_first_delta),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                q.p50_ms, q.p90_ms, q.p99_ms, q.max_ms
            );
        }
        let _ = writeln!(
            out,
            "\nFirst delta added by the adapter (p50): {:.3} ms; deltas/s p50: SSE {:.1}, Watch {:.1} ({:.3}×)\n",
            p.first_delta_added_p50_ms, p.sse_deltas_per_s_p50, p.watch_deltas_per_s_p50, p.deltas_per_s_ratio
        );
    }
    if let Some(st) = &report.steer {
        let _ = writeln!(
            out,
            "### Steer into a running turn → its user/message at the next step ({} rounds, tool sleep {} ms, \
             0 ms model)\n",
            st.rounds, st.sleep_ms
        );
        let _ = writeln!(out, "| measured | p50 | p90 | p99 | max |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, p) in [
            ("max(ack, step's tool/result at the watcher) → user/message", &st.steer_to_message),
            ("steer ack → user/message (includes the rest of the sleep)", &st.ack_to_message),
            ("the Steer call (sent → ack)", &st.steer_call),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
            );
        }
        let _ = writeln!(
            out,
            "\n{} of {} steers landed in the running step; between the tool/result and the user/message the \
             watcher got: {}\n",
            st.landed_in_running_step,
            st.rounds,
            st.boundary_events.join(", ")
        );
    }
    if let Some(c) = &report.cluster {
        let _ = writeln!(
            out,
            "### Cluster (3 nats-servers R3, 3 workers, 2 gateways)\n\n{:.0} followups/s, p50 {:.3} ms, p99 \
             {:.3} ms, errors {}; CPU s per 1,000 followups: {}\n",
            c["cluster_followups_per_s"].as_f64().unwrap_or_default(),
            c["cluster_followup_p50_ms"].as_f64().unwrap_or_default(),
            c["cluster_followup_p99_ms"].as_f64().unwrap_or_default(),
            c["throughput"]["errors"],
            c["cluster_cpu_s_per_1k_followups"]
        );
    }
    let sum = &report.summary;
    let _ = writeln!(out, "### Summary (each figure beside its anchor, same run)\n");
    let _ = writeln!(out, "| figure | value | anchor | ratio |");
    let _ = writeln!(out, "|---|---:|---:|---:|");
    let f = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.3}"));
    let _ = writeln!(
        out,
        "| idle followup p50 ms vs raw publish-ack p50 ms | {} | {} | {}× |",
        f(sum.followup_p50_ms),
        f(sum.raw_publish_ack_p50_ms),
        f(sum.followup_to_raw_p50)
    );
    let _ = writeln!(
        out,
        "| followup on a loaded session p50 ms vs raw publish-ack p50 ms | {} | {} | {}× |",
        f(sum.followup_warm_p50_ms),
        f(sum.raw_publish_ack_p50_ms),
        f(sum.followup_warm_to_raw_p50)
    );
    let _ = writeln!(
        out,
        "| WhenIdle of an idle loaded session p50 ms (gateway + driver, no journal IO) | {} | | |",
        f(sum.driver_roundtrip_p50_ms)
    );
    let _ = writeln!(
        out,
        "| gRPC health check p50 ms (the gRPC hop alone, same server and channel) | {} | | |",
        f(sum.grpc_floor_p50_ms)
    );
    let _ = writeln!(
        out,
        "| events/s vs raw async publish/s | {} | {} | {} |",
        f(sum.events_per_s),
        f(sum.raw_async_publish_per_s),
        f(sum.events_to_raw_async)
    );
    let _ = writeln!(out, "| followups/s | {} | | |", f(sum.followups_per_s));
    let _ = writeln!(out, "| bytes per idle loaded session | {} | | |", f(sum.idle_session_bytes));
    let _ = writeln!(out, "| bytes per passivated session | {} | | |", f(sum.idle_passivated_session_bytes));
    let _ = writeln!(
        out,
        "| Watch → caught-up p50 ms, 100k events vs 1k events | {} | {} | {}× |",
        f(sum.watch_caught_up_100k_ms),
        f(sum.watch_caught_up_1k_ms),
        f(ratio_of(sum.watch_caught_up_100k_ms, sum.watch_caught_up_1k_ms))
    );
    let _ = writeln!(out, "| GetInbox p50 ms (100k events) | {} | | |", f(sum.get_inbox_ms));
    let _ = writeln!(
        out,
        "| Watch fan-out: followup → first delta p50 ms, all watchers vs one | {} (p99 {}) | {} | {}× |",
        f(sum.watch_fanout_delta_p50_ms),
        f(sum.watch_fanout_delta_p99_ms),
        f(sum.watch_fanout_one_watcher_p50_ms),
        f(ratio_of(sum.watch_fanout_delta_p50_ms, sum.watch_fanout_one_watcher_p50_ms))
    );
    let _ = writeln!(out, "| kill -9 → next accepted followup p50 ms | {} | | |", f(sum.failover_kill9_p50_ms));
    let _ = writeln!(
        out,
        "| steer: max(ack, step end) → its user/message p50 ms | {} (p99 {}) | | |",
        f(sum.steer_to_message_p50_ms),
        f(sum.steer_to_message_p99_ms)
    );
    let _ = writeln!(
        out,
        "| real model (llama.cpp, SmolLM2): TTFT p50 ms through Turnstile vs straight | {} | {} | +{} ms |",
        f(sum.model_ttft_p50_ms),
        f(sum.model_direct_ttft_p50_ms),
        f(sum.model_ttft_added_ms)
    );
    let _ = writeln!(
        out,
        "| real model: deltas/s p50 through Turnstile vs straight | {} | {} | {}× |",
        f(sum.model_deltas_per_s_p50),
        f(sum.model_direct_deltas_per_s_p50),
        f(sum.model_rate_to_direct)
    );
    let _ = writeln!(
        out,
        "| resume: watcher dropped mid-reply → first resumed delta p50 ms, dev / cluster (other gateway) | {} (p99 \
         {}) / {} (p99 {}) | caught-up {} | |",
        f(sum.resume_first_delta_p50_ms),
        f(sum.resume_first_delta_p99_ms),
        f(sum.cluster_resume_first_delta_p50_ms),
        f(sum.cluster_resume_first_delta_p99_ms),
        f(sum.resume_caught_up_p50_ms)
    );
    let _ = writeln!(
        out,
        "| cluster followups/s (3 workers, 2 gateways, R3) vs single node | {} | {} | {} |",
        f(sum.cluster_followups_per_s),
        f(sum.followups_per_s),
        f(sum.cluster_to_single_node_followups)
    );
    let _ = writeln!(
        out,
        "| cluster followup p50 ms (under load) vs raw R3 publish-ack p50 ms | {} | {} | {}× |",
        f(sum.cluster_followup_p50_ms),
        f(sum.cluster_raw_publish_ack_p50_ms),
        f(ratio_of(sum.cluster_followup_p50_ms, sum.cluster_raw_publish_ack_p50_ms))
    );
    if let Some(cpu) = &sum.cluster_cpu_s_per_1k_followups {
        let single = sum.cpu_s_per_1k_followups.as_ref().and_then(|c| c.get("total").copied());
        let _ = writeln!(
            out,
            "| cluster CPU s per 1,000 followups, all processes vs single node (dev + nats-server) | {} {} | {} | {} |",
            f(cpu["total"].as_f64()),
            cpu["per_role"],
            f(single),
            f(ratio_of(cpu["total"].as_f64(), single))
        );
    }
    out.push_str(&goals::markdown(&report.goals));
    out
}
