//! What a gateway holds for its Watch streams, bounded in bytes (decision 0088).
//!
//! Each watcher has two queues: its **backlog**, the shared feed's items it has not taken yet (the feed
//! pushes into it and never waits), and its **send queue**, the items its task has made ready for the
//! connection. The task waits while the send queue holds a quarter of the watcher's bytes (backpressure:
//! a long history is read from the log no faster than the client takes it); the backlog cannot wait, so a
//! watcher whose backlog and send queue together would pass [`BufferLimits::per_watcher`] has fallen
//! behind its session and is **cut**: both queues are dropped at once and its stream ends with
//! UNAVAILABLE naming the last durable seq its connection took (`reconnect with after_seq = N`, and the
//! `resume-after-seq` trailer), which is where every client already resumes a lost Watch. The same
//! happens to a watcher that holds bytes while the gateway's total passes [`BufferLimits::total`]. A
//! watcher with nothing queued always takes one more item, so an item larger than the limits still gets
//! through and every watcher keeps moving.
//!
//! The total counts each byte once: a feed item shared by many watchers is charged when the feed makes it
//! and released when the last watcher lets go of it ([`Held`]); an item the task made for one watcher is
//! charged while it waits in that watcher's send queue.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::{Notify, watch};
use tonic::Status;
use tonic::metadata::MetadataValue;
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;

use crate::feed_item::FeedItem;

mod connection;
pub use connection::{EncodedItemStream, ItemStream};

/// Default [`BufferLimits::per_watcher`]: 4 MiB.
pub const DEFAULT_PER_WATCHER_BYTES: usize = 4 * 1024 * 1024;

/// Default [`BufferLimits::total`]: 256 MiB.
pub const DEFAULT_TOTAL_BYTES: usize = 256 * 1024 * 1024;

/// The trailer of a cut stream that names the last durable seq its connection took.
pub const RESUME_AFTER_SEQ: &str = "resume-after-seq";

/// A watcher's send queue may hold `per_watcher / SEND_SHARE` bytes before its task waits; the rest is
/// room for the backlog while the client is slow.
const SEND_SHARE: usize = 4;

/// The byte bounds of a gateway's Watch buffers (config `limits.watch_buffer_bytes`,
/// `limits.watch_buffer_total_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLimits {
    /// Bytes one watcher may hold, backlog and send queue together, before it is cut.
    pub per_watcher: usize,
    /// Bytes every watcher of the gateway may hold together before the ones holding any are cut.
    pub total: usize,
}

impl Default for BufferLimits {
    fn default() -> Self {
        Self { per_watcher: DEFAULT_PER_WATCHER_BYTES, total: DEFAULT_TOTAL_BYTES }
    }
}

/// The Watch buffers of one gateway: their limits and the bytes they hold. Cheap to clone.
#[derive(Clone)]
pub struct WatchBuffers {
    budget: Arc<Budget>,
}

struct Budget {
    limits: BufferLimits,
    total: AtomicUsize,
    /// Bumped when a charge takes the total past its limit: watchers waiting for their connection
    /// re-check the total and the ones holding bytes step aside.
    pressure: watch::Sender<u64>,
}

impl std::fmt::Debug for WatchBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchBuffers").field("limits", &self.budget.limits).field("held", &self.held()).finish()
    }
}

impl WatchBuffers {
    pub fn new(limits: BufferLimits) -> Self {
        let limits = BufferLimits { per_watcher: limits.per_watcher.max(1), total: limits.total.max(1) };
        let (pressure, _) = watch::channel(0);
        Self { budget: Arc::new(Budget { limits, total: AtomicUsize::new(0), pressure }) }
    }

    pub fn limits(&self) -> BufferLimits {
        self.budget.limits
    }

    /// Bytes the gateway's Watch buffers hold now.
    pub fn held(&self) -> usize {
        self.budget.total.load(Ordering::SeqCst)
    }

