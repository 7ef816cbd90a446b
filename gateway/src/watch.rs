//! The Watch stream: durable history after the client's seq, `caught_up`, then the session's shared
//! feed ([`crate::feed`]): the merged live tail every watcher of the session on this gateway follows.
//!
//! Joining the feed *before* reading the log is what makes the tail gap-free: anything broadcast while
//! the history is read waits in the subscription, and [`Join`] drops what the history already had. A
//! watcher that falls further behind than the feed keeps reads the durable events it lost from the log
//! and rejoins the broadcast where it is: it misses no durable event (live ones are best effort).

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_journal::snapshot::SnapshotStore;
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;

use crate::feed::{FeedItem, SessionFeeds, event_item};
use crate::merge::{Join, Step};
use turnstile_proto::codec;

use crate::{read, status};

/// One Watch request, decoded.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    pub session: SessionRef,
    pub after_seq: u64,
    pub live: bool,
}

type Tx = mpsc::Sender<Result<pb::WatchItem, Status>>;

/// Why a stream stops before the client goes away.
enum Stop {
    /// The client went away: nothing to send.
    Gone,
    Failed(Status),
}

impl From<Status> for Stop {
    fn from(status: Status) -> Self {
        Self::Failed(status)
    }
}

async fn send(tx: &Tx, item: pb::WatchItem) -> Result<(), Stop> {
    tx.send(Ok(item)).await.map_err(|_| Stop::Gone)
}

/// Runs one Watch until the client goes away or the log fails. Errors are sent to the client as the
/// stream's final status.
pub async fn run(
    log: Arc<dyn SessionLog>,
    feeds: SessionFeeds,
    snapshots: Arc<dyn SnapshotStore>,
    spec: WatchSpec,
    tx: Tx,
    shutdown: CancellationToken,
) {
    let _open = turnstile_ops::GaugeGuard::inc(metrics::gauge!(turnstile_ops::names::WATCH_STREAMS_OPEN));
    let result = tokio::select! {
        r = stream(log.as_ref(), &feeds, snapshots.as_ref(), &spec, &tx) => r,
        () = shutdown.cancelled() => Err(Stop::Failed(Status::unavailable(
            "the gateway is shutting down; reconnect with after_seq set to the last seq you received",
        ))),
    };
    if let Err(Stop::Failed(status)) = result {
        tracing::debug!(session = %spec.session, %status, "watch ended with an error");
        let _ = tx.send(Err(status)).await;
    }
}

/// Returns when the client went away or the stream failed.
async fn stream(
    log: &dyn SessionLog,
    feeds: &SessionFeeds,
    snapshots: &dyn SnapshotStore,
    spec: &WatchSpec,
    tx: &Tx,
) -> Result<(), Stop> {
    let session = &spec.session;
    let mut feed = feeds.subscribe(session).await?;
    // The state at caught-up comes from the latest read snapshot plus the events after it. A client
    // resuming within those events gets them from that same read; one resuming further back gets its
    // history from a reader that starts at its seq (located by an O(log n) search, `SessionLog::tail`), so
    // the history is streamed, never held or folded.
    let fold = read::project_with_tail(log, snapshots, session).await?;
    let last_seq = fold.state.last_seq;
    match fold.events_after(spec.after_seq) {
        Some(missed) => {
            for e in missed {
                send(tx, event_item(e)).await?;
            }
        }
        None => {
            let mut history = Join::new(spec.after_seq, spec.after_seq);
            read_log(log, session, &mut history, last_seq, tx).await?;
        }
    }
    let caught_up = pb::CaughtUp {
        seq: last_seq,
        inbox: Some(codec::encode_inbox(&fold.state.inbox, last_seq)),
        status: codec::encode_status(fold.state.status) as i32,
    };
    send(tx, pb::WatchItem { item: Some(pb::watch_item::Item::CaughtUp(caught_up)) }).await?;
    drop(fold);

    let mut join = Join::new(last_seq, spec.after_seq);
    loop {
        let next = tokio::select! {
            biased;
            () = tx.closed() => return Err(Stop::Gone),
            next = feed.recv() => next,
        };
        match next {
            Ok(item) => match &*item {
                FeedItem::Durable { seq, item } => {
                    let mut step = join.durable(*seq);
                    if step == Step::Gap {
                        // The feed is ahead of this watcher (it started after this watcher's caught-up
                        // was read from a log further along, say): the log has the events in between.
                        read_log(log, session, &mut join, seq - 1, tx).await?;
                        step = join.durable(*seq);
                    }
                    if step == Step::Send {
                        send(tx, item.clone()).await?;
                    }
                }
                FeedItem::Live { after_seq, item } => {
                    if spec.live && join.live(*after_seq) {
                        send(tx, item.clone()).await?;
                    }
                }
                FeedItem::End(end) => return Err(Stop::Failed(end.status(session, join.position()))),
            },
            Err(RecvError::Lagged(lost)) => {
                // Every durable event the feed has broadcast is in the log: read the lost ones from there;
                // those still in the subscription after them are skipped by the join.
                let upto = feed.last_durable();
                tracing::debug!(%session, lost, from = join.position(), upto, "a watcher lagged behind its feed");
                read_log(log, session, &mut join, upto, tx).await?;
            }
            // The feed sends its end item before it goes; a closed channel without one is a feed gone
            // for another reason: the client resumes where it is.
            Err(RecvError::Closed) => {
                return Err(Stop::Failed(Status::unavailable(format!(
                    "the watch feed of session {session} stopped; reconnect with after_seq = {}",
                    join.position()
                ))));
            }
        }
    }
}

/// Sends the durable events after `join`'s position up to `upto` from a reader of the log of its own
/// (a history, or what a lagging watcher lost); the reader is dropped (and its consumer deleted) after.
async fn read_log(log: &dyn SessionLog, session: &SessionRef, join: &mut Join, upto: u64, tx: &Tx) -> Result<(), Stop> {
    if join.position() >= upto {
        return Ok(());
    }
    let mut events = log.tail(session, join.position()).await.map_err(status::from_journal)?;
    while join.position() < upto {
        let e = match events.next().await {
            Some(Ok(e)) => e,
            Some(Err(e)) => return Err(status::from_journal(e).into()),
            None => {
                return Err(Status::unavailable(format!(
                    "the log of session {session} ended while it was read; reconnect with after_seq = {}",
                    join.position()
                ))
                .into());
            }
        };
        match join.durable(e.seq) {
            Step::Send => send(tx, event_item(&e)).await?,
            Step::Pass | Step::Skip => {}
            // The reader checks that its seqs are contiguous, so this is a log that changed under it.
            Step::Gap => {
                return Err(Status::unavailable(format!(
                    "the log of session {session} jumped from seq {} to {}; reconnect with after_seq = {}",
                    join.position(),
                    e.seq,
                    join.position()
                ))
                .into());
            }
        }
    }
    Ok(())
}
