//! Logs that cannot be folded, through the worker's host (issue 37, decisions 0083 and 0084): an import
//! whose events would not fold is refused before anything of the group is written, epochs and times out of
//! bounds are refused, and a session whose log got that way anyway (planted straight into the journal) is
//! quarantined: the host starts and serves the others, its commands get FAILED_PRECONDITION, and a delete
//! removes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::{EmbeddedLog, LocalBus, SessionLog};
use turnstile_model::{
    Command, CommandError, CommandReply, Envelope, EventPayload, SessionRef, Target, TurnEndReason, UserMessage,
};
use turnstile_worker::SessionHost;

fn followup(id: &str, text: &str) -> Command {
    let message = UserMessage::user_text(id, text);
    Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None }
}

fn host(log: &Arc<EmbeddedLog>) -> Arc<SessionHost> {
    SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into()).build()
}

fn sref(id: &str) -> SessionRef {
    SessionRef::new("acme", id).unwrap()
}

fn import(events: Vec<Envelope>, complete: bool) -> Command {
    Command::Import { events, complete }
}

/// A lone `turn/end` at seq 1: no turn was ever started.
fn lone_turn_end(session: &SessionRef) -> Vec<Envelope> {
    let payload = EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed };
    vec![Envelope { session: session.clone(), seq: 1, time_ms: 1_000, epoch: 1, payload }]
}

/// The log of a session that ran one turn, written by a host of its own, as `session`'s events.
async fn a_real_log(session: &SessionRef) -> Vec<Envelope> {
    let log = Arc::new(EmbeddedLog::in_memory());
    let source = host(&log);
    source.execute(session, followup("m1", "hello"), None).await.unwrap();
    source.execute(session, Command::WhenIdle, None).await.unwrap();
    log.read_after(session, 0, None).await.unwrap().unwrap()
}

