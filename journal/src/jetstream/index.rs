//! The session index on JetStream (SPEC §16, decision 0069): one KV entry per session in the bucket
//! `turnstile_index` under `<tenant>.<id>`, written by the session's owner, mirrored in memory by every node
//! through a KV watch; queries read the mirror.
//!
//! Writes never hold the owner up: [`KvIndex::submit`] applies the entry to the local mirror and queues it;
//! one writer task puts the latest entry of each queued session, concurrently across sessions and in order
//! for one session. The queue ([`PendingWrites`]) keeps one entry per session, the latest (an index needs
//! only that), so it stays bounded by the sessions this node changed however long NATS is away
//! (decision 0090); a failed put goes back in unless a newer entry of its session came meanwhile, and is
//! tried again after a pause. An entry lost to a crash is written again when the session is next loaded
//! (its new owner submits what it folded) or changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use tokio::sync::{Notify, watch};
use turnstile_model::message::SessionRef;

use crate::index::{IndexEntry, MemoryIndex, Query, SessionIndex};
use crate::log::JournalError;

/// The bucket of the session index.
pub const INDEX_BUCKET: &str = "turnstile_index";

/// Puts in flight at once, across sessions.
const MAX_CONCURRENT_PUTS: usize = 64;

/// The pause after a batch with failed puts, doubling up to [`MAX_RETRY_PAUSE`] while puts keep failing.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

fn key(session: &SessionRef) -> String {
    format!("{}.{}", session.tenant, session.id)
}

/// Index writes waiting for the bucket: the latest per session (`None`: remove it). A newer write of a
/// session replaces its queued one, so the queue holds at most one entry per session.
///
/// ```
/// use turnstile_journal::jetstream::PendingWrites;
/// use turnstile_model::SessionRef;
/// let pending = PendingWrites::default();
/// let s = SessionRef::new("acme", "s1").unwrap();
/// for _ in 0..1000 {
///     pending.put(s.clone(), None);
/// }
/// assert_eq!(pending.len(), 1);
/// ```
#[derive(Default)]
pub struct PendingWrites {
    entries: Mutex<HashMap<SessionRef, Option<IndexEntry>>>,
    ready: Notify,
    /// Told the queue's length after each change (the `turnstile_index_writes_pending` gauge).
    observer: OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
    /// The index is gone: the writer stops once the queue is empty.
    closed: AtomicBool,
}

impl std::fmt::Debug for PendingWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrites").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl PendingWrites {
    // Each critical section is one map operation: a poisoned lock still holds a consistent map.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionRef, Option<IndexEntry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, len: usize) {
        if let Some(observer) = self.observer.get() {
            observer(len);
        }
    }

    /// Queues `entry` as `session`'s write, replacing the one queued.
    pub fn put(&self, session: SessionRef, entry: Option<IndexEntry>) {
        let len = {
            let mut entries = self.lock();
            entries.insert(session, entry);
            entries.len()
        };
        self.observe(len);
        self.ready.notify_one();
    }

    /// Queues again a write that failed, unless a newer one of its session is queued already.
    pub fn retry(&self, session: SessionRef, entry: Option<IndexEntry>) {
        let len = {
            let mut entries = self.lock();
            entries.entry(session).or_insert(entry);
            entries.len()
        };
        self.observe(len);
    }

    /// Everything queued, leaving the queue empty.
    pub fn take(&self) -> HashMap<SessionRef, Option<IndexEntry>> {
        let taken = std::mem::take(&mut *self.lock());
        self.observe(0);
        taken
    }

    /// Writes queued now (sessions).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until something is queued, then takes it all; `None` once the index is gone and nothing is.
    async fn next_batch(&self) -> Option<HashMap<SessionRef, Option<IndexEntry>>> {
        loop {
            let notified = self.ready.notified();
            let batch = self.take();
            if !batch.is_empty() {
                return Some(batch);
            }
            if self.closed.load(Ordering::SeqCst) {
                return None;
            }
            notified.await;
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.ready.notify_one();
    }
}

/// [`SessionIndex`] on a JetStream KV bucket with an in-memory mirror.
pub struct KvIndex {
    mirror: Arc<MemoryIndex>,
    writes: Arc<PendingWrites>,
    /// Whether the mirror has caught up with the bucket's history (set once, by the mirror task).
    loaded: watch::Sender<bool>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex").field("bucket", &INDEX_BUCKET).field("mirror", &self.mirror).finish()
    }
}

