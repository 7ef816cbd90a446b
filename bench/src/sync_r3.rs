//! `turnstile-bench sync --cluster`: `sync_interval: always` against nats-server's default at R3 (issue 44
//! item 6). Each round is the cluster phase (`turnstile-bench cluster`, a child process: 3 nats-servers
//! with R3 streams, 3 workers, 2 gateways) on a fresh cluster, with the same flags but for
//! `--sync-always`; the settings alternate round by round, and the report gives the median of each figure
//! over a setting's rounds and the ratios always / default.

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::child::child_phase;
use crate::stats::median;

/// One cluster round's figures, from `turnstile-bench cluster --json`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClusterRound {
    pub followups_per_s: f64,
    pub followup_p50_ms: f64,
    pub followup_p99_ms: f64,
    /// Sequential raw R3 publish-acks on a scratch stream of the same nats-servers, before the load.
    pub raw_publish_ack_p50_ms: f64,
    pub raw_publish_ack_p99_ms: f64,
    pub nats_cpu_s_per_1k_followups: f64,
    pub cpu_s_per_1k_followups: f64,
    pub errors: u64,
}

impl ClusterRound {
    /// The figures of one `turnstile-bench cluster --json` object; an error names a missing key.
    pub fn of(report: &serde_json::Value) -> Result<Self> {
        let at = |pointer: &str| {
            report.pointer(pointer).and_then(serde_json::Value::as_f64).with_context(|| format!("no {pointer}"))
        };
        let count = |pointer: &str| report.pointer(pointer).and_then(serde_json::Value::as_u64).unwrap_or(0);
        Ok(Self {
            followups_per_s: at("/cluster_followups_per_s")?,
            followup_p50_ms: at("/cluster_followup_p50_ms")?,
            followup_p99_ms: at("/cluster_followup_p99_ms")?,
            raw_publish_ack_p50_ms: at("/cluster_raw_publish_ack/p50_ms")?,
            raw_publish_ack_p99_ms: at("/cluster_raw_publish_ack/p99_ms")?,
            nats_cpu_s_per_1k_followups: at("/cluster_cpu_s_per_1k_followups/per_role/nats-server")?,
            cpu_s_per_1k_followups: at("/cluster_cpu_s_per_1k_followups/total")?,
            errors: count("/throughput/errors") + count("/throughput/drain_errors"),
        })
    }
}

/// One setting's medians over its rounds.
#[derive(Debug, Serialize)]
pub struct ClusterSetting {
    pub setting: &'static str,
    pub followups_per_s: f64,
    pub followup_p50_ms: f64,
    pub followup_p99_ms: f64,
    pub raw_publish_ack_p50_ms: f64,
    pub raw_publish_ack_p99_ms: f64,
    pub nats_cpu_s_per_1k_followups: f64,
    pub cpu_s_per_1k_followups: f64,
    pub rounds: Vec<ClusterRound>,
}

