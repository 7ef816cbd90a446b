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

impl SessionHost {
    /// Starts, once, the task that passivates parked drivers: it drops each once its `until` has passed
    /// and ends with the host.
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
                let dropped: Vec<(SessionRef, Slot)> = {
                    let mut table = lock(&table);
                    table.drop_stale_imports();
                    let due: Vec<SessionRef> = table
                        .runners
                        .iter()
                        .filter(|(_, slot)| matches!(slot, Slot::Parked(p) if p.until <= now))
                        .map(|(s, _)| s.clone())
                        .collect();
                    due.into_iter().filter_map(|s| table.runners.remove_entry(&s)).collect()
                };
                if !dropped.is_empty() {
                    tracing::debug!(sessions = dropped.len(), "passivated idle sessions");
                }
                for (session, _) in &dropped {
                    log.unloaded(session);
                }
                // The drivers are freed here, outside the lock.
                drop(dropped);
            }
        });
    }
}
