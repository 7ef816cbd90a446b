//! CPU seconds per 1,000 followups of a measured cluster, by process and by role: what the cluster phase
//! measures ([`crate::cluster`]) and the replication cost is the difference of ([`crate::replication`]).

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct CpuPer1k {
    /// By process name (`w1`…, `g0`…, `n1`…).
    pub per_process: BTreeMap<String, f64>,
    /// Summed by role (`worker`, `gateway`, `nats-server`).
    pub per_role: BTreeMap<&'static str, f64>,
    /// Every cluster process.
    pub total: f64,
    /// This load generator itself (its 32 clients), for scale; not part of the total.
    pub bench_clients: f64,
}