impl ClusterSetting {
    fn of(setting: &'static str, rounds: Vec<ClusterRound>) -> Self {
        let of = |f: fn(&ClusterRound) -> f64| median(rounds.iter().map(f).collect());
        Self {
            setting,
            followups_per_s: of(|r| r.followups_per_s),
            followup_p50_ms: of(|r| r.followup_p50_ms),
            followup_p99_ms: of(|r| r.followup_p99_ms),
            raw_publish_ack_p50_ms: of(|r| r.raw_publish_ack_p50_ms),
            raw_publish_ack_p99_ms: of(|r| r.raw_publish_ack_p99_ms),
            nats_cpu_s_per_1k_followups: of(|r| r.nats_cpu_s_per_1k_followups),
            cpu_s_per_1k_followups: of(|r| r.cpu_s_per_1k_followups),
            rounds,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ClusterSyncReport {
    pub replicas: usize,
    pub nats_nodes: usize,
    pub default: ClusterSetting,
    pub always: ClusterSetting,
    /// always / default.
    pub followups_per_s_ratio: f64,
    pub followup_p50_ratio: f64,
    pub followup_p99_ratio: f64,
    pub raw_publish_ack_p50_ratio: f64,
    pub cpu_s_per_1k_ratio: f64,
    pub nproc: usize,
    pub cpu_model: String,
    pub turnstile_bin: String,
    /// What each round ran: `turnstile-bench cluster` with these arguments (and `--sync-always`).
    pub cluster_args: Vec<String>,
}

/// How the rounds run.
pub struct ClusterSyncOpts {
    pub rounds: usize,
    pub duration: f64,
    pub clients: usize,
    pub sessions: usize,
    pub raw_rounds: usize,
}

impl ClusterSyncOpts {
    /// The arguments of every round's `turnstile-bench cluster` (without `--sync-always` and `--json`).
    pub fn cluster_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec!["cluster".into()];
        for (flag, value) in [
            ("--duration", self.duration.to_string()),
            ("--clients", self.clients.to_string()),
            ("--sessions", self.sessions.to_string()),
            ("--raw-rounds", self.raw_rounds.to_string()),
        ] {
            args.extend([flag.to_owned(), value]);
        }
        // Neither the resume rounds nor the R1 run are part of this comparison.
        args.extend(["--resume-rounds".to_owned(), "0".to_owned(), "--skip-r1".to_owned()]);
        args
    }
}

pub async fn run(bin: &std::path::Path, opts: &ClusterSyncOpts) -> Result<ClusterSyncReport> {
    let base = opts.cluster_args();
    let mut measured: [Vec<ClusterRound>; 2] = [Vec::new(), Vec::new()];
    let (mut replicas, mut nats_nodes) = (0, 0);
    for round in 0..opts.rounds.max(1) {
        for (i, always) in [false, true].into_iter().enumerate() {
            let name = if always { "always" } else { "default" };
            eprintln!("sync --cluster: round {} of {}, sync_interval {name} ...", round + 1, opts.rounds.max(1));
            let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
            if always {
                args.push("--sync-always");
            }
            let report = child_phase(bin, &args).await?;
            replicas = report["replicas"].as_u64().unwrap_or(0) as usize;
            nats_nodes = report["nats_nodes"].as_u64().unwrap_or(0) as usize;
            measured[i].push(ClusterRound::of(&report).with_context(|| format!("round {} ({name})", round + 1))?);
        }
    }
    let [default, always] = measured;
    let (default, always) =
        (ClusterSetting::of("default", default), ClusterSetting::of("sync_interval: always", always));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(ClusterSyncReport {
        replicas,
        nats_nodes,
        followups_per_s_ratio: ratio(always.followups_per_s, default.followups_per_s),
        followup_p50_ratio: ratio(always.followup_p50_ms, default.followup_p50_ms),
        followup_p99_ratio: ratio(always.followup_p99_ms, default.followup_p99_ms),
        raw_publish_ack_p50_ratio: ratio(always.raw_publish_ack_p50_ms, default.raw_publish_ack_p50_ms),
        cpu_s_per_1k_ratio: ratio(always.cpu_s_per_1k_followups, default.cpu_s_per_1k_followups),
        default,
        always,
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        turnstile_bin: bin.display().to_string(),
        cluster_args: base,
    })
}

pub fn markdown(r: &ClusterSyncReport) -> String {
    let row = |f: &ClusterSetting| {
        format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            f.setting,
            f.followups_per_s,
            f.followup_p50_ms,
            f.followup_p99_ms,
            f.raw_publish_ack_p50_ms,
            f.raw_publish_ack_p99_ms,
            f.nats_cpu_s_per_1k_followups,
            f.cpu_s_per_1k_followups
        )
    };
    let mut out = format!(
        "## sync_interval: default (2 min) against always, R{} on {} nats-servers\n\n{} cores, {}; medians of {} \
         rounds each, alternating; each round `turnstile-bench {}`.\n\n",
        r.replicas,
        r.nats_nodes,
        r.nproc,
        r.cpu_model,
        r.default.rounds.len(),
        r.cluster_args.join(" ")
    );
    out.push_str(
        "| nats-servers | followups/s | p50 ms | p99 ms | raw R3 publish-ack p50 ms | p99 ms | nats CPU-s / 1k \
         followups | cluster CPU-s / 1k |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    out.push_str(&row(&r.default));
    out.push_str(&row(&r.always));
    out.push_str(&format!(
        "\nalways / default: followups/s ×{:.2}, p50 ×{:.2}, p99 ×{:.2}, raw publish-ack p50 ×{:.2}, cluster CPU per \
         followup ×{:.2}\n",
        r.followups_per_s_ratio,
        r.followup_p50_ratio,
        r.followup_p99_ratio,
        r.raw_publish_ack_p50_ratio,
        r.cpu_s_per_1k_ratio
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(followups_per_s: f64, p50: f64) -> serde_json::Value {
        serde_json::json!({
            "replicas": 3,
            "cluster_followups_per_s": followups_per_s,
            "cluster_followup_p50_ms": p50,
            "cluster_followup_p99_ms": p50 * 3.0,
            "cluster_raw_publish_ack": {"p50_ms": 0.5, "p99_ms": 1.5},
            "cluster_cpu_s_per_1k_followups": {"per_role": {"nats-server": 0.4, "worker": 0.5}, "total": 1.1},
            "throughput": {"errors": 1, "drain_errors": 2},
        })
    }

    #[test]
    fn a_cluster_round_is_read_from_the_cluster_phases_json() {
        let r = ClusterRound::of(&round(1200.0, 20.0)).unwrap();
        assert_eq!((r.followups_per_s, r.followup_p99_ms, r.raw_publish_ack_p99_ms), (1200.0, 60.0, 1.5));
        assert_eq!((r.nats_cpu_s_per_1k_followups, r.cpu_s_per_1k_followups, r.errors), (0.4, 1.1, 3));
        let mut missing = round(1200.0, 20.0);
        missing["cluster_raw_publish_ack"] = serde_json::Value::Null;
        let e = ClusterRound::of(&missing).unwrap_err();
        assert_eq!(e.to_string(), "no /cluster_raw_publish_ack/p50_ms");
    }

    #[test]
    fn a_setting_is_the_median_of_its_rounds() {
        let rounds = [(1000.0, 30.0), (1400.0, 10.0), (1200.0, 20.0)]
            .map(|(f, p)| ClusterRound::of(&round(f, p)).unwrap())
            .to_vec();
        let s = ClusterSetting::of("default", rounds);
        assert_eq!((s.followups_per_s, s.followup_p50_ms, s.rounds.len()), (1200.0, 20.0, 3));
    }

    #[test]
    fn every_round_runs_the_same_cluster_flags_without_resume_or_r1() {
        let opts = ClusterSyncOpts { rounds: 2, duration: 10.0, clients: 32, sessions: 1000, raw_rounds: 300 };
        assert_eq!(
            opts.cluster_args().join(" "),
            "cluster --duration 10 --clients 32 --sessions 1000 --raw-rounds 300 --resume-rounds 0 --skip-r1"
        );
    }
}
