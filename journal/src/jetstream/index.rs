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
//!
//! A write that changes nothing but the session's progress (`last_seq`, `last_time_ms`, `last_turn`:
//! [`IndexEntry::same_but_progress`]) against what the bucket holds waits up to [`ACTIVITY_REFRESH`]
//! instead (decision 0198), joined by the session's later changes: a followup's `running` then `idle` is
//! such a write once the window has merged them. What the bucket holds is the mirror's entry when the
//! session's first queued write was submitted (nothing of it was queued, so that entry had been written),
//! kept with the queued write: no map of every session. Removals, status or any other change, and activity
//! moved by the refresh or more are written with the window; a flush or the close writes the waiting ones
//! too.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use turnstile_model::message::SessionRef;

use crate::index::{IndexEntry, MemoryIndex, Query, SessionIndex};
use crate::log::JournalError;

mod mirror;
mod writer;

use mirror::{Follower, OwnPuts};
use writer::writer_task;

/// The bucket of the session index.
pub const INDEX_BUCKET: &str = "turnstile_index";

/// How long the writer gathers entries after the first of a batch before it puts them (decision 0177):
/// short against what a reader of `ListSessions` notices, long against a followup (~1 ms), so a busy
/// session's changes in between cost one put.
pub const WRITE_WINDOW: Duration = Duration::from_millis(100);

/// How long a write that changes nothing but a session's progress (`last_seq`, `last_time_ms`,
/// `last_turn`) may wait (decision 0198): the bucket's activity of a session is never older than this (plus
/// the window) against its owner's. Ordering by last activity and the `updated_after`/`updated_before` filters see activity, so
/// it is bounded: two seconds keep a list ordered by activity right to the second or two a reader of it
/// tells apart (the runner already submits activity alone only once it moved by a second), and cut a busy
/// session's puts to one per two seconds however many followups it takes in them.
pub const ACTIVITY_REFRESH: Duration = Duration::from_secs(2);

fn key(session: &SessionRef) -> String {
    format!("{}.{}", session.tenant, session.id)
}

/// Index writes waiting for the bucket: the latest per session (`None`: remove it). A newer write of a
/// session replaces its queued one, so the queue holds at most one entry per session.
///
/// A write that changes nothing but the session's progress (`last_seq`, `last_time_ms`, `last_turn`:
/// [`IndexEntry::same_but_progress`]) against what the bucket holds waits for the activity refresh ([`ACTIVITY_REFRESH`], decision 0198)
/// instead of the window: a session busy with followups is put once per refresh, not once per followup.
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
    /// How long a write of activity alone may wait ([`ACTIVITY_REFRESH`] unless a test chooses).
    refresh: Duration,
    ready: Notify,
    /// Told the number of writes due (not those waiting for their activity refresh, which wait by design)
    /// after each change: the `turnstile_index_writes_pending` gauge, which an alert reads as NATS away.
    observer: OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
    /// The index is gone: the writer stops once the queue is empty.
    closed: AtomicBool,
    /// Wakes a writer waiting out its window or a refresh (a flush, the index closing).
    cut_window: Notify,
    /// The generation of the last batch written (or tried once): a flush waits for its own.
    written: watch::Sender<u64>,
}

/// One session's queued write.
#[derive(Debug)]
struct Pending {
    /// The entry to put, or `None` to remove the session.
    entry: Option<IndexEntry>,
    /// What the bucket holds for the session as far as this node knows: the mirror's entry when the first
    /// of the queued writes was submitted (nothing was queued, so that entry had been written); `None`:
    /// nothing, or not known. Kept only while a write is queued, so no map of every session is needed.
    held: Option<IndexEntry>,
    /// The generation at which the first of the queued writes was queued (orders the waiting ones).
    first: u64,
    /// When it was queued: a write of activity alone is due a refresh after it.
    since: Instant,
}

