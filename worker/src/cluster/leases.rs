//! Shard leases: which virtual shards this worker owns, under which epoch, until when.
//!
//! Every `renew_every` the lease loop heartbeats into `turnstile_workers`, renews each held lease by CAS,
//! drops the ones it lost or let lapse (stopping their sessions at once), computes the fair share
//! ceil(V / live workers), acquires free or expired shards up to it (each acquisition takes epoch + 1 and
//! resumes the shard's running sessions, SPEC §6), and hands back shards above it (drain, snapshot,
//! release) so the next owner starts at once instead of waiting for expiry.
//!
//! A peer whose NATS connection is gone ([`super::presence`]) is dead: it no longer counts towards the fair
//! share and its leases are taken at once with the next epoch, without waiting for them to expire. The
//! presence watch wakes the loop as soon as it knows.
//!
//! A NATS node that dies takes with it the requests in flight through it and, for a few seconds (its
//! streams' leader elections, 4–9 s in nats-server), the lease bucket when it led it (decision 0094). So
//! every call to the lease store is bounded well inside the lease ([`Leases::store_timeout`]); a renewal
//! the store did not answer keeps the lease for up to [`STORE_GRACE`] more while the store stays away (no
//! one can take a lease the store cannot write), instead of stopping every session of the worker; a
//! renewal refused because our own unanswered write landed adopts it; and after an outage a worker judges
//! no peer "lapsed" and takes no peer's expired lease until the store has answered it for a whole TTL,
//! since an outage lets every lease expire alike (a worker left with no lease to renew reads one entry a
//! round until the store answers, or it would never see the outage end: decision 0174).
//!
//! Safety does not rest on this loop being timely: [`Leases::may_write`] compares against a local deadline
//! taken *before* each renewal request, so a worker that was paused past its lease refuses to write
//! when it wakes, and the conditional append refuses any writer whose view of the log is stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{Notify, watch};
use turnstile_cluster::{CasError, ClusterKv, LeaseConfig, ShardLease, ShardMap, WorkerInfo};
use turnstile_model::SessionRef;
use turnstile_model::shard::{fnv1a64, shard_of};
use turnstile_ops::clock::now_ms;

use turnstile_ops::names;

mod hand_back;
mod peers;
mod store_health;

use crate::host::SessionHost;
use crate::ownership::Ownership;
use crate::sync::lock;
use peers::Peers;
use store_health::StoreHealth;

/// Lease acquisitions in flight at once (each is a read and a compare-and-set).
const ACQUIRE_AT_ONCE: usize = 16;

/// How long a hand-over waits for the index writes of its sessions (decision 0177) before it releases
/// the leases anyway: a few of the writer's windows; the next owner repairs what is still missing.
const INDEX_FLUSH_PATIENCE: Duration = Duration::from_secs(2);

/// How much longer than its TTL a held lease stays valid while the lease store does not answer its
/// renewals (decision 0094): longer than a JetStream leader election of the bucket's stream after its
/// leader's node died (nats-server waits 4–9 s before it elects), so a worker keeps serving through one.
/// Nobody can take the lease meanwhile (every take is a compare-and-set through the same store), and
/// should someone take it as the store comes back, the newer epoch in the map and the conditional append
/// fence this worker's writes as they do for a taken lease of a dead peer.
pub const STORE_GRACE: Duration = Duration::from_secs(10);

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
    peers: Mutex<Peers>,
    /// Wakes the lease loop before its next round (a peer was found dead).
    wake: Notify,
    /// The shard-lease bucket's answers to this worker.
    store: Mutex<StoreHealth>,
    /// The heartbeat bucket's (`turnstile_workers`): who counts as live comes from it.
    workers_store: Mutex<StoreHealth>,
    /// What readiness reads ([`Leases::serving`]): the live workers the last rebalance counted, and
    /// whether this worker has held its share since it started.
    share: Mutex<Share>,
}

