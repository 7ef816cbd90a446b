//! Shard leases: which virtual shards this worker owns, under which epoch, until when.
//!
//! Every `renew_every` the lease loop heartbeats into `turnstile_workers`, renews each held lease by CAS,
//! drops the ones it lost or let lapse (stopping their sessions at once), computes the fair share
//! ceil(V / live workers), acquires free or expired shards up to it (each acquisition takes epoch + 1 and
//! resumes the shard's running sessions, SPEC §6), and hands back shards above it (drain, snapshot,
//! release) so the next owner starts at once instead of waiting for expiry.
//!
//! Safety does not rest on this loop being timely: [`Leases::may_write`] compares against a local deadline
//! taken *before* each renewal request, so a worker that was paused past its lease refuses to write
//! when it wakes, and the conditional append refuses any writer whose view of the log is stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use turnstile_cluster::{CasError, ClusterKv, LeaseConfig, ShardLease, ShardMap, WorkerInfo};
use turnstile_model::SessionRef;
use turnstile_model::shard::{fnv1a64, shard_of};
use turnstile_ops::clock::now_ms;

use turnstile_ops::names;

use crate::host::{Ownership, SessionHost};

/// A lease this worker holds.
#[derive(Clone, Debug)]
struct Held {
    epoch: u64,
    revision: u64,
    /// Local deadline: renewal start + 90% of the TTL. Past it, nothing is written under this lease.
    valid_until: Instant,
    /// Being handed over: no new commands, but the running step may still write.
    releasing: bool,
}

/// This worker's leases; the [`Ownership`] its session host consults.
pub struct Leases {
    id: String,
    addr: String,
    kv: ClusterKv,
    config: LeaseConfig,
    held: Mutex<HashMap<u32, Held>>,
    map: watch::Receiver<ShardMap>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("id", &self.id).field("held", &self.held_shards()).finish_non_exhaustive()
    }
}

