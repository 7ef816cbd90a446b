//! The node's mirror of the bucket: a KV watch applied to the in-memory index, skipping the echo of this
//! process's own puts before decoding it (the entry was applied when it was submitted).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::jetstream::kv;
use bytes::Bytes;
use tokio::sync::watch;
use turnstile_model::message::SessionRef;

use crate::index::{IndexEntry, MemoryIndex};

/// The bytes of this process's own puts not yet echoed by the watch, by key: the mirror skips an echo
/// equal to them without decoding it (it applied the entry when it was submitted). Bounded by the sessions
/// this process wrote whose echo has not come.
#[derive(Default)]
pub(super) struct OwnPuts(Mutex<HashMap<String, Bytes>>);

impl OwnPuts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bytes>> {
        // One map operation per critical section: a poisoned lock still holds a consistent map.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn put(&self, key: &str, value: Bytes) {
        self.lock().insert(key.to_owned(), value);
    }

    pub(super) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Whether `value` at `key` is the echo of this process's last put there (consumed if so).
    fn is_echo(&self, key: &str, value: &[u8]) -> bool {
        let mut own = self.lock();
        if own.get(key).is_some_and(|v| v.as_ref() == value) {
            own.remove(key);
            return true;
        }
        false
    }
}

/// What the mirror task keeps: the mirror, whether it has loaded, and this process's own puts.
pub(super) struct Follower {
    pub(super) mirror: Arc<MemoryIndex>,
    pub(super) loaded: watch::Sender<bool>,
    pub(super) own: Arc<OwnPuts>,
    pub(super) echoes_skipped: Arc<std::sync::atomic::AtomicU64>,
}

impl Follower {
    /// Applies one of the bucket's entries (its history first, then each change) to the mirror. The watch
    /// may be opened again with the history ([`crate::jetstream::follow_bucket`]): applying an entry twice
    /// changes nothing, since the mirror keeps each session's entry with the highest `last_seq`.
    pub(super) fn apply(&self, entry: kv::Entry) {
        if (entry.delta == 0 || entry.seen_current) && !*self.loaded.borrow() {
            self.loaded.send_replace(true);
        }
        match entry.operation {
            kv::Operation::Put if self.own.is_echo(&entry.key, &entry.value) => {
                self.echoes_skipped.fetch_add(1, Ordering::Relaxed);
            }
            kv::Operation::Put => match serde_json::from_slice::<IndexEntry>(&entry.value) {
                Ok(indexed) => self.mirror.apply(indexed),
                Err(e) => {
                    tracing::warn!(key = %entry.key, error = %e, "session index entry not readable; skipped")
                }
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some((tenant, id)) = entry.key.split_once('.')
                    && let Ok(session) = SessionRef::new(tenant, id)
                {
                    self.mirror.forget(&session);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_echo_of_the_last_own_put_is_skipped() {
        let own = OwnPuts::default();
        own.put("t.a", Bytes::from_static(b"two"));
        assert!(!own.is_echo("t.a", b"one"), "an older put's echo is decoded");
        assert!(!own.is_echo("t.b", b"two"), "another key's is too");
        assert!(own.is_echo("t.a", b"two"));
        assert!(!own.is_echo("t.a", b"two"), "an echo is skipped once");
    }
}
