//! SPEC §7 inbox scenarios (19, 20, 21, 22, 23, 25) end to end.
//! Every scenario runs twice (`backend_tests!`): on the embedded journal and on `--nats` (a nats-server of
//! its own per test).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::{InboxSnapshot, Target, WatchItem};
use turnstile_tests::watch::durable_events;
use turnstile_tests::{Deployment, Projection, Session, WatchRecorder, assert_lines, text_of, user_msg};

fn ids(list: &[turnstile_proto::v1::UserMessage]) -> Vec<&str> {
    list.iter().map(|m| m.id.as_str()).collect()
}

/// Asserts that nothing was written since `before` (same last seq, same replayed log).
async fn assert_unchanged(s: &Session, before: &(Vec<turnstile_proto::v1::SessionEvent>, u64)) {
    assert_eq!(&s.replay(0).await.unwrap(), before, "the log is unchanged");
    assert_eq!(s.info().await.unwrap().last_seq, before.1);
}

/// Scenario 19: replace(id, new) across lists is one canceled splice, discarded(old), inserted(new);
/// replacing with an id already pending elsewhere fails and writes nothing; a same-id replace rewrites
/// the content and keeps the id.
async fn s19_replace_across_lists(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.queue(user_msg("A", "a")).await.unwrap();
    s.queue(user_msg("B", "b")).await.unwrap();
    s.inject(user_msg("I", "i")).await.unwrap();

    assert_eq!(s.replace("I", user_msg("I2", "i2")).await.unwrap().seq, 4, "next-step item replaced");
    assert_eq!(s.replace("B", user_msg("B2", "b2")).await.unwrap().seq, 5, "next-turn item at index 1 replaced");
    assert_eq!(s.replace("A", user_msg("A", "a, rewritten")).await.unwrap().seq, 6, "same id, new content");

    let before = s.replay(0).await.unwrap();
    let err = s.replace("A", user_msg("I2", "clash")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains("I2"), "the message names the clashing id: {}", err.message());
    assert_unchanged(&s, &before).await;

    let lines = watch.settle(&s).await.unwrap();
    assert_lines(
        &lines,
        &[
            "C caught_up 0",
            "D spliced next-turn 0 0 [A]",
            "L inserted A",
            "D spliced next-turn 1 0 [B]",
            "L inserted B",
            "D spliced next-step 0 0 [I]",
            "L inserted I",
            "D spliced next-step 0 1 [I2] canceled",
            "L discarded I",
            "L inserted I2",
            "D spliced next-turn 1 1 [B2] canceled",
            "L discarded B",
            "L inserted B2",
            "D spliced next-turn 0 1 [A] canceled",
            "L discarded A",
            "L inserted A",
        ],
    );
    let inbox = s.inbox().await.unwrap();
    assert_eq!((ids(&inbox.next_turn), ids(&inbox.next_step)), (vec!["A", "B2"], vec!["I2"]));
    assert_eq!(text_of(&inbox.next_turn[0]), "a, rewritten");
}

/// Scenario 20: remove(unknown id) is NOT_FOUND and writes nothing; remove(known id) is one canceled
/// splice and a discarded event.
async fn s20_remove_unknown_and_known(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.queue(user_msg("A", "a")).await.unwrap();
    let before = s.replay(0).await.unwrap();

    let err = s.remove("nope").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("nope"), "the message names the id: {}", err.message());
    assert_unchanged(&s, &before).await;

    assert_eq!(s.remove("A").await.unwrap().seq, 2);
    assert_lines(
        &watch.settle(&s).await.unwrap(),
        &[
            "C caught_up 0",
            "D spliced next-turn 0 0 [A]",
            "L inserted A",
            "D spliced next-turn 0 1 [] canceled",
            "L discarded A",
        ],
    );
}