impl Pending {
    /// Whether the write changes only the activity of what the bucket holds, and that by less than
    /// `refresh`: then it may wait until `since + refresh`. A removal never waits.
    fn may_wait(&self, refresh: Duration) -> bool {
        let refresh_ms = u64::try_from(refresh.as_millis()).unwrap_or(u64::MAX);
        match (&self.entry, &self.held) {
            (Some(entry), Some(held)) => {
                entry.same_but_progress(held)
                    && entry.summary.last_time_ms < held.summary.last_time_ms.saturating_add(refresh_ms)
            }
            _ => false,
        }
    }

    /// Whether the bucket holds this very entry already (nothing to put).
    fn is_held(&self) -> bool {
        self.entry.is_some() && self.entry == self.held
    }
}

/// The queued writes, and how many writes were ever queued (a flush's generation).
#[derive(Default)]
struct Queue {
    /// Due when the window ends.
    ready: HashMap<SessionRef, Pending>,
    /// Of activity alone: due a refresh after their `since`.
    waiting: HashMap<SessionRef, Pending>,
    /// The waiting sessions by their `first`, which orders them by `since` too (both are taken together
    /// under the lock): the oldest is due first.
    waiting_order: BTreeMap<u64, SessionRef>,
    generation: u64,
    /// A flush waits: the next batch takes everything, the waiting writes too, without a window.
    urgent: bool,
}

impl Queue {
    fn len(&self) -> usize {
        self.ready.len() + self.waiting.len()
    }

    /// Takes `session`'s queued write out, wherever it waits.
    fn remove(&mut self, session: &SessionRef) -> Option<Pending> {
        if let Some(pending) = self.ready.remove(session) {
            return Some(pending);
        }
        let pending = self.waiting.remove(session)?;
        self.waiting_order.remove(&pending.first);
        Some(pending)
    }

    /// Queues `pending` as `session`'s write, ready or waiting as it may; whether the writer should look
    /// again (it is ready, or it is a new deadline).
    fn insert(&mut self, session: SessionRef, pending: Pending, refresh: Duration, was_waiting: bool) -> bool {
        if pending.may_wait(refresh) {
            self.waiting_order.insert(pending.first, session.clone());
            self.waiting.insert(session, pending);
            !was_waiting
        } else {
            self.ready.insert(session, pending);
            true
        }
    }

    /// When the oldest waiting write is due.
    fn next_refresh(&self, refresh: Duration) -> Option<Instant> {
        let (_, session) = self.waiting_order.first_key_value()?;
        // The two maps hold the same sessions; were they ever not to, it is due now rather than never.
        Some(self.waiting.get(session).map_or_else(Instant::now, |p| p.since + refresh))
    }

    /// The ready writes, the waiting ones due by `now` (all of them with `all`), and the generation the
    /// store is at once they are written: that of the queue, or just before the oldest write left waiting.
    fn take(&mut self, now: Instant, refresh: Duration, all: bool) -> (Vec<(SessionRef, Pending)>, u64) {
        let mut batch: Vec<_> = self.ready.drain().collect();
        while let Some((&first, session)) = self.waiting_order.first_key_value() {
            let due = self.waiting.get(session).is_none_or(|p| p.since + refresh <= now);
            if !all && !due {
                break;
            }
            if let Some(session) = self.waiting_order.remove(&first)
                && let Some(pending) = self.waiting.remove(&session)
            {
                batch.push((session, pending));
            }
        }
        let generation = match self.waiting_order.first_key_value() {
            Some((&first, _)) => self.generation.min(first - 1),
            None => self.generation,
        };
        (batch, generation)
    }
}

impl Default for PendingWrites {
    fn default() -> Self {
        Self::new(ACTIVITY_REFRESH)
    }
}

