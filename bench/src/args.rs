//! The command line: the default mode's options and the modes (`Args`, `Mode`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::{cluster, failover, hooks, hostile, memory, model, nats_loss, reads, search, sync, tools};

#[derive(Parser, Debug)]
#[command(name = "turnstile-bench", about = "Benchmarks Turnstile's followup path against raw JetStream")]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) mode: Option<Mode>,
    /// Use this nats-server (loopback only) instead of starting one with the harness.
    #[arg(long)]
    pub(crate) nats: Option<String>,
    /// The `turnstile` binary to run as `turnstile dev --nats URL` (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    pub(crate) turnstile_bin: Option<PathBuf>,
    /// Extra arguments for `turnstile dev` (repeatable).
    #[arg(long = "dev-arg", allow_hyphen_values = true)]
    pub(crate) dev_args: Vec<String>,
    /// Measured rounds of the latency comparison (one followup and one raw append each).
    #[arg(long, default_value_t = 2000)]
    pub(crate) iterations: usize,
    /// Rounds run first and dropped.
    #[arg(long, default_value_t = 200)]
    pub(crate) warmup: usize,
    /// Concurrent clients of the throughput phase.
    #[arg(long, default_value_t = 32)]
    pub(crate) clients: usize,
    /// Sessions the throughput phase cycles through.
    #[arg(long, default_value_t = 1000)]
    pub(crate) sessions: usize,
    /// Length of the throughput phase, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) duration: f64,
    /// Stop the throughput phase after this many followups (even before --duration).
    #[arg(long)]
    pub(crate) count: Option<usize>,
    /// The followup text (the scripted model answers `echo: <text>` at once).
    #[arg(long, default_value = "hello")]
    pub(crate) text: String,
    /// Skip the latency comparison.
    #[arg(long)]
    pub(crate) skip_latency: bool,
    /// Skip the throughput phase.
    #[arg(long)]
    pub(crate) skip_throughput: bool,
    /// Messages of the raw async publish phase (the ceiling: many acks in flight).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) raw_count: usize,
    /// Acks in flight at most in the raw async publish phase.
    #[arg(long, default_value_t = 256)]
    pub(crate) raw_window: usize,
    /// Body bytes of each raw async publish (about an idle followup's first append group).
    #[arg(long, default_value_t = 400)]
    pub(crate) raw_body_bytes: usize,
    /// Skip the raw async publish phase.
    #[arg(long)]
    pub(crate) skip_raw: bool,
    /// Fresh sessions given one queued message each, for the memory per idle loaded session (issue 44's
    /// "one million" is `--idle-sessions 1000000` with a `--passivate-after-ms` longer than their creation).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) idle_sessions: usize,
    /// Concurrent clients creating the idle sessions (one connection each).
    #[arg(long, default_value_t = 32)]
    pub(crate) idle_clients: usize,
    /// Followups timed, one at a time, to random idle sessions while they are parked, and as many to
    /// others once they have passivated (loaded from their log); 0 skips both.
    #[arg(long, default_value_t = 300)]
    pub(crate) idle_followups: usize,
    /// Skip the idle phase's second batch of as many fresh sessions after the passivation (the memory
    /// reuse reading).
    #[arg(long)]
    pub(crate) idle_skip_second_batch: bool,
    /// How long the idle sessions are left alone before the "after" RSS (past the worker's 1 s
    /// `park_after`, decision 0037).
    #[arg(long, default_value_t = 3_000)]
    pub(crate) idle_settle_ms: u64,
    /// `[journal] passivate_after_ms` of `turnstile dev` (a config file the bench writes; 0 leaves the
    /// default 300 s and skips the passivated reading of the idle phase).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) passivate_after_ms: u64,
    /// Events of the long session of the reads phase (`turnstile-bench reads --events`, on its own
    /// nats-server and `turnstile dev`); 0 skips the phase.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) reads_events: u64,
    /// Timed rounds of each read of the reads phase.
    #[arg(long, default_value_t = 20)]
    pub(crate) reads_rounds: usize,
    /// kill -9 rounds of the failover phase (`turnstile-bench failover`, a cluster of 3 worker processes
    /// of the same binary); 0 skips the phase.
    #[arg(long, default_value_t = 5)]
    pub(crate) failover_kills: usize,
    /// Live Watch streams of one session in the fan-out phase; 0 skips it. They share the gateway's one
    /// feed of the session (one JetStream consumer, decision 0039); before that each held its own and
    /// 1,000 reached the server's consumer limit (10026; see docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 1000)]
    pub(crate) fanout_watchers: usize,
    /// Followups (turns streaming a reply) of the fan-out phase, with one watcher and with all of them.
    #[arg(long, default_value_t = 20)]
    pub(crate) fanout_rounds: usize,
    /// Skip the idle-sessions phase.
    #[arg(long)]
    pub(crate) skip_idle: bool,
    /// Rounds of the steer phase (a steer into a running turn → its user/message at the next step); 0
    /// skips it.
    #[arg(long, default_value_t = 200)]
    pub(crate) steer_rounds: usize,
    /// Rounds of the resume phase (a watcher dropped mid-reply reconnects with its offsets → its first
    /// resumed delta; SPEC §14); 0 skips it. The cluster phase runs it across its two gateways too.
    #[arg(long, default_value_t = 100)]
    pub(crate) resume_rounds: usize,
    /// Rounds of the protocols phase (`POST /v1/responses` streamed against a gRPC Watch of the same turn:
    /// time to first SSE byte and delta, deltas/s; issue 39); 0 skips it.
    #[arg(long, default_value_t = 50)]
    pub(crate) protocols_rounds: usize,
    /// Seconds of load of the cluster phase (`turnstile-bench cluster`: 3 nats-servers with R3 streams,
    /// 3 workers and 2 gateways of `TURNSTILE_BIN`, `--clients` over `--sessions`); 0 skips the phase.
    #[arg(long, default_value_t = 15.0)]
    pub(crate) cluster_duration: f64,
    /// Skip the cluster phase's second run of the same load at R1 (the replication cost apart,
    /// `turnstile-bench cluster --skip-r1`).
    #[arg(long)]
    pub(crate) cluster_skip_r1: bool,
    /// Measured rounds of the model phase (`turnstile-bench model`: llama-server on SmolLM2 straight and
    /// through `turnstile dev --config`, interleaved); 0 skips it, and so does a machine without
    /// `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (scripts/setup-test-deps installs both; the report says so).
    #[arg(long, default_value_t = 10)]
    pub(crate) model_runs: usize,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Mode {
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
    /// `PutMemory`, `GetMemory` and `SearchMemory` p50/p99 over 100,000 documents of one tenant on
    /// `dev --nats` (SPEC §20).
    Memory(memory::MemoryArgs),
    /// What nats-server's `sync_interval: always` (an fsync before every acknowledgement) costs against
    /// its default (every 2 minutes): followup latency and followups/s, alternating rounds; on one node, or
    /// at R3 with `--cluster`.
    Sync(sync::SyncArgs),
    /// One nats-server of three killed under load: the max and p99 followup wait (issue 37 item 8).
    NatsLoss(nats_loss::NatsLossArgs),
    /// Another tenant's followup latency beside a hostile tenant, against quiet rounds (issue 37).
    Hostile(hostile::HostileArgs),
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{Args, Mode};

    #[test]
    fn the_million_run_parses() {
        let args = Args::try_parse_from([
            "turnstile-bench",
            "--idle-sessions",
            "1000000",
            "--idle-clients",
            "128",
            "--idle-followups",
            "500",
            "--idle-skip-second-batch",
            "--passivate-after-ms",
            "600000",
            "--cluster-skip-r1",
        ])
        .unwrap();
        assert_eq!((args.idle_sessions, args.idle_clients, args.idle_followups), (1_000_000, 128, 500));
        assert!(args.idle_skip_second_batch && args.cluster_skip_r1);
        assert_eq!(args.passivate_after_ms, 600_000);
        let defaults = Args::try_parse_from(["turnstile-bench"]).unwrap();
        assert_eq!((defaults.idle_clients, defaults.idle_followups), (32, 300));
        assert!(!defaults.idle_skip_second_batch && !defaults.cluster_skip_r1);
    }

    #[test]
    fn the_r3_modes_parse() {
        let args = Args::try_parse_from(["turnstile-bench", "sync", "--cluster", "--rounds", "3"]).unwrap();
        assert!(matches!(args.mode, Some(Mode::Sync(s)) if s.cluster && s.rounds == 3));
        let args =
            Args::try_parse_from(["turnstile-bench", "cluster", "--sync-always", "--replicas", "1", "--skip-r1"])
                .unwrap();
        assert!(matches!(args.mode, Some(Mode::Cluster(c)) if c.sync_always && c.replicas == Some(1) && c.skip_r1));
        assert!(Args::try_parse_from(["turnstile-bench", "--idle-clients", "many"]).is_err());
    }
}