/// Where this worker stands against its share of the shards (decision 0160).
#[derive(Clone, Copy, Debug, Default)]
struct Share {
    /// Live workers (this one included) at the last rebalance; 0 until the first one.
    live: usize,
    /// It has held at least its share once: from then on only holding no shard at all makes it unready,
    /// so the few seconds in which survivors take a dead peer's shards do not take every worker out of
    /// its Service at once.
    reached: bool,
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
        Arc::new(Self {
            id,
            addr,
            kv,
            config,
            held: Mutex::new(HashMap::new()),
            map,
            peers: Mutex::new(Peers::default()),
            wake: Notify::new(),
            store: Mutex::new(StoreHealth::new()),
            workers_store: Mutex::new(StoreHealth::new()),
            share: Mutex::new(Share::default()),
        })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Whether this worker serves its share of the shards, for `/readyz` (decision 0160): until it has
    /// held `shards / live workers` (rounded down) of them, it is joining, and not ready; after that, it is
    /// not ready only while it holds none. A cluster with more workers than shards gives a share of 0: such
    /// a worker is ready once it has counted its peers.
    pub fn serving(&self) -> Result<(), String> {
        let Share { live, reached } = *lock(&self.share);
        let shards = self.config.shards as usize;
        if live == 0 {
            return Err("joining: has not counted the live workers yet".to_owned());
        }
        let (held, share) = (self.active(), shards / live);
        if held >= share || (reached && held > 0) {
            return Ok(());
        }
        let state = if reached { "holds no shard lease" } else { "joining" };
        Err(format!("{state}: holds {held} of its {share} shards ({shards} shards, {live} live workers)"))
    }

    /// Shards held and not being handed back.
    fn active(&self) -> usize {
        self.lock().values().filter(|h| !h.releasing).count()
    }

