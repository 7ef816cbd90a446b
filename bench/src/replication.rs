//! The replication cost of the cluster phase's appends, apart (issue 44, decision 0189): the same load on
//! the same processes and flags with every stream and bucket at R1, against the R3 run.
//!
//! Only the nats-servers replicate, so the nats-servers' CPU-s per 1,000 followups at R3 minus at R1 is
//! what the two more copies of the same appends (their stores and the Raft traffic) cost. The other roles'
//! difference is reported too: the workers and gateways do the same work at either replication, so what
//! they spend more at R3 is the longer acknowledgement's side effects (smaller batches, more wakeups), not
//! replication itself. A per-process split of one R3 run cannot give this: every nats-server leads some
//! streams and follows others, so each process's CPU mixes both.

use serde::Serialize;

use crate::cpu::CpuPer1k;

const NATS: &str = "nats-server";

#[derive(Debug, Serialize)]
pub struct Replication {
    /// The R1 run: the same processes, flags and load, every stream and bucket at R1.
    pub r1_followups_per_s: f64,
    pub r1_followup_p50_ms: f64,
    pub r1_followup_p99_ms: f64,
    /// A sequential raw publish-ack on an R1 scratch stream of the same nats-servers.
    pub r1_raw_publish_ack_p50_ms: Option<f64>,
    pub r1_cpu_s_per_1k_followups: CpuPer1k,
    /// The nats-servers' CPU-s per 1,000 followups at R3 − at R1: the replication of the same appends.
    pub replication_cpu_s_per_1k_followups: f64,
    /// Every cluster process, R3 − R1 (replication and its side effects in the other roles).
    pub cluster_delta_cpu_s_per_1k_followups: f64,
    /// The R3 cluster's CPU-s per 1,000 followups less `replication_cpu_s_per_1k_followups`.
    pub cluster_cpu_s_per_1k_without_replication: f64,
    /// `replication_cpu_s_per_1k_followups` / the R3 cluster's total.
    pub replication_share_of_cluster_cpu: f64,
}

impl Replication {
    /// The CPU figures of the R3 run (`replicated`) against the R1 run (`unreplicated`); the R1 run's
    /// throughput and latency are left zero for the caller, which has its report.
    pub fn of_cpu(replicated: &CpuPer1k, unreplicated: &CpuPer1k) -> Self {
        let nats = |c: &CpuPer1k| c.per_role.get(NATS).copied().unwrap_or(0.0);
        let replication = nats(replicated) - nats(unreplicated);
        Self {
            r1_followups_per_s: 0.0,
            r1_followup_p50_ms: 0.0,
            r1_followup_p99_ms: 0.0,
            r1_raw_publish_ack_p50_ms: None,
            r1_cpu_s_per_1k_followups: unreplicated.clone(),
            replication_cpu_s_per_1k_followups: replication,
            cluster_delta_cpu_s_per_1k_followups: replicated.total - unreplicated.total,
            cluster_cpu_s_per_1k_without_replication: replicated.total - replication,
            replication_share_of_cluster_cpu: if replicated.total > 0.0 { replication / replicated.total } else { 0.0 },
        }
    }

    /// The R1 run beside the R`replicas` one (`replicated`), per role.
    pub fn markdown(&self, replicas: usize, replicated: &CpuPer1k) -> String {
        use std::fmt::Write as _;
        let unreplicated = &self.r1_cpu_s_per_1k_followups;
        let mut out = format!(
            "The same load at R1 on the same nats-servers: {:.0} followups/s, p50 {:.3} ms, p99 {:.3} ms{}.\n\n",
            self.r1_followups_per_s,
            self.r1_followup_p50_ms,
            self.r1_followup_p99_ms,
            self.r1_raw_publish_ack_p50_ms.map_or_else(String::new, |v| format!(", raw R1 publish-ack p50 {v:.3} ms"))
        );
        let _ = writeln!(out, "| CPU-s / 1k followups | R{replicas} | R1 | R{replicas} − R1 |");
        let _ = writeln!(out, "|---|---:|---:|---:|");
        for (role, v) in &replicated.per_role {
            let r1 = unreplicated.per_role.get(role).copied().unwrap_or(0.0);
            let _ = writeln!(out, "| {role} | {v:.3} | {r1:.3} | {:+.3} |", v - r1);
        }
        let _ = writeln!(
            out,
            "| cluster | {:.3} | {:.3} | {:+.3} |\n",
            replicated.total, unreplicated.total, self.cluster_delta_cpu_s_per_1k_followups
        );
        let _ = writeln!(
            out,
            "Replication (the nats-servers' R{replicas} − R1): {:.3} CPU-s per 1,000 followups, {:.0} % of the \
             cluster's; the cluster without it: {:.3}.\n",
            self.replication_cpu_s_per_1k_followups,
            self.replication_share_of_cluster_cpu * 100.0,
            self.cluster_cpu_s_per_1k_without_replication
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn cpu(worker: f64, gateway: f64, nats: f64) -> CpuPer1k {
        let per_role: BTreeMap<&'static str, f64> =
            [("worker", worker), ("gateway", gateway), (NATS, nats)].into_iter().collect();
        CpuPer1k { per_process: BTreeMap::new(), per_role, total: worker + gateway + nats, bench_clients: 0.3 }
    }

    #[test]
    fn replication_is_the_nats_servers_difference_and_the_rest_is_reported_beside_it() {
        let r3 = cpu(0.48, 0.20, 0.50);
        let r1 = cpu(0.45, 0.19, 0.20);
        let r = Replication::of_cpu(&r3, &r1);
        assert!((r.replication_cpu_s_per_1k_followups - 0.30).abs() < 1e-9);
        assert!((r.cluster_delta_cpu_s_per_1k_followups - 0.34).abs() < 1e-9);
        assert!((r.cluster_cpu_s_per_1k_without_replication - 0.88).abs() < 1e-9);
        assert!((r.replication_share_of_cluster_cpu - 0.30 / 1.18).abs() < 1e-9);
        let md = r.markdown(3, &r3);
        assert!(md.contains("| nats-server | 0.500 | 0.200 | +0.300 |"), "{md}");
    }

    #[test]
    fn no_cpu_measured_gives_no_share() {
        let r = Replication::of_cpu(&cpu(0.0, 0.0, 0.0), &cpu(0.0, 0.0, 0.0));
        assert_eq!(r.replication_share_of_cluster_cpu, 0.0);
    }
}