impl std::fmt::Debug for PendingWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrites").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl PendingWrites {
    /// An empty queue whose writes of activity alone wait up to `refresh`.
    pub fn new(refresh: Duration) -> Self {
        Self {
            queue: Mutex::default(),
            refresh,
            ready: Notify::new(),
            observer: OnceLock::new(),
            closed: AtomicBool::new(false),
            cut_window: Notify::new(),
            written: watch::Sender::new(0),
        }
    }

    // Each critical section leaves the maps consistent with each other before it can panic (inserts and
    // removals of one session): a poisoned lock still holds a usable queue.
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, len: usize) {
        if let Some(observer) = self.observer.get() {
            observer(len);
        }
    }

    /// Queues `entry` as `session`'s write, replacing the one queued, not knowing what the bucket holds (so
    /// it is written when the window ends).
    pub fn put(&self, session: SessionRef, entry: Option<IndexEntry>) {
        self.submit(session, entry, None);
    }

    /// Queues `entry` as `session`'s write, replacing the one queued; `held` is what the bucket holds for
    /// the session if nothing of it is queued (the mirror's entry before this one).
    fn submit(&self, session: SessionRef, entry: Option<IndexEntry>, held: Option<IndexEntry>) {
        let (len, look) = {
            let mut queue = self.lock();
            queue.generation += 1;
            let generation = queue.generation;
            let was_waiting = queue.waiting.contains_key(&session);
            let pending = match queue.remove(&session) {
                // What the bucket holds did not change: only the write did.
                Some(pending) => Pending { entry, ..pending },
                None => Pending { entry, held, first: generation, since: Instant::now() },
            };
            let look = queue.insert(session, pending, self.refresh, was_waiting);
            (queue.ready.len(), look)
        };
        self.observe(len);
        if look {
            self.ready.notify_one();
        }
    }

    /// Queues again a write that failed: a newer write of its session queued meanwhile replaces its entry
    /// but not what the bucket holds (the failed write's, which the newer one took for written), nor how
    /// long it has been queued.
    fn retry(&self, session: SessionRef, failed: Pending) {
        let len = {
            let mut queue = self.lock();
            let was_waiting = queue.waiting.contains_key(&session);
            let pending = match queue.remove(&session) {
                Some(newer) => Pending { entry: newer.entry, ..failed },
                None => failed,
            };
            // It was due: it goes back among the ready ones unless a newer write makes it one that may wait.
            queue.insert(session, pending, self.refresh, was_waiting);
            queue.ready.len()
        };
        self.observe(len);
    }

    /// Everything queued, waiting or not, leaving the queue empty.
    pub fn take(&self) -> HashMap<SessionRef, Option<IndexEntry>> {
        let (batch, _) = self.lock().take(Instant::now(), self.refresh, true);
        self.observe(0);
        batch.into_iter().map(|(session, pending)| (session, pending.entry)).collect()
    }

    /// Writes queued now (sessions), waiting ones included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until a write is ready (or a waiting one is due), then `window` more (unless a flush or the
    /// close cuts it short), then takes the ready and due writes with the generation they bring the store
    /// to; everything at once for a flush or the close. `None` once the index is gone and nothing is queued.
    async fn next_batch(&self, window: Duration) -> Option<(Vec<(SessionRef, Pending)>, u64)> {
        loop {
            let notified = self.ready.notified();
            let cut = self.cut_window.notified();
            let closed = self.closed.load(Ordering::SeqCst);
            let refresh = {
                let mut queue = self.lock();
                if queue.len() == 0 {
                    if closed {
                        return None;
                    }
                    // Nothing to write: a flush found it written already (or will once the batch in
                    // flight is).
                    queue.urgent = false;
                    None
                } else if closed || queue.urgent || !queue.ready.is_empty() {
                    break;
                } else {
                    queue.next_refresh(self.refresh)
                }
            };
            match refresh {
                Some(at) if at <= Instant::now() => break,
                Some(at) => tokio::select! {
                    () = notified => {}
                    () = cut => {}
                    () = tokio::time::sleep_until(at) => {}
                },
                None => tokio::select! {
                    () = notified => {}
                    () = cut => {}
                },
            }
        }
        let hurry = self.closed.load(Ordering::SeqCst) || self.lock().urgent;
        if !hurry {
            tokio::select! {
                () = tokio::time::sleep(window) => {}
                () = self.cut_window.notified() => {}
            }
        }
        let (taken, left) = {
            let mut queue = self.lock();
            let all = std::mem::take(&mut queue.urgent) || self.closed.load(Ordering::SeqCst);
            (queue.take(Instant::now(), self.refresh, all), queue.ready.len())
        };
        self.observe(left);
        Some(taken)
    }

    /// The batch of `generation` was written (or tried once).
    fn written(&self, generation: u64) {
        self.written.send_if_modified(|at| {
            let moved = generation > *at;
            *at = (*at).max(generation);
            moved
        });
    }

    /// Resolves once every write queued before the call was written or tried once, waiting ones included.
    fn flush(&self) -> BoxFuture<'static, ()> {
        let mut written = self.written.subscribe();
        let wanted = {
            let mut queue = self.lock();
            if *written.borrow() >= queue.generation {
                return Box::pin(std::future::ready(()));
            }
            queue.urgent = true;
            queue.generation
        };
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
        Self::open_with_periods(client, replicas, window, ACTIVITY_REFRESH).await
    }

    /// [`KvIndex::open_with_window`] with writes of activity alone waiting up to `refresh` instead of
    /// [`ACTIVITY_REFRESH`].
    pub async fn open_with_periods(
        client: &async_nats::Client,
        replicas: usize,
        window: Duration,
        refresh: Duration,
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
        tokio::spawn(super::follow_bucket(store.clone(), watch, "session index", move |entry| follower.apply(entry)));
        let writes = Arc::new(PendingWrites::new(refresh));
        tokio::spawn(writer_task(store, writes.clone(), own, window));
        Ok(Self { mirror, writes, echoes_skipped, loaded })
    }

    /// How many echoes of this process's own puts the mirror skipped without decoding them.
    pub fn echoes_skipped(&self) -> u64 {
        self.echoes_skipped.load(Ordering::Relaxed)
    }

    /// Tells `observer` the number of writes due (not those waiting for their activity refresh) whenever
    /// it changes (a gauge; the journal itself exports no metrics). Set once; later calls are ignored.
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

