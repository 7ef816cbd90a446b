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
//!
//! The writer gathers for [`WRITE_WINDOW`] after the first entry of a batch before it puts (decision
//! 0177): a session changed several times in the window costs one put, not one per change, so the puts
//! leave the followup's path. [`SessionIndex::flush`] cuts the window short and waits for the batch (a
//! shard handed over, the process stopping). The mirror knows the bytes of this process's own puts and
//! skips their echo from the watch before decoding it: the entry was applied when it was submitted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
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

/// How long the writer gathers entries after the first of a batch before it puts them (decision 0177):
/// short against what a reader of `ListSessions` notices, long against a followup (~1 ms), so a busy
/// session's changes in between cost one put.
pub const WRITE_WINDOW: Duration = Duration::from_millis(100);

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
pub struct PendingWrites {
    queue: Mutex<Queue>,
    ready: Notify,
    /// Told the queue's length after each change (the `turnstile_index_writes_pending` gauge).
    observer: OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
    /// The index is gone: the writer stops once the queue is empty.
    closed: AtomicBool,
    /// A flush waits: the writer puts what is queued without waiting out its window.
    urgent: AtomicBool,
    /// Wakes a writer waiting out its window (a flush, the index closing).
    cut_window: Notify,
    /// The generation of the last batch written (or tried once): a flush waits for its own.
    written: watch::Sender<u64>,
}

/// The queued writes, and how many writes were ever queued (a flush's generation).
#[derive(Default)]
struct Queue {
    entries: HashMap<SessionRef, Option<IndexEntry>>,
    generation: u64,
}

impl Default for PendingWrites {
    fn default() -> Self {
        Self {
            queue: Mutex::default(),
            ready: Notify::new(),
            observer: OnceLock::new(),
            closed: AtomicBool::new(false),
            urgent: AtomicBool::new(false),
            cut_window: Notify::new(),
            written: watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for PendingWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrites").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl PendingWrites {
    // Each critical section is one map operation and a counter: a poisoned lock still holds a consistent
    // queue.
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, len: usize) {
        if let Some(observer) = self.observer.get() {
            observer(len);
        }
    }

    /// Queues `entry` as `session`'s write, replacing the one queued.
    pub fn put(&self, session: SessionRef, entry: Option<IndexEntry>) {
        let len = {
            let mut queue = self.lock();
            queue.entries.insert(session, entry);
            queue.generation += 1;
            queue.entries.len()
        };
        self.observe(len);
        self.ready.notify_one();
    }

    /// Queues again a write that failed, unless a newer one of its session is queued already.
    pub fn retry(&self, session: SessionRef, entry: Option<IndexEntry>) {
        let len = {
            let mut queue = self.lock();
            queue.entries.entry(session).or_insert(entry);
            queue.entries.len()
        };
        self.observe(len);
    }

    /// Everything queued, leaving the queue empty.
    pub fn take(&self) -> HashMap<SessionRef, Option<IndexEntry>> {
        self.take_with_generation().0
    }

    /// Everything queued and the generation it brings the store to once written.
    fn take_with_generation(&self) -> (HashMap<SessionRef, Option<IndexEntry>>, u64) {
        let taken = {
            let mut queue = self.lock();
            (std::mem::take(&mut queue.entries), queue.generation)
        };
        self.observe(0);
        taken
    }

    /// Writes queued now (sessions).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until something is queued, then `window` more (unless a flush or the close cuts it short), then
    /// takes it all with its generation; `None` once the index is gone and nothing is queued.
    async fn next_batch(&self, window: Duration) -> Option<(HashMap<SessionRef, Option<IndexEntry>>, u64)> {
        loop {
            let notified = self.ready.notified();
            if !self.is_empty() {
                break;
            }
            if self.closed.load(Ordering::SeqCst) {
                return None;
            }
            notified.await;
        }
        if !self.closed.load(Ordering::SeqCst) && !self.urgent.swap(false, Ordering::SeqCst) {
            tokio::select! {
                () = tokio::time::sleep(window) => {}
                () = self.cut_window.notified() => {}
            }
        }
        self.urgent.store(false, Ordering::SeqCst);
        Some(self.take_with_generation())
    }

    /// The batch of `generation` was written (or tried once).
    fn written(&self, generation: u64) {
        self.written.send_if_modified(|at| {
            let moved = generation > *at;
            *at = (*at).max(generation);
            moved
        });
    }

    /// Resolves once every write queued before the call was written or tried once.
    fn flush(&self) -> BoxFuture<'static, ()> {
        let wanted = self.lock().generation;
        let mut written = self.written.subscribe();
        if *written.borrow() >= wanted {
            return Box::pin(std::future::ready(()));
        }
        self.urgent.store(true, Ordering::SeqCst);
        self.cut_window.notify_one();
        // A writer that is gone drops the sender: nothing more will be written, so the flush is over.
        Box::pin(async move {
            let _ = written.wait_for(|at| *at >= wanted).await;
        })
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.ready.notify_one();
        self.cut_window.notify_one();
    }
}

/// The bytes of this process's own puts not yet echoed by the watch, by key: the mirror skips an echo
/// equal to them without decoding it (it applied the entry when it was submitted). Bounded by the sessions
/// this process wrote whose echo has not come.
#[derive(Default)]
struct OwnPuts(Mutex<HashMap<String, Bytes>>);

