//! SPEC §7 cancel and interrupt scenarios (13, 14, 15, 24) end to end.
//! Every scenario runs twice (`backend_tests!`): on the embedded journal and on `--nats` (a nats-server of
//! its own per test).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{Deployment, Served, Session, WatchRecorder, assert_lines, text_of, user_msg};

/// A slow prompt: long enough that a command sent after its first delta lands mid-stream.
const SLOW: &str = "[[delay:3000]] one two three four five six seven eight nine ten";

/// The opening of turn 1 for `A`, up to its user/message.
const OPENING: [&str; 10] = [
    "C caught_up 0",
    "D spliced next-turn 0 0 [A] wake",
    "L inserted A",
    "D status running",
    "L status running",
    "D turn/start 1",
    "D spliced next-turn 0 1 []",
    "L claimed A 1",
    "D step/start 1.1",
    "D user/message A",
];

/// One completed single-step turn that claims `id` from the head of next-turn and echoes `text`.
fn turn_lines(id: &str, turn: u64, text: &str) -> Vec<String> {
    vec![
        format!("D turn/start {turn}"),
        "D spliced next-turn 0 1 []".to_owned(),
        format!("L claimed {id} {turn}"),
        format!("D step/start {turn}.1"),
        format!("D user/message {id}"),
        format!("D assistant/message {turn}.1 {:?}", format!("echo: {text}")),
        format!("D step/end {turn}.1"),
        format!("D turn/end {turn} completed"),
    ]
}

fn with(prefix: &[&str], rest: Vec<String>) -> Vec<String> {
    prefix.iter().map(|s| (*s).to_owned()).chain(rest).collect()
}

fn refs(lines: &[String]) -> Vec<&str> {
    lines.iter().map(String::as_str).collect()
}

/// Starts `A` = [`SLOW`] and waits for its first delta.
async fn streaming(server: &Served) -> (Session, WatchRecorder) {
    let s = server.session();
    let watch = s.watch().await.unwrap();
    assert_eq!(s.followup(user_msg("A", SLOW)).await.unwrap().turn, Some(1));
    watch.wait_line("L delta 1.1 *").await.unwrap();
    (s, watch)
}

/// The interrupted message carries exactly the delivered prefix: what the deltas had streamed.
fn assert_delivered_prefix(watch: &WatchRecorder) {
    let message = watch.assistant_message(1, 1).expect("an interrupted assistant/message");
    assert!(message.interrupted);
    assert!(!message.text.is_empty(), "a delta had arrived before the cancel, so some text was delivered");
    assert_eq!(message.text, watch.delta_text(1, 1), "the interrupted text is what the deltas delivered");
}

/// Scenario 13: cancel(user) mid-stream: interrupted assistant/message with the delivered prefix,
/// step/end, turn/end aborted{user}; the queued item is discarded (canceled splice, discarded event).
async fn s13_cancel_mid_stream_discards_queue(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let (s, watch) = streaming(&server).await;
    s.queue(user_msg("Q", "queued")).await.unwrap();
    s.cancel(false).await.unwrap();

    let lines = watch.settle(&s).await.unwrap();
    let expected = with(
        &OPENING,
        [
            "D spliced next-turn 0 0 [Q]",
            "L inserted Q",
            "D spliced next-turn 0 1 [] canceled",
            "L discarded Q",
            "D assistant/message 1.1 interrupted *",
            "D step/end 1.1",
            "D turn/end 1 aborted{user}",
            "D status idle",
            "L status idle",
        ]
        .map(String::from)
        .to_vec(),
    );
    assert_lines(&lines, &refs(&expected));
    assert_delivered_prefix(&watch);
    let inbox = s.inbox().await.unwrap();
    assert!(inbox.next_turn.is_empty() && inbox.next_step.is_empty());
}

/// Scenario 14: cancel(user, keep_inbox) mid-stream with B queued: B parks after idle; a later
/// followup(C) runs B then C.
async fn s14_cancel_keep_inbox_parks_queue(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let (s, watch) = streaming(&server).await;
    s.queue(user_msg("B", "parked")).await.unwrap();
    s.cancel(true).await.unwrap();

    let lines = watch.settle(&s).await.unwrap();
    let aborted = [
        "D spliced next-turn 0 0 [B]",
        "L inserted B",
        "D assistant/message 1.1 interrupted *",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ];
    assert_lines(&lines, &refs(&with(&OPENING, aborted.map(String::from).to_vec())));
    assert_delivered_prefix(&watch);
    let inbox = s.inbox().await.unwrap();
    assert_eq!(inbox.next_turn.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["B"], "B parks");
    assert_eq!(s.info().await.unwrap().status, SessionStatus::Idle as i32);

    let c = s.followup(user_msg("C", "fresh")).await.unwrap();
    assert_eq!(c.turn, Some(2));
    let lines = watch.settle(&s).await.unwrap();
    let mut rest: Vec<String> = aborted.map(String::from).to_vec();
    rest.extend(
        ["D spliced next-turn 1 0 [C] wake", "L inserted C", "D status running", "L status running"].map(String::from),
    );
    rest.extend(turn_lines("B", 2, "parked"));
    rest.extend(turn_lines("C", 3, "fresh"));
    rest.extend(["D status idle".into(), "L status idle".into()]);
    assert_lines(&lines, &refs(&with(&OPENING, rest)));
}

