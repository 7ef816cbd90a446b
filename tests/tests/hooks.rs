//! Remote pre-step hooks (SPEC §9, §7 9–12): `turnstile dev --config FILE` with agents whose `hooks` point
//! at a hook server on a loopback port ([`HookServer`], in this process; one test runs a Python grpcio
//! server instead). Each test writes the configuration, runs prompts and reads the session's log.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tempfile::TempDir;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{InjectMode, SessionStatus};
use turnstile_tests::{
    Behaviour, DevOptions, DevServer, HookServer, PythonHookServer, Session, WatchRecorder, text_of, user_msg,
};

/// Long enough that a passing run never reaches it, short enough to keep the deadline tests quick: the
/// hooks that are meant to miss it sleep far longer ([`SLEEP`]).
const SHORT_DEADLINE_MS: u64 = 200;
const SLEEP: Duration = Duration::from_secs(30);

/// A deadline no passing call reaches.
const DEADLINE_MS: u64 = 10_000;

/// `turnstile dev --config FILE` with `toml` as the file.
async fn dev(toml: &str) -> (TempDir, DevServer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, toml).unwrap();
    let opts = DevOptions { extra_args: vec!["--config".into(), path.display().to_string()], ..DevOptions::default() };
    (dir, DevServer::start_with(opts).await.unwrap())
}

/// One agent `guarded` (the default) with `hooks`, each `(url, deadline_ms, on_failure)`.
fn guarded(hooks: &[(&str, u64, &str)]) -> String {
    let hooks: Vec<String> = hooks
        .iter()
        .map(|(url, deadline, on_failure)| {
            format!("{{ url = \"{url}\", deadline_ms = {deadline}, on_failure = \"{on_failure}\" }}")
        })
        .collect();
    format!("default_agent = \"guarded\"\n\n[agents.guarded]\ntools = [\"echo\"]\nhooks = [{}]\n", hooks.join(", "))
}

/// The session's durable lines once it is idle.
async fn settle(watch: &WatchRecorder, s: &Session) -> Vec<String> {
    watch.settle(s).await.unwrap()
}

fn has(lines: &[String], line: &str) -> bool {
    lines.iter().any(|l| l == line)
}

/// The entered `user/message`s of the log: (id, text).
async fn entered(s: &Session) -> Vec<(String, String)> {
    let (events, _) = s.replay(0).await.unwrap();
    events
        .into_iter()
        .filter_map(|e| match e.payload {
            Some(Payload::UserMessage(m)) => m.message.map(|m| (m.id.clone(), text_of(&m))),
            _ => None,
        })
        .collect()
}

/// §7 11: the hook rewrites the content; the `user/message` carries the new content and the same id, and
/// the model answers it. The hook got the session, agent, turn and step.
#[tokio::test]
async fn a_rewrite_enters_the_new_content_under_the_same_id() {
    let hook = HookServer::start(Behaviour::Prefix("hooked: ".into())).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D assistant/message 1.1 \"echo: hooked: hello\""), "{lines:#?}");
    assert!(has(&lines, "D turn/end 1 completed"), "{lines:#?}");
    assert_eq!(entered(&s).await, [("A".to_owned(), "hooked: hello".to_owned())]);
    let requests = hook.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!((r.agent.as_str(), r.turn, r.step), ("guarded", 1, 1));
    assert_eq!(r.session.as_ref().map(|s| s.id.clone()), Some(s.reference().id));
}

