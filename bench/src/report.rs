//! The default mode's report: the machine, the headline figures beside their anchors (`Summary`), every
//! phase's report (`Report`) and its Markdown.

use serde::Serialize;

use crate::args::Args;
use crate::latency::LatencyReport;
use crate::phases::Phases;
use crate::stats::ratio_of;
use crate::throughput::ThroughputReport;
use crate::{fanout, goals, idle, protocols, raw, resume, steer};

#[derive(Debug, Serialize)]
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu_model: String,
    pub(crate) nats_server_version: String,
    pub(crate) nats_url: String,
    pub(crate) turnstile_bin: String,
    pub(crate) nats_started_by_bench: bool,
}

/// The headline figures, each beside its anchor from the same run (issue 11 part 5); null when the phase
/// was skipped.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Summary {
    pub(crate) followup_p50_ms: Option<f64>,
    pub(crate) raw_publish_ack_p50_ms: Option<f64>,
    /// followup_p50_ms / raw_publish_ack_p50_ms.
    pub(crate) followup_to_raw_p50: Option<f64>,
    /// The followup split by hop (latency phase): a followup on a loaded session (no session load) and
    /// its ratio to the raw publish-ack, and a `WhenIdle` of an idle loaded session (no journal IO).
    pub(crate) followup_warm_p50_ms: Option<f64>,
    pub(crate) followup_warm_to_raw_p50: Option<f64>,
    pub(crate) driver_roundtrip_p50_ms: Option<f64>,
    /// A gRPC health check on the same server and channel: the gRPC hop alone.
    pub(crate) grpc_floor_p50_ms: Option<f64>,
    pub(crate) followups_per_s: Option<f64>,
    pub(crate) raw_async_publish_per_s: Option<f64>,
    pub(crate) events_per_s: Option<f64>,
    /// events_per_s / raw_async_publish_per_s.
    pub(crate) events_to_raw_async: Option<f64>,
    /// Bytes per idle loaded session (RSS delta once they are idle, decision 0037).
    pub(crate) idle_session_bytes: Option<f64>,
    /// Bytes per session once they have passivated (RSS delta; freed memory glibc keeps counts too).
    pub(crate) idle_passivated_session_bytes: Option<f64>,
    /// RSS growth per session of as many fresh sessions loaded after the passivation (memory reused).
    pub(crate) idle_second_batch_session_bytes: Option<f64>,
    pub(crate) idle_sessions: Option<usize>,
    /// A followup to a random idle session, timed to its acknowledgement, while parked (fold in memory) and
    /// once passivated (loaded from its log), p50 / p99 (issue 44's "one million").
    pub(crate) idle_parked_followup_p50_ms: Option<f64>,
    pub(crate) idle_parked_followup_p99_ms: Option<f64>,
    pub(crate) idle_passivated_followup_p50_ms: Option<f64>,
    pub(crate) idle_passivated_followup_p99_ms: Option<f64>,
    /// kill -9 of a session's owner → the next accepted followup, p50 (`failover` phase).
    pub(crate) failover_kill9_p50_ms: Option<f64>,
    /// Watch → caught-up resuming 10 events before the end of a 100,000-event session, p50 (`reads`).
    pub(crate) watch_caught_up_100k_ms: Option<f64>,
    /// Its anchor: the same read on a 1,000-event session, same run.
    pub(crate) watch_caught_up_1k_ms: Option<f64>,
    /// GetInbox on the long session, p50.
    pub(crate) get_inbox_ms: Option<f64>,
    /// Followup sent → each of `fanout_watchers` live watchers' first delta, p50 / p99.
    pub(crate) watch_fanout_delta_p50_ms: Option<f64>,
    pub(crate) watch_fanout_delta_p99_ms: Option<f64>,
    /// The same with one watcher, same run (the anchor).
    pub(crate) watch_fanout_one_watcher_p50_ms: Option<f64>,
    /// max(Steer ack, the running step's end) → the steer's `user/message` at a watcher, p50 / p99
    /// (`steer` phase; see its module for exactly what is timed).
    pub(crate) steer_to_message_p50_ms: Option<f64>,
    pub(crate) steer_to_message_p99_ms: Option<f64>,
    /// A watcher dropped mid-reply reconnects with its seq and offsets → its first resumed delta, p50 /
    /// p99, on `dev` (`resume` phase); its anchor, the same Watch's `caught_up`.
    pub(crate) resume_first_delta_p50_ms: Option<f64>,
    pub(crate) resume_first_delta_p99_ms: Option<f64>,
    pub(crate) resume_caught_up_p50_ms: Option<f64>,
    /// `POST /v1/responses` streamed beside a gRPC Watch of the same turn (`protocols` phase): the first
    /// text delta's p50 through the adapter minus through the Watch (goal ≤ 1 ms), and the ratio of their
    /// deltas/s p50 (goal ≥ 0.95).
    pub(crate) protocols_first_delta_added_p50_ms: Option<f64>,
    pub(crate) protocols_deltas_per_s_ratio: Option<f64>,
    /// The same through the cluster's other gateway (`cluster` phase).
    pub(crate) cluster_resume_first_delta_p50_ms: Option<f64>,
    pub(crate) cluster_resume_first_delta_p99_ms: Option<f64>,
    /// A real model (`model` phase): time to first token p50 and the delta rate p50, through Turnstile and
    /// straight from llama-server, same run; and the ratios (goals: TTFT within 2 ms, rate ≥ 0.95×).
    pub(crate) model_ttft_p50_ms: Option<f64>,
    pub(crate) model_direct_ttft_p50_ms: Option<f64>,
    pub(crate) model_ttft_added_ms: Option<f64>,
    pub(crate) model_deltas_per_s_p50: Option<f64>,
    pub(crate) model_direct_deltas_per_s_p50: Option<f64>,
    pub(crate) model_rate_to_direct: Option<f64>,
    /// Sustained followups/s through both gateways of the cluster (`cluster` phase); its anchor is
    /// `followups_per_s` (one `dev` process on one nats-server).
    pub(crate) cluster_followups_per_s: Option<f64>,
    /// cluster_followups_per_s / followups_per_s.
    pub(crate) cluster_to_single_node_followups: Option<f64>,
    pub(crate) cluster_followup_p50_ms: Option<f64>,
    pub(crate) cluster_followup_p99_ms: Option<f64>,
    /// CPU-seconds per 1,000 accepted followups: `per_process`, `per_role`, `total`, `bench_clients`.
    pub(crate) cluster_cpu_s_per_1k_followups: Option<serde_json::Value>,
    /// Sequential raw publish-ack on an R3 stream of the same nats cluster (its own ceiling per append).
    pub(crate) cluster_raw_publish_ack_p50_ms: Option<f64>,
    /// The nats-servers' CPU-s per 1,000 followups at R3 − the same load at R1 (`cluster.replication`,
    /// decision 0189), and the cluster's total less it.
    pub(crate) cluster_replication_cpu_s_per_1k_followups: Option<f64>,
    pub(crate) cluster_cpu_s_per_1k_without_replication: Option<f64>,
    /// The anchor of `cluster_cpu_s_per_1k_followups`: the throughput phase's `turnstile dev` and
    /// nats-server, and their total.
    pub(crate) cpu_s_per_1k_followups: Option<std::collections::BTreeMap<String, f64>>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    #[serde(flatten)]
    pub(crate) summary: Summary,
    /// Each goal of the round beside this run's figure (`goals.rs`).
    pub(crate) goals: Vec<goals::Goal>,
    pub(crate) machine: Machine,
    pub(crate) latency: Option<LatencyReport>,
    pub(crate) throughput: Option<ThroughputReport>,
    pub(crate) raw_async: Option<raw::RawReport>,
    pub(crate) idle: Option<idle::IdleReport>,
    pub(crate) fanout: Option<fanout::FanoutReport>,
    /// Why the fan-out phase failed, when it did.
    pub(crate) fanout_error: Option<String>,
    /// `turnstile-bench reads --json`, run as a child process.
    pub(crate) reads: Option<serde_json::Value>,
    /// `turnstile-bench failover --json`, run as a child process.
    pub(crate) failover: Option<serde_json::Value>,
    pub(crate) steer: Option<steer::SteerReport>,
    pub(crate) resume: Option<resume::ResumeReport>,
    pub(crate) protocols: Option<protocols::ProtocolsReport>,
    /// `turnstile-bench cluster --json`, run as a child process.
    pub(crate) cluster: Option<serde_json::Value>,
    /// `turnstile-bench model --json`, run as a child process.
    pub(crate) model: Option<serde_json::Value>,
    /// Why the model phase did not run, when it was asked for and could not.
    pub(crate) model_skipped: Option<String>,
}