/// Scenario 15: cancel(keep_inbox) then followup(B) before the aborted turn converges: B latches and runs
/// as turn 2 (`status idle`, then `status running` again without another delivery).
///
/// Whether B lands before the abort converges is up to the server's speed (cancel replies before the turn
/// converges, and B is sent right after that reply). Both orders must end with B running as turn 2; the
/// latch order is checked exactly when it happens, and the other order is checked exactly too.
async fn s15_followup_during_abort_latches(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let (s, watch) = streaming(&server).await;
    s.cancel(true).await.unwrap();
    let b = s.followup(user_msg("B", "after")).await.unwrap();

    let lines = watch.settle(&s).await.unwrap();
    let b_at = lines.iter().position(|l| l == "D spliced next-turn 0 0 [B] wake").expect("B's splice, to next-turn");
    let end_at = lines.iter().position(|l| l == "D turn/end 1 aborted{user}").expect("turn 1 aborted");
    let aborted = ["D assistant/message 1.1 interrupted *", "D step/end 1.1", "D turn/end 1 aborted{user}"];
    let mut rest: Vec<String> = Vec::new();
    if b_at < end_at {
        // Latched: B was accepted during the abort, so it is forced to next-turn and turn 2 follows the
        // idle flip by itself.
        assert_eq!(b.turn, None, "B reached a session that was still running");
        rest.extend(["D spliced next-turn 0 0 [B] wake", "L inserted B"].map(String::from));
        rest.extend(aborted.map(String::from));
        rest.extend(["D status idle", "L status idle", "D status running", "L status running"].map(String::from));
    } else {
        eprintln!("s15: the abort converged before B arrived; B was an ordinary idle followup");
        assert_eq!(b.turn, Some(2));
        rest.extend(aborted.map(String::from));
        rest.extend(["D status idle", "L status idle"].map(String::from));
        rest.extend(
            ["D spliced next-turn 0 0 [B] wake", "L inserted B", "D status running", "L status running"]
                .map(String::from),
        );
    }
    rest.extend(turn_lines("B", 2, "after"));
    rest.extend(["D status idle".into(), "L status idle".into()]);
    assert_lines(&lines, &refs(&with(&OPENING, rest)));
    assert_delivered_prefix(&watch);
}

/// Scenario 15 with steer: a waking delivery during the abort is forced to next-turn whatever it asked for.
/// (Same ordering caveat as above; only the latch order says something about forcing.)
async fn s15_steer_during_abort_goes_to_next_turn(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let (s, watch) = streaming(&server).await;
    s.cancel(true).await.unwrap();
    s.steer(user_msg("S", "steer"), None).await.unwrap();

    let lines = watch.settle(&s).await.unwrap();
    let turn_end = lines.iter().position(|l| l == "D turn/end 1 aborted{user}").unwrap();
    match lines.iter().position(|l| l.contains("[S] wake")) {
        Some(at) if at < turn_end => {
            assert_eq!(lines[at], "D spliced next-turn 0 0 [S] wake", "forced to next-turn during the abort");
            assert!(lines.contains(&"D turn/start 2".to_owned()) && lines.contains(&"L claimed S 2".to_owned()));
        }
        Some(at) => {
            eprintln!("s15: the abort converged before S arrived; S was an idle steer");
            assert_eq!(lines[at], "D spliced next-step 0 0 [S] wake");
        }
        None => panic!("no splice for S:\n{}", lines.join("\n")),
    }
    let user_messages: Vec<&String> = lines.iter().filter(|l| l.starts_with("D user/message")).collect();
    assert_eq!(user_messages, ["D user/message A", "D user/message S"]);
}

/// Scenario 24: interrupt(X) while turn 1 runs (in a tool) with B queued: turn 1 ends aborted{user},
/// turn 2 runs X, turn 3 runs B.
async fn s24_interrupt_runs_next_with_queue_behind(backend: Deployment) {
    let server = backend.start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:sleep 2000]]")).await.unwrap();
    watch.wait_line("D tool/call 1.1 *").await.unwrap();
    s.queue(user_msg("B", "queued")).await.unwrap();
    let x = s.interrupt(user_msg("X", "now")).await.unwrap();
    assert_eq!(x.turn, None, "the interrupted session was running");

    let lines = watch.settle(&s).await.unwrap();
    let mut expected: Vec<String> = OPENING.iter().map(|s| (*s).to_owned()).collect();
    expected.extend(
        [
            "D assistant/message 1.1 \"echo: \" call sleep 2000",
            "D tool/call 1.1 sleep 2000",
            "D spliced next-turn 0 0 [B]",
            "L inserted B",
            "D spliced next-turn 0 0 [X] wake",
            "L inserted X",
            // The started sleep stops at the abort and commits an error result.
            "D tool/result 1.1 error *",
            "D step/end 1.1",
            "D turn/end 1 aborted{user}",
            "D status idle",
            "L status idle",
            "D status running",
            "L status running",
        ]
        .map(String::from),
    );
    expected.extend(turn_lines("X", 2, "now"));
    expected.extend(turn_lines("B", 3, "queued"));
    expected.extend(["D status idle".into(), "L status idle".into()]);
    assert_lines(&lines, &refs(&expected));

    let x_message = watch.events().into_iter().find_map(|e| match e.payload {
        Some(turnstile_proto::v1::session_event::Payload::UserMessage(m)) if m.turn == 2 => m.message,
        _ => None,
    });
    assert_eq!(x_message.map(|m| text_of(&m)), Some("now".to_owned()));
}

turnstile_tests::scenario_tests!(
    s13_cancel_mid_stream_discards_queue,
    s14_cancel_keep_inbox_parks_queue,
    s15_followup_during_abort_latches,
    s15_steer_during_abort_goes_to_next_turn,
    s24_interrupt_runs_next_with_queue_behind,
);
