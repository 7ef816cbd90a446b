//! Wake-ups of sessions that are not loaded (SPEC §15): a session whose only pending timer is a schedule's
//! next firing may park and be passivated like any idle session; the host keeps the time it must be loaded
//! again here, and its waker task loads (or resumes) it then, so the driver's timer fires the schedule.
//!
//! Entries are set when a runner parks or unloads (from its driver's next timer) and when a new owner
//! scans the sessions of a shard it acquired (from their folds). An entry for a session this worker no
//! longer owns is dropped when it comes due.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use turnstile_model::SessionRef;

use crate::sync::lock;

#[derive(Default)]
struct Entries {
    by_time: BTreeSet<(u64, SessionRef)>,
    by_session: HashMap<SessionRef, u64>,
}

/// When each unloaded session must be woken, in Unix ms.
#[derive(Default)]
pub(crate) struct Wakes {
    entries: Mutex<Entries>,
    /// Wakes the waker task when an earlier entry arrives.
    changed: tokio::sync::Notify,
}

impl Wakes {
    /// Sets (or with `None` clears) the time `session` must be woken.
    pub(crate) fn set(&self, session: &SessionRef, at_ms: Option<u64>) {
        let earlier = {
            let mut entries = lock(&self.entries);
            if let Some(old) = entries.by_session.remove(session) {
                entries.by_time.remove(&(old, session.clone()));
            }
            let Some(at) = at_ms else { return };
            let earlier = entries.by_time.first().is_none_or(|(first, _)| at < *first);
            entries.by_time.insert((at, session.clone()));
            entries.by_session.insert(session.clone(), at);
            earlier
        };
        if earlier {
            self.changed.notify_one();
        }
    }

    /// The earliest wake-up.
    pub(crate) fn next(&self) -> Option<u64> {
        lock(&self.entries).by_time.first().map(|(at, _)| *at)
    }

    /// Removes and returns the sessions due at `now_ms`.
    pub(crate) fn take_due(&self, now_ms: u64) -> Vec<SessionRef> {
        let mut entries = lock(&self.entries);
        let mut due = Vec::new();
        while let Some((at, _)) = entries.by_time.first()
            && *at <= now_ms
        {
            if let Some((_, session)) = entries.by_time.pop_first() {
                entries.by_session.remove(&session);
                due.push(session);
            }
        }
        due
    }

    /// Resolves when an entry earlier than the ones before was set.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).by_session.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_due_in_time_order_and_a_new_time_replaces_the_old() {
        let wakes = Wakes::default();
        let s = |id: &str| SessionRef::new("t", id).unwrap();
        wakes.set(&s("a"), Some(30));
        wakes.set(&s("b"), Some(10));
        wakes.set(&s("a"), Some(20));
        assert_eq!(wakes.next(), Some(10));
        assert_eq!(wakes.take_due(25), vec![s("b"), s("a")]);
        wakes.set(&s("c"), Some(5));
        wakes.set(&s("c"), None);
        assert_eq!((wakes.next(), wakes.len()), (None, 0));
    }
}