impl Leases {
    pub fn new(
        id: String,
        addr: String,
        kv: ClusterKv,
        map: watch::Receiver<ShardMap>,
        config: LeaseConfig,
    ) -> Arc<Self> {
        Arc::new(Self { id, addr, kv, config, held: Mutex::new(HashMap::new()), map })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The shards held now, in order.
    pub fn held_shards(&self) -> Vec<u32> {
        let mut shards: Vec<u32> = self.lock().keys().copied().collect();
        shards.sort_unstable();
        shards
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn shard(&self, session: &SessionRef) -> u32 {
        shard_of(session, self.config.shards)
    }

    fn valid_for(&self) -> Duration {
        self.config.ttl.mul_f64(0.9)
    }

    /// Records this worker as live.
    pub async fn heartbeat(&self) {
        let info = WorkerInfo { id: self.id.clone(), addr: self.addr.clone(), capacity: 1, heartbeat_ms: now_ms() };
        if let Err(e) = self.kv.heartbeat(&info).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
    }

    /// One round: heartbeat, renew, drop lapsed, rebalance.
    pub async fn tick(self: &Arc<Self>, host: &Arc<SessionHost>) {
        self.heartbeat().await;
        self.renew(host).await;
        self.drop_lapsed(host);
        match self.kv.live_workers(now_ms(), self.config.worker_ttl).await {
            Ok(live) => self.rebalance(host, live.len().max(1)).await,
            Err(e) => tracing::warn!(error = %e, "cannot list workers; not rebalancing this round"),
        }
        metrics::gauge!(names::SHARDS_OWNED).set(self.lock().len() as f64);
    }

    async fn renew(&self, host: &Arc<SessionHost>) {
        let held: Vec<(u32, Held)> = self.lock().iter().map(|(s, h)| (*s, h.clone())).collect();
        let renewals = futures::stream::iter(held)
            .map(|(shard, h)| async move {
                let started = Instant::now();
                let lease = ShardLease {
                    owner: self.id.clone(),
                    addr: self.addr.clone(),
                    epoch: h.epoch,
                    expires_at_ms: now_ms() + self.config.ttl.as_millis() as u64,
                };
                (shard, started, self.kv.put_lease(shard, &lease, Some(h.revision)).await)
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        let mut lost = Vec::new();
        {
            let mut held = self.lock();
            for (shard, started, result) in renewals {
                match result {
                    Ok(revision) => {
                        if let Some(h) = held.get_mut(&shard) {
                            h.revision = revision;
                            h.valid_until = started + self.valid_for();
                        }
                    }
                    Err(CasError::Lost { .. }) => {
                        metrics::counter!(names::LEASE_RENEW_FAILURES, "reason" => "lost").increment(1);
                        tracing::warn!(shard, "lease taken over by another worker");
                        held.remove(&shard);
                        lost.push(shard);
                    }
                    // Keep the lease; it lapses by its local deadline if the store stays away.
                    Err(CasError::Store(e)) => {
                        metrics::counter!(names::LEASE_RENEW_FAILURES, "reason" => "error").increment(1);
                        tracing::warn!(shard, error = %e, "lease renewal failed");
                    }
                }
            }
        }
        self.stop_shards(host, &lost);
    }

    fn drop_lapsed(&self, host: &Arc<SessionHost>) {
        let now = Instant::now();
        let lapsed: Vec<u32> = {
            let mut held = self.lock();
            let lapsed: Vec<u32> = held.iter().filter(|(_, h)| h.valid_until <= now).map(|(s, _)| *s).collect();
            for shard in &lapsed {
                held.remove(shard);
            }
            lapsed
        };
        if !lapsed.is_empty() {
            tracing::warn!(?lapsed, "leases lapsed; their sessions stop");
        }
        self.stop_shards(host, &lapsed);
    }

    fn stop_shards(&self, host: &Arc<SessionHost>, shards: &[u32]) {
        if !shards.is_empty() {
            let shards = shards.to_vec();
            let v = self.config.shards;
            host.stop_where(move |s| shards.contains(&shard_of(s, v)));
        }
    }

    async fn rebalance(self: &Arc<Self>, host: &Arc<SessionHost>, live: usize) {
        let v = self.config.shards;
        let fair = (v as usize).div_ceil(live);
        let active: Vec<u32> = self.lock().iter().filter(|(_, h)| !h.releasing).map(|(s, _)| *s).collect();
        if active.len() < fair {
            self.acquire(host, fair - active.len()).await;
        } else if active.len() > fair {
            let mut extra = active;
            extra.sort_unstable();
            let give_back: Vec<u32> = extra.split_off(fair);
            for shard in give_back {
                self.release(host, shard);
            }
        }
    }

    async fn acquire(self: &Arc<Self>, host: &Arc<SessionHost>, wanted: usize) {
        let v = self.config.shards;
        let now = now_ms();
        // Start from a point of our own so workers do not all race for the same shards.
        let offset = (fnv1a64(self.id.as_bytes()) % u64::from(v)) as u32;
        let candidates: Vec<u32> = {
            let map = self.map.borrow();
            let held = self.lock();
            (0..v)
                .map(|i| (offset + i) % v)
                .filter(|s| !held.contains_key(s))
                .filter(|s| map.owner(*s, now).is_none_or(|l| l.owner == self.id))
                .take(wanted.min(self.config.max_acquire_per_tick))
                .collect()
        };
        let mut acquired = Vec::new();
        for shard in candidates {
            let started = Instant::now();
            let current = match self.kv.lease(shard).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(shard, error = %e, "cannot read lease");
                    break;
                }
            };
            if let Some(c) = &current
                && c.lease.is_held(now_ms())
                && c.lease.owner != self.id
            {
                continue;
            }
            let epoch = current.as_ref().map_or(1, |c| c.lease.epoch + 1);
            let lease = ShardLease {
                owner: self.id.clone(),
                addr: self.addr.clone(),
                epoch,
                expires_at_ms: now_ms() + self.config.ttl.as_millis() as u64,
            };
            match self.kv.put_lease(shard, &lease, current.map(|c| c.revision)).await {
                Ok(revision) => {
                    let held = Held { epoch, revision, valid_until: started + self.valid_for(), releasing: false };
                    self.lock().insert(shard, held);
                    acquired.push(shard);
                }
                Err(CasError::Lost { .. }) => {}
                Err(CasError::Store(e)) => {
                    tracing::warn!(shard, error = %e, "cannot acquire lease");
                    break;
                }
            }
        }
        if acquired.is_empty() {
            return;
        }
        tracing::info!(count = acquired.len(), worker = %self.id, "acquired shards");
        // Sessions that were running on a shard's previous owner are repaired and resumed now, not on their
        // next command (SPEC §6). Off the lease loop, which must keep renewing.
        let host = host.clone();
        tokio::spawn(async move {
            if let Err(e) = host.resume_where(|s| acquired.contains(&shard_of(s, v))).await {
                tracing::warn!(error = %e, "resuming sessions of acquired shards failed");
            }
        });
    }

    /// Hands `shard` back: refuse new commands, drain its sessions, release the lease.
    fn release(self: &Arc<Self>, host: &Arc<SessionHost>, shard: u32) {
        match self.lock().get_mut(&shard) {
            Some(h) if !h.releasing => h.releasing = true,
            _ => return,
        }
        let (leases, host) = (self.clone(), host.clone());
        tokio::spawn(async move { leases.drain_and_release(&host, vec![shard]).await });
    }

    async fn drain_and_release(&self, host: &Arc<SessionHost>, shards: Vec<u32>) {
        let v = self.config.shards;
        let chosen = shards.clone();
        host.drain_where(move |s| chosen.contains(&shard_of(s, v)), self.config.drain_timeout).await;
        for shard in shards {
            let Some(h) = self.lock().remove(&shard) else { continue };
            let released = ShardLease { owner: String::new(), addr: String::new(), epoch: h.epoch, expires_at_ms: 0 };
            if let Err(e) = self.kv.put_lease(shard, &released, Some(h.revision)).await {
                tracing::warn!(shard, error = %e, "release failed; the lease will expire instead");
            }
        }
    }

    /// Clean shutdown: stop taking commands, drain every session, release every lease, leave.
    pub async fn leave(&self, host: &Arc<SessionHost>) {
        let shards: Vec<u32> = {
            let mut held = self.lock();
            for h in held.values_mut() {
                h.releasing = true;
            }
            held.keys().copied().collect()
        };
        // Renewals stop with the loop; keep the leases valid while the drain runs.
        let keep_alive = async {
            loop {
                tokio::time::sleep(self.config.renew_every).await;
                let held: Vec<(u32, Held)> = self.lock().iter().map(|(s, h)| (*s, h.clone())).collect();
                for (shard, h) in held {
                    let lease = ShardLease {
                        owner: self.id.clone(),
                        addr: self.addr.clone(),
                        epoch: h.epoch,
                        expires_at_ms: now_ms() + self.config.ttl.as_millis() as u64,
                    };
                    let started = Instant::now();
                    if let Ok(revision) = self.kv.put_lease(shard, &lease, Some(h.revision)).await
                        && let Some(h) = self.lock().get_mut(&shard)
                    {
                        h.revision = revision;
                        h.valid_until = started + self.valid_for();
                    }
                }
            }
        };
        tokio::select! {
            () = self.drain_and_release(host, shards) => {}
            () = keep_alive => {}
        }
        if let Err(e) = self.kv.leave(&self.id).await {
            tracing::warn!(error = %e, "could not remove the heartbeat");
        }
    }
}

impl Ownership for Leases {
    fn accepting(&self, session: &SessionRef) -> Result<u64, Option<String>> {
        let shard = self.shard(session);
        if let Some(h) = self.lock().get(&shard)
            && !h.releasing
            && h.valid_until > Instant::now()
        {
            return Ok(h.epoch);
        }
        let map = self.map.borrow();
        Err(map.owner(shard, now_ms()).filter(|l| l.owner != self.id).map(|l| l.addr.clone()))
    }

    fn may_write(&self, session: &SessionRef, epoch: u64) -> bool {
        let shard = self.shard(session);
        self.lock().get(&shard).is_some_and(|h| h.epoch == epoch && h.valid_until > Instant::now())
    }
}