    /// A feed item as watchers hold it, its bytes counted in the total until the last holder drops it.
    /// It is encoded here, once: every watcher's connection sends these same bytes (decision 0178).
    pub fn hold(&self, item: FeedItem) -> Arc<Held> {
        let encoded = item.watch_item().map(|i| Bytes::from(i.encode_to_vec())).unwrap_or_default();
        let bytes = encoded.len();
        Arc::new(Held { item, bytes, encoded, _charge: self.budget.charge(bytes) })
    }

    /// A new watcher of `session` whose client has every durable event up to `after_seq`: the handle its
    /// task sends through and the stream its connection reads.
    pub fn watcher(&self, session: &SessionRef, after_seq: u64) -> (Outbound, ItemStream) {
        let watcher = Arc::new(Watcher {
            session: session.clone(),
            budget: self.budget.clone(),
            state: Mutex::new(State { taken: after_seq, ..State::default() }),
            to_task: Notify::new(),
            to_connection: Notify::new(),
        });
        let stream = connection::item_stream(watcher.clone());
        let pressure = self.budget.pressure.subscribe();
        (Outbound { watcher, pressure }, stream)
    }
}

impl Budget {
    fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        let total = self.total.fetch_add(bytes, Ordering::SeqCst) + bytes;
        metrics::gauge!(turnstile_ops::names::WATCH_BUFFERED_BYTES).set(total as f64);
        if total > self.limits.total {
            self.pressure.send_modify(|generation| *generation = generation.wrapping_add(1));
        }
        Charge { budget: self.clone(), bytes }
    }

    fn over(&self) -> bool {
        self.total.load(Ordering::SeqCst) > self.limits.total
    }
}

/// Bytes counted in the total while this lives.
struct Charge {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let total = self.budget.total.fetch_sub(self.bytes, Ordering::SeqCst) - self.bytes;
        metrics::gauge!(turnstile_ops::names::WATCH_BUFFERED_BYTES).set(total as f64);
    }
}

/// A feed item shared by the watchers that hold it.
pub struct Held {
    pub item: FeedItem,
    /// Its encoded size: what it counts for in every buffer it waits in.
    pub bytes: usize,
    /// The item as sent (empty for a feed's end), shared by every watcher's connection.
    encoded: Bytes,
    _charge: Charge,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("item", &self.item).field("bytes", &self.bytes).finish()
    }
}

/// One item of a send queue: a feed item as it is, or one the task made for this watcher.
enum Outgoing {
    Shared(Arc<Held>),
    Own { item: Box<pb::WatchItem>, bytes: usize, _charge: Charge },
}

impl Outgoing {
    fn bytes(&self) -> usize {
        match self {
            Self::Shared(held) => held.bytes,
            Self::Own { bytes, .. } => *bytes,
        }
    }

    /// The durable seq it brings its client to, if any.
    fn durable_seq(&self) -> Option<u64> {
        match self {
            Self::Shared(held) => held.item.durable_seq(),
            Self::Own { item, .. } => durable_seq(item),
        }
    }

    fn into_item(self) -> Option<pb::WatchItem> {
        match self {
            Self::Shared(held) => held.item.watch_item().cloned(),
            Self::Own { item, .. } => Some(*item),
        }
    }

    /// The item's bytes as sent: the feed's shared buffer as it is (no copy, no encode), or this watcher's
    /// own item encoded now.
    fn into_encoded(self) -> Option<Bytes> {
        match self {
            Self::Shared(held) => held.item.watch_item().is_some().then(|| held.encoded.clone()),
            Self::Own { item, .. } => Some(Bytes::from(item.encode_to_vec())),
        }
    }
}

/// Why a watcher was cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Its own bytes passed the per-watcher limit.
    Behind,
    /// The gateway's total passed its limit while it held bytes.
    GatewayFull,
}

impl Cut {
    fn label(self) -> &'static str {
        match self {
            Self::Behind => "behind",
            Self::GatewayFull => "gateway_full",
        }
    }
}

/// How a watcher's stream ends.
#[derive(Default)]
enum End {
    #[default]
    Open,
    /// After the send queue, this status (none: the stream just ends).
    Finished(Option<Status>),
    /// The connection went away.
    Gone,
}