    /// The shards held now, in order.
    pub fn held_shards(&self) -> Vec<u32> {
        let mut shards: Vec<u32> = self.lock().keys().copied().collect();
        shards.sort_unstable();
        shards
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Held>> {
        lock(&self.held)
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Peers> {
        lock(&self.peers)
    }

    /// The bound on one call to the lease store: a third of the TTL (at least 100 ms), so that a request
    /// lost with a dying NATS node (the client waits for its reply until its own 5 s timeout) fails in time
    /// for the next renewal instead of stalling the loop past every lease.
    pub fn store_timeout(&self) -> Duration {
        (self.config.ttl / 3).max(Duration::from_millis(100))
    }

    /// `call`, bounded by [`Leases::store_timeout`]; no answer in time is a store error.
    async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, CasError>>,
    ) -> Result<T, CasError> {
        match tokio::time::timeout(self.store_timeout(), call).await {
            Ok(result) => result,
            Err(_) => Err(CasError::Store(turnstile_cluster::MembershipError::Unavailable(format!(
                "{what}: no answer within {} ms",
                self.store_timeout().as_millis()
            )))),
        }
    }

    /// Records what the lease store answered: any answer (a refusal too) ends an outage.
    fn store_answered(&self, answered: bool) {
        if lock(&self.store).record(answered) {
            tracing::info!("the lease store answers again");
        }
    }

    /// Records what the heartbeat bucket answered.
    fn workers_store_answered(&self, answered: bool) {
        if lock(&self.workers_store).record(answered) {
            tracing::info!("the heartbeat store answers again");
        }
    }

    /// Whether both buckets have answered this worker for at least a TTL: only then is a peer's expired
    /// lease, or its missing heartbeat, evidence that the peer stopped (an outage of either, or a leader
    /// election of its stream, lets every lease expire or every heartbeat age out alike).
    fn store_settled(&self) -> bool {
        lock(&self.store).settled(self.config.ttl) && lock(&self.workers_store).settled(self.config.ttl)
    }

    /// Until when `h` may be used: its local deadline, or [`STORE_GRACE`] past it while the store does not
    /// answer, if the outage began while the lease was still valid (a worker paused past its lease gets
    /// no grace when it wakes).
    fn deadline(&self, h: &Held) -> Instant {
        match lock(&self.store).failing_since {
            Some(since) if since < h.valid_until => h.valid_until + STORE_GRACE,
            _ => h.valid_until,
        }
    }

    /// The map names a newer epoch for `shard` than `epoch`: someone took the shard over.
    fn superseded(&self, shard: u32, epoch: u64) -> bool {
        self.map.borrow().leases.get(&shard).is_some_and(|e| e.lease.epoch > epoch)
    }

    fn shard(&self, session: &SessionRef) -> u32 {
        shard_of(session, self.config.shards)
    }

    fn valid_for(&self) -> Duration {
        self.config.ttl.mul_f64(0.9)
    }

    /// Records this worker as live.
    pub async fn heartbeat(&self) {
        let info = WorkerInfo {
            id: self.id.clone(),
            addr: self.addr.clone(),
            capacity: 1,
            heartbeat_ms: now_ms(),
            presence: true,
        };
        let beat = tokio::time::timeout(self.store_timeout(), self.kv.heartbeat(&info)).await;
        self.workers_store_answered(matches!(beat, Ok(Ok(()))));
        match beat {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(timeout_ms = self.store_timeout().as_millis() as u64, "heartbeat not answered"),
        }
    }

    /// One round: heartbeat, renew, drop lapsed, rebalance.
    pub async fn tick(self: &Arc<Self>, host: &Arc<SessionHost>) {
        self.heartbeat().await;
        self.renew(host).await;
        self.drop_lapsed(host);
        self.rebalance_now(host).await;
    }

    /// Recomputes the fair share and acquires or hands back shards towards it, without renewing: what the
    /// lease loop does between rounds when a peer died or a peer's lease ran out.
    pub async fn rebalance_now(self: &Arc<Self>, host: &Arc<SessionHost>) {
        // Bounded like one call: a listing that waits on a consumer lost with a dying node would hold up
        // the next renewal past the leases (a round that takes longer than the TTL lets them expire).
        let listed = tokio::time::timeout(self.store_timeout(), self.kv.live_workers(now_ms(), self.config.worker_ttl))
            .await
            .unwrap_or_else(|_| Err(turnstile_cluster::MembershipError::Unavailable("no answer in time".into())));
        self.workers_store_answered(listed.is_ok());
        match listed {
            Ok(live) => {
                self.track_peers(&live);
                // A dead peer's heartbeat outlives it by up to `worker_ttl`, and so does a paused one's; a
                // peer that is dead, or that let a lease lapse, is not doing its share, so its share is ours
                // to split now rather than when its heartbeat expires.
                let expired = self.lapsed_owners(now_ms());
                let alive = {
                    let mut peers = self.peers();
                    for w in live.iter().filter(|w| expired.contains(&w.id)) {
                        peers.lapsed.insert(w.id.clone(), w.heartbeat_ms);
                    }
                    peers.lapsed.retain(|id, then| live.iter().any(|w| w.id == *id && w.heartbeat_ms <= *then));
                    live.iter().filter(|w| !peers.dead.contains(&w.id) && !peers.lapsed.contains_key(&w.id)).count()
                };
                self.rebalance(host, alive.max(1)).await;
                let mut share = lock(&self.share);
                share.live = alive.max(1);
                share.reached |= self.active() >= self.config.shards as usize / share.live;
            }
            Err(e) => tracing::warn!(error = %e, "cannot list workers; not rebalancing this round"),
        }
        metrics::gauge!(names::SHARDS_OWNED).set(self.lock().len() as f64);
    }

    async fn renew(&self, host: &Arc<SessionHost>) {
        let held: Vec<(u32, Held)> = self.lock().iter().map(|(s, h)| (*s, h.clone())).collect();
        if held.is_empty() {
            self.probe_store().await;
        }
        let renewals = futures::stream::iter(held)
            .map(|(shard, h)| async move {
                let started = Instant::now();
                let lease = ShardLease {
                    owner: self.id.clone(),
                    addr: self.addr.clone(),
                    epoch: h.epoch,
                    expires_at_ms: now_ms() + self.config.ttl.as_millis() as u64,
                };
                let renewed = self.bounded("lease renewal", self.kv.put_lease(shard, &lease, Some(h.revision))).await;
                let renewed = match renewed {
                    Err(CasError::Lost { .. }) => self.adopt_own_write(shard, &h, &lease, started).await,
                    other => other,
                };
                (shard, started, renewed)
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        let mut lost = Vec::new();
        if !renewals.is_empty() {
            self.store_answered(renewals.iter().any(|(_, _, r)| !matches!(r, Err(CasError::Store(_)))));
        }
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
                    // Keep the lease; it lapses by its local deadline (and the grace) if the store stays away.
                    Err(CasError::Store(e)) => {
                        metrics::counter!(names::LEASE_RENEW_FAILURES, "reason" => "error").increment(1);
                        tracing::warn!(shard, error = %e, "lease renewal failed");
                    }
                }
            }
        }
        self.stop_shards(host, &lost);
    }

