//! Bad input over gRPC: each request breaks one rule of SPEC §1–§3 / docs/API.md. Every case asserts the exact
//! status code, that the message names the offending field or value, and that nothing was written (the
//! same replayed log and `last_seq` before and after; a never-written session stays NOT_FOUND).
//! Every scenario runs twice (`backend_tests!`): on the embedded journal and on `--nats` (a nats-server of
//! its own per test).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::{Code, Status};
use turnstile_proto::v1::message_source::Kind;
use turnstile_proto::v1::{DeliverRequest, GoalSource, SendRequest, SessionRef, Target};
use turnstile_tests::{Backend, DevServer, Session, source_msg, user_msg};

/// Asserts `result` failed with `code` and a message that mentions one of `mentions` (case-insensitive).
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, mentions: &[&str]) {
    let err = result.expect_err("the request must be refused");
    assert_eq!(err.code(), code, "message: {}", err.message());
    let message = err.message().to_lowercase();
    assert!(
        mentions.iter().any(|m| message.contains(&m.to_lowercase())),
        "{code:?} message {:?} mentions none of {mentions:?}",
        err.message()
    );
}

/// A session with one queued message, and its log.
async fn written(server: &DevServer) -> (Session, (Vec<turnstile_proto::v1::SessionEvent>, u64)) {
    let s = server.session();
    s.queue(user_msg("Q", "queued")).await.unwrap();
    let log = s.replay(0).await.unwrap();
    assert_eq!(log.1, 1);
    (s, log)
}

async fn assert_unchanged(s: &Session, before: &(Vec<turnstile_proto::v1::SessionEvent>, u64)) {
    assert_eq!(&s.replay(0).await.unwrap(), before, "the log is unchanged");
    assert_eq!(s.info().await.unwrap().last_seq, before.1);
}

async fn assert_never_written(s: &Session) {
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound, "the refused write did not create the session");
    assert_eq!(s.inbox().await.unwrap_err().code(), Code::NotFound);
}

async fn oversized_content_is_invalid_argument(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    // "big" counts its id, its text and 64 bytes for its block: one byte over 1 MiB.
    let big = "x".repeat(1024 * 1024 + 1 - 3 - 64);
    assert_refused(s.followup(user_msg("big", &big)).await, Code::InvalidArgument, &["1048577", "limit"]);
    assert_unchanged(&s, &before).await;

    let fresh = server.session();
    assert_refused(fresh.queue(user_msg("big", &big)).await, Code::InvalidArgument, &["1048577", "limit"]);
    assert_never_written(&fresh).await;

    // Exactly at the limit is accepted: the bound is inclusive.
    let at_limit = "x".repeat(1024 * 1024 - 3 - 64);
    assert_eq!(s.queue(user_msg("max", &at_limit)).await.unwrap().seq, 2);
}

async fn message_id_length_is_checked(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    assert_refused(s.followup(user_msg("", "x")).await, Code::InvalidArgument, &["message.id"]);
    let long = "i".repeat(129);
    assert_refused(s.queue(user_msg(&long, "x")).await, Code::InvalidArgument, &["message.id", "129"]);
    assert_refused(s.replace("Q", user_msg(&long, "x")).await, Code::InvalidArgument, &["message.id", "129"]);
    assert_refused(s.remove("").await, Code::InvalidArgument, &["id"]);
    assert_unchanged(&s, &before).await;

    let fresh = server.session();
    assert_refused(fresh.followup(user_msg("", "x")).await, Code::InvalidArgument, &["message.id"]);
    assert_never_written(&fresh).await;
    // 128 bytes is fine.
    assert!(fresh.queue(user_msg(&"i".repeat(128), "x")).await.is_ok());
}

async fn session_id_is_checked(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let client = server.client();
    for (id, mentions) in [
        ("", &["session", "0"][..]),
        ("has/slash", &["session", "has/slash", "/"][..]),
        ("spa ce", &["session", "spa ce"][..]),
    ] {
        let s = Session::with_ref(client.clone(), SessionRef { tenant: "test".into(), id: id.into() });
        assert_refused(s.followup(user_msg("A", "x")).await, Code::InvalidArgument, mentions);
        assert_refused(s.info().await, Code::InvalidArgument, mentions);
    }
    let long = Session::with_ref(client.clone(), SessionRef { tenant: "test".into(), id: "s".repeat(129) });
    assert_refused(long.followup(user_msg("A", "x")).await, Code::InvalidArgument, &["session", "129"]);
    // A missing session field is refused too.
    let req = DeliverRequest { session: None, message: Some(user_msg("A", "x")), output_schema: None };
    assert_refused(client.clone().followup(req).await, Code::InvalidArgument, &["session"]);
}

async fn send_target_must_be_a_list(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    assert_refused(s.send(user_msg("A", "x"), Target::Unspecified, true).await, Code::InvalidArgument, &["target"]);
    let req = SendRequest { session: Some(s.reference()), message: Some(user_msg("A", "x")), target: 7, wakeup: true };
    assert_refused(s.client().send(req).await, Code::InvalidArgument, &["target 7", "7"]);
    assert_unchanged(&s, &before).await;

    let fresh = server.session();
    assert_refused(
        fresh.send(user_msg("A", "x"), Target::Unspecified, false).await,
        Code::InvalidArgument,
        &["target"],
    );
    assert_never_written(&fresh).await;
}

