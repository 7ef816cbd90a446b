//! `turnstile dev --nats`: the single-process cluster on JetStream, seen from outside.
//!
//! - an unreachable NATS at startup is a clear error naming the URL, exit 1;
//! - an outside observer (a plain async-nats subscriber) gets the live events of an idle followup on the
//!   documented subjects `turnstile.live.<tenant>.<session>.<type with / as .>`, in order, the same ones
//!   Watch streams;
//! - a SIGKILLed process restarted on the same NATS keeps every session and repairs and resumes the work
//!   that was running (SPEC §6, §7 26 and 27);
//! - NATS lost while running: commands fail UNAVAILABLE, nothing is half-applied, and service comes back
//!   by itself when NATS does.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use futures::StreamExt as _;
use prost::Message as _;
use tonic::Code;
use turnstile_journal::{JetStreamConfig, JetStreamLog, SessionLog};
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{LiveEvent, SessionEvent, SessionRef, SessionStatus, WatchItem};
use turnstile_tests::binary::turnstile_bin;
use turnstile_tests::ports::ClosedPort;
use turnstile_tests::process::ChildProcess;
use turnstile_tests::watch::check_stream;
use turnstile_tests::{
    Backend, DEFAULT_WAIT, DevOptions, DevServer, NatsServer, Session, assert_lines, lines_of, new_session_ref,
    user_msg,
};

/// The durable log as lines (`D ...`), from a fresh replay.
async fn log_lines(s: &Session) -> Vec<String> {
    lines_of(&items(s.replay(0).await.unwrap().0), false)
}

fn items(events: Vec<SessionEvent>) -> Vec<WatchItem> {
    events.into_iter().map(|e| WatchItem { item: Some(Item::Event(e)) }).collect()
}

