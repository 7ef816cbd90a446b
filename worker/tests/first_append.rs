//! The first command of a session the host holds nothing of (decision 0040): a command that writes is
//! written as the session's first group while the session loads. On a new session that one write is the
//! whole cost; on a session with events the write is refused and the command runs on the loaded session,
//! exactly as if the host had loaded it first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_support;

use std::sync::Arc;
use std::time::Duration;

use log_support::TestLog;
use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::log::read_all;
use turnstile_journal::snapshot::MemorySnapshots;
use turnstile_journal::{LocalBus, SessionLog};
use turnstile_model::{Command, CommandError, CommandReply, EventPayload, SessionRef, Target, UserMessage};
use turnstile_worker::{SessionHost, WorkerConfig};

fn send(id: &str, text: &str, wakeup: bool, expected_turn: Option<u64>) -> Command {
    let message = UserMessage::user_text(id, text);
    Command::Send { message, target: Target::NextTurn, wakeup, expected_turn, deadline: None }
}

fn followup(id: &str, text: &str) -> Command {
    send(id, text, true, None)
}

/// A host over `log` as a worker that just started would have it: nothing loaded.
fn host(log: &Arc<TestLog>, snapshots: &Arc<MemorySnapshots>) -> Arc<SessionHost> {
    SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into())
        .snapshots(snapshots.clone())
        .build()
}

async fn idle(host: &SessionHost, session: &SessionRef) {
    match host.execute(session, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap() {
        CommandReply::Idle(_) => {}
        other => panic!("WhenIdle answered {other:?}"),
    }
}

fn session(id: &str) -> SessionRef {
    SessionRef::new("acme", id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sessions_followup_is_written_as_its_first_group() {
    let (log, snapshots) = (Arc::new(TestLog::recording()), Arc::new(MemorySnapshots::default()));
    let host = host(&log, &snapshots);
    let s = session("new");
    let reply = host.execute(&s, followup("m1", "hello"), None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: 1, turn: Some(1) });
    assert_eq!(*log.first_appends.lock().unwrap(), vec![true]);
    idle(&host, &s).await;
    // The turn ran on from that first group as on a loaded session: one contiguous log, one turn.
    let events = read_all(log.as_ref(), &s, 1).await.unwrap();
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1));
    let turns = events.iter().filter(|e| matches!(e.payload, EventPayload::TurnStart { .. })).count();
    assert_eq!(turns, 1, "{events:#?}");
    assert!(events.iter().any(|e| matches!(&e.payload, EventPayload::AssistantMessage { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_events_runs_the_command_on_its_loaded_log() {
    let (log, snapshots) = (Arc::new(TestLog::recording()), Arc::new(MemorySnapshots::default()));
    let s = session("old");
    let first = host(&log, &snapshots);
    let accepted = first.execute(&s, followup("m1", "hello"), None).await.unwrap();
    idle(&first, &s).await;
    drop(first);
    let last = log.last_seq(&s).await.unwrap();

    // A worker that never saw the session: its followup's empty-session group is refused and the
    // followup runs on the loaded session, in turn 2, right after the log's end.
    let second = host(&log, &snapshots);
    let reply = second.execute(&s, followup("m2", "again"), None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: last + 1, turn: Some(2) });
    assert_eq!(*log.first_appends.lock().unwrap(), vec![true, false]);
    idle(&second, &s).await;
    drop(second);

    // A retry of the first delivery on yet another worker: the same answer as the first time, nothing
    // written (the empty session would have accepted it anew).
    let last = log.last_seq(&s).await.unwrap();
    let third = host(&log, &snapshots);
    assert_eq!(third.execute(&s, followup("m1", "hello"), None).await.unwrap(), accepted);
    assert_eq!(log.last_seq(&s).await.unwrap(), last);
    assert_eq!(*log.first_appends.lock().unwrap(), vec![true, false, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_writes_nothing_on_an_empty_session_is_answered_from_the_loaded_one() {
    let (log, snapshots) = (Arc::new(TestLog::recording()), Arc::new(MemorySnapshots::default()));
    let s = session("refused");
    let first = host(&log, &snapshots);
    first.execute(&s, followup("m1", "hello"), None).await.unwrap();
    idle(&first, &s).await;
    drop(first);
    let last = log.last_seq(&s).await.unwrap();

    // On an empty session this is refused without a write ("last turn 0"); the answer must be the loaded
    // session's, whose last turn is 1.
    let second = host(&log, &snapshots);
    let err = second.execute(&s, send("m2", "late", false, Some(1)), None).await.unwrap_err();
    match err {
        CommandError::FailedPrecondition(m) => assert!(m.contains("last turn 1"), "{m}"),
        other => panic!("expected FAILED_PRECONDITION, got {other:?}"),
    }
    assert_eq!(log.last_seq(&s).await.unwrap(), last);
    assert!(log.first_appends.lock().unwrap().len() == 1, "nothing was tried for the refused command");
    // The session is loaded and serves the next command as usual.
    let reply = second.execute(&s, followup("m3", "next"), None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: last + 1, turn: Some(2) });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_queued_behind_the_first_run_after_it_in_order() {
    let (log, snapshots) = (Arc::new(TestLog::recording()), Arc::new(MemorySnapshots::default()));
    let host = host(&log, &snapshots);
    let s = session("burst");
    // Queued messages do not wake the session, so the seqs are only the inserts' splices.
    let replies =
        futures::future::join_all((0..8).map(|i| host.execute(&s, send(&format!("q{i}"), "later", false, None), None)))
            .await;
    let mut seqs: Vec<u64> = replies
        .into_iter()
        .map(|r| match r.unwrap() {
            CommandReply::Sent { seq, turn: None } => seq,
            other => panic!("{other:?}"),
        })
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 8, "each queued message has its own splice");
    assert_eq!(log.last_seq(&s).await.unwrap(), *seqs.last().unwrap());
    assert_eq!(*log.first_appends.lock().unwrap(), vec![true], "one first group, the rest appended after it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_this_host_served_before_is_loaded_first_after_passivation() {
    let (log, snapshots) = (Arc::new(TestLog::recording()), Arc::new(MemorySnapshots::default()));
    let config = WorkerConfig {
        park_after: Duration::from_millis(20),
        passivate_after: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let host = SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into())
        .snapshots(snapshots.clone())
        .config(config)
        .build();
    let s = session("known");
    host.execute(&s, followup("m1", "hello"), None).await.unwrap();
    idle(&host, &s).await;
    let passivated = async {
        while host.held_sessions() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), passivated).await.expect("the session was never passivated");
    let last = log.last_seq(&s).await.unwrap();
    let reply = host.execute(&s, followup("m2", "again"), None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: last + 1, turn: Some(2) });
    // Only the very first command tried a first group.
    assert_eq!(*log.first_appends.lock().unwrap(), vec![true]);
}