#[derive(Default)]
struct State {
    backlog: VecDeque<Arc<Held>>,
    backlog_bytes: usize,
    queue: VecDeque<Outgoing>,
    queue_bytes: usize,
    /// The last durable seq the connection took (at first, the one the client asked to watch after): where
    /// its client resumes after a cut.
    taken: u64,
    end: End,
}

impl State {
    fn bytes(&self) -> usize {
        self.backlog_bytes + self.queue_bytes
    }

    fn open(&self) -> bool {
        matches!(self.end, End::Open)
    }

    /// Ends the stream with `status` right away; returns what the queues held, to be dropped outside the
    /// lock.
    fn cut(&mut self, status: Status) -> Dropped {
        self.end = End::Finished(Some(status));
        self.drain()
    }

    fn drain(&mut self) -> Dropped {
        self.backlog_bytes = 0;
        self.queue_bytes = 0;
        (std::mem::take(&mut self.backlog), std::mem::take(&mut self.queue))
    }
}

type Dropped = (VecDeque<Arc<Held>>, VecDeque<Outgoing>);

/// One watcher's queues, shared by the feed (backlog in), its task (backlog out, send queue in) and its
/// connection (send queue out).
pub(crate) struct Watcher {
    session: SessionRef,
    budget: Arc<Budget>,
    state: Mutex<State>,
    /// Wakes the task: the backlog grew, the send queue has room, or the stream ended.
    to_task: Notify,
    /// Wakes the connection: the send queue grew, or the stream ended.
    to_connection: Notify,
}

impl Watcher {
    // Every critical section leaves the state consistent, so a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        turnstile_model::sync::lock(&self.state)
    }

    /// The feed's item for this watcher: queued, or the watcher is cut when it would pass its limit (or
    /// holds bytes while the gateway is over its total).
    pub(crate) fn push(&self, held: &Arc<Held>) {
        let dropped = {
            let mut state = self.lock();
            if !state.open() {
                return;
            }
            let holding = state.bytes();
            let cut = if holding == 0 {
                None
            } else if holding + held.bytes > self.budget.limits.per_watcher {
                Some(Cut::Behind)
            } else if self.budget.over() {
                Some(Cut::GatewayFull)
            } else {
                None
            };
            match cut {
                None => {
                    state.backlog_bytes += held.bytes;
                    state.backlog.push_back(held.clone());
                    None
                }
                Some(cut) => Some(self.cut_locked(&mut state, cut, holding + held.bytes)),
            }
        };
        self.to_task.notify_one();
        if dropped.is_some() {
            self.to_connection.notify_one();
        }
    }

    /// The feed ended: `item` (its end) is queued whatever the limits, so the task learns why.
    pub(crate) fn push_end(&self, held: &Arc<Held>) {
        {
            let mut state = self.lock();
            if !state.open() {
                return;
            }
            state.backlog_bytes += held.bytes;
            state.backlog.push_back(held.clone());
        }
        self.to_task.notify_one();
    }

    fn cut_locked(&self, state: &mut State, cut: Cut, bytes: usize) -> Dropped {
        let limits = self.budget.limits;
        let taken = state.taken;
        let why = match cut {
            Cut::Behind => format!(
                "{bytes} bytes were waiting for this client, above config limits.watch_buffer_bytes = {}",
                limits.per_watcher
            ),
            Cut::GatewayFull => format!(
                "the gateway's Watch buffers hold more than config limits.watch_buffer_total_bytes = {} and this \
                 stream had {bytes} bytes waiting for its client",
                limits.total
            ),
        };
        tracing::debug!(session = %self.session, reason = cut.label(), bytes, taken, "a watcher fell behind and was cut");
        metrics::counter!(turnstile_ops::names::WATCH_CUTS, "reason" => cut.label()).increment(1);
        let message = format!(
            "this Watch of session {} fell behind: {why}; reconnect with after_seq = {taken} (the last seq this \
             stream sent)",
            self.session
        );
        state.cut(resumable(message, taken))
    }
}