/// Replays until the log ends with `status idle` after `turn/end {turn} ...` (bounded), then checks the
/// envelopes and returns the lines. For sessions resumed at startup, where no Watch can be opened early
/// enough to see every live event.
async fn wait_idle_after_turn(s: &Session, turn: u64) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let end = format!("D turn/end {turn} ");
    loop {
        let lines = match s.replay(0).await {
            Ok((events, _)) => {
                check_stream(&items(events.clone()), 0).unwrap();
                lines_of(&items(events), false)
            }
            // The process may still be loading the session.
            Err(_) => Vec::new(),
        };
        let ended = lines.iter().rposition(|l| l.starts_with(&end));
        if ended.is_some_and(|at| lines[at..].iter().any(|l| l == "D status idle")) {
            let info = s.when_idle().await.unwrap();
            assert_eq!(info.status, SessionStatus::Idle as i32);
            return log_lines(s).await;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no idle after turn {turn}; the log so far:\n{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How often each MessageId was entered (`D user/message ID`).
fn entered(lines: &[String], id: &str) -> usize {
    lines.iter().filter(|l| l.split(' ').take(3).collect::<Vec<_>>() == ["D", "user/message", id]).count()
}

/// An outside subscriber to every live event of `session`, registered on the server when this returns.
async fn observe(nats: &NatsServer, session: &SessionRef) -> async_nats::Subscriber {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let subject = format!("turnstile.live.{}.{}.>", session.tenant, session.id);
    let subscriber = client.subscribe(subject).await.unwrap();
    turnstile_journal::jetstream::barrier(&client).await.unwrap();
    subscriber
}

/// Takes messages until `done` holds for the decoded ones (bounded).
async fn collect_live(
    sub: &mut async_nats::Subscriber,
    mut done: impl FnMut(&[(String, LiveEvent)]) -> bool,
) -> Vec<(String, LiveEvent)> {
    let mut got = Vec::new();
    let read = async {
        while !done(&got) {
            let message = sub.next().await.expect("the subscription ended");
            let event = LiveEvent::decode(message.payload.as_ref()).expect("a protobuf LiveEvent body");
            got.push((message.subject.to_string(), event));
        }
    };
    if tokio::time::timeout(DEFAULT_WAIT, read).await.is_err() {
        let seen: Vec<String> = got.iter().map(|(s, e)| format!("{s} after {}", e.after_seq)).collect();
        panic!("the observer did not get what it waited for; got:\n{}", seen.join("\n"));
    }
    got
}

fn is_idle_status(e: &LiveEvent) -> bool {
    matches!(&e.payload, Some(turnstile_proto::v1::live_event::Payload::Status(s)) if s.status == SessionStatus::Idle as i32)
}

#[tokio::test]
async fn an_unreachable_nats_at_startup_is_named_and_exits_1() {
    let bin = tokio::task::spawn_blocking(turnstile_bin).await.unwrap().unwrap();
    // A port nobody listens on: held bound, never listening, for the whole test.
    let closed = ClosedPort::new().unwrap();
    let url = format!("nats://{}", closed.addr());
    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("dev.log");
    let mut command = Command::new(bin);
    command.args(["dev", "--listen", "127.0.0.1:0", "--nats", &url]).env("NO_COLOR", "1");
    let mut child = ChildProcess::spawn("turnstile dev --nats (unreachable)", command, &log).unwrap();
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let status = loop {
        if let Some(status) = child.exited() {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "still running:\n{}", child.log_tail());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let output = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status, "exit status: 1", "{output}");
    let line = output.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("no error line:\n{output}"));
    assert!(line.starts_with(&format!("error: cannot reach NATS at {url}: ")), "{line}");
    assert!(line.ends_with("; start nats-server with -js or pass the right --nats"), "{line}");
    assert!(!output.contains("listening"), "nothing is served without the journal:\n{output}");
}

/// The documented live subjects carry the live events of one idle followup (SPEC §5) in order, as
/// protobuf `LiveEvent`s, exactly the ones Watch streams.
#[tokio::test]
async fn an_outside_subscriber_sees_the_live_events_of_an_idle_followup() {
    let server = Backend::Nats.start_dev().await.unwrap();
    let nats = server.nats().unwrap();
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains(&format!("journal    JetStream at {}", nats.url())), "the banner names the journal:\n{log}");

    let s = server.session();
    let mut sub = observe(nats, &s.reference()).await;
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    watch.settle(&s).await.unwrap();
    let got = collect_live(&mut sub, |got| got.last().is_some_and(|(_, e)| is_idle_status(e))).await;

    let session = s.reference();
    for (subject, event) in &got {
        assert_eq!(*subject, format!("turnstile.live.test.{}.{}", session.id, event.r#type.replace('/', ".")));
        assert_eq!(event.session.as_ref(), Some(&session));
    }
    let without_deltas: Vec<(&str, u64)> = got
        .iter()
        .filter(|(_, e)| e.r#type != "assistant/delta")
        .map(|(s, e)| (s.rsplit_once(&session.id).unwrap().1, e.after_seq))
        .collect();
    assert_eq!(
        without_deltas,
        [(".agent.inbox.inserted", 1), (".agent.status", 2), (".agent.inbox.claimed", 4), (".agent.status", 10)],
        "inserted after the splice, status after status running, claimed after the claim splice, status after \
         status idle"
    );
    let deltas: Vec<&LiveEvent> = got.iter().map(|(_, e)| e).filter(|e| e.r#type == "assistant/delta").collect();
    assert!(!deltas.is_empty() && deltas.iter().all(|e| e.after_seq == 6), "deltas follow the user/message (seq 6)");
    let positions: Vec<usize> = ["agent/inbox/claimed", "assistant/delta"]
        .iter()
        .map(|t| got.iter().position(|(_, e)| e.r#type == *t).unwrap())
        .collect();
    assert!(positions[0] < positions[1], "deltas come after the claim");
    let observed: Vec<LiveEvent> = got.into_iter().map(|(_, e)| e).collect();
    assert_eq!(observed, watch.live_events(), "the observer and Watch see the same live events in the same order");
}

/// SPEC §7 26 on `dev --nats`: SIGKILL mid tool call; the restarted process records the call interrupted,
/// writes its synthetic result and `turn/end interrupted`, answers that result in turn 2 (never running the
/// call again, decision 0143) and then runs the followup that was pending; another session's log and inbox are untouched; no MessageId is lost or entered twice.
#[tokio::test]
async fn s26_sigkill_mid_tool_call_then_restart_resumes_on_nats() {
    let nats = NatsServer::start().await.unwrap();
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();

    // A bystander: idle, one queued message.
    let other = server.session();
    other.followup(user_msg("O", "other")).await.unwrap();
    other.when_idle().await.unwrap();
    other.queue(user_msg("Q", "parked")).await.unwrap();
    let other_log = other.replay(0).await.unwrap();
    let other_inbox = other.inbox().await.unwrap();

    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:sleep 3000]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep *").await.unwrap();
    s.followup(user_msg("B", "bee")).await.unwrap();
    watch.wait_line("L inserted B").await.unwrap();
    drop(watch);
    server.kill();

    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let s = Session::with_ref(server.client(), s.reference());
    let lines = wait_idle_after_turn(&s, 3).await;
    assert_lines(
        &lines,
        &[
            "D spliced next-turn 0 0 [A] wake",
            "D status running",
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "D step/start 1.1",
            "D user/message A",
            "D assistant/message 1.1 \"echo: go\" call sleep 3000",
            "D tool/call 1.1 sleep 3000",
            "D spliced next-turn 0 0 [B] wake",
            // Written by the restarted process: the cut call is recorded interrupted and never run again;
            // the resumed turn answers its result (decision 0143).
            "D tool/repaired 1.1 call-1-1-1 interrupted",
            "D tool/result 1.1 error *",
            "D step/end 1.1",
            "D turn/end 1 interrupted",
            "D turn/start 2",
            "D step/start 2.1",
            "D assistant/message 2.1 \"tool results: sleep failed: interrupted: the worker running this call stopped before it finished\"",
            "D step/end 2.1",
            "D turn/end 2 completed",
            "D turn/start 3",
            "D spliced next-turn 0 1 []",
            "D step/start 3.1",
            "D user/message B",
            "D assistant/message 3.1 \"echo: bee\"",
            "D step/end 3.1",
            "D turn/end 3 completed",
            "D status idle",
        ],
    );
    assert_eq!((entered(&lines, "A"), entered(&lines, "B")), (1, 1), "each MessageId entered exactly once");

    let other = Session::with_ref(server.client(), other.reference());
    assert_eq!(other.replay(0).await.unwrap(), other_log, "the idle session's log is unchanged");
    assert_eq!(other.inbox().await.unwrap(), other_inbox, "and its queued message still pending");
    // A graceful restart keeps everything too.
    server.stop().await;
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let other = Session::with_ref(server.client(), other.reference());
    assert_eq!(other.inbox().await.unwrap(), other_inbox);
    let s = Session::with_ref(server.client(), s.reference());
    assert_eq!(log_lines(&s).await, lines);
}

/// SPEC §7 27 on `dev --nats`: the owner died after claiming A and before `step/start`. No directive
/// holds a pre-step long enough to SIGKILL there, so the test writes that log itself: the first four
/// events of a real idle followup (splice, status running, turn/start, claim) and a real queue splice of
/// B, copied to a fresh session exactly as the runner wrote them. The restarted process must restore A
/// (`restored` splice, live `inserted`), run it in turn 2 and then B in turn 3.
#[tokio::test]
async fn s27_killed_between_claim_and_step_start_restores_the_claim_on_nats() {
    let nats = NatsServer::start().await.unwrap();
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let model = server.session();
    model.followup(user_msg("A", "hello")).await.unwrap();
    model.when_idle().await.unwrap();
    model.queue(user_msg("B", "bee")).await.unwrap();
    let lines = log_lines(&model).await;
    server.kill();

    let journal = JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.unwrap();
    let from = turnstile_model::SessionRef::new(&model.reference().tenant, &model.reference().id).unwrap();
    let written = journal.read(&from, 1, 100).await.unwrap();
    assert_eq!(written.len(), lines.len());
    assert_eq!(lines[3], "D spliced next-turn 0 1 []", "event 4 is the claim");
    assert_eq!(lines.last().map(String::as_str), Some("D spliced next-turn 0 0 [B]"), "the last is B's queue splice");
    let target = new_session_ref();
    let to = turnstile_model::SessionRef::new(&target.tenant, &target.id).unwrap();
    let crashed: Vec<_> = written[..4]
        .iter()
        .chain(written.last())
        .zip(1..)
        .map(|(e, seq)| {
            let mut e = e.clone();
            e.session = to.clone();
            e.seq = seq;
            e
        })
        .collect();
    assert_eq!(journal.append(&to, 0, &crashed, None).await.unwrap(), 5);

    let mut sub = observe(&nats, &target).await;
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let s = Session::with_ref(server.client(), target);
    let lines = wait_idle_after_turn(&s, 3).await;
    assert_lines(
        &lines,
        &[
            "D spliced next-turn 0 0 [A] wake",
            "D status running",
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "D spliced next-turn 0 0 [B]",
            // Written by the restarted process.
            "D turn/end 1 interrupted",
            "D spliced next-turn 0 0 [A] restored",
            "D turn/start 2",
            "D spliced next-turn 0 1 []",
            "D step/start 2.1",
            "D user/message A",
            "D assistant/message 2.1 \"echo: hello\"",
            "D step/end 2.1",
            "D turn/end 2 completed",
            "D turn/start 3",
            "D spliced next-turn 0 1 []",
            "D step/start 3.1",
            "D user/message B",
            "D assistant/message 3.1 \"echo: bee\"",
            "D step/end 3.1",
            "D turn/end 3 completed",
            "D status idle",
        ],
    );
    assert_eq!((entered(&lines, "A"), entered(&lines, "B")), (1, 1));
    let live = collect_live(&mut sub, |got| got.last().is_some_and(|(_, e)| is_idle_status(e))).await;
    let kinds: Vec<String> = live
        .iter()
        .filter(|(_, e)| e.r#type != "assistant/delta")
        .map(|(_, e)| format!("{} {}", e.r#type, e.after_seq))
        .collect();
    assert_eq!(
        kinds,
        ["agent/inbox/inserted 7", "agent/inbox/claimed 9", "agent/inbox/claimed 16", "agent/status 22"],
        "the restored A is inserted again, claimed by turn 2, B by turn 3, then idle"
    );
    // The restored message is still the original acceptance: a retry returns its first seq.
    assert_eq!(s.followup(user_msg("A", "hello")).await.unwrap().seq, 1);
}

/// NATS stops while `dev --nats` runs: commands fail UNAVAILABLE with a message that says so, and reads
/// too; when the same nats-server comes back (same store) the service resumes on its own, a retry of the
/// failed delivery with the same MessageId is applied exactly once, and the earlier log is intact.
#[tokio::test]
async fn losing_nats_fails_commands_unavailable_and_service_resumes_when_it_returns() {
    let mut server = Backend::Nats.start_dev().await.unwrap();
    let s = server.session();
    s.followup(user_msg("A", "hello")).await.unwrap();
    s.when_idle().await.unwrap();
    let before = s.replay(0).await.unwrap();
    let fresh = server.session();

    server.nats_mut().unwrap().stop().await;
    let failed = tokio::time::timeout(DEFAULT_WAIT, s.followup(user_msg("B", "during the outage")))
        .await
        .expect("a command answers while NATS is down");
    let status = failed.expect_err("a delivery cannot be accepted without the journal");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("unavailable"), "the message says what is wrong: {status:?}");
    let status = tokio::time::timeout(DEFAULT_WAIT, fresh.queue(user_msg("F", "new session")))
        .await
        .expect("a command for an unloaded session answers too")
        .expect_err("nor for a session never loaded");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    server.nats_mut().unwrap().restart().await.unwrap();
    // Service resumes by itself: retry B (same id, same content) until the journal takes it.
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let reply = loop {
        match s.followup(user_msg("B", "during the outage")).await {
            Ok(reply) => break reply,
            Err(status) if status.code() == Code::Unavailable => {
                assert!(tokio::time::Instant::now() < deadline, "still unavailable after NATS returned: {status:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("unexpected answer after NATS returned: {status:?}"),
        }
    };
    assert_eq!(reply.seq, 11, "B's splice follows the ten events of turn 1, whether or not the first try landed");
    s.when_idle().await.unwrap();
    let (events, last) = s.replay(0).await.unwrap();
    assert_eq!(&events[..10], &before.0[..], "the log before the outage is intact");
    let lines = lines_of(&items(events.clone()), false);
    check_stream(&items(events), 0).unwrap();
    // B's group (splice, status, turn/start, claim: one message, decision 0021) either did not land, or
    // landed with its ack lost: then the reload repairs turn 2 (interrupted, B restored, SPEC §6) and
    // turn 3 runs B. Either way B is accepted and entered once.
    let repaired = lines.iter().any(|l| l == "D turn/end 2 interrupted");
    if repaired {
        assert!(lines.iter().any(|l| l == "D spliced next-turn 0 0 [B] restored"), "{lines:#?}");
        assert_eq!(last, 24, "B's group, the repair of turn 2 and a whole turn 3 for B: {lines:#?}");
    } else {
        assert_eq!(last, 20, "one group and one whole turn for B: {lines:#?}");
    }
    let accepted = lines.iter().filter(|l| l.contains("[B]") && !l.contains("restored")).count();
    assert_eq!(accepted, 1, "B accepted once: {lines:#?}");
    assert_eq!(entered(&lines, "B"), 1);
    assert_eq!(lines.last().map(String::as_str), Some("D status idle"));
    // The session that was refused during the outage works now, and holds only what was accepted.
    let queued = fresh.queue(user_msg("F", "new session")).await.unwrap();
    assert_eq!(queued.seq, 1, "the refused queue left nothing behind (or exactly the one splice, idempotent)");
}

/// Replays until every turn that started has ended and the log ends `status idle` (bounded), without
/// sending any command; tolerates UNAVAILABLE on the way.
async fn wait_settled_by_itself(s: &Session) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    loop {
        let lines = match s.replay(0).await {
            Ok((events, _)) => {
                check_stream(&items(events.clone()), 0).unwrap();
                lines_of(&items(events), false)
            }
            Err(_) => Vec::new(),
        };
        let started = lines.iter().filter(|l| l.starts_with("D turn/start ")).count();
        let ended = lines.iter().filter(|l| l.starts_with("D turn/end ")).count();
        if started > 0 && started == ended && lines.last().map(String::as_str) == Some("D status idle") {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session did not settle by itself after NATS returned; the log so far:\n{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// NATS stops while a turn runs (mid tool call) and the tool finishes during the outage, so the runner's
/// next append fails. When NATS returns, the session is repaired or continued and settles idle by itself,
/// with no command sent: the prompt is answered, every turn ends, nothing is entered twice, the call is
/// never run again.
#[tokio::test]
async fn losing_nats_mid_turn_the_session_settles_by_itself_when_it_returns() {
    let mut server = Backend::Nats.start_dev().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:sleep 300]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep *").await.unwrap();
    drop(watch);
    server.nats_mut().unwrap().stop().await;
    // The outage must outlast the tool (300 ms) so that the runner's next append meets it: the refused
    // command above usually takes the journal's request timeout, and this bounds it from below.
    let status = tokio::time::timeout(DEFAULT_WAIT, s.followup(user_msg("B", "during the outage")))
        .await
        .expect("a command answers while NATS is down")
        .expect_err("no delivery without the journal");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;

    server.nats_mut().unwrap().restart().await.unwrap();
    let lines = wait_settled_by_itself(&s).await;
    assert_eq!(entered(&lines, "A"), 1, "{lines:#?}");
    assert!(entered(&lines, "B") <= 1, "{lines:#?}");
    // Either the runner appended the tool's result once NATS was back, or the repair ended the call
    // interrupted (decision 0143): the model is answered with one or the other, and the call never runs again.
    assert!(
        lines.iter().any(|l| l.starts_with("D assistant/message")
            && (l.contains("tool results: sleep: slept 300") || l.contains("tool results: sleep failed: interrupted"))),
        "the tool's result or its interruption is answered: {lines:#?}"
    );
    assert_eq!(lines.iter().filter(|l| l.starts_with("D tool/call ")).count(), 1, "never re-run: {lines:#?}");
}
