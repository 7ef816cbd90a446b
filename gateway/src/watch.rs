//! The Watch stream: durable history after the client's seq, `caught_up`, then the merged live tail.
//!
//! Subscribing to the live bus *before* reading the log is what makes the tail gap-free: anything
//! published while the history is read waits in the subscription and is sorted out by [`TailMerge`].

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use turnstile_journal::snapshot::SnapshotStore;
use turnstile_journal::{LiveBus, LiveStream, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;

use crate::merge::{Merged, TailMerge};
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

fn event_item(e: &turnstile_model::Envelope) -> pb::WatchItem {
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(codec::encode_session_event(e))) }
}

fn merged_item(m: &Merged) -> pb::WatchItem {
    match m {
        Merged::Durable(e) => event_item(e),
        Merged::Live(l) => pb::WatchItem { item: Some(pb::watch_item::Item::Live(codec::encode_live_event(l))) },
    }
}

/// Runs one Watch until the client goes away or the log fails. Errors are sent to the client as the
/// stream's final status.
pub async fn run(
    log: Arc<dyn SessionLog>,
    bus: Arc<dyn LiveBus>,
    snapshots: Arc<dyn SnapshotStore>,
    spec: WatchSpec,
    tx: Tx,
    shutdown: CancellationToken,
) {
    let _open = turnstile_ops::GaugeGuard::inc(metrics::gauge!(turnstile_ops::names::WATCH_STREAMS_OPEN));
    let result = tokio::select! {
        r = stream(log, bus, snapshots.as_ref(), &spec, &tx) => r,
        () = shutdown.cancelled() => Err(Status::unavailable(
            "the gateway is shutting down; reconnect with after_seq set to the last seq you received",
        )),
    };
    if let Err(status) = result {
        tracing::debug!(session = %spec.session, %status, "watch ended with an error");
        let _ = tx.send(Err(status)).await;
    }
}

/// `Ok` when the client went away.
async fn stream(
    log: Arc<dyn SessionLog>,
    bus: Arc<dyn LiveBus>,
    snapshots: &dyn SnapshotStore,
    spec: &WatchSpec,
    tx: &Tx,
) -> Result<(), Status> {
    let session = &spec.session;
    let mut live: LiveStream = if spec.live {
        bus.subscribe(session).await.map_err(status::from_journal)?
    } else {
        futures::stream::pending().boxed()
    };
    // The state at caught-up comes from the latest read snapshot plus the events after it. A client
    // resuming within those events gets them from that same read; one resuming further back gets its
    // history from a reader that starts at its seq (located by an O(log n) search, `SessionLog::tail`) and goes
    // on as the live tail, so the history is streamed, never held or folded.
    let fold = read::project_with_tail(log.as_ref(), snapshots, session).await?;
    let last_seq = fold.state.last_seq;
    let mut history = None;
    match fold.events_after(spec.after_seq) {
        Some(missed) => {
            for e in missed {
                if tx.send(Ok(event_item(e))).await.is_err() {
                    return Ok(());
                }
            }
        }
        None => {
            let mut events = log.tail(session, spec.after_seq).await.map_err(status::from_journal)?;
            let mut next = spec.after_seq + 1;
            while next <= last_seq {
                let e = match events.next().await {
                    Some(Ok(e)) => e,
                    Some(Err(e)) => return Err(status::from_journal(e)),
                    None => {
                        return Err(Status::unavailable(format!(
                            "the log of session {session} ended while its history was read; reconnect with after_seq = {}",
                            next - 1
                        )));
                    }
                };
                next = e.seq + 1;
                if tx.send(Ok(event_item(&e))).await.is_err() {
                    return Ok(());
                }
            }
            history = Some(events);
        }
    }
    let caught_up = pb::CaughtUp {
        seq: last_seq,
        inbox: Some(codec::encode_inbox(&fold.state.inbox, last_seq)),
        status: codec::encode_status(fold.state.status) as i32,
    };
    if tx.send(Ok(pb::WatchItem { item: Some(pb::watch_item::Item::CaughtUp(caught_up)) })).await.is_err() {
        return Ok(());
    }
    drop(fold);

    let mut merge = TailMerge::new(last_seq, spec.after_seq);
    let mut tail = match history {
        // The history reader goes on past caught-up: it is the tail.
        Some(events) => events,
        None => log.tail(session, last_seq).await.map_err(status::from_journal)?,
    };
    loop {
        // Live first: the driver publishes a live event before it appends the next durable one, so a
        // live event that is already waiting belongs before any durable event that is ready now.
        let out = tokio::select! {
            biased;
            () = tx.closed() => return Ok(()),
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
                Some(Err(e)) => return Err(status::from_journal(e)),
                None => return Err(Status::unavailable(format!(
                    "the log tail of session {session} ended; reconnect with after_seq = {}", merge.last_sent()
                ))),
            },
        };
        for m in &out {
            if tx.send(Ok(merged_item(m))).await.is_err() {
                return Ok(());
            }
        }
    }
}