impl Summary {
    /// The figures the round's goals are made of; `failover` and `reads` are the child phases' JSON.
    pub(crate) fn goal_figures(
        &self,
        failover: Option<&serde_json::Value>,
        reads: Option<&serde_json::Value>,
    ) -> goals::Figures {
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
            idle_sessions: self.idle_sessions,
            passivated_followup_p99_ms: self.idle_passivated_followup_p99_ms,
            model_ttft_added_ms: self.model_ttft_added_ms,
            model_rate_to_direct: self.model_rate_to_direct,
        }
    }

    pub(crate) fn of(phases: &Phases) -> Self {
        let followup_p50_ms = phases.latency.as_ref().map(|l| l.followup.p50_ms);
        let raw_publish_ack_p50_ms = phases.latency.as_ref().map(|l| l.raw.p50_ms);
        let followup_warm_p50_ms = phases.latency.as_ref().map(|l| l.followup_warm.p50_ms);
        let events_per_s = phases.throughput.as_ref().map(|t| t.events_per_s);
        let raw_async_publish_per_s = phases.raw_async.as_ref().map(|r| r.publishes_per_s);
        let followups_per_s = phases.throughput.as_ref().map(|t| t.followups_per_s);
        let cluster_f64 = |key: &str| phases.cluster.as_ref().and_then(|c| c[key].as_f64());
        let cluster_followups_per_s = cluster_f64("cluster_followups_per_s");
        let idle_followup = |f: fn(&idle::IdleReport) -> Option<f64>| phases.idle.as_ref().and_then(f);
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
            idle_parked_followup_p50_ms: idle_followup(|i| i.parked_followup.map(|p| p.p50_ms)),
            idle_parked_followup_p99_ms: idle_followup(|i| i.parked_followup.map(|p| p.p99_ms)),
            idle_passivated_followup_p50_ms: idle_followup(|i| i.passivated_followup.map(|p| p.p50_ms)),
            idle_passivated_followup_p99_ms: idle_followup(|i| i.passivated_followup.map(|p| p.p99_ms)),
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
            cluster_replication_cpu_s_per_1k_followups: phases
                .cluster
                .as_ref()
                .and_then(|c| c["replication"]["replication_cpu_s_per_1k_followups"].as_f64()),
            cluster_cpu_s_per_1k_without_replication: phases
                .cluster
                .as_ref()
                .and_then(|c| c["replication"]["cluster_cpu_s_per_1k_without_replication"].as_f64()),
            cpu_s_per_1k_followups: phases.throughput.as_ref().and_then(|t| t.cpu_s_per_1k_followups.clone()),
        }
    }
}

