//! `DeleteSession` through the worker's host (SPEC §12): a running turn is canceled with cause `disposed`
//! (its events are written before the log goes), then the log, the snapshots and the dedup state are
//! removed; the id is then a new session. A log wrapper keeps every append, since the log itself is gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use log_support::TestLog;
use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::snapshot::{MemorySnapshots, SnapshotStore};
use turnstile_journal::{LocalBus, SessionLog};
use turnstile_model::{
    CancelCause, Command, CommandError, CommandReply, EventPayload, SessionRef, Target, TurnEndReason, UserMessage,
};
use turnstile_worker::{SessionHost, WorkerConfig};

fn followup(id: &str, text: &str) -> Command {
    let message = UserMessage::user_text(id, text);
    Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None }
}

fn queue(id: &str, text: &str) -> Command {
    let message = UserMessage::user_text(id, text);
    Command::Send { message, target: Target::NextTurn, wakeup: false, expected_turn: None, deadline: None }
}

struct Fixture {
    log: Arc<TestLog>,
    snapshots: Arc<MemorySnapshots>,
    host: Arc<SessionHost>,
    session: SessionRef,
}

fn fixture() -> Fixture {
    let log = Arc::new(TestLog::recording());
    let snapshots = Arc::new(MemorySnapshots::default());
    // A snapshot after every event, so there is one to remove.
    let config = WorkerConfig { snapshot_every: 1, ..WorkerConfig::default() };
    let host = SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into())
        .snapshots(snapshots.clone())
        .config(config)
        .build();
    Fixture { log, snapshots, host, session: SessionRef::new("acme", "doomed").unwrap() }
}

/// Waits (through a tail, never a sleep) until the log holds an event that `wanted` picks.
async fn until_logged(log: &TestLog, session: &SessionRef, wanted: impl Fn(&EventPayload) -> bool) {
    let mut tail = log.tail(session, 0).await.unwrap();
    let wait = async {
        while let Some(event) = tail.next().await {
            if wanted(&event.unwrap().payload) {
                return;
            }
        }
        panic!("the tail ended before the event came");
    };
    tokio::time::timeout(Duration::from_secs(20), wait).await.expect("the event was never written");
}

#[tokio::test]
async fn delete_cancels_the_running_turn_as_disposed_then_removes_everything() {
    let f = fixture();
    let s = &f.session;
    // A turn parked in a long tool call, with a queued message behind it.
    f.host.execute(s, followup("A", "[[tool:sleep 600000]]"), None).await.unwrap();
    f.host.execute(s, queue("Q", "queued"), None).await.unwrap();
    until_logged(&f.log, s, |p| matches!(p, EventPayload::ToolCall { .. })).await;

    let reply = f.host.execute(s, Command::Delete, None).await.unwrap();
    let appended = f.log.appended.lock().unwrap().clone();
    let last = appended.last().unwrap().seq;
    assert_eq!(reply, CommandReply::Written { seq: last }, "the reply is the last seq the log had");
    // The cancel was written before the log went: the sleep aborted, the turn ended aborted{disposed},
    // the driver idle; nothing after that (the queued message goes with the log, no splice removes it).
    let turn_end = appended
        .iter()
        .position(|e| {
            matches!(
                &e.payload,
                EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Aborted(CancelCause::Disposed) }
            )
        })
        .expect("turn 1 ended aborted{disposed}");
    assert!(matches!(appended[turn_end + 1].payload, EventPayload::Status(turnstile_model::Status::Idle)));
    assert_eq!(turn_end + 2, appended.len(), "nothing was written after the idle status");
    assert!(
        !appended.iter().any(|e| matches!(&e.payload,
            EventPayload::InboxSpliced(sp) if sp.outcome == turnstile_model::SpliceOutcome::Canceled)),
        "nothing is cleared before the delete"
    );
    assert!(
        appended[..turn_end].iter().any(|e| matches!(&e.payload, EventPayload::ToolResult { .. })),
        "the aborted sleep committed its result"
    );

    // Log, snapshots (and the dedup index they hold) are gone.
    assert_eq!(f.log.last_seq(s).await.unwrap(), 0);
    assert!(f.snapshots.load(s).await.unwrap().is_none());
    assert!(f.snapshots.load_for_reads(s).await.unwrap().is_none());
    assert!(f.log.list_sessions(None, None, 10).await.unwrap().is_empty());

    // A second delete finds nothing.
    let again = f.host.execute(s, Command::Delete, None).await.unwrap_err();
    assert!(matches!(again, CommandError::NotFound(_)), "{again:?}");

    // The id is a new session: the same MessageId is a new message (no dedup memory), turn 1, seq 1.
    let reply = f.host.execute(s, followup("A", "hello again"), None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: 1, turn: Some(1) });
    f.host.execute(s, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap();
    let fresh = turnstile_journal::log::read_all(f.log.as_ref(), s, 1).await.unwrap();
    assert_eq!(fresh.first().map(|e| e.seq), Some(1));
    assert!(
        fresh.iter().any(|e| matches!(&e.payload, EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed }))
    );
}

#[tokio::test]
async fn delete_of_an_idle_session_writes_nothing_and_of_a_missing_one_is_not_found() {
    let f = fixture();
    let s = &f.session;
    let missing = f.host.execute(s, Command::Delete, None).await.unwrap_err();
    assert!(matches!(&missing, CommandError::NotFound(m) if m.contains("acme/doomed")), "{missing:?}");

    f.host.execute(s, followup("A", "hi"), None).await.unwrap();
    f.host.execute(s, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap();
    f.host.execute(s, queue("Q", "parked"), None).await.unwrap();
    let before = f.log.appended.lock().unwrap().len();
    let reply = f.host.execute(s, Command::Delete, None).await.unwrap();
    assert_eq!(reply, CommandReply::Written { seq: before as u64 });
    assert_eq!(
        f.log.appended.lock().unwrap().len(),
        before,
        "an idle session gets no cancel events, pending messages or not"
    );
    assert_eq!(f.log.last_seq(s).await.unwrap(), 0);
}