    /// Asks the lease store one read while it is recorded as failing and this worker holds no lease to
    /// renew (decision 0174). Only renewals and acquisitions record its answers, and while it is failing a
    /// worker takes no peer's expired lease: one whose leases all lapsed in an outage, and whose shards all
    /// name a live peer, would otherwise ask the store nothing again and never see the outage end.
    async fn probe_store(&self) {
        if lock(&self.store).failing_since.is_none() {
            return;
        }
        let read = self.bounded("lease read", async { self.kv.lease(0).await.map_err(CasError::Store) }).await;
        self.store_answered(read.is_ok());
    }

    /// A renewal refused as "changed under us": when the entry still names this worker under the same
    /// epoch, the change was our own earlier renewal that landed after its call gave up waiting (a request
    /// lost with a dying NATS node); renew again on that revision instead of giving the shard up.
    async fn adopt_own_write(
        &self,
        shard: u32,
        h: &Held,
        lease: &ShardLease,
        started: Instant,
    ) -> Result<u64, CasError> {
        let lost = CasError::Lost { shard };
        let current = self.bounded("lease read", async { self.kv.lease(shard).await.map_err(CasError::Store) }).await?;
        match current {
            Some(c) if c.lease.owner == self.id && c.lease.epoch == h.epoch && started.elapsed() < self.valid_for() => {
                tracing::info!(shard, "lease renewal found our own earlier renewal in place; renewing on it");
                self.bounded("lease renewal", self.kv.put_lease(shard, lease, Some(c.revision))).await
            }
            _ => Err(lost),
        }
    }