/// Hooks are per agent: a session configured to an agent without hooks never calls the server.
#[tokio::test]
async fn an_agent_without_hooks_does_not_call_them() {
    let hook = HookServer::start(Behaviour::Reject("never".into())).await.unwrap();
    let toml = format!("{}\n[agents.plain]\n", guarded(&[(&hook.url(), DEADLINE_MS, "error")]));
    let (_dir, server) = dev(&toml).await;
    let s = server.session();
    s.configure("plain", InjectMode::Pending).await.unwrap();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D turn/end 1 completed"), "{lines:#?}");
    assert!(hook.requests().is_empty());
}

/// The hook drops a message: only the others are entered.
#[tokio::test]
async fn a_drop_leaves_the_message_out() {
    let hook = HookServer::start(Behaviour::DropContaining("secret".into())).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    // An idle inject joins the next waking delivery's batch (§7 7): the hook sees both.
    s.inject(user_msg("I", "a secret")).await.unwrap();
    s.followup(user_msg("P", "public")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert_eq!(hook.batches(), [vec!["a secret".to_owned(), "public".to_owned()]]);
    assert_eq!(entered(&s).await, [("P".to_owned(), "public".to_owned())]);
    assert!(has(&lines, "D assistant/message 1.1 \"echo: public\""), "{lines:#?}");
}

/// §7 9: the hook rejects; the turn ends `blocked{reason}` with no step; a prompt queued afterwards parks
/// until the next waking delivery.
#[tokio::test]
async fn a_reject_blocks_the_turn_and_a_queued_prompt_parks() {
    let hook = HookServer::start(Behaviour::Reject("not today".into())).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("R", "please")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert_eq!(
        &lines[5..],
        [
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "L claimed R 1",
            "D turn/end 1 blocked{not today}",
            "D status idle",
            "L status idle",
        ],
        "{lines:#?}"
    );
    s.queue(user_msg("Q", "later")).await.unwrap();
    settle(&watch, &s).await;
    let info = s.info().await.unwrap();
    assert_eq!((info.status, info.last_seq), (SessionStatus::Idle as i32, 7), "the queued prompt parks");

    hook.set(Behaviour::Pass);
    s.followup(user_msg("F", "wake")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D assistant/message 2.1 \"echo: later\""), "{lines:#?}");
    assert!(has(&lines, "D assistant/message 3.1 \"echo: wake\""), "{lines:#?}");
}

/// §7 10: `enter([])` at the first proposal ends the turn `completed` with no step; a queue parks.
#[tokio::test]
async fn enter_nothing_at_the_first_proposal_completes_without_a_step() {
    let hook = HookServer::start(Behaviour::EnterNothing).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D turn/end 1 completed"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.starts_with("D step/start")), "{lines:#?}");
    let seq = s.info().await.unwrap().last_seq;
    s.queue(user_msg("Q", "later")).await.unwrap();
    settle(&watch, &s).await;
    let info = s.info().await.unwrap();
    assert_eq!((info.status, info.last_seq), (SessionStatus::Idle as i32, seq + 1), "the queued prompt parks");
}

/// A hook that answers after its deadline, under `on_failure`. Returns the lines of the first turn and
/// those of a second followup after the hook behaves again.
async fn late_hook(on_failure: &str) -> (Vec<String>, Vec<String>, String) {
    let hook = HookServer::start(Behaviour::Sleep(SLEEP)).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), SHORT_DEADLINE_MS, on_failure)])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let first = settle(&watch, &s).await;
    hook.set(Behaviour::Pass);
    s.followup(user_msg("B", "again")).await.unwrap();
    let second = settle(&watch, &s).await;
    let second = second[first.len()..].to_vec();
    (first, second, hook.url())
}

/// §7 12 with `on_failure = "error"`: live `agent/error` naming the hook, `turn/end error`, idle; the
/// next followup runs normally.
#[tokio::test]
async fn a_late_hook_with_on_failure_error_ends_the_turn_error() {
    let (first, second, url) = late_hook("error").await;
    let error = first.iter().find(|l| l.starts_with("L error 1.")).unwrap_or_else(|| panic!("{first:#?}"));
    assert!(error.contains(&url) && error.contains("deadline of 200 ms"), "{error}");
    assert!(has(&first, "D turn/end 1 error"), "{first:#?}");
    assert!(!first.iter().any(|l| l.starts_with("D step/start")), "{first:#?}");
    assert!(has(&second, "D assistant/message 2.1 \"echo: again\""), "{second:#?}");
}