async fn missing_message_and_malformed_source(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    let req = DeliverRequest { session: Some(s.reference()), message: None, output_schema: None };
    assert_refused(s.client().followup(req).await, Code::InvalidArgument, &["message"]);
    let goal = Kind::Goal(GoalSource { goal_id: "g".into(), revision: 1, round: 0 });
    assert_refused(s.queue(source_msg("G", "x", Some(goal))).await, Code::InvalidArgument, &["round"]);
    assert_unchanged(&s, &before).await;
}

async fn duplicate_pending_id_with_other_content_already_exists(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    assert_refused(s.queue(user_msg("Q", "different")).await, Code::AlreadyExists, &["Q"]);
    assert_refused(s.inject(user_msg("Q", "queued")).await, Code::AlreadyExists, &["Q"]);
    assert_unchanged(&s, &before).await;
}

async fn replace_or_remove_of_unknown_id_is_not_found(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    assert_refused(s.replace("ghost", user_msg("new", "x")).await, Code::NotFound, &["ghost"]);
    assert_refused(s.remove("ghost").await, Code::NotFound, &["ghost"]);
    assert_unchanged(&s, &before).await;

    let fresh = server.session();
    assert_refused(fresh.replace("ghost", user_msg("new", "x")).await, Code::NotFound, &["ghost"]);
    assert_never_written(&fresh).await;
}

async fn steer_with_stale_expected_turn_is_failed_precondition(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    assert_refused(s.steer(user_msg("S", "x"), Some(3)).await, Code::FailedPrecondition, &["idle"]);
    assert_unchanged(&s, &before).await;

    let fresh = server.session();
    assert_refused(fresh.steer(user_msg("S", "x"), Some(1)).await, Code::FailedPrecondition, &["idle"]);
    assert_never_written(&fresh).await;
}

/// SPEC §3: an out-of-range client splice is not refused but normalized like `Array.prototype.splice`,
/// and the durable record holds the normalized values; one that then changes nothing writes nothing.
async fn splice_out_of_range_is_normalized(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, before) = written(&server).await;
    // next-turn is [Q]: deleting 2 from the end (start 2 → 1) with nothing to insert changes nothing.
    assert_eq!(s.splice(Target::NextTurn, 2, 2, vec![]).await.unwrap().seq, before.1);
    assert_unchanged(&s, &before).await;
    // start 2 of 1 is the end: an append at 1.
    s.splice(Target::NextTurn, 2, 0, vec![user_msg("N", "x")]).await.unwrap();
    // delete 9 from 0 removes the 2 that are there.
    s.splice(Target::NextTurn, 0, 9, vec![]).await.unwrap();
    let (log, last) = s.replay(0).await.unwrap();
    assert_eq!(last, 3);
    let splices: Vec<(u32, u32, usize)> = log[1..]
        .iter()
        .map(|e| match &e.payload {
            Some(turnstile_proto::v1::session_event::Payload::InboxSpliced(sp)) => {
                (sp.start, sp.removed_count, sp.inserted.len())
            }
            other => panic!("expected a splice, got {other:?}"),
        })
        .collect();
    assert_eq!(splices, [(1, 0, 1), (0, 2, 0)]);
    assert!(s.inbox().await.unwrap().next_turn.is_empty());
}

/// More than the configured pending items (default 1,000 across both lists) is RESOURCE_EXHAUSTED.
async fn pending_limit_is_resource_exhausted(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let (s, _) = written(&server).await;
    for i in 1..1000 {
        let list_choice = i % 2 == 0;
        let m = user_msg(&format!("m{i}"), "x");
        if list_choice {
            s.queue(m).await.unwrap()
        } else {
            s.inject(m).await.unwrap()
        };
    }
    let before = s.replay(0).await.unwrap();
    assert_eq!(before.1, 1000);
    assert_refused(s.queue(user_msg("over", "x")).await, Code::ResourceExhausted, &["1000", "1,000", "pending"]);
    assert_refused(s.inject(user_msg("over", "x")).await, Code::ResourceExhausted, &["1000", "1,000", "pending"]);
    assert_unchanged(&s, &before).await;
    // A retry of an already-pending message writes nothing and so is still answered.
    assert_eq!(s.queue(user_msg("Q", "queued")).await.unwrap().seq, 1);
}

turnstile_tests::backend_tests!(
    oversized_content_is_invalid_argument,
    message_id_length_is_checked,
    session_id_is_checked,
    send_target_must_be_a_list,
    missing_message_and_malformed_source,
    duplicate_pending_id_with_other_content_already_exists,
    replace_or_remove_of_unknown_id_is_not_found,
    steer_with_stale_expected_turn_is_failed_precondition,
    splice_out_of_range_is_normalized,
    pending_limit_is_resource_exhausted,
);
