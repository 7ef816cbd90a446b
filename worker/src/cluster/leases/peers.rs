//! What this worker knows of its peers' NATS connections ([`crate::cluster::presence`]): who is probed, who is
//! dead, who let a lease lapse, and when a peer's lease runs out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use turnstile_cluster::WorkerInfo;
use turnstile_ops::clock::now_ms;

use super::Leases;
use crate::cluster::presence::Probe;

/// What this worker knows of its peers' NATS connections ([`super::presence`]).
#[derive(Debug, Default)]
pub(super) struct Peers {
    /// Peers that answer presence probes (their heartbeat says so); only these are probed, so a worker of
    /// a build without presence is never taken for dead.
    pub(super) present: HashSet<String>,
    /// Peers whose subscription was gone at two probes in a row: their connection is closed.
    pub(super) dead: HashSet<String>,
    /// Peers that let a lease lapse, with their heartbeat time then: left out of the fair share until
    /// they heartbeat again (a paused peer), so the shares do not flip back as soon as its lapsed leases
    /// have been taken.
    pub(super) lapsed: HashMap<String, u64>,
}

impl Leases {
    /// Resolves when the presence watch found a peer dead (or at once if it did since the last call).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Workers this worker knows to have lost their NATS connection, in order.
    pub fn dead_peers(&self) -> Vec<String> {
        let mut dead: Vec<String> = self.peers().dead.iter().cloned().collect();
        dead.sort_unstable();
        dead
    }

    /// The peers the presence watch should probe now: those that advertise presence, but not this worker.
    pub fn presence_targets(&self) -> Vec<String> {
        let mut targets: Vec<String> = self.peers().present.iter().filter(|p| **p != self.id).cloned().collect();
        targets.sort_unstable();
        targets
    }

    /// Takes in what the presence watch learned about `peer`: [`Probe::Gone`] (confirmed, see
    /// `watch_peers` in [`crate::cluster`]) makes it dead and wakes the lease loop; an answer makes it live
    /// again; a timeout changes nothing.
    pub fn observe(&self, peer: &str, probe: Probe) {
        let newly_dead = {
            let mut peers = self.peers();
            match probe {
                Probe::Present => {
                    if peers.dead.remove(peer) {
                        tracing::info!(peer, "worker answers its presence probes again");
                    }
                    false
                }
                Probe::Unknown => false,
                Probe::Gone => peers.dead.insert(peer.to_owned()),
            }
        };
        if newly_dead {
            tracing::warn!(peer, "worker's NATS connection is gone; taking its shards without waiting for expiry");
            self.wake.notify_one();
        }
    }

    /// Peers to probe from now on: every live heartbeat that advertises presence, and whoever still owns
    /// a lease in the map among the ones probed before (a dead worker's heartbeat expires before long
    /// leases do).
    pub(super) fn track_peers(&self, live: &[WorkerInfo]) {
        let owners: HashSet<String> = {
            let map = self.map.borrow();
            map.leases.values().filter(|e| !e.lease.owner.is_empty()).map(|e| e.lease.owner.clone()).collect()
        };
        let mut peers = self.peers();
        let Peers { present, dead, .. } = &mut *peers;
        present.retain(|p| owners.contains(p));
        present.extend(live.iter().filter(|w| w.presence && w.id != self.id).map(|w| w.id.clone()));
        dead.retain(|p| present.contains(p));
    }

    /// Peers named as the owner of a lease that expired at `now_ms` (they stopped renewing).
    pub(super) fn lapsed_owners(&self, now_ms: u64) -> HashSet<String> {
        if !self.store_settled() {
            return HashSet::new();
        }
        let map = self.map.borrow();
        map.leases
            .values()
            .filter(|e| !e.lease.owner.is_empty() && e.lease.owner != self.id && !e.lease.is_held(now_ms))
            .map(|e| e.lease.owner.clone())
            .collect()
    }

    /// How long until a peer's lease in the map expires, if one does before `within`: the lease loop wakes
    /// then (a paused owner's shards move when its lease runs out, not up to a round later). Healthy
    /// owners renew long before, so this only fires for owners that stopped renewing.
    pub fn next_peer_expiry(&self, within: Duration) -> Option<Duration> {
        let now = now_ms();
        let map = self.map.borrow();
        map.leases
            .values()
            .filter(|e| e.lease.is_held(now) && e.lease.owner != self.id)
            .map(|e| Duration::from_millis(e.lease.expires_at_ms - now))
            .filter(|d| *d < within)
            .min()
    }
}
