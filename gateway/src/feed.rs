//! Shared Watch feeds (decision 0039): one durable tail and one live subscription per watched session,
//! fanned out in process to every Watch stream of this gateway once it has caught up.
//!
//! A Watch used to open its own log reader (a JetStream consumer) and its own live subscription; a
//! thousand watchers of one session were a thousand consumers, past the server's limit. Now the first
//! watcher of a session starts a [`Feed`]: a task that owns the session's `log.tail(..)` and
//! `bus.subscribe(..)`, merges them with the one [`TailMerge`], encodes each item once and broadcasts it.
//! Each watcher reads its own history and caught-up as before, then follows the broadcast (see
//! [`crate::watch`] for the join rule). The task ends, releasing its reader and subscription, when its
//! last subscriber is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use turnstile_journal::{LiveBus, LiveStream, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::merge::{Merged, TailMerge};
use crate::status;

/// Items a feed keeps for its slowest subscriber by default; one further behind lags and catches up
/// from the log ([`crate::watch`]).
pub const DEFAULT_CAPACITY: usize = 1024;

/// One broadcast item, encoded once for every subscriber.
#[derive(Debug)]
pub enum FeedItem {
    Durable {
        seq: u64,
        item: pb::WatchItem,
    },
    Live {
        after_seq: u64,
        item: pb::WatchItem,
    },
    /// The feed stopped; nothing follows.
    End(FeedEnd),
}

/// Why a feed stopped.
#[derive(Clone, Debug)]
pub enum FeedEnd {
    /// The log or the bus failed: every watcher ends with this status, as a lone Watch did.
    Failed { code: Code, message: String },
    /// The log's tail ended without an error.
    TailEnded,
}

impl FeedEnd {
    fn failed(status: &Status) -> Self {
        Self::Failed { code: status.code(), message: status.message().to_owned() }
    }

    /// The status a watcher of `session` that has every event up to `position` ends with.
    pub fn status(&self, session: &SessionRef, position: u64) -> Status {
        match self {
            Self::Failed { code, message } => Status::new(*code, message.clone()),
            Self::TailEnded => Status::unavailable(format!(
                "the log tail of session {session} ended; reconnect with after_seq = {position}"
            )),
        }
    }
}

#[derive(Clone, Debug)]
enum FeedState {
    Starting,
    Running,
    Ended(FeedEnd),
}

/// The shared feeds of one gateway, by session. Cheap to clone.
#[derive(Clone)]
pub struct SessionFeeds {
    inner: Arc<Inner>,
}

struct Inner {
    log: Arc<dyn SessionLog>,
    bus: Arc<dyn LiveBus>,
    capacity: usize,
    feeds: Mutex<HashMap<SessionRef, Arc<Feed>>>,
}

/// One session's feed.
struct Feed {
    session: SessionRef,
    sender: broadcast::Sender<Arc<FeedItem>>,
    /// The last durable seq broadcast: a subscriber that lagged reads the log up to it, after which the
    /// broadcast has everything it still needs.
    last_durable: AtomicU64,
    /// Changed only under the map's lock, so the last subscriber leaving (which removes the feed) and a
    /// new one joining it cannot interleave.
    subscribers: AtomicUsize,
    /// Stops the task when the last subscriber leaves.
    stop: CancellationToken,
    state: watch::Sender<FeedState>,
}

impl std::fmt::Debug for SessionFeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionFeeds").field("capacity", &self.inner.capacity).field("open", &self.open()).finish()
    }
}

impl SessionFeeds {
    /// Feeds over `log` and `bus`, each keeping `capacity` items for its slowest subscriber.
    pub fn new(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, capacity: usize) -> Self {
        Self { inner: Arc::new(Inner { log, bus, capacity: capacity.max(1), feeds: Mutex::default() }) }
    }

    /// Feeds running now (one per session with watchers here).
    pub fn open(&self) -> usize {
        self.inner.lock().len()
    }

    /// Joins `session`'s feed, starting it if it is not running. Returns once the feed's live
    /// subscription is registered and the log's end *now* is where its tail starts, so every durable event
    /// after it and every live event published from now on will be broadcast to the returned subscription
    /// (or the feed's end, if its tail cannot be opened).
    pub async fn subscribe(&self, session: &SessionRef) -> Result<Subscription, Status> {
        let (feed, receiver, created) = {
            let mut feeds = self.inner.lock();
            let mut created = false;
            let feed = feeds
                .entry(session.clone())
                .or_insert_with(|| {
                    created = true;
                    Feed::new(session.clone(), self.inner.capacity)
                })
                .clone();
            feed.subscribers.fetch_add(1, Ordering::SeqCst);
            let receiver = feed.sender.subscribe();
            (feed, receiver, created)
        };
        // From here the guard accounts for this subscriber, whatever happens next.
        let subscription = Subscription { inner: self.inner.clone(), feed: feed.clone(), receiver };
        if created {
            tokio::spawn(run(self.inner.clone(), feed.clone()));
        }
        let mut state = feed.state.subscribe();
        let started = state.wait_for(|s| !matches!(s, FeedState::Starting)).await.map(|s| s.clone());
        match started {
            Ok(FeedState::Running) => Ok(subscription),
            Ok(FeedState::Ended(end)) => Err(end.status(session, 0)),
            // The task holds the sender until it has set a final state.
            Ok(FeedState::Starting) | Err(_) => {
                Err(Status::unavailable(format!("the watch feed of session {session} stopped while starting")))
            }
        }
    }
}