impl OwnPuts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bytes>> {
        // One map operation per critical section: a poisoned lock still holds a consistent map.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, key: &str, value: Bytes) {
        self.lock().insert(key.to_owned(), value);
    }

    fn forget(&self, key: &str) {
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

/// [`SessionIndex`] on a JetStream KV bucket with an in-memory mirror.
pub struct KvIndex {
    mirror: Arc<MemoryIndex>,
    writes: Arc<PendingWrites>,
    /// Counted echoes skipped (tests read it; the skip is invisible otherwise).
    echoes_skipped: Arc<std::sync::atomic::AtomicU64>,
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
        Self::open_with_window(client, replicas, WRITE_WINDOW).await
    }

    /// [`KvIndex::open`] with the writer gathering for `window` instead of [`WRITE_WINDOW`] (tests take an
    /// hour, so that only a flush or the close writes).
    pub async fn open_with_window(
        client: &async_nats::Client,
        replicas: usize,
        window: Duration,
    ) -> Result<Self, JournalError> {
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
        let own = Arc::new(OwnPuts::default());
        let echoes_skipped = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let follower = Follower {
            mirror: mirror.clone(),
            loaded: loaded.clone(),
            own: own.clone(),
            echoes_skipped: echoes_skipped.clone(),
        };
        tokio::spawn(mirror_task(store.clone(), watch, follower));
        let writes = Arc::new(PendingWrites::default());
        tokio::spawn(writer_task(store, writes.clone(), own, window));
        Ok(Self { mirror, writes, echoes_skipped, loaded })
    }

    /// How many echoes of this process's own puts the mirror skipped without decoding them.
    pub fn echoes_skipped(&self) -> u64 {
        self.echoes_skipped.load(Ordering::Relaxed)
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
async fn mirror_task(store: kv::Store, first: kv::Watch, follower: Follower) {
    let mut watch = first;
    loop {
        follower.follow(&mut watch).await;
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

/// What the mirror task keeps: the mirror, whether it has loaded, and this process's own puts.
struct Follower {
    mirror: Arc<MemoryIndex>,
    loaded: watch::Sender<bool>,
    own: Arc<OwnPuts>,
    echoes_skipped: Arc<std::sync::atomic::AtomicU64>,
}

impl Follower {
    /// Applies `watch`'s entries to the mirror until the watch ends.
    async fn follow(&self, watch: &mut kv::Watch) {
        while let Some(entry) = watch.next().await {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(error = %e, "session index watch failed; the index mirror may lag");
                    continue;
                }
            };
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
}

/// Puts the queued entries: `window` after the first entry of a batch, everything queued is taken at
/// once (the latest per session), written concurrently, then the next batch; the failed ones go back in
/// the queue and wait out a pause that grows while puts keep failing. Ends when the index is dropped and
/// its last writes are put (or failed once).
async fn writer_task(store: kv::Store, queue: Arc<PendingWrites>, own: Arc<OwnPuts>, window: Duration) {
    let mut pause = RETRY_PAUSE;
    while let Some((batch, generation)) = queue.next_batch(window).await {
        let failed = Mutex::new(Vec::new());
        futures::stream::iter(batch)
            .for_each_concurrent(MAX_CONCURRENT_PUTS, |(session, entry)| {
                let (store, failed, own) = (store.clone(), &failed, &own);
                async move {
                    let key = key(&session);
                    let result = match &entry {
                        Some(indexed) => match serde_json::to_vec(indexed) {
                            Ok(bytes) => {
                                let bytes = Bytes::from(bytes);
                                // Known before the put, so an echo that beats the ack is skipped too.
                                own.put(&key, bytes.clone());
                                store.put(key, bytes).await.map(|_| ()).map_err(|e| e.to_string())
                            }
                            // Not retried: the same entry would fail the same way.
                            Err(e) => {
                                tracing::warn!(%session, error = %e, "session index entry not encodable; skipped");
                                return;
                            }
                        },
                        None => {
                            own.forget(&key);
                            store.purge(key).await.map_err(|e| e.to_string())
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(%session, error = %e, "session index not written; queued again");
                        failed.lock().unwrap_or_else(PoisonError::into_inner).push((session, entry));
                    }
                }
            })
            .await;
        queue.written(generation);
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

    fn flush(&self) -> BoxFuture<'static, ()> {
        self.writes.flush()
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

    #[tokio::test]
    async fn a_batch_waits_out_its_window_unless_a_flush_cuts_it_short() {
        let pending = Arc::new(PendingWrites::default());
        let s = SessionRef::new("t", "a").unwrap();
        pending.put(s.clone(), Some(entry("a", 1)));
        // An hour's window: only the flush can end it.
        let writer = tokio::spawn({
            let pending = pending.clone();
            async move {
                let (batch, generation) = pending.next_batch(Duration::from_secs(3600)).await.unwrap();
                pending.written(generation);
                batch
            }
        });
        // Changes while the window is open join the same batch.
        pending.put(s.clone(), Some(entry("a", 2)));
        pending.flush().await;
        let batch = writer.await.unwrap();
        assert_eq!(batch[&s].as_ref().map(|e| e.summary.last_seq), Some(2), "one write, the latest");
        // Nothing queued: a flush has nothing to wait for.
        pending.flush().await;
    }

    #[tokio::test]
    async fn a_closed_queue_hands_over_what_it_holds_at_once_then_ends() {
        let pending = PendingWrites::default();
        pending.put(SessionRef::new("t", "a").unwrap(), Some(entry("a", 1)));
        pending.close();
        let (batch, _) = pending.next_batch(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(batch.len(), 1);
        assert!(pending.next_batch(Duration::from_secs(3600)).await.is_none());
    }

    #[test]
    fn only_the_echo_of_the_last_own_put_is_skipped() {
        let own = OwnPuts::default();
        own.put("t.a", Bytes::from_static(b"two"));
        assert!(!own.is_echo("t.a", b"one"), "an older put's echo is decoded");
        assert!(!own.is_echo("t.b", b"two"), "another key's is too");
        assert!(own.is_echo("t.a", b"two"));
        assert!(!own.is_echo("t.a", b"two"), "an echo is skipped once");
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
