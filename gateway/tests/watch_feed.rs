//! A shared Watch feed whose log tail fails (decision 0039): every watcher following it ends with the
//! error, as a lone Watch did, and the next watcher starts a new feed. On the in-memory journal, with a
//! tail that fails when the test says so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on setup failure by design

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use turnstile_gateway::feed::SessionFeeds;
use turnstile_gateway::watch::{self, WatchSpec};
use turnstile_gateway::watch_buffer::{BufferLimits, ItemStream, WatchBuffers};
use turnstile_journal::log::EventStream;
use turnstile_journal::snapshot::NoSnapshots;
use turnstile_journal::{EmbeddedLog, JournalError, LocalBus, SessionLog};
use turnstile_model::{Envelope, SessionRef};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::watch_item::Item;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(20);

/// The in-memory log, whose tails all fail once `break_tails` is notified.
struct BreakableLog {
    inner: EmbeddedLog,
    break_tails: Arc<Notify>,
}

#[async_trait]
impl SessionLog for BreakableLog {
    async fn append(
        &self,
        session: &SessionRef,
        expected: u64,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        self.inner.append(session, expected, events, traceparent).await
    }

    async fn read(&self, session: &SessionRef, from_seq: u64, limit: usize) -> Result<Vec<Envelope>, JournalError> {
        self.inner.read(session, from_seq, limit).await
    }

    async fn last_seq(&self, session: &SessionRef) -> Result<u64, JournalError> {
        self.inner.last_seq(session).await
    }

    async fn tail(&self, session: &SessionRef, after_seq: u64) -> Result<EventStream, JournalError> {
        let events = self.inner.tail(session, after_seq).await?;
        let broken = self.break_tails.clone();
        let failure = futures::stream::once(async move {
            broken.notified().await;
            Err(JournalError::Unavailable("the test broke the tail".into()))
        });
        Ok(futures::stream::select(events, failure).boxed())
    }

    async fn delete(&self, session: &SessionRef) -> Result<u64, JournalError> {
        self.inner.delete(session).await
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, JournalError> {
        self.inner.list_sessions(tenant, after, limit).await
    }
}

/// A cluster where no owner answers: a Watch gets no streaming step from it.
struct NoOwner;

#[async_trait]
impl turnstile_cluster::CommandRouter for NoOwner {
    async fn execute(
        &self,
        session: &SessionRef,
        _command: turnstile_model::Command,
        _timeout: Option<Duration>,
    ) -> Result<turnstile_model::CommandReply, turnstile_model::CommandError> {
        Err(turnstile_model::CommandError::Unavailable(format!("no owner of {session} in this test")))
    }
}

type Rx = ItemStream;

fn open(log: &Arc<dyn SessionLog>, feeds: &SessionFeeds, stop: &CancellationToken) -> Rx {
    let session = SessionRef { tenant: "t".into(), id: "s".into() };
    let (tx, rx) = feeds.buffers().watcher(&session, 0);
    let spec = WatchSpec { session, after_seq: 0, live: true, resume: None };
    let owners = watch::Owners(Arc::new(NoOwner));
    tokio::spawn(watch::run(log.clone(), feeds.clone(), Arc::new(NoSnapshots), owners, spec, tx, stop.clone()));
    rx
}

async fn next(rx: &mut Rx) -> Option<Result<pb::WatchItem, Status>> {
    tokio::time::timeout(PATIENCE, rx.next()).await.expect("the watch stream answered in time")
}

#[tokio::test]
async fn a_failing_tail_ends_every_watcher_of_the_feed_with_its_error() {
    let break_tails = Arc::new(Notify::new());
    let log: Arc<dyn SessionLog> =
        Arc::new(BreakableLog { inner: EmbeddedLog::in_memory(), break_tails: break_tails.clone() });
    let feeds = SessionFeeds::new(log.clone(), Arc::new(LocalBus::new()), WatchBuffers::new(BufferLimits::default()));
    let stop = CancellationToken::new();
    let mut watchers = [open(&log, &feeds, &stop), open(&log, &feeds, &stop), open(&log, &feeds, &stop)];
    for rx in &mut watchers {
        let first = next(rx).await.unwrap().unwrap();
        assert!(matches!(first.item, Some(Item::CaughtUp(pb::CaughtUp { seq: 0, .. }))), "{first:?}");
    }
    assert_eq!(feeds.open(), 1, "one feed for the three watchers");

    // The feed's tail is the only one open: it fails.
    break_tails.notify_one();
    for rx in &mut watchers {
        let status = next(rx).await.unwrap().expect_err("the stream ends with the tail's error");
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("the test broke the tail"), "{status:?}");
        assert!(next(rx).await.is_none(), "nothing after the error");
    }
    assert_eq!(feeds.open(), 0, "the failed feed left the map before it told its watchers");

    // A new watcher starts a new feed, with a tail that has not failed.
    let mut again = open(&log, &feeds, &stop);
    let first = next(&mut again).await.unwrap().unwrap();
    assert!(matches!(first.item, Some(Item::CaughtUp(_))));
    assert_eq!(feeds.open(), 1);
    stop.cancel();
}
