//! Shared Watch feeds (decision 0039): one durable tail and one live subscription per watched session,
//! fanned out in process to every Watch stream of this gateway once it has caught up.
//!
//! A Watch used to open its own log reader (a JetStream consumer) and its own live subscription; a
//! thousand watchers of one session were a thousand consumers, past the server's limit. Now the first
//! watcher of a session starts a [`Feed`]: a task that owns the session's `log.tail(..)` and
//! `bus.subscribe(..)`, merges them with the one [`TailMerge`], encodes each item once and pushes the one
//! shared item into every watcher's backlog ([`crate::watch_buffer`]: bounded in bytes; a watcher that
//! falls behind is cut, decision 0088). Each watcher reads its own history and caught-up as before, then
//! follows its backlog (see [`crate::watch`] for the join rule). The task ends, releasing its reader and
//! subscription, when its last subscriber leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use turnstile_model::sync::lock;

use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use turnstile_journal::{LiveBus, LiveStream, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

pub use crate::feed_item::{FeedEnd, FeedItem};
use crate::merge::{Merged, TailMerge};
use crate::status;
use crate::watch_buffer::{Held, WatchBuffers, Watcher};

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
    buffers: WatchBuffers,
    feeds: Mutex<HashMap<SessionRef, Arc<Feed>>>,
}

/// One session's feed.
struct Feed {
    session: SessionRef,
    /// The backlogs the feed pushes into. Joined and left only under the map's lock, so the last
    /// subscriber leaving (which removes the feed) and a new one joining it cannot interleave.
    watchers: Mutex<Vec<Arc<Watcher>>>,
    /// Stops the task when the last subscriber leaves.
    stop: CancellationToken,
    state: watch::Sender<FeedState>,
}

impl std::fmt::Debug for SessionFeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionFeeds").field("buffers", &self.inner.buffers).field("open", &self.open()).finish()
    }
}

impl SessionFeeds {
    /// Feeds over `log` and `bus`, their items held in `buffers`.
    pub fn new(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, buffers: WatchBuffers) -> Self {
        Self { inner: Arc::new(Inner { log, bus, buffers, feeds: Mutex::default() }) }
    }

    /// Feeds running now (one per session with watchers here).
    pub fn open(&self) -> usize {
        self.inner.lock().len()
    }

    /// The buffers of this gateway's watchers.
    pub fn buffers(&self) -> &WatchBuffers {
        &self.inner.buffers
    }

    /// Joins `session`'s feed with `watcher`'s backlog, starting the feed if it is not running. Returns
    /// once the feed's live subscription is registered and the log's end *now* is where its tail starts,
    /// so every durable event after it and every live event published from now on will be pushed to the
    /// watcher (or the feed's end, if its tail cannot be opened). The watcher stays until the returned
    /// subscription is dropped.
    pub(crate) async fn subscribe(&self, session: &SessionRef, watcher: &Arc<Watcher>) -> Result<Subscription, Status> {
        let (feed, created) = {
            let mut feeds = self.inner.lock();
            let mut created = false;
            let feed = feeds
                .entry(session.clone())
                .or_insert_with(|| {
                    created = true;
                    Feed::new(session.clone())
                })
                .clone();
            lock(&feed.watchers).push(watcher.clone());
            (feed, created)
        };
        // From here the guard accounts for this subscriber, whatever happens next.
        let subscription = Subscription { inner: self.inner.clone(), feed: feed.clone(), watcher: watcher.clone() };
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
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionRef, Arc<Feed>>> {
        lock(&self.feeds)
    }

    /// Takes `feed` out of the map if it is still the session's feed (a later one may have replaced it).
    fn remove(feeds: &mut HashMap<SessionRef, Arc<Feed>>, feed: &Arc<Feed>) {
        if feeds.get(&feed.session).is_some_and(|f| Arc::ptr_eq(f, feed)) {
            feeds.remove(&feed.session);
        }
    }
}

impl Feed {
    fn new(session: SessionRef) -> Arc<Self> {
        let (state, _) = watch::channel(FeedState::Starting);
        Arc::new(Self { session, watchers: Mutex::default(), stop: CancellationToken::new(), state })
    }

    fn publish(&self, buffers: &WatchBuffers, merged: Merged) {
        let item = match merged {
            Merged::Durable(e) => FeedItem::Durable { seq: e.seq, item: event_item(&e) },
            Merged::Live(l) => FeedItem::Live {
                after_seq: l.after_seq,
                item: pb::WatchItem { item: Some(pb::watch_item::Item::Live(codec::encode_live_event(&l))) },
            },
        };
        let held = buffers.hold(item);
        for watcher in lock(&self.watchers).iter() {
            watcher.push(&held);
        }
    }

    /// Every watcher's last item: why the feed stopped.
    fn end(&self, buffers: &WatchBuffers, end: FeedEnd) {
        let held: Arc<Held> = buffers.hold(FeedItem::End(end));
        for watcher in lock(&self.watchers).iter() {
            watcher.push_end(&held);
        }
    }
}

/// A durable event as a Watch item.
pub(crate) fn event_item(e: &turnstile_model::Envelope) -> pb::WatchItem {
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(codec::encode_session_event(e))) }
}

/// One watcher's place in a feed. Dropping it leaves the feed; the last one out stops it.
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    feed: Arc<Feed>,
    watcher: Arc<Watcher>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("session", &self.feed.session).finish_non_exhaustive()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut feeds = self.inner.lock();
        let mut watchers = lock(&self.feed.watchers);
        watchers.retain(|w| !Arc::ptr_eq(w, &self.watcher));
        if watchers.is_empty() {
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
    // is in the list already, so it gets the end item below.
    Inner::remove(&mut inner.lock(), &feed);
    feed.state.send_replace(FeedState::Ended(end.clone()));
    feed.end(&inner.buffers, end);
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
            feed.publish(&inner.buffers, m);
        }
    }
}