fn invalid_argument(result: Result<CommandReply, CommandError>) -> String {
    match result {
        Err(CommandError::InvalidArgument(message)) => message,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[tokio::test]
async fn an_import_that_cannot_be_folded_is_refused_and_nothing_of_it_is_written() {
    let log = Arc::new(EmbeddedLog::in_memory());
    let host = host(&log);

    // A lone turn/end.
    let lone = sref("lone");
    let message = invalid_argument(host.execute(&lone, import(lone_turn_end(&lone), true), None).await);
    assert!(message.contains("acme/lone") && message.contains("event 1"), "names the session and seq: {message}");
    assert_eq!(log.last_seq(&lone).await.unwrap(), 0, "nothing written");

    // A real log with its turn/start left out and the rest renumbered, so the seqs are contiguous.
    let renumbered = sref("renumbered");
    let mut events = a_real_log(&renumbered).await;
    let start = events.iter().position(|e| matches!(e.payload, EventPayload::TurnStart { .. })).unwrap();
    events.remove(start);
    for (i, e) in events.iter_mut().enumerate() {
        e.seq = i as u64 + 1;
    }
    let message = invalid_argument(host.execute(&renumbered, import(events, true), None).await);
    assert!(message.contains("acme/renumbered"), "{message}");
    assert_eq!(log.last_seq(&renumbered).await.unwrap(), 0, "nothing written");

    // The same session refused in its second group: the first stays, and folds; the session is let go.
    let split = sref("split");
    let events = a_real_log(&split).await;
    let (head, tail) = events.split_at(4);
    host.execute(&split, import(head.to_vec(), false), None).await.unwrap();
    let mut bad = tail.to_vec();
    bad[0].payload = EventPayload::TurnEnd { turn: 7, reason: TurnEndReason::Completed };
    let message = invalid_argument(host.execute(&split, import(bad, true), None).await);
    assert!(message.contains("event 5") && message.contains("delete the session"), "{message}");
    assert_eq!(log.last_seq(&split).await.unwrap(), 4, "only the group that folded");
    let reply = host.execute(&split, followup("after", "still usable"), None).await.unwrap();
    assert!(matches!(reply, CommandReply::Sent { .. }), "the part written folds and takes commands: {reply:?}");

    // The same log as it was is imported whole.
    let whole = sref("whole");
    let events = a_real_log(&whole).await;
    let last = events.last().unwrap().seq;
    let (head, tail) = events.split_at(4);
    host.execute(&whole, import(head.to_vec(), false), None).await.unwrap();
    assert_eq!(
        host.execute(&whole, import(tail.to_vec(), true), None).await.unwrap(),
        CommandReply::Written { seq: last }
    );
}

#[tokio::test]
async fn imported_epochs_and_times_are_bounded() {
    let log = Arc::new(EmbeddedLog::in_memory());
    let host = host(&log);
    let now = turnstile_ops::clock::now_ms();
    let with = |id: &str, epoch: u64, time_ms: u64| {
        let session = sref(id);
        let mut events = lone_turn_end(&session);
        // A session that folds: one status event.
        events[0].payload = EventPayload::Status(turnstile_model::Status::Idle);
        events[0].epoch = epoch;
        events[0].time_ms = time_ms;
        (session, events)
    };
    for (id, epoch, time_ms) in [("epoch-2-63", 1 << 63, now), ("epoch-max-1", 1 << 53, now), ("time-max", 1, u64::MAX)]
    {
        let (session, events) = with(id, epoch, time_ms);
        let message = invalid_argument(host.execute(&session, import(events, true), None).await);
        assert!(message.contains(&format!("acme/{id}")) && message.contains("event 1"), "{message}");
        assert_eq!(log.last_seq(&session).await.unwrap(), 0, "{id}: nothing written");
    }
    // At the bounds: the largest epoch, and a clock a minute ahead of this one.
    let (session, events) = with("at-bounds", (1 << 53) - 1, now + 60_000);
    host.execute(&session, import(events, true), None).await.unwrap();
    let reply = host.execute(&session, followup("m", "hello"), None).await.unwrap();
    assert!(matches!(reply, CommandReply::Sent { .. }), "{reply:?}");
}

fn quarantined(result: Result<CommandReply, CommandError>) -> String {
    match result {
        Err(CommandError::FailedPrecondition(message)) if message.contains("quarantined") => message,
        other => panic!("expected FAILED_PRECONDITION naming the quarantine, got {other:?}"),
    }
}

#[tokio::test]
async fn a_planted_unfoldable_session_is_quarantined_and_the_host_serves_the_others() {
    let log = Arc::new(EmbeddedLog::in_memory());
    let (good, bad) = (sref("good"), sref("bad"));
    let first = host(&log);
    first.execute(&good, followup("g1", "hello"), None).await.unwrap();
    first.execute(&good, Command::WhenIdle, None).await.unwrap();
    drop(first);
    // Planted by hand, past every check an import makes.
    log.append_first(&bad, &lone_turn_end(&bad), None).await.unwrap();

    // A host started on that journal takes every session over: the bad one does not stop it.
    let host = host(&log);
    host.resume_running().await.unwrap();
    let message = quarantined(host.execute(&bad, followup("b1", "hello?"), None).await);
    assert!(message.contains("acme/bad") && message.contains("event 1"), "{message}");
    quarantined(host.execute(&bad, Command::WhenIdle, None).await);
    let reply = host.execute(&good, followup("g2", "again"), None).await.unwrap();
    assert!(matches!(reply, CommandReply::Sent { .. }), "{reply:?}");

    // One planted while the host runs is found by the load of its first command.
    let later = sref("later");
    log.append_first(&later, &lone_turn_end(&later), None).await.unwrap();
    quarantined(host.execute(&later, followup("l1", "hello?"), None).await);
    quarantined(host.execute(&later, followup("l2", "and again?"), None).await);

    // Deleting removes it; the id is then a new session.
    for session in [&bad, &later] {
        assert_eq!(host.execute(session, Command::Delete, None).await.unwrap(), CommandReply::Written { seq: 1 });
        let reply = host.execute(session, followup("new", "a new session"), None).await.unwrap();
        assert!(matches!(reply, CommandReply::Sent { .. }), "{reply:?}");
    }
}