/// The hook calls are counted by hook, outcome and action on `/metrics`, and timed.
#[tokio::test]
async fn hook_calls_are_counted_by_outcome() {
    let hook = HookServer::start(Behaviour::Sleep(SLEEP)).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), SHORT_DEADLINE_MS, "skip")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    settle(&watch, &s).await;
    hook.set(Behaviour::Pass);
    s.followup(user_msg("B", "again")).await.unwrap();
    settle(&watch, &s).await;
    let metrics = scrape_metrics(server.http_addr().unwrap()).await;
    let url = hook.url();
    let count = |outcome: &str, action: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("turnstile_pre_step_hook_calls_total{"))
            .filter(|l| {
                l.contains(&format!("hook=\"{url}\""))
                    && l.contains(&format!("outcome=\"{outcome}\""))
                    && l.contains(&format!("action=\"{action}\""))
            })
            .map(|l| l.rsplit_once(' ').unwrap().1.to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(count("timeout", "skip"), ["1"], "{metrics}");
    assert_eq!(count("enter", "pass"), ["1"], "{metrics}");
    assert!(metrics.contains("turnstile_pre_step_hook_duration_seconds"), "{metrics}");
}

/// `GET /metrics` on the server's HTTP port.
async fn scrape_metrics(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
}

/// A cancel while a hook is deciding ends the proposal at once: the turn ends `aborted{user}` with no
/// step, without waiting for the hook's deadline.
#[tokio::test]
async fn a_cancel_ends_a_pending_hook_call() {
    let hook = HookServer::start(Behaviour::Sleep(SLEEP)).await.unwrap();
    // A deadline far beyond any test wait: only the cancel can end this proposal.
    let (_dir, server) = dev(&guarded(&[(&hook.url(), 600_000, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let deadline = tokio::time::Instant::now() + turnstile_tests::DEFAULT_WAIT;
    while hook.requests().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the hook was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.cancel(false).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D turn/end 1 aborted{user}"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.starts_with("D step/start")), "{lines:#?}");
}

/// `on_failure = "reject"`: the turn ends `blocked` with a reason naming the hook and the failure.
#[tokio::test]
async fn a_late_hook_with_on_failure_reject_blocks_the_turn() {
    let (first, second, url) = late_hook("reject").await;
    let expected =
        format!("D turn/end 1 blocked{{pre-step hook {url} failed: no answer within the deadline of 200 ms}}");
    assert!(has(&first, &expected), "{first:#?}");
    assert!(!first.iter().any(|l| l.starts_with("L error")), "{first:#?}");
    assert!(has(&second, "D assistant/message 2.1 \"echo: again\""), "{second:#?}");
}

/// `on_failure = "skip"`: the batch goes on unchanged.
#[tokio::test]
async fn a_late_hook_with_on_failure_skip_is_left_out() {
    let (first, _, _) = late_hook("skip").await;
    assert!(has(&first, "D assistant/message 1.1 \"echo: hello\""), "{first:#?}");
    assert!(has(&first, "D turn/end 1 completed"), "{first:#?}");
}

/// A hook nothing listens on (`on_failure = "error"`): the turn ends `error` naming the hook.
#[tokio::test]
async fn a_hook_that_is_down_fails_the_turn() {
    let url = {
        // A port that was free a moment ago and now has no listener.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let (_dir, server) = dev(&guarded(&[(&url, DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D turn/end 1 error"), "{lines:#?}");
    let error = lines.iter().find(|l| l.starts_with("L error 1.")).unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(error.contains(&url) && error.contains("unavailable"), "{error}");
}

/// Invalid answers are failures naming the offending id; a gRPC error status is one too.
#[tokio::test]
async fn invalid_answers_and_error_statuses_are_hook_failures() {
    let hook = HookServer::start(Behaviour::AddMessage("X".into())).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&hook.url(), DEADLINE_MS, "reject")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    let url = hook.url();
    let cases = [
        (Behaviour::AddMessage("X".into()), "enter.messages[1]: id \"X\" is not in the batch the hook was given"),
        (Behaviour::Duplicate, "enter.messages[1]: id \"A2\" appears twice"),
        (Behaviour::Empty, "the decision is empty (set reject or enter)"),
    ];
    let mut turn = 0;
    for (behaviour, failure) in cases {
        turn += 1;
        hook.set(behaviour);
        s.followup(user_msg(&format!("A{turn}"), "hello")).await.unwrap();
        let lines = settle(&watch, &s).await;
        let expected = format!("D turn/end {turn} blocked{{pre-step hook {url} failed: invalid answer: {failure}}}");
        assert!(has(&lines, &expected), "{expected}\n{lines:#?}");
    }
    turn += 1;
    hook.set(Behaviour::Fail("boom".into()));
    s.followup(user_msg("F", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    let expected = format!("D turn/end {turn} blocked{{pre-step hook {url} failed: answered Internal: boom}}");
    assert!(has(&lines, &expected), "{expected}\n{lines:#?}");
}

/// Two hooks in a row: the second gets the batch the first produced.
#[tokio::test]
async fn the_second_hook_sees_the_first_hooks_output() {
    let one = HookServer::start(Behaviour::Prefix("one:".into())).await.unwrap();
    let two = HookServer::start(Behaviour::Prefix("two:".into())).await.unwrap();
    let (_dir, server) = dev(&guarded(&[(&one.url(), DEADLINE_MS, "error"), (&two.url(), DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "hello")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert_eq!(one.batches(), [vec!["hello".to_owned()]]);
    assert_eq!(two.batches(), [vec!["one:hello".to_owned()]]);
    assert!(has(&lines, "D assistant/message 1.1 \"echo: two:one:hello\""), "{lines:#?}");
}

/// The built-in step budget: a tool step takes the turn to a second proposal, which a budget of one step
/// rejects; a budget of two lets the model answer the tool result.
#[tokio::test]
async fn the_step_budget_blocks_the_step_past_the_limit() {
    let toml = "default_agent = \"one\"\n[agents.one]\ntools = [\"echo\"]\nmax_steps_per_turn = 1\n\
                [agents.two]\ntools = [\"echo\"]\nmax_steps_per_turn = 2\n";
    let (_dir, server) = dev(toml).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:echo x]] go")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D tool/result 1.1 \"x\""), "{lines:#?}");
    assert!(has(&lines, "D step/end 1.1"), "{lines:#?}");
    assert!(has(&lines, "D turn/end 1 blocked{step budget: turn 1 reached its limit of 1 step}"), "{lines:#?}");
    assert!(!has(&lines, "D step/start 1.2"), "{lines:#?}");

    let s = server.session();
    s.configure("two", InjectMode::Pending).await.unwrap();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:echo x]] go")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert!(has(&lines, "D assistant/message 1.2 \"tool results: echo: x\""), "{lines:#?}");
    assert!(has(&lines, "D turn/end 1 completed"), "{lines:#?}");
}

/// A hook written in Python with grpcio (`tests/fixtures/hook_server.py`), stubs generated from `proto/`
/// at test time: it upper-cases the batch.
#[tokio::test]
async fn a_python_hook_rewrites_the_batch() {
    let python = PythonHookServer::start(&[]).await.unwrap();
    let url = python.url().to_owned();
    let (_dir, server) = dev(&guarded(&[(&url, DEADLINE_MS, "error")])).await;
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.inject(user_msg("I", "some context")).await.unwrap();
    s.followup(user_msg("P", "hello there")).await.unwrap();
    let lines = settle(&watch, &s).await;
    assert_eq!(
        entered(&s).await,
        [("I".to_owned(), "SOME CONTEXT".to_owned()), ("P".to_owned(), "HELLO THERE".to_owned())]
    );
    assert!(has(&lines, "D turn/end 1 completed"), "{lines:#?}");
}