pub(crate) fn markdown(report: &Report, args: &Args) -> String {
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
        let gauge = |v: Option<f64>| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.0}"));
        let _ = writeln!(
            out,
            "Created at {:.0} sessions/s by {} clients; `turnstile_sessions_loaded` before / after / passivated: \
             {} / {} / {}\n",
            i.sessions_per_s,
            i.clients,
            gauge(i.loaded_before),
            gauge(i.loaded_after),
            gauge(i.loaded_passivated)
        );
        for (name, p) in [("parked", &i.parked_followup), ("passivated", &i.passivated_followup)] {
            if let Some(p) = p {
                let _ = writeln!(
                    out,
                    "Followup to a random {name} session ({} of them, one at a time): p50 {:.3} ms, p90 {:.3} ms, \
                     p99 {:.3} ms, max {:.3} ms\n",
                    p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
                );
            }
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
        "| followup to a random passivated idle session p50 ms vs a parked one | {} (p99 {}) | {} (p99 {}) | |",
        f(sum.idle_passivated_followup_p50_ms),
        f(sum.idle_passivated_followup_p99_ms),
        f(sum.idle_parked_followup_p50_ms),
        f(sum.idle_parked_followup_p99_ms)
    );
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
        let _ = writeln!(
            out,
            "| … of which replication (nats-servers R3 − R1), and the cluster without it vs single node | {} | {} | {} |",
            f(sum.cluster_replication_cpu_s_per_1k_followups),
            f(sum.cluster_cpu_s_per_1k_without_replication),
            f(ratio_of(sum.cluster_cpu_s_per_1k_without_replication, single))
        );
    }
    out.push_str(&goals::markdown(&report.goals));
    out
}