    fn drop_lapsed(&self, host: &Arc<SessionHost>) {
        let now = Instant::now();
        let lapsed: Vec<u32> = {
            let mut held = self.lock();
            let lapsed: Vec<u32> = held.iter().filter(|(_, h)| self.deadline(h) <= now).map(|(s, _)| *s).collect();
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
        let wanted = wanted.min(self.config.max_acquire_per_tick);
        let dead = self.peers().dead.clone();
        // Right after a store outage every lease looks expired: only free ones, our own and a dead peer's
        // are taken then, until the store has answered for a TTL and the peers renewed theirs.
        let settled = self.store_settled();
        let takeable = |l: &ShardLease, now: u64| {
            (!l.is_held(now) && (settled || l.owner.is_empty())) || l.owner == self.id || dead.contains(&l.owner)
        };
        // Every takeable shard, not just `wanted` of them: survivors of a dead peer race for the same
        // shards, and one that loses a race goes on to the next instead of waiting for its next round.
        let candidates: Vec<u32> = {
            let map = self.map.borrow();
            let held = self.lock();
            let mut candidates: Vec<u32> = (0..v)
                .map(|i| (offset + i) % v)
                .filter(|s| !held.contains_key(s))
                .filter(|s| map.leases.get(s).is_none_or(|e| takeable(&e.lease, now)))
                .collect();
            // Our own first (a lease we let lapse): taking a peer's instead would move two shards.
            candidates.sort_by_key(|s| map.leases.get(s).is_none_or(|e| e.lease.owner != self.id));
            candidates
        };
        // A few at a time, never more than still wanted (an acquisition beyond the share would be handed
        // back at once): a dead peer's shards are all taken within a few round trips.
        let mut acquired = Vec::new();
        let mut from_dead = 0usize;
        let mut candidates = candidates.into_iter();
        while acquired.len() < wanted {
            let batch: Vec<u32> = candidates.by_ref().take((wanted - acquired.len()).min(ACQUIRE_AT_ONCE)).collect();
            if batch.is_empty() {
                break;
            }
            let outcomes =
                futures::future::join_all(batch.into_iter().map(|shard| self.try_acquire(shard, &takeable))).await;
            let mut store_failed = false;
            for outcome in outcomes {
                match outcome {
                    Ok(Some((shard, was_dead))) => {
                        acquired.push(shard);
                        from_dead += usize::from(was_dead);
                    }
                    Ok(None) => {}
                    Err(()) => store_failed = true,
                }
            }
            if store_failed {
                break;
            }
        }
        if from_dead > 0 {
            tracing::warn!(count = from_dead, worker = %self.id, "took over shards of dead workers before their leases expired");
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

    /// Takes `shard` if it is still takeable when read: `Some((shard, held by a dead peer))` if this worker
    /// holds it now, `None` if someone else got it first, `Err` if the store failed (stop acquiring).
    async fn try_acquire(
        &self,
        shard: u32,
        takeable: &impl Fn(&ShardLease, u64) -> bool,
    ) -> Result<Option<(u32, bool)>, ()> {
        let started = Instant::now();
        let current =
            match self.bounded("lease read", async { self.kv.lease(shard).await.map_err(CasError::Store) }).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(shard, error = %e, "cannot read lease");
                    return Err(());
                }
            };
        if let Some(c) = &current
            && !takeable(&c.lease, now_ms())
        {
            return Ok(None);
        }
        // Taking a live-looking lease of a dead peer is safe: the next epoch fences its writes (`may_write`
        // sees the newer epoch in the map, its renewal's CAS fails, and the conditional append refuses any
        // stale view of the log).
        let was_dead = current.as_ref().is_some_and(|c| c.lease.is_held(now_ms()) && c.lease.owner != self.id);
        if was_dead && let Some(c) = &current {
            tracing::debug!(shard, from = %c.lease.owner, epoch = c.lease.epoch + 1, "taking over a dead worker's shard");
        }
        let epoch = current.as_ref().map_or(1, |c| c.lease.epoch + 1);
        let lease = ShardLease {
            owner: self.id.clone(),
            addr: self.addr.clone(),
            epoch,
            expires_at_ms: now_ms() + self.config.ttl.as_millis() as u64,
        };
        let taken =
            self.bounded("lease acquisition", self.kv.put_lease(shard, &lease, current.map(|c| c.revision))).await;
        self.store_answered(!matches!(taken, Err(CasError::Store(_))));
        match taken {
            Ok(revision) => {
                let held = Held { epoch, revision, valid_until: started + self.valid_for(), releasing: false };
                self.lock().insert(shard, held);
                Ok(Some((shard, was_dead)))
            }
            // Workers that start together race for the same free shards: losing is expected, not a fault.
            Err(CasError::Lost { .. }) => {
                tracing::debug!(shard, "another worker took the shard first");
                Ok(None)
            }
            Err(CasError::Store(e)) => {
                tracing::warn!(shard, error = %e, "cannot acquire lease");
                Err(())
            }
        }
    }
}

impl Ownership for Leases {
    fn accepting(&self, session: &SessionRef) -> Result<u64, Option<String>> {
        let shard = self.shard(session);
        let now = Instant::now();
        let epoch = self.lock().get(&shard).filter(|h| !h.releasing && self.deadline(h) > now).map(|h| h.epoch);
        if let Some(epoch) = epoch
            && !self.superseded(shard, epoch)
        {
            return Ok(epoch);
        }
        let map = self.map.borrow();
        Err(map.owner(shard, now_ms()).filter(|l| l.owner != self.id).map(|l| l.addr.clone()))
    }

    fn may_write(&self, session: &SessionRef, epoch: u64) -> bool {
        let shard = self.shard(session);
        // A taker may act before this lease expires (a peer that saw our NATS connection drop): its newer
        // epoch in the map stops us before the next renewal would tell.
        let now = Instant::now();
        self.lock().get(&shard).is_some_and(|h| h.epoch == epoch && self.deadline(h) > now)
            && !self.superseded(shard, epoch)
    }
}