impl Drop for KvIndex {
    fn drop(&mut self) {
        self.writes.close();
    }
}

impl SessionIndex for KvIndex {
    fn submit(&self, entry: IndexEntry) {
        // The entry the mirror held is what the bucket holds unless a write of the session is queued
        // (decision 0198): the queue compares the new entry with it, so no map of every session's written
        // entry is kept. (A watch echo of another node landing in between only costs a put or a wait.)
        let held = self.mirror.swap(entry.clone());
        self.writes.submit(entry.session.clone(), Some(entry), held);
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
    use turnstile_model::{SessionState, SessionSummary, Status};

    use super::*;

    fn entry(id: &str, last_seq: u64) -> IndexEntry {
        let mut state = SessionState::new(SessionRef::new("t", id).unwrap(), 10);
        state.last_seq = last_seq;
        IndexEntry::of(&state, SessionSummary::of(&state, String::new(), "scripted".into()))
    }

    /// `id`'s entry at `last_seq`, its last activity at `ms`, with `status`.
    fn at(id: &str, last_seq: u64, ms: u64, status: Status) -> IndexEntry {
        let mut e = entry(id, last_seq);
        e.summary.last_time_ms = ms;
        e.summary.status = status;
        e
    }

    fn session(id: &str) -> SessionRef {
        SessionRef::new("t", id).unwrap()
    }

    /// The ids and last seqs of a batch, sorted.
    fn seqs(batch: &[(SessionRef, Pending)]) -> Vec<(String, Option<u64>)> {
        let mut out: Vec<_> =
            batch.iter().map(|(s, p)| (s.id.clone(), p.entry.as_ref().map(|e| e.summary.last_seq))).collect();
        out.sort();
        out
    }

    const WINDOW: Duration = Duration::from_millis(100);
    const REFRESH: Duration = Duration::from_secs(2);

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
        assert_eq!(seqs(&batch), [("a".to_owned(), Some(2))], "one write, the latest");
        // Nothing queued: a flush has nothing to wait for.
        pending.flush().await;
    }

