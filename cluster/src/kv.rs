//! The cluster's ownership records in JetStream KV (ARCHITECTURE "KV buckets").
//!
//! - `turnstile_shards`: key = virtual shard (decimal), value = [`ShardLease`] as JSON. Entries are never
//!   deleted: a released or expired lease keeps its epoch, so the next acquisition can take a higher one.
//!   Every change is a compare-and-set on the entry's revision, so two workers can never both succeed.
//! - `turnstile_workers`: key = worker id, value = [`WorkerInfo`] as JSON, heartbeats; the bucket's max age
//!   drops a worker that stopped beating.
//!
//! Lease expiry is a wall-clock time in the lease. The single-writer rule does not depend on clocks: a
//! worker also keeps a local deadline measured from *before* each renewal, stops writing when it passes,
//! and the conditional append (SPEC §6) refuses any stale writer regardless.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use turnstile_journal::jetstream::wrong_last_sequence;

pub const SHARDS_BUCKET: &str = "turnstile_shards";
pub const WORKERS_BUCKET: &str = "turnstile_workers";

/// Why the ownership buckets could not be read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// NATS could not be reached or refused the operation; retry.
    #[error("{0}")]
    Unavailable(String),
    /// A record could not be encoded or decoded.
    #[error("{0}")]
    Storage(String),
}

/// Who owns a virtual shard, until when, under which epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLease {
    /// Owner worker id; empty once released.
    pub owner: String,
    /// The owner's internal gRPC address.
    pub addr: String,
    /// Increases with every acquisition (from 1), stamped on every event the owner writes.
    pub epoch: u64,
    /// Wall-clock expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

impl ShardLease {
    /// Held by someone and not expired at `now_ms`.
    pub fn is_held(&self, now_ms: u64) -> bool {
        !self.owner.is_empty() && self.expires_at_ms > now_ms
    }
}

/// A worker's heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: String,
    pub addr: String,
    /// Relative capacity (1 = one fair share).
    pub capacity: u32,
    pub heartbeat_ms: u64,
    /// The worker answers on its presence subject while its NATS connection lives, so peers may treat a
    /// missing subscriber as a dead worker. False (absent) for builds without presence, which peers then
    /// only ever replace by lease expiry.
    #[serde(default)]
    pub presence: bool,
}

/// A lease entry and the KV revision that a compare-and-set must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseEntry {
    pub lease: ShardLease,
    pub revision: u64,
}

/// Why a compare-and-set did not happen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CasError {
    /// Someone else changed the entry first.
    #[error("shard {shard} changed under us")]
    Lost { shard: u32 },
    #[error(transparent)]
    Store(#[from] MembershipError),
}

/// Every shard's current lease, as seen through the KV watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardMap {
    /// The number of virtual shards (V).
    pub shards: u32,
    pub leases: BTreeMap<u32, LeaseEntry>,
    /// True once the watch has delivered the bucket's current contents (stays false for an empty bucket).
    pub complete: bool,
}

impl ShardMap {
    /// The lease of `shard` if it is held and unexpired at `now_ms`.
    pub fn owner(&self, shard: u32, now_ms: u64) -> Option<&ShardLease> {
        self.leases.get(&shard).map(|e| &e.lease).filter(|l| l.is_held(now_ms))
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> MembershipError {
    MembershipError::Unavailable(format!("{what}: {e}"))
}

/// Handles on the two ownership buckets.
#[derive(Clone)]
pub struct ClusterKv {
    shards_kv: kv::Store,
    workers_kv: kv::Store,
    shards: u32,
}

impl std::fmt::Debug for ClusterKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterKv").field("shards", &self.shards).finish_non_exhaustive()
    }
}

async fn bucket(client: &async_nats::Client, config: kv::Config) -> Result<kv::Store, MembershipError> {
    turnstile_journal::jetstream::open_bucket_with(client, config)
        .await
        .map_err(|e| MembershipError::Unavailable(e.to_string()))
}

/// How long the shard watch may see no change before it is re-established (see `watch_shards`). Leases
/// are renewed every `LeaseConfig::renew_every` (400 ms by default), so a healthy watch is never this quiet
/// while any worker lives; a cluster without workers re-establishes it every few seconds, which is cheap.
const SHARD_WATCH_IDLE: Duration = Duration::from_secs(5);