impl KvIndex {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket and starts the mirror's watch and
    /// the writer. Queries see the whole index once [`SessionIndex::is_loaded`].
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let description = "Turnstile session index (status, agent, parent, labels, last activity)";
        let store = super::open_bucket(client, INDEX_BUCKET, description, replicas).await?;
        let mirror = Arc::new(MemoryIndex::default());
        let loaded = watch::Sender::new(false);
        // Like the bucket, the status and the watch wait out a leader election of its stream.
        let (empty, watch) = super::while_starting("the session index watch", || async {
            let empty = store.status().await.map_err(unavailable)?.values() == 0;
            Ok::<_, JournalError>((empty, store.watch_with_history(">").await.map_err(unavailable)?))
        })
        .await?;
        if empty {
            loaded.send_replace(true);
        }
        tokio::spawn(mirror_task(store.clone(), watch, mirror.clone(), loaded.clone()));
        let writes = Arc::new(PendingWrites::default());
        tokio::spawn(writer_task(store, writes.clone()));
        Ok(Self { mirror, writes, loaded })
    }

    /// Tells `observer` the number of queued writes whenever it changes (a gauge; the journal itself
    /// exports no metrics). Set once; later calls are ignored.
    pub fn observe_pending(self, observer: impl Fn(usize) + Send + Sync + 'static) -> Self {
        let _ = self.writes.observer.set(Box::new(observer));
        self
    }

    /// Writes queued for the bucket now (one per session at most).
    pub fn pending_writes(&self) -> usize {
        self.writes.len()
    }
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("session index: {e}"))
}

/// Applies the bucket's entries (its history first, then each change) to `mirror`. A watch that ends (its
/// stream's leader moved, NATS restarted) is opened again with the history: applying an entry twice changes
/// nothing, since the mirror keeps each session's entry with the highest `last_seq`.
async fn mirror_task(store: kv::Store, first: kv::Watch, mirror: Arc<MemoryIndex>, loaded: watch::Sender<bool>) {
    let mut watch = first;
    loop {
        follow(&mut watch, &mirror, &loaded).await;
        tracing::warn!("session index watch ended; reopening it");
        watch = loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            match store.watch_with_history(">").await {
                Ok(watch) => break watch,
                Err(e) => tracing::warn!(error = %e, "cannot reopen the session index watch yet; the mirror may lag"),
            }
        };
    }
}

/// Applies `watch`'s entries to `mirror` until the watch ends.
async fn follow(watch: &mut kv::Watch, mirror: &MemoryIndex, loaded: &watch::Sender<bool>) {
    while let Some(entry) = watch.next().await {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "session index watch failed; the index mirror may lag");
                continue;
            }
        };
        if (entry.delta == 0 || entry.seen_current) && !*loaded.borrow() {
            loaded.send_replace(true);
        }
        match entry.operation {
            kv::Operation::Put => match serde_json::from_slice::<IndexEntry>(&entry.value) {
                Ok(indexed) => mirror.apply(indexed),
                Err(e) => tracing::warn!(key = %entry.key, error = %e, "session index entry not readable; skipped"),
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some((tenant, id)) = entry.key.split_once('.')
                    && let Ok(session) = SessionRef::new(tenant, id)
                {
                    mirror.forget(&session);
                }
            }
        }
    }
}