impl Inner {
    // Each critical section is one map operation plus a counter: a poisoned lock still holds a consistent map.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionRef, Arc<Feed>>> {
        self.feeds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `feed` out of the map if it is still the session's feed (a later one may have replaced it).
    fn remove(feeds: &mut HashMap<SessionRef, Arc<Feed>>, feed: &Arc<Feed>) {
        if feeds.get(&feed.session).is_some_and(|f| Arc::ptr_eq(f, feed)) {
            feeds.remove(&feed.session);
        }
    }
}

impl Feed {
    fn new(session: SessionRef, capacity: usize) -> Arc<Self> {
        let (sender, _) = broadcast::channel(capacity);
        let (state, _) = watch::channel(FeedState::Starting);
        Arc::new(Self {
            session,
            sender,
            last_durable: AtomicU64::new(0),
            subscribers: AtomicUsize::new(0),
            stop: CancellationToken::new(),
            state,
        })
    }

    fn publish(&self, merged: Merged) {
        let item = match merged {
            Merged::Durable(e) => {
                let seq = e.seq;
                // Stored before the send: a subscriber that reads it after the send has the item in its
                // receiver (or lagged past it, and then reads it from the log).
                self.last_durable.store(seq, Ordering::SeqCst);
                FeedItem::Durable { seq, item: event_item(&e) }
            }
            Merged::Live(l) => FeedItem::Live {
                after_seq: l.after_seq,
                item: pb::WatchItem { item: Some(pb::watch_item::Item::Live(codec::encode_live_event(&l))) },
            },
        };
        // An error only says nobody is subscribed right now (the last one is leaving).
        let _ = self.sender.send(Arc::new(item));
    }
}

/// A durable event as a Watch item.
pub(crate) fn event_item(e: &turnstile_model::Envelope) -> pb::WatchItem {
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(codec::encode_session_event(e))) }
}

/// One watcher's place in a feed. Dropping it leaves the feed; the last one out stops it.
pub struct Subscription {
    inner: Arc<Inner>,
    feed: Arc<Feed>,
    receiver: broadcast::Receiver<Arc<FeedItem>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("session", &self.feed.session).finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next item; `Lagged` when this subscriber fell more than the capacity behind and lost items.
    pub async fn recv(&mut self) -> Result<Arc<FeedItem>, broadcast::error::RecvError> {
        self.receiver.recv().await
    }

    /// The last durable seq the feed has broadcast.
    pub fn last_durable(&self) -> u64 {
        self.feed.last_durable.load(Ordering::SeqCst)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut feeds = self.inner.lock();
        if self.feed.subscribers.fetch_sub(1, Ordering::SeqCst) == 1 {
            Inner::remove(&mut feeds, &self.feed);
            self.feed.stop.cancel();
        }
    }
}

/// The feed's task: starts the feed, then merges and broadcasts until the last subscriber leaves or the
/// log fails.
async fn run(inner: Arc<Inner>, feed: Arc<Feed>) {
    let _open = turnstile_ops::GaugeGuard::inc(metrics::gauge!(turnstile_ops::names::WATCH_FEEDS_OPEN));
    let end = tokio::select! {
        () = feed.stop.cancelled() => return,
        end = follow(&inner, &feed) => end,
    };
    tracing::debug!(session = %feed.session, ?end, "watch feed ended");
    // Out of the map first: a watcher that joins after this starts a new feed, and one that joined before
    // has its receiver already, so it gets the end item below.
    Inner::remove(&mut inner.lock(), &feed);
    feed.state.send_replace(FeedState::Ended(end.clone()));
    let _ = feed.sender.send(Arc::new(FeedItem::End(end)));
}

/// Opens the live subscription, then the tail at the log's end, then merges them.
async fn follow(inner: &Inner, feed: &Feed) -> FeedEnd {
    let session = &feed.session;
    // Live first, so the live events of every durable event the tail will deliver are subscribed to.
    let mut live: LiveStream = match inner.bus.subscribe(session).await {
        Ok(live) => live,
        Err(e) => return FeedEnd::failed(&status::from_journal(e)),
    };
    let start = match inner.log.last_seq(session).await {
        Ok(seq) => seq,
        Err(e) => return FeedEnd::failed(&status::from_journal(e)),
    };
    feed.last_durable.store(start, Ordering::SeqCst);
    // Subscribers may read their folds now (each at or after `start`) while the tail opens: opening a
    // reader is the slowest step, and nothing is broadcast before it is open.
    feed.state.send_replace(FeedState::Running);
    let mut tail = match inner.log.tail(session, start).await {
        Ok(tail) => tail,
        Err(e) => return FeedEnd::failed(&status::from_journal(e)),
    };
    // Every subscriber's caught-up is at or after `start` (it reads its fold after joining), so the live
    // events the merge drops as stale are stale for all of them.
    let mut merge = TailMerge::new(start, start);
    loop {
        // Live first: the driver publishes a live event before it appends the next durable one, so a
        // live event that is already waiting belongs before any durable event that is ready now.
        let out = tokio::select! {
            biased;
            next = live.next() => match next {
                Some(l) => merge.live(l),
                // The bus went away: keep serving durable events, which are what matters.
                None => { live = futures::stream::pending().boxed(); Vec::new() }
            },
            next = tail.next() => match next {
                Some(Ok(e)) => {
                    let mut out = Vec::new();
                    while let Some(Some(l)) = live.next().now_or_never() {
                        out.extend(merge.live(l));
                    }
                    out.extend(merge.durable(e));
                    out
                }
                Some(Err(e)) => return FeedEnd::failed(&status::from_journal(e)),
                None => return FeedEnd::TailEnded,
            },
        };
        for m in out {
            feed.publish(m);
        }
    }
}