/// UNAVAILABLE with `message` and the [`RESUME_AFTER_SEQ`] trailer: every client resumes a Watch on it.
pub fn resumable(message: String, after_seq: u64) -> Status {
    let mut status = Status::unavailable(message);
    status.metadata_mut().insert(RESUME_AFTER_SEQ, MetadataValue::from(after_seq));
    status
}

/// The task's side of one watcher: takes the feed's items, sends items to the connection, ends the stream.
/// Dropping it ends the stream (after what is queued) if the task did not.
pub struct Outbound {
    watcher: Arc<Watcher>,
    pressure: watch::Receiver<u64>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").field("session", &self.watcher.session).finish_non_exhaustive()
    }
}

/// The stream has ended: the connection went away, or it was cut or finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended;

impl Outbound {
    pub(crate) fn watcher(&self) -> &Arc<Watcher> {
        &self.watcher
    }

    /// The next feed item of this watcher's backlog; `Err` once the stream has ended.
    pub async fn recv(&self) -> Result<Arc<Held>, Ended> {
        loop {
            let notified = self.watcher.to_task.notified();
            {
                let mut state = self.watcher.lock();
                if !state.open() {
                    return Err(Ended);
                }
                if let Some(held) = state.backlog.pop_front() {
                    state.backlog_bytes -= held.bytes;
                    return Ok(held);
                }
            }
            notified.await;
        }
    }

    /// Sends `item` (made for this watcher), waiting while the send queue is full.
    pub async fn send(&mut self, item: pb::WatchItem) -> Result<(), Ended> {
        let bytes = item.encoded_len();
        let charge = self.watcher.budget.charge(bytes);
        self.enqueue(Outgoing::Own { item: Box::new(item), bytes, _charge: charge }).await
    }

    /// Sends the feed's `held` item as it is, waiting while the send queue is full.
    pub async fn forward(&mut self, held: Arc<Held>) -> Result<(), Ended> {
        self.enqueue(Outgoing::Shared(held)).await
    }

    async fn enqueue(&mut self, out: Outgoing) -> Result<(), Ended> {
        let room = (self.watcher.budget.limits.per_watcher / SEND_SHARE).max(1);
        let bytes = out.bytes();
        let mut out = Some(out);
        loop {
            let notified = self.watcher.to_task.notified();
            self.pressure.borrow_and_update();
            let dropped = {
                let mut state = self.watcher.lock();
                if !state.open() {
                    return Err(Ended);
                }
                if state.queue_bytes == 0 || state.queue_bytes + bytes <= room {
                    let Some(out) = out.take() else { return Err(Ended) };
                    state.queue_bytes += bytes;
                    state.queue.push_back(out);
                    drop(state);
                    self.watcher.to_connection.notify_one();
                    return Ok(());
                }
                // Waiting on a client while the gateway is over its total: this watcher steps aside.
                self.watcher.budget.over().then(|| {
                    let holding = state.bytes();
                    self.watcher.cut_locked(&mut state, Cut::GatewayFull, holding)
                })
            };
            if dropped.is_some() {
                drop(dropped);
                self.watcher.to_connection.notify_one();
                return Err(Ended);
            }
            tokio::select! {
                () = notified => {}
                // The sender lives in the budget this watcher holds, so this never fails.
                _ = self.pressure.changed() => {}
            }
        }
    }

    /// Ends the stream with `status` after what is queued (the feed or the log failed).
    pub fn finish(&self, status: Status) {
        {
            let mut state = self.watcher.lock();
            if !state.open() {
                return;
            }
            state.end = End::Finished(Some(status));
        }
        self.watcher.to_connection.notify_one();
    }

    /// Ends the stream now with the status `make` builds from the last durable seq the connection took;
    /// what is queued is dropped.
    pub fn cut(&self, make: impl FnOnce(u64) -> Status) {
        let dropped = {
            let mut state = self.watcher.lock();
            if !state.open() {
                return;
            }
            let status = make(state.taken);
            state.cut(status)
        };
        drop(dropped);
        self.watcher.to_connection.notify_one();
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        let ended = {
            let mut state = self.watcher.lock();
            let ended = state.open();
            if ended {
                let taken = state.taken;
                let message = format!(
                    "the Watch of session {} stopped; reconnect with after_seq = {taken}",
                    self.watcher.session
                );
                state.end = End::Finished(Some(resumable(message, taken)));
            }
            // The backlog has no reader any more.
            let backlog = std::mem::take(&mut state.backlog);
            state.backlog_bytes = 0;
            drop(state);
            drop(backlog);
            ended
        };
        if ended {
            self.watcher.to_connection.notify_one();
        }
    }
}