    #[tokio::test]
    async fn a_closed_queue_hands_over_what_it_holds_at_once_then_ends() {
        let pending = PendingWrites::default();
        pending.put(SessionRef::new("t", "a").unwrap(), Some(entry("a", 1)));
        // A write of activity alone goes too: the close does not wait for its refresh.
        pending.submit(session("b"), Some(at("b", 2, 1_001, Status::Idle)), Some(at("b", 1, 1_000, Status::Idle)));
        pending.close();
        let (batch, _) = pending.next_batch(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(batch.len(), 2);
        assert!(pending.next_batch(Duration::from_secs(3600)).await.is_none());
    }

    #[test]
    fn a_failed_write_goes_back_unless_a_newer_one_came() {
        let pending = PendingWrites::default();
        let (a, b) = (SessionRef::new("t", "a").unwrap(), SessionRef::new("t", "b").unwrap());
        pending.put(a.clone(), Some(entry("a", 1)));
        pending.put(b.clone(), Some(entry("b", 1)));
        let (batch, _) = pending.lock().take(Instant::now(), REFRESH, true);
        // While the batch was in flight, a changed again; then both puts failed.
        pending.put(a.clone(), Some(entry("a", 2)));
        for (session, old) in batch {
            pending.retry(session, old);
        }
        let again = pending.take();
        assert_eq!(again[&a].as_ref().map(|e| e.summary.last_seq), Some(2), "the newer entry wins");
        assert_eq!(again[&b].as_ref().map(|e| e.summary.last_seq), Some(1), "the failed one is written again");
    }

    /// Decision 0198: against what the bucket holds, a change of activity alone waits for the refresh;
    /// anything else is written when the window ends.
    #[tokio::test(start_paused = true)]
    async fn a_change_of_activity_alone_waits_for_the_refresh_and_other_writes_do_not() {
        let pending = PendingWrites::new(REFRESH);
        let gauge = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let seen = gauge.clone();
        let _ = pending.observer.set(Box::new(move |n| seen.store(n, Ordering::SeqCst)));
        let idle = at("a", 10, 1_000, Status::Idle);
        // The followup's two changes (running, then idle again) within one window: what is left to write is
        // the held entry but for its activity.
        pending.submit(session("a"), Some(at("a", 11, 1_400, Status::Running)), Some(idle.clone()));
        // The followup's turn is the session's next: its last turn moved too, which no query filters on.
        let mut next_turn = at("a", 13, 1_410, Status::Idle);
        next_turn.summary.last_turn += 1;
        pending.submit(session("a"), Some(next_turn), None);
        let start = Instant::now();
        // A status change, a removal, and activity moved by the refresh or more: all due with the window.
        pending.submit(session("b"), Some(at("b", 2, 1_000, Status::Running)), Some(at("b", 1, 1_000, Status::Idle)));
        pending.submit(session("c"), None, Some(at("c", 1, 1_000, Status::Idle)));
        pending.submit(session("d"), Some(at("d", 2, 3_000, Status::Idle)), Some(at("d", 1, 1_000, Status::Idle)));
        // Nothing known of what the bucket holds (a new session, a mirror still loading): written.
        pending.submit(session("e"), Some(at("e", 1, 1_000, Status::Idle)), None);
        assert_eq!(pending.len(), 5);
        let (batch, generation) = pending.next_batch(WINDOW).await.unwrap();
        assert_eq!(Instant::now() - start, WINDOW, "the window, not the refresh");
        assert_eq!(
            seqs(&batch),
            [("b".into(), Some(2)), ("c".into(), None), ("d".into(), Some(2)), ("e".into(), Some(1))]
        );
        assert_eq!(generation, 0, "the store is not at the waiting write's generation (the first of all)");
        assert_eq!(pending.len(), 1, "a's write waits");
        assert_eq!(gauge.load(Ordering::SeqCst), 0, "the gauge (an alert's: NATS away) counts no write held back");

        // More followups of a within the refresh join its waiting write; the next batch is its refresh,
        // counted from its first change.
        pending.submit(session("a"), Some(at("a", 16, 1_900, Status::Idle)), None);
        let (batch, generation) = pending.next_batch(WINDOW).await.unwrap();
        assert!(Instant::now() - start >= REFRESH, "a write of activity alone waited for its refresh");
        assert_eq!(seqs(&batch), [("a".into(), Some(16))], "the latest activity is written");
        assert_eq!(generation, 7, "everything queued so far");
        assert!(pending.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_write_that_becomes_a_status_change_is_written_with_the_window() {
        let pending = PendingWrites::new(REFRESH);
        let start = Instant::now();
        pending.submit(session("a"), Some(at("a", 2, 1_001, Status::Idle)), Some(at("a", 1, 1_000, Status::Idle)));
        assert!(tokio::time::timeout(WINDOW * 3, pending.next_batch(WINDOW)).await.is_err(), "it waits");
        pending.submit(session("a"), Some(at("a", 3, 1_002, Status::Running)), None);
        let (batch, _) = pending.next_batch(WINDOW).await.unwrap();
        assert_eq!(seqs(&batch), [("a".into(), Some(3))]);
        assert!(Instant::now() - start < REFRESH, "written with the window, not at the refresh");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_writes_the_waiting_writes_too() {
        let pending = Arc::new(PendingWrites::new(REFRESH));
        pending.submit(session("a"), Some(at("a", 2, 1_001, Status::Idle)), Some(at("a", 1, 1_000, Status::Idle)));
        pending.submit(session("b"), Some(at("b", 2, 1_000, Status::Running)), Some(at("b", 1, 1_000, Status::Idle)));
        // A writer's first batch takes b alone and does not count a's write as written.
        let (batch, generation) = pending.next_batch(WINDOW).await.unwrap();
        assert_eq!(seqs(&batch), [("b".into(), Some(2))]);
        pending.written(generation);
        let start = Instant::now();
        let writer = tokio::spawn({
            let pending = pending.clone();
            async move {
                let (batch, generation) = pending.next_batch(WINDOW).await.unwrap();
                pending.written(generation);
                batch
            }
        });
        pending.flush().await;
        assert!(Instant::now() - start < REFRESH, "the flush did not wait for the refresh");
        assert_eq!(seqs(&writer.await.unwrap()), [("a".into(), Some(2))]);
        assert!(pending.is_empty());
    }

    #[test]
    fn a_failed_write_keeps_what_the_bucket_holds_for_the_newer_one() {
        let pending = PendingWrites::new(REFRESH);
        let idle = at("a", 1, 1_000, Status::Idle);
        pending.submit(session("a"), Some(at("a", 2, 1_000, Status::Running)), Some(idle.clone()));
        let (mut batch, _) = pending.lock().take(Instant::now(), REFRESH, false);
        // While the running entry's put was in flight, the session went idle: that write took running for
        // held, so alone it would be a status change; then the put failed.
        pending.submit(session("a"), Some(at("a", 3, 1_010, Status::Idle)), Some(at("a", 2, 1_000, Status::Running)));
        let (s, failed) = batch.remove(0);
        pending.retry(s, failed);
        let queue = pending.lock();
        let waiting = queue.waiting.get(&session("a")).expect("the bucket still holds idle: activity alone, waiting");
        assert_eq!(waiting.held, Some(idle));
        assert_eq!(waiting.entry.as_ref().map(|e| e.summary.last_seq), Some(3));
        assert!(queue.ready.is_empty());
    }

    #[test]
    fn a_write_the_bucket_holds_already_is_not_put() {
        let held = at("a", 1, 1_000, Status::Idle);
        let pending = Pending { entry: Some(held.clone()), held: Some(held), first: 1, since: Instant::now() };
        assert!(pending.is_held());
        let removal = Pending { entry: None, held: None, first: 1, since: Instant::now() };
        assert!(!removal.is_held(), "a removal is always written");
    }
}