impl ClusterKv {
    /// Opens (creating if needed) both buckets. `worker_ttl` is how long a heartbeat counts.
    pub async fn open(
        client: &async_nats::Client,
        replicas: usize,
        shards: u32,
        worker_ttl: Duration,
    ) -> Result<Self, MembershipError> {
        let shards_kv = bucket(
            client,
            kv::Config {
                bucket: SHARDS_BUCKET.to_owned(),
                description: "Turnstile shard leases: owner, address, epoch, expiry".to_owned(),
                history: 1,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
                ..Default::default()
            },
        )
        .await?;
        let workers_kv = bucket(
            client,
            kv::Config {
                bucket: WORKERS_BUCKET.to_owned(),
                description: "Turnstile worker heartbeats".to_owned(),
                history: 1,
                max_age: worker_ttl,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
                ..Default::default()
            },
        )
        .await?;
        Ok(Self { shards_kv, workers_kv, shards: shards.max(1) })
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The current lease of `shard`, if it ever had one.
    pub async fn lease(&self, shard: u32) -> Result<Option<LeaseEntry>, MembershipError> {
        let entry = self.shards_kv.entry(shard.to_string()).await.map_err(|e| unavailable("shard lease", e))?;
        Ok(entry.and_then(|e| decode_lease(&e)))
    }

    /// Writes `lease` iff the entry is still at `revision` (`None`: iff the shard has no entry yet).
    pub async fn put_lease(&self, shard: u32, lease: &ShardLease, revision: Option<u64>) -> Result<u64, CasError> {
        let value = serde_json::to_vec(lease).map_err(|e| MembershipError::Storage(e.to_string()))?;
        let key = shard.to_string();
        let lost = CasError::Lost { shard };
        // Another worker writing first is `Lost` however the server words it (10164 at R3 included).
        match revision {
            None => self.shards_kv.create(&key, value.into()).await.map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => lost,
                _ if wrong_last_sequence(&e) => lost,
                _ => CasError::Store(unavailable("shard lease create", e)),
            }),
            Some(rev) => self.shards_kv.update(&key, value.into(), rev).await.map_err(|e| match e.kind() {
                kv::UpdateErrorKind::WrongLastRevision => lost,
                _ if wrong_last_sequence(&e) => lost,
                _ => CasError::Store(unavailable("shard lease update", e)),
            }),
        }
    }

    /// Records a heartbeat.
    pub async fn heartbeat(&self, info: &WorkerInfo) -> Result<(), MembershipError> {
        let value = serde_json::to_vec(info).map_err(|e| MembershipError::Storage(e.to_string()))?;
        self.workers_kv.put(&info.id, value.into()).await.map_err(|e| unavailable("worker heartbeat", e))?;
        Ok(())
    }

    /// Removes a worker's heartbeat (clean shutdown), so others rebalance at once.
    pub async fn leave(&self, worker_id: &str) -> Result<(), MembershipError> {
        self.workers_kv.delete(worker_id).await.map_err(|e| unavailable("worker leave", e))
    }

    /// Workers whose heartbeat is younger than `ttl` at `now_ms`, ordered by id.
    pub async fn live_workers(&self, now_ms: u64, ttl: Duration) -> Result<Vec<WorkerInfo>, MembershipError> {
        let mut keys = self.workers_kv.keys().await.map_err(|e| unavailable("worker list", e))?;
        let mut ids = Vec::new();
        while let Some(key) = keys.next().await {
            ids.push(key.map_err(|e| unavailable("worker list", e))?);
        }
        let mut live = Vec::new();
        for id in ids {
            let Some(bytes) = self.workers_kv.get(&id).await.map_err(|e| unavailable("worker heartbeat", e))? else {
                continue;
            };
            if let Ok(info) = serde_json::from_slice::<WorkerInfo>(&bytes)
                && info.heartbeat_ms + ttl.as_millis() as u64 > now_ms
            {
                live.push(info);
            }
        }
        live.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(live)
    }

    /// A shard map kept current by a KV watch (with the bucket's history first) in a background task.
    /// The task ends when every receiver is dropped; a broken watch is re-established.
    /// Opening the first watch is retried while the bucket's stream may be electing a leader
    /// ([`turnstile_journal::jetstream::while_starting`]).
    pub async fn watch_shards(&self) -> Result<watch::Receiver<ShardMap>, MembershipError> {
        let first = turnstile_journal::jetstream::while_starting("the shard watch", || async {
            self.shards_kv.watch_with_history(">").await.map_err(|e| unavailable("shard watch", e))
        })
        .await?;
        let (tx, rx) = watch::channel(ShardMap { shards: self.shards, ..ShardMap::default() });
        let store = self.shards_kv.clone();
        tokio::spawn(async move {
            let mut stream = Some(first);
            loop {
                let mut watch = match stream.take() {
                    Some(w) => w,
                    None => match store.watch_with_history(">").await {
                        Ok(w) => w,
                        Err(e) => {
                            tracing::warn!(error = %e, "shard watch failed; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            if tx.is_closed() {
                                return;
                            }
                            continue;
                        }
                    },
                };
                loop {
                    let next = tokio::select! {
                        () = tx.closed() => return,
                        next = tokio::time::timeout(SHARD_WATCH_IDLE, watch.next()) => next,
                    };
                    // A watch that saw nothing for SHARD_WATCH_IDLE has stalled: live owners renew their
                    // leases every few hundred ms. The KV watch is an ordered push consumer, and when the
                    // bucket's stream leader moves it can go quiet without ending or erroring, which left
                    // gateways routing on a map that named no owner for a minute (cluster_chaos, leader kill).
                    let Ok(next) = next else {
                        tracing::warn!(
                            idle_ms = SHARD_WATCH_IDLE.as_millis() as u64,
                            "shard watch idle; re-establishing"
                        );
                        break;
                    };
                    let Some(Ok(entry)) = next else { break };
                    let Ok(shard) = entry.key.parse::<u32>() else { continue };
                    tx.send_modify(|map| {
                        match (entry.operation, decode_lease(&entry)) {
                            (kv::Operation::Put, Some(lease)) => {
                                map.leases.insert(shard, lease);
                            }
                            _ => {
                                map.leases.remove(&shard);
                            }
                        }
                        if entry.delta == 0 {
                            map.complete = true;
                        }
                    });
                }
                tracing::debug!("shard watch ended; re-establishing");
            }
        });
        Ok(rx)
    }
}

fn decode_lease(entry: &kv::Entry) -> Option<LeaseEntry> {
    if entry.operation != kv::Operation::Put {
        return None;
    }
    serde_json::from_slice::<ShardLease>(&entry.value).ok().map(|lease| LeaseEntry { lease, revision: entry.revision })
}