/// The durable seq `item` brings its client to, if any.
pub(crate) fn durable_seq(item: &pb::WatchItem) -> Option<u64> {
    match &item.item {
        Some(pb::watch_item::Item::Event(e)) => Some(e.seq),
        Some(pb::watch_item::Item::CaughtUp(c)) => Some(c.seq),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use turnstile_proto::v1::watch_item::Item;

    use super::*;
    use crate::feed_item::FeedItem;

    fn session() -> SessionRef {
        SessionRef::new("t", "s").unwrap()
    }

    fn event(seq: u64, text_bytes: usize) -> pb::WatchItem {
        let event = pb::SessionEvent { seq, r#type: "x".repeat(text_bytes), ..pb::SessionEvent::default() };
        pb::WatchItem { item: Some(Item::Event(event)) }
    }

    fn durable(buffers: &WatchBuffers, seq: u64, text_bytes: usize) -> Arc<Held> {
        buffers.hold(FeedItem::Durable { seq, item: event(seq, text_bytes) })
    }

    fn seq_of(item: &pb::WatchItem) -> u64 {
        durable_seq(item).unwrap()
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_cut_naming_the_last_seq_its_connection_took() {
        let buffers = WatchBuffers::new(BufferLimits { per_watcher: 10_000, total: 1 << 30 });
        let (mut out, mut items) = buffers.watcher(&session(), 0);
        out.send(event(1, 100)).await.unwrap();
        out.forward(durable(&buffers, 2, 100)).await.unwrap();
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 1);
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 2);
        // Taken by the connection, these count no more.
        assert_eq!(buffers.held(), 0);

        // The client stops reading: the feed fills the backlog until the watcher passes its limit.
        let watcher = out.watcher().clone();
        for seq in 3..=7 {
            watcher.push(&durable(&buffers, seq, 3_000));
        }
        assert!(out.recv().await.is_err(), "the stream was cut");
        assert_eq!(buffers.held(), 0, "a cut watcher holds nothing");
        let status = items.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("reconnect with after_seq = 2"), "{status:?}");
        assert!(status.message().contains("limits.watch_buffer_bytes = 10000"), "{status:?}");
        assert_eq!(status.metadata().get(RESUME_AFTER_SEQ).unwrap(), "2");
        assert!(items.next().await.is_none(), "nothing after the status");
    }

    #[tokio::test]
    async fn every_watcher_sends_the_feed_items_one_encoding_and_its_own_items_encoded_alike() {
        let buffers = WatchBuffers::new(BufferLimits::default());
        let (mut a, items_a) = buffers.watcher(&session(), 0);
        let (mut b, items_b) = buffers.watcher(&session(), 0);
        let (mut a_items, mut b_items) = (items_a.into_encoded(), items_b.into_encoded());
        // An item made for one watcher, then a feed item both take.
        a.send(event(1, 10)).await.unwrap();
        let held = durable(&buffers, 2, 10);
        a.forward(held.clone()).await.unwrap();
        b.forward(held.clone()).await.unwrap();
        let own = a_items.next().await.unwrap().unwrap();
        assert_eq!(own, event(1, 10).encode_to_vec(), "its own item, encoded as prost does");
        let (shared_a, shared_b) = (a_items.next().await.unwrap().unwrap(), b_items.next().await.unwrap().unwrap());
        assert_eq!(shared_a, event(2, 10).encode_to_vec(), "the same message on the wire");
        assert_eq!(shared_a.as_ptr(), shared_b.as_ptr(), "one buffer for both watchers, not a copy each");
        assert_eq!(shared_a.as_ptr(), held.encoded.as_ptr(), "the one the feed encoded");
        // A feed's end sends no message: the stream ends with its status.
        let end = buffers.hold(FeedItem::End(crate::feed_item::FeedEnd::TailEnded));
        assert_eq!(end.bytes, 0);
        a.forward(end).await.unwrap();
        a.finish(Status::unavailable("ended"));
        assert_eq!(a_items.next().await.unwrap().unwrap_err().code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn a_watcher_cut_before_its_connection_took_anything_names_where_its_client_was() {
        let buffers = WatchBuffers::new(BufferLimits { per_watcher: 1_000, total: 1 << 30 });
        let (out, mut items) = buffers.watcher(&session(), 41);
        for seq in 42..45 {
            out.watcher().push(&durable(&buffers, seq, 600));
        }
        let status = items.next().await.unwrap().unwrap_err();
        assert_eq!(status.metadata().get(RESUME_AFTER_SEQ).unwrap(), "41");
    }

    #[tokio::test]
    async fn an_empty_watcher_always_takes_one_item_whatever_its_size() {
        let buffers = WatchBuffers::new(BufferLimits { per_watcher: 100, total: 100 });
        let (mut out, mut items) = buffers.watcher(&session(), 0);
        out.watcher().push(&durable(&buffers, 1, 1_000));
        let held = out.recv().await.unwrap();
        out.forward(held).await.unwrap();
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 1);
        out.send(event(2, 1_000)).await.unwrap();
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 2);
        assert_eq!(buffers.held(), 0);
    }

    #[tokio::test]
    async fn the_send_queue_waits_for_the_connection_instead_of_growing() {
        let buffers = WatchBuffers::new(BufferLimits { per_watcher: 4_000, total: 1 << 30 });
        let (mut out, mut items) = buffers.watcher(&session(), 0);
        out.send(event(1, 600)).await.unwrap();
        // A quarter of the watcher's bytes is the send queue's room: the next waits.
        let second = out.send(event(2, 600));
        tokio::pin!(second);
        assert!(futures::poll!(second.as_mut()).is_pending(), "the task waits for its client");
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 1);
        second.await.unwrap();
        assert_eq!(seq_of(&items.next().await.unwrap().unwrap()), 2);
    }

    #[tokio::test]
    async fn a_watcher_waiting_for_its_client_steps_aside_when_the_gateway_is_over_its_total() {
        let buffers = WatchBuffers::new(BufferLimits { per_watcher: 4_000, total: 5_000 });
        let (mut stuck, mut stuck_items) = buffers.watcher(&session(), 0);
        stuck.send(event(1, 900)).await.unwrap();
        let waiting = tokio::spawn(async move {
            let result = stuck.send(event(2, 900)).await;
            (stuck, result)
        });
        // Another watcher's items take the gateway past its total: the waiting one is cut.
        let (mut other, mut other_items) = buffers.watcher(&session(), 0);
        other.send(event(1, 5_000)).await.unwrap();
        let (_stuck, result) = waiting.await.unwrap();
        assert_eq!(result, Err(Ended));
        let status = stuck_items.next().await.unwrap().unwrap_err();
        assert!(status.message().contains("limits.watch_buffer_total_bytes = 5000"), "{status:?}");
        assert!(status.message().contains("after_seq = 0"), "{status:?}");
        // The other one, holding one item, goes on.
        assert_eq!(seq_of(&other_items.next().await.unwrap().unwrap()), 1);
    }

    #[tokio::test]
    async fn a_connection_that_goes_away_releases_everything_and_ends_the_task() {
        let buffers = WatchBuffers::new(BufferLimits::default());
        let (mut out, items) = buffers.watcher(&session(), 0);
        out.send(event(1, 1_000)).await.unwrap();
        out.watcher().push(&durable(&buffers, 2, 1_000));
        assert!(buffers.held() > 0);
        drop(items);
        assert_eq!(buffers.held(), 0);
        assert_eq!(out.send(event(3, 10)).await, Err(Ended));
        assert!(out.recv().await.is_err());
    }
}