/// Scenario 21: clear() writes the next-step splice, then the next-turn splice, both canceled; a second
/// clear writes nothing and replies the session's last seq.
async fn s21_clear_next_step_then_next_turn(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.queue(user_msg("A", "a")).await.unwrap();
    s.queue(user_msg("B", "b")).await.unwrap();
    s.inject(user_msg("I", "i")).await.unwrap();

    assert_eq!(s.clear().await.unwrap().seq, 5);
    let before = s.replay(0).await.unwrap();
    assert_eq!(s.clear().await.unwrap().seq, 5, "an empty clear replies the last seq");
    assert_unchanged(&s, &before).await;

    assert_lines(
        &watch.settle(&s).await.unwrap(),
        &[
            "C caught_up 0",
            "D spliced next-turn 0 0 [A]",
            "L inserted A",
            "D spliced next-turn 1 0 [B]",
            "L inserted B",
            "D spliced next-step 0 0 [I]",
            "L inserted I",
            "D spliced next-step 0 1 [] canceled",
            "L discarded I",
            "D spliced next-turn 0 2 [] canceled",
            "L discarded A",
            "L discarded B",
        ],
    );
    let inbox = s.inbox().await.unwrap();
    assert!(inbox.next_turn.is_empty() && inbox.next_step.is_empty());
}

