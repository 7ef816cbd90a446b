//! Cluster membership, the command seam and the internal gateway → worker hop, shared by the gateway and
//! the worker so that neither imports the other and neither goes through the log crate.
//!
//! Place in the architecture: the gateway routes each command to the worker that owns the session's
//! virtual shard; the worker acquires and renews shard leases (and routes the commands of `spawn_agent`'s
//! child sessions as a gateway would). Both sides need the same facts:
//!
//! - [`kv`]: the ownership records in JetStream KV (shard leases, worker heartbeats) and the watched
//!   [`ShardMap`]; [`shard_of`] is the session → shard hash (from `turnstile-model`).
//! - [`LeaseConfig`]: lease timing, the same on every node.
//! - [`router`]: the [`CommandRouter`] trait, the gateway → driver seam (the in-process host in
//!   `turnstile dev`), and the internal gRPC hop behind it in a cluster: [`ClusterRouter`] routes each command
//!   to its shard's owner over a [`router::transport`] and retries while shards move.
//! - [`codec`] and [`status`]: the internal `turnstile.cluster.v1` API's commands and replies, and the one
//!   [`CommandError`](turnstile_model::CommandError) ↔ gRPC status mapping, used in both directions.
//! - [`tools`]: the [`ToolBus`] a worker calls client tools over (NATS requests to the gateways holding
//!   their executors).

pub mod codec;
pub mod kv;
pub mod router;
pub mod status;
pub mod tools;

use std::time::Duration;

pub use kv::{CasError, ClusterKv, LeaseEntry, MembershipError, ShardLease, ShardMap, WorkerInfo};
pub use router::{ClusterRouter, ClusterRouterConfig, CommandRouter, GrpcTransport, WorkerTransport};
pub use tools::{NatsToolBus, ToolBus, ToolBusError};
pub use turnstile_model::shard::shard_of;

/// Lease timing. The defaults give failover in about two to three seconds when only the lease can tell
/// (a paused or partitioned owner); an owner whose NATS connection closed is replaced within a few
/// `presence_every`.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Virtual shards (V).
    pub shards: u32,
    /// How long a lease lasts without renewal.
    pub ttl: Duration,
    /// How often leases are renewed and shares recomputed.
    pub renew_every: Duration,
    /// How long a heartbeat keeps a worker counted as live.
    pub worker_ttl: Duration,
    /// How long a released shard's sessions may take to finish their running step.
    pub drain_timeout: Duration,
    /// Acquisitions per tick, so a starting worker does not stall its loop.
    pub max_acquire_per_tick: usize,
    /// How often a worker asks each peer's presence subject whether its NATS connection still lives
    /// (docs/decisions/0019): a peer whose subscription is gone twice in a row is dead, and its shards are
    /// taken at once instead of after `ttl`. Each probe waits at most this long for an answer.
    pub presence_every: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            shards: 256,
            ttl: Duration::from_millis(1500),
            renew_every: Duration::from_millis(400),
            worker_ttl: Duration::from_millis(3000),
            drain_timeout: Duration::from_secs(10),
            max_acquire_per_tick: 64,
            // 50 ms (decision 0179): a kill -9 is confirmed 12–63 ms after it, not 25–125 ms.
            presence_every: Duration::from_millis(50),
        }
    }
}
