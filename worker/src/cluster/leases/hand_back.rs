//! Handing shards back: one shard the rebalance gives up ([`Leases::release`]), or every shard at a clean
//! shutdown ([`Leases::leave`]); both drain the shard's sessions and flush their index entries first.

use std::sync::Arc;
use std::time::Instant;

use turnstile_cluster::ShardLease;
use turnstile_model::shard::shard_of;
use turnstile_ops::clock::now_ms;

use super::{Held, INDEX_FLUSH_PATIENCE, Leases};
use crate::host::SessionHost;

impl Leases {
    /// Hands `shard` back: refuse new commands, drain its sessions, release the lease.
    pub(super) fn release(self: &Arc<Self>, host: &Arc<SessionHost>, shard: u32) {
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
        // The drained sessions' last index entries are written before the next owner may take the shards.
        host.flush_index(INDEX_FLUSH_PATIENCE).await;
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