/// Scenario 22: a retried followup with the same MessageId and content returns the same seq and writes
/// nothing, after the turn ran and while still pending; the same id with other content or routing is
/// ALREADY_EXISTS.
async fn s22_retry_is_idempotent(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    let first = s.followup(user_msg("A", "hello")).await.unwrap();
    watch.settle(&s).await.unwrap();
    let before = s.replay(0).await.unwrap();

    let retry = s.followup(user_msg("A", "hello")).await.unwrap();
    assert_eq!(retry.seq, first.seq, "a retry returns the original acceptance");
    assert_unchanged(&s, &before).await;

    let q = s.queue(user_msg("Q", "pending")).await.unwrap();
    let before = s.replay(0).await.unwrap();
    assert_eq!(s.queue(user_msg("Q", "pending")).await.unwrap().seq, q.seq, "a retry of a pending message");
    assert_unchanged(&s, &before).await;

    let err = s.followup(user_msg("A", "other text")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let err = s.followup(user_msg("Q", "pending")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "same content, other routing (followup vs queue): {err:?}");
    assert_unchanged(&s, &before).await;

    let lines = watch.settle(&s).await.unwrap();
    assert_eq!(lines.iter().filter(|l| l.starts_with("D user/message")).count(), 1, "A ran once");
    assert_eq!(lines.iter().filter(|l| l.contains("[A]")).count(), 1, "A was inserted once");
}

/// Scenario 23: a steer with a stale `expected_turn` is FAILED_PRECONDITION naming the running turn (or
/// saying the session is idle) and writes nothing.
async fn s23_steer_with_stale_expected_turn(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();

    // Never written: refused, and the session still does not exist.
    let err = s.steer(user_msg("S0", "s"), Some(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("idle"), "says the session is idle: {}", err.message());
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound);

    s.followup(user_msg("A", "hello")).await.unwrap();
    watch.settle(&s).await.unwrap();
    let before = s.replay(0).await.unwrap();
    let err = s.steer(user_msg("S1", "s"), Some(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("idle"), "says the session is idle: {}", err.message());
    assert_unchanged(&s, &before).await;

    s.followup(user_msg("B", "[[tool:sleep 2000]]")).await.unwrap();
    watch.wait_line("D tool/call 2.1 *").await.unwrap();
    let before = s.replay(0).await.unwrap();
    let err = s.steer(user_msg("S2", "s"), Some(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains('2'), "names the running turn 2: {}", err.message());
    assert_eq!(s.replay(0).await.unwrap().1, before.1, "nothing was written by the refused steer");
    assert!(!watch.lines().iter().any(|l| l.contains("S2")));

    // The right turn is accepted.
    s.steer(user_msg("S3", "s"), Some(2)).await.unwrap();
    let lines = watch.settle(&s).await.unwrap();
    assert!(lines.contains(&"D user/message S3".to_owned()));
    assert!(!lines.iter().any(|l| l.contains("S0") || l.contains("S1") || l.contains("S2")));
}

/// Compares the server's inbox (GetInbox, and a fresh Watch's caught_up) with an independent fold of
/// the durable log up to the snapshot's seq.
async fn assert_projection_agrees(s: &Session, label: &str) -> InboxSnapshot {
    let snapshot = s.inbox().await.unwrap();
    let (events, _) = s.replay(0).await.unwrap();
    let folded = Projection::fold_upto(&events, snapshot.seq).unwrap();
    assert!(
        folded.matches(&snapshot),
        "{label}: fold of the log up to seq {} = {folded:?}, GetInbox = {snapshot:?}",
        snapshot.seq
    );
    let fresh = WatchRecorder::start(s.client(), s.reference(), 0, false).await.unwrap();
    let items = fresh.items();
    let caught_up = items
        .iter()
        .find_map(|i| match &i.item {
            Some(turnstile_proto::v1::watch_item::Item::CaughtUp(c)) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    let inbox = caught_up.inbox.clone().expect("caught_up carries the inbox");
    let folded = Projection::fold_upto(&durable_events(&items), caught_up.seq).unwrap();
    assert!(folded.matches(&inbox), "{label}: caught_up inbox {inbox:?} differs from the fold {folded:?}");
    snapshot
}

async fn check(s: &Session, label: &str, next_turn: &[&str], next_step: &[&str]) {
    let snap = assert_projection_agrees(s, label).await;
    assert_eq!((ids(&snap.next_turn), ids(&snap.next_step)), (next_turn.to_vec(), next_step.to_vec()), "{label}");
}

/// Folds `items` one durable event at a time; every prefix must be a valid projection.
fn fold_every_prefix(items: &[WatchItem]) -> Projection {
    let mut p = Projection::default();
    for e in durable_events(items) {
        p.apply(&e).unwrap_or_else(|err| panic!("the log does not fold: {err}"));
    }
    p
}

/// Scenario 25: a projection rebuilt elsewhere from the log equals the owner's inbox after every step:
/// deliveries, edits, claims by running turns, a cancel.
async fn s25_rebuilt_projection_equals_owner_inbox(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();

    s.queue(user_msg("A", "a")).await.unwrap();
    check(&s, "queue A", &["A"], &[]).await;
    s.queue(user_msg("B", "b")).await.unwrap();
    check(&s, "queue B", &["A", "B"], &[]).await;
    s.inject(user_msg("I", "i")).await.unwrap();
    check(&s, "inject I", &["A", "B"], &["I"]).await;
    s.replace("B", user_msg("B2", "b2")).await.unwrap();
    check(&s, "replace B", &["A", "B2"], &["I"]).await;
    s.splice(Target::NextTurn, 1, 0, vec![user_msg("M", "m")]).await.unwrap();
    check(&s, "splice M", &["A", "M", "B2"], &["I"]).await;
    s.remove("M").await.unwrap();
    check(&s, "remove M", &["A", "B2"], &["I"]).await;

    // A waking delivery: turn 1 claims I and A, turn 2 B2, turn 3 F; then everything is empty.
    s.followup(user_msg("F", "f")).await.unwrap();
    watch.settle(&s).await.unwrap();
    let snap = assert_projection_agrees(&s, "after the turns").await;
    assert!(snap.next_turn.is_empty() && snap.next_step.is_empty());

    // Mid-turn: a running turn with two queued behind it, then a cancel that clears them.
    s.followup(user_msg("G", "[[tool:sleep 2000]]")).await.unwrap();
    watch.wait_line("D tool/call 4.1 *").await.unwrap();
    s.queue(user_msg("H", "h")).await.unwrap();
    s.inject(user_msg("J", "j")).await.unwrap();
    check(&s, "mid-turn", &["H"], &["J"]).await;
    s.cancel(false).await.unwrap();
    watch.settle(&s).await.unwrap();
    let snap = assert_projection_agrees(&s, "after cancel").await;
    assert!(snap.next_turn.is_empty() && snap.next_step.is_empty());

    // The live recording folds at every prefix, and its end state equals the owner's.
    let folded = fold_every_prefix(&watch.items());
    assert!(folded.matches(&snap));
}

turnstile_tests::scenario_tests!(
    s19_replace_across_lists,
    s20_remove_unknown_and_known,
    s21_clear_next_step_then_next_turn,
    s22_retry_is_idempotent,
    s23_steer_with_stale_expected_turn,
    s25_rebuilt_projection_equals_owner_inbox,
);