/// Puts the queued entries: everything queued is taken at once (the latest per session), written
/// concurrently, then the next batch; the failed ones go back in the queue and wait out a pause that grows
/// while puts keep failing. Ends when the index is dropped and its last writes are put (or failed once).
async fn writer_task(store: kv::Store, queue: Arc<PendingWrites>) {
    let mut pause = RETRY_PAUSE;
    while let Some(batch) = queue.next_batch().await {
        let failed = Mutex::new(Vec::new());
        futures::stream::iter(batch)
            .for_each_concurrent(MAX_CONCURRENT_PUTS, |(session, entry)| {
                let (store, failed) = (store.clone(), &failed);
                async move {
                    let result = match &entry {
                        Some(indexed) => match serde_json::to_vec(indexed) {
                            Ok(bytes) => {
                                store.put(key(&session), bytes.into()).await.map(|_| ()).map_err(|e| e.to_string())
                            }
                            // Not retried: the same entry would fail the same way.
                            Err(e) => {
                                tracing::warn!(%session, error = %e, "session index entry not encodable; skipped");
                                return;
                            }
                        },
                        None => store.purge(key(&session)).await.map_err(|e| e.to_string()),
                    };
                    if let Err(e) = result {
                        tracing::debug!(%session, error = %e, "session index not written; queued again");
                        failed.lock().unwrap_or_else(PoisonError::into_inner).push((session, entry));
                    }
                }
            })
            .await;
        let failed = failed.into_inner().unwrap_or_else(PoisonError::into_inner);
        if failed.is_empty() {
            pause = RETRY_PAUSE;
            continue;
        }
        if queue.closed.load(Ordering::SeqCst) {
            tracing::warn!(
                failed = failed.len(),
                "session index writes failed as the index closed; written at next load"
            );
            return;
        }
        tracing::warn!(
            failed = failed.len(),
            retry_in_ms = pause.as_millis() as u64,
            "session index writes failed; retrying"
        );
        for (session, entry) in failed {
            queue.retry(session, entry);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

impl Drop for KvIndex {
    fn drop(&mut self) {
        self.writes.close();
    }
}

impl SessionIndex for KvIndex {
    fn submit(&self, entry: IndexEntry) {
        self.mirror.apply(entry.clone());
        self.writes.put(entry.session.clone(), Some(entry));
    }

    fn remove(&self, session: &SessionRef) {
        self.mirror.forget(session);
        self.writes.put(session.clone(), None);
    }

    fn get(&self, session: &SessionRef) -> Option<IndexEntry> {
        self.mirror.get(session)
    }

    fn query(&self, query: &Query) -> Vec<IndexEntry> {
        self.mirror.query(query)
    }

    fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    fn loaded(&self) -> watch::Receiver<bool> {
        self.loaded.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use turnstile_model::{SessionState, SessionSummary};

    use super::*;

    fn entry(id: &str, last_seq: u64) -> IndexEntry {
        let mut state = SessionState::new(SessionRef::new("t", id).unwrap(), 10);
        state.last_seq = last_seq;
        IndexEntry::of(&state, SessionSummary::of(&state, String::new(), "scripted".into()))
    }

    #[test]
    fn the_queue_keeps_the_latest_write_of_each_session_and_no_more() {
        let pending = PendingWrites::default();
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let gauge = seen.clone();
        let _ = pending.observer.set(Box::new(move |n| gauge.store(n, Ordering::SeqCst)));
        // NATS away: a thousand changes of three sessions queue three writes.
        for seq in 1..=1000 {
            for id in ["a", "b", "c"] {
                pending.put(SessionRef::new("t", id).unwrap(), Some(entry(id, seq)));
            }
        }
        pending.put(SessionRef::new("t", "c").unwrap(), None);
        assert_eq!(pending.len(), 3);
        assert_eq!(seen.load(Ordering::SeqCst), 3, "the gauge follows the queue");
        let batch = pending.take();
        assert_eq!(batch[&SessionRef::new("t", "a").unwrap()].as_ref().map(|e| e.summary.last_seq), Some(1000));
        assert_eq!(batch[&SessionRef::new("t", "c").unwrap()], None, "the removal replaced the entry");
        assert!(pending.is_empty());
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_failed_write_goes_back_unless_a_newer_one_came() {
        let pending = PendingWrites::default();
        let (a, b) = (SessionRef::new("t", "a").unwrap(), SessionRef::new("t", "b").unwrap());
        pending.put(a.clone(), Some(entry("a", 1)));
        pending.put(b.clone(), Some(entry("b", 1)));
        let batch = pending.take();
        // While the batch was in flight, a changed again; then both puts failed.
        pending.put(a.clone(), Some(entry("a", 2)));
        for (session, old) in batch {
            pending.retry(session, old);
        }
        let again = pending.take();
        assert_eq!(again[&a].as_ref().map(|e| e.summary.last_seq), Some(2), "the newer entry wins");
        assert_eq!(again[&b].as_ref().map(|e| e.summary.last_seq), Some(1), "the failed one is written again");
    }
}
