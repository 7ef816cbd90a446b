//! Cluster membership of a worker: shard leases, ownership checks, and the internal gRPC service.
//!
//! [`start_worker`] wires a [`SessionHost`] to [`leases::Leases`] (its [`crate::ownership::Ownership`]) and runs
//! the lease loop and the watch of the peers' presence; [`presence`] tells a dead peer (closed NATS
//! connection) from a slow one; [`service`] exposes the host to gateways over `turnstile.cluster.v1`.

pub mod leases;
pub mod presence;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::{ClusterKv, MembershipError};
use turnstile_journal::snapshot::SnapshotStore;
use turnstile_journal::{LiveBus, SessionLog};

use crate::agent::Agents;
use crate::budget::Budgets;
use crate::config::WorkerConfig;
use crate::host::SessionHost;
use crate::ownership::Ownership;
pub use leases::Leases;
pub use turnstile_cluster::LeaseConfig;

/// What a cluster worker is.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Unique worker id (reported as the session owner).
    pub id: String,
    /// The internal gRPC address gateways reach this worker at.
    pub advertise_addr: String,
    pub leases: LeaseConfig,
    /// Driver settings; `owner_id` is replaced by `id`, `epoch` by each shard's lease epoch.
    pub worker: WorkerConfig,
    /// Tenants' daily token budgets, checked before each model request (SPEC §17); `None`: none.
    pub budgets: Option<Budgets>,
}

/// A running worker: its host, its lease loop and its presence.
pub struct WorkerHandle {
    host: Arc<SessionHost>,
    leases: Arc<Leases>,
    /// Stops the lease loop and the probing of peers.
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// Stops answering presence probes: only after the leave, since a worker that stops answering while
    /// it drains would have its shards taken before it released them.
    present: CancellationToken,
    presence: JoinHandle<()>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("leases", &self.leases).finish_non_exhaustive()
    }
}

/// Joins the cluster: opens the ownership buckets, starts the host running `agents` over the journal's
/// `log`, `bus` and `snapshots`, with the shard leases as its ownership, and the lease loop.
pub async fn start_worker(
    options: WorkerOptions,
    agents: Agents,
    client: &async_nats::Client,
    replicas: usize,
    log: Arc<dyn SessionLog>,
    bus: Arc<dyn LiveBus>,
    snapshots: Arc<dyn SnapshotStore>,
) -> Result<WorkerHandle, MembershipError> {
    let kv = ClusterKv::open(client, replicas, options.leases.shards, options.leases.worker_ttl).await?;
    let map = kv.watch_shards().await?;
    // Before the first heartbeat (which tells peers to probe): a peer must never find us absent.
    let present = CancellationToken::new();
    let presence = presence::serve(client, &options.id, present.clone()).await?;
    let leases = Leases::new(options.id.clone(), options.advertise_addr.clone(), kv, map, options.leases.clone());
    let mut config = options.worker;
    config.owner_id = options.id;
    let ownership: Arc<dyn Ownership> = leases.clone();
    // The session index (SPEC §16) in the KV bucket every gateway mirrors.
    let index = turnstile_journal::jetstream::KvIndex::open(client, replicas)
        .await
        .map_err(|e| MembershipError::Unavailable(e.to_string()))?
        .observe_pending(turnstile_ops::gauge_setter(turnstile_ops::names::INDEX_WRITES_PENDING));
    // Webhook positions (SPEC §15), so a new owner goes on where this one stopped.
    let positions = turnstile_journal::jetstream::KvWebhookPositions::open(client, replicas)
        .await
        .map_err(|e| MembershipError::Unavailable(e.to_string()))?;
    // The webhooks tenants registered (SPEC §21), mirrored from their bucket.
    let registry = turnstile_journal::jetstream::KvWebhookRegistry::open(client, replicas)
        .await
        .map_err(|e| MembershipError::Unavailable(e.to_string()))?;
    let mut host = SessionHost::builder(log, bus, agents)
        .snapshots(snapshots)
        .ownership(ownership)
        .config(config)
        .index(Arc::new(index))
        .webhook_positions(Arc::new(positions))
        .webhook_registry(Arc::new(registry));
    if let Some(budgets) = options.budgets {
        host = host.budgets(budgets);
    }
    let host = host.build();
    let stop = CancellationToken::new();
    tokio::spawn(watch_peers(client.clone(), leases.clone(), stop.clone()));
    let task = tokio::spawn(lease_loop(leases.clone(), host.clone(), stop.clone()));
    Ok(WorkerHandle { host, leases, stop, task, present, presence })
}

async fn lease_loop(leases: Arc<Leases>, host: Arc<SessionHost>, stop: CancellationToken) {
    let every = leases.config().renew_every;
    // Announce first and give workers that start together a round to see each other's heartbeats, so
    // the first one up does not take every shard only to hand most of them back.
    leases.heartbeat().await;
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(every * 2) => {}
    }
    loop {
        leases.tick(&host).await;
        let round = tokio::time::Instant::now() + every;
        // Between rounds, rebalance (without renewing) when a peer is found dead or when a stalled peer's
        // lease runs out, so its shards move then and not up to a round later.
        loop {
            let expiry = leases.next_peer_expiry(every).map(|d| {
                // Just past the expiry, and never a spin on a lease that expires now.
                tokio::time::Instant::now() + (d + Duration::from_millis(5)).max(Duration::from_millis(20))
            });
            let wake_at = expiry.map_or(round, |e| e.min(round));
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake_at) => {}
                () = leases.woken() => {}
            }
            if tokio::time::Instant::now() >= round {
                break;
            }
            leases.rebalance_now(&host).await;
        }
    }
}

/// Probes the peers [`Leases::presence_targets`] names every `presence_every`, all at once, until `stop`.
/// A peer found gone is asked once more a quarter interval later, and only a second "gone" reaches
/// [`Leases::observe`] as [`presence::Probe::Gone`]: one missing subscriber may be interest still on its way between
/// clustered servers, two a quarter interval apart are a closed connection.
async fn watch_peers(client: async_nats::Client, leases: Arc<Leases>, stop: CancellationToken) {
    let every = leases.config().presence_every.max(Duration::from_millis(10));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let targets = leases.presence_targets();
        let answers = futures::future::join_all(targets.into_iter().map(|id| {
            let client = &client;
            async move {
                let mut answer = presence::probe(client, &id, every).await;
                if answer == presence::Probe::Gone {
                    tokio::time::sleep(every / 4).await;
                    answer = presence::probe(client, &id, every).await;
                }
                (id, answer)
            }
        }))
        .await;
        for (id, answer) in answers {
            leases.observe(&id, answer);
        }
    }
}

impl WorkerHandle {
    pub fn host(&self) -> Arc<SessionHost> {
        self.host.clone()
    }

    pub fn leases(&self) -> Arc<Leases> {
        self.leases.clone()
    }

    /// Leaves the cluster cleanly: drains every session (bounded by `drain_timeout`), releases every
    /// lease so the next owners start at once, removes the heartbeat.
    pub async fn shutdown(self, drain_timeout: Duration) {
        self.stop.cancel();
        let _ = self.task.await;
        let _ = tokio::time::timeout(drain_timeout + Duration::from_secs(2), self.leases.leave(&self.host)).await;
        self.present.cancel();
        let _ = self.presence.await;
    }
}
