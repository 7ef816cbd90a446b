//! The schedule waker (SPEC §15): loads an unloaded session when its next schedule firing is due
//! ([`crate::wakes::Wakes`]), so its driver's timer fires.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::SessionHost;

/// The longest the waker sleeps, so a host dropped meanwhile ends its task soon.
const LONGEST_SLEEP_MS: u64 = 30_000;

impl SessionHost {
    /// Starts, once, the task that starts (or resumes) the runner of each session whose firing is due. A
    /// session this worker no longer owns is skipped: its new owner scanned it when it took the shard. The
    /// task ends with the host.
    pub(super) fn start_waker(&self) {
        if self.waking.swap(true, Ordering::Relaxed) {
            return;
        }
        let (me, wakes) = (self.me.clone(), self.deps.wakes.clone());
        tokio::spawn(async move {
            loop {
                let now = turnstile_ops::clock::now_ms();
                let wait = wakes.next().map_or(LONGEST_SLEEP_MS, |at| at.saturating_sub(now)).min(LONGEST_SLEEP_MS);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    () = wakes.changed() => {}
                }
                let Some(host) = me.upgrade() else { return };
                for session in wakes.take_due(turnstile_ops::clock::now_ms()) {
                    let Ok(epoch) = host.epoch_for(&session) else { continue };
                    match host.runner(&session, epoch, &mut None) {
                        Ok(_) => tracing::debug!(%session, "woke a session for its schedule"),
                        Err(e) => tracing::warn!(%session, error = %e, "could not wake a session for its schedule"),
                    }
                }
            }
        });
    }
}
