//! Passivation: a parked driver whose session stayed idle past `passivate_after` is dropped (its state is
//! in the log; nothing is written), so an idle session costs nothing until its next command loads it. So is
//! the fold an import holds once its importer has gone away.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use turnstile_model::SessionRef;

use super::SessionHost;
use super::table::Slot;
use crate::sync::lock;

/// Parked drivers dropped per hold of the table's lock, so commands of other sessions wait at most one
/// chunk while a crowd of sessions passivates at once.
const PASSIVATE_AT_ONCE: usize = 1024;

/// More drivers than this are freed on the blocking pool, off the runtime threads that serve requests.
const FREE_INLINE: usize = 64;

impl SessionHost {
    /// Starts, once, the task that passivates parked drivers: it drops each once its `until` has passed
    /// and ends with the host. The due ones come from the front of the table's parking queue (nothing is
    /// walked that is not due), a chunk per hold of the lock, and a large crowd of drivers is freed on the
    /// blocking pool (decision 0178).
    pub(super) fn start_sweep(&self) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let every = (self.deps.config.passivate_after / 8).clamp(Duration::from_millis(10), Duration::from_secs(30));
        let (table, log) = (Arc::downgrade(&self.table), self.deps.log.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(table) = table.upgrade() else { return };
                let now = tokio::time::Instant::now();
                lock(&table).drop_stale_imports();
                loop {
                    let (dropped, more): (Vec<(SessionRef, Slot)>, bool) =
                        lock(&table).take_due(now, PASSIVATE_AT_ONCE);
                    if !dropped.is_empty() {
                        tracing::debug!(sessions = dropped.len(), "passivated idle sessions");
                    }
                    for (session, _) in &dropped {
                        log.unloaded(session);
                    }
                    // The drivers are freed outside the lock.
                    if dropped.len() > FREE_INLINE {
                        drop(tokio::task::spawn_blocking(move || drop(dropped)));
                    } else {
                        drop(dropped);
                    }
                    if !more {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
    }
}
