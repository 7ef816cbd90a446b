//! The Watch stream: durable history after the client's seq, `caught_up`, then the session's shared
//! feed ([`crate::feed`]): the merged live tail every watcher of the session on this gateway follows.
//!
//! Joining the feed *before* reading the log is what makes the tail gap-free: anything the feed pushes
//! while the history is read waits in the watcher's backlog, and [`Join`] drops what the history already
//! had. What waits for a watcher is bounded in bytes ([`crate::watch_buffer`], decision 0088): the history
//! is read no faster than the client takes it, and a watcher whose backlog passes its limit is cut with
//! UNAVAILABLE naming the seq to resume after, so it misses no durable event across the reconnect.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use turnstile_cluster::CommandRouter;
use turnstile_journal::SessionLog;
use turnstile_journal::snapshot::SnapshotStore;
use turnstile_model::{Command, CommandReply, SessionRef, StreamingStep};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::feed::{FeedItem, SessionFeeds, event_item};
use crate::merge::{Join, Step};
use crate::resume::{Delta, DeltaAction, StepPosition, StepStream};
use crate::watch_buffer::{Outbound, resumable};

use crate::{read, status};

/// One Watch request, decoded.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    pub session: SessionRef,
    pub after_seq: u64,
    pub live: bool,
    /// What the client has of a step that was streaming (SPEC §14).
    pub resume: Option<StepPosition>,
}

/// Bound on asking the owner for the streaming step's output: it is one in-memory read at the owner, and a
/// Watch must not wait long for what is only an optimisation of its live tail.
const OWNER_OUTPUT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a Watch gets the output so far of the step its session's owner is streaming.
#[derive(Clone)]
pub struct Owners(pub Arc<dyn CommandRouter>);

impl Owners {
    /// The output so far, if a step streams; none when the owner cannot be asked (live output is best
    /// effort: the durable `assistant/message` always holds the whole reply).
    async fn streaming_step(&self, session: &SessionRef) -> Option<StreamingStep> {
        match self.0.execute(session, Command::StreamingStep, Some(OWNER_OUTPUT_TIMEOUT)).await {
            Ok(CommandReply::Streaming(step)) => step.map(|s| *s),
            Ok(other) => {
                tracing::warn!(%session, ?other, "the owner answered a streaming-step read with another reply");
                None
            }
            Err(e) => {
                tracing::debug!(%session, error = %e, "no streaming step from the owner");
                None
            }
        }
    }
}

type Tx = Outbound;

/// Why a stream stops before the client goes away.
enum Stop {
    /// The client went away, or the stream was cut: nothing to send.
    Gone,
    Failed(Status),
}

impl From<Status> for Stop {
    fn from(status: Status) -> Self {
        Self::Failed(status)
    }
}

async fn send(tx: &mut Tx, item: pb::WatchItem) -> Result<(), Stop> {
    tx.send(item).await.map_err(|_| Stop::Gone)
}

/// Runs one Watch until the client goes away, the stream is cut or the log fails, sending through `tx`
/// (from [`SessionFeeds::buffers`]). Errors are sent to the client as the stream's final status.
pub async fn run(
    log: Arc<dyn SessionLog>,
    feeds: SessionFeeds,
    snapshots: Arc<dyn SnapshotStore>,
    owners: Owners,
    spec: WatchSpec,
    mut tx: Tx,
    shutdown: CancellationToken,
) {
    let _open = turnstile_ops::GaugeGuard::inc(metrics::gauge!(turnstile_ops::names::WATCH_STREAMS_OPEN));
    let result = tokio::select! {
        r = stream(log.as_ref(), &feeds, snapshots.as_ref(), &owners, &spec, &mut tx) => r,
        () = shutdown.cancelled() => {
            // At once, whatever is queued: a client that does not read must not hold the drain up.
            tx.cut(|taken| resumable(
                format!("the gateway is shutting down; reconnect with after_seq = {taken} (the last seq this stream sent)"),
                taken,
            ));
            return;
        }
    };
    if let Err(Stop::Failed(status)) = result {
        tracing::debug!(session = %spec.session, %status, "watch ended with an error");
        tx.finish(status);
    }
}

/// Returns when the client went away or the stream failed.
async fn stream(
    log: &dyn SessionLog,
    feeds: &SessionFeeds,
    snapshots: &dyn SnapshotStore,
    owners: &Owners,
    spec: &WatchSpec,
    tx: &mut Tx,
) -> Result<(), Stop> {
    let session = &spec.session;
    // Held until the stream ends: the feed pushes into this watcher's backlog meanwhile.
    let _feed = feeds.subscribe(session, tx.watcher()).await?;
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
    let mut step_stream = StepStream::new(spec.resume);
    if spec.live {
        // Asked after joining the feed: a delta published after the owner's answer reaches the feed.
        if let Some(output) = owners.streaming_step(session).await {
            tracing::debug!(%session, turn = output.turn, step = output.step, after_seq = output.after_seq,
                text = output.text.len(), position = join.position(), "the owner's streaming step");
            send_deltas(tx, session, output.after_seq, step_stream.owner_output(output, join.position())).await?;
        } else {
            tracing::debug!(%session, position = join.position(), "no streaming step at the owner");
        }
    }
    loop {
        let held = tx.recv().await.map_err(|_| Stop::Gone)?;
        match &held.item {
            FeedItem::Durable { seq, item } => {
                let mut step = join.durable(*seq);
                if step == Step::Gap {
                    // The feed is ahead of this watcher (it started after this watcher's caught-up was
                    // read from a log further along, say): the log has the events in between.
                    read_log(log, session, &mut join, seq - 1, tx).await?;
                    step = join.durable(*seq);
                }
                if step == Step::Send {
                    if spec.live
                        && let Some(m) = as_assistant_message(item)
                    {
                        let rest = step_stream.complete(m.turn, m.step, &m.text, m.reasoning.as_deref().unwrap_or(""));
                        send_deltas(tx, session, seq - 1, rest).await?;
                    }
                    tx.forward(held.clone()).await.map_err(|_| Stop::Gone)?;
                }
                if spec.live {
                    send_deltas(tx, session, *seq, step_stream.advanced(join.position())).await?;
                }
            }
            FeedItem::Live { after_seq, item } => {
                if spec.live && join.live(*after_seq) {
                    match delta_action(&mut step_stream, item) {
                        DeltaAction::Send => tx.forward(held.clone()).await.map_err(|_| Stop::Gone)?,
                        DeltaAction::Drop => {}
                        DeltaAction::Trim(n) => send(tx, trimmed(item, n)).await?,
                        DeltaAction::Gap => fill_gap(owners, session, &mut step_stream, &join, item, tx).await?,
                    }
                }
            }
            FeedItem::End(end) => return Err(Stop::Failed(end.status(session, join.position()))),
        }
    }
}

/// Sends `deltas` of the owner's output as live events following durable `after_seq`.
async fn send_deltas(tx: &mut Tx, session: &SessionRef, after_seq: u64, deltas: Vec<Delta>) -> Result<(), Stop> {
    for d in deltas {
        let event = pb::LiveEvent {
            session: Some(codec::encode_session_ref(session)),
            after_seq,
            r#type: "assistant/delta".into(),
            payload: Some(pb::live_event::Payload::AssistantDelta(pb::AssistantDelta {
                turn: d.turn,
                step: d.step,
                text: d.text,
                reasoning: d.reasoning,
                offset: d.offset,
            })),
        };
        send(tx, pb::WatchItem { item: Some(pb::watch_item::Item::Live(event)) }).await?;
    }
    Ok(())
}

/// The feed's durable item as an `assistant/message`, if it is one.
fn as_assistant_message(item: &pb::WatchItem) -> Option<&pb::AssistantMessage> {
    match &item.item {
        Some(pb::watch_item::Item::Event(pb::SessionEvent {
            payload: Some(pb::session_event::Payload::AssistantMessage(m)),
            ..
        })) => Some(m),
        _ => None,
    }
}

/// The feed's live item as an assistant delta, if it is one.
fn as_delta(item: &pb::WatchItem) -> Option<&pb::AssistantDelta> {
    match &item.item {
        Some(pb::watch_item::Item::Live(pb::LiveEvent {
            payload: Some(pb::live_event::Payload::AssistantDelta(d)),
            ..
        })) => Some(d),
        _ => None,
    }
}

/// What this watcher does with a live item of the feed (anything but a delta is sent).
fn delta_action(step_stream: &mut StepStream, item: &pb::WatchItem) -> DeltaAction {
    match as_delta(item) {
        Some(d) => step_stream.delta(d.turn, d.step, d.reasoning, d.offset, d.text.len()),
        None => DeltaAction::Send,
    }
}

/// Missing bytes before the feed's delta `item`: the owner's output fills them (it holds the delta, which
/// was published before it answered); an owner that no longer streams the step closes it for this watcher.
async fn fill_gap(
    owners: &Owners,
    session: &SessionRef,
    step_stream: &mut StepStream,
    join: &Join,
    item: &pb::WatchItem,
    tx: &mut Tx,
) -> Result<(), Stop> {
    let Some(d) = as_delta(item) else { return Ok(()) };
    match owners.streaming_step(session).await {
        Some(output) if output.turn == d.turn && output.step == d.step => {
            let deltas = step_stream.owner_output(output, join.position());
            send_deltas(tx, session, join.position(), deltas).await
        }
        _ => {
            step_stream.close(d.turn, d.step);
            Ok(())
        }
    }
}

/// A delta item without its first `n` bytes (a boundary of the step's text: the client's next offset).
fn trimmed(item: &pb::WatchItem, n: usize) -> pb::WatchItem {
    let mut item = item.clone();
    if let Some(pb::watch_item::Item::Live(pb::LiveEvent {
        payload: Some(pb::live_event::Payload::AssistantDelta(d)),
        ..
    })) = &mut item.item
    {
        d.text = d.text.get(n..).unwrap_or_default().to_owned();
        d.offset += n as u64;
    }
    item
}

/// Sends the durable events after `join`'s position up to `upto` from a reader of the log of its own
/// (a history, or what a lagging watcher lost); the reader is dropped (and its consumer deleted) after.
async fn read_log(
    log: &dyn SessionLog,
    session: &SessionRef,
    join: &mut Join,
    upto: u64,
    tx: &mut Tx,
) -> Result<(), Stop> {
    if join.position() >= upto {
        return Ok(());
    }
    // Stored events go out as stored (`tail_as_sent`): a long history is not decoded and encoded again.
    let mut events = log.tail_as_sent(session, join.position()).await.map_err(status::from_journal)?;
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
            Step::Send => send(tx, pb::WatchItem { item: Some(pb::watch_item::Item::Event(e)) }).await?,
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
