//! A real model end to end: llama.cpp's `llama-server` with SmolLM2-135M-Instruct (the harness's
//! [`LlamaServer`]), first on its own, then behind `turnstile dev --config FILE` as an `openai` model.
//!
//! Needs `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (`scripts/setup-test-deps`, `source .ci/test-env.sh`).
//! Nothing here asserts on durations or on the exact words of the model: the server runs greedy
//! (`--temp 0`), but the tests only rely on what holds for any answer (non-empty, deltas before the
//! durable message, token counts, what the requests carried).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use tonic::Code;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::llama::{LlamaServer, RecordingProxy, SMOLLM2_MODEL, chat_body, stream_chat};
use turnstile_tests::msg::TEST_TENANT;
use turnstile_tests::{DevOptions, DevServer, Session, WatchRecorder, user_msg};

const SYSTEM: &str = "You are a helpful assistant. Answer in one short sentence.";

/// The server starts on a port it picked, is healthy, and streams a short answer with usage; the same
/// request gives the same text (greedy decoding); the recording proxy forwards the stream unchanged and
/// keeps the request exactly as sent.
#[tokio::test]
async fn llama_server_streams_deterministically() {
    let llama = LlamaServer::start().await.unwrap();
    assert!(llama.addr().ip().is_loopback());
    assert_eq!(llama.health().await, Some(200));

    let body = chat_body(SYSTEM, "What colour is the sky on a clear day?", 16);
    let first = stream_chat(llama.addr(), &body).await.unwrap();
    let text = first.text();
    assert!(!text.trim().is_empty(), "an empty answer: {first:?}\n{}", llama.log_tail());
    assert!(first.deltas.len() > 1, "streamed in one piece: {first:?}");
    let usage = first.usage.expect("usage in the last chunk (stream_options.include_usage)");
    assert!(usage.prompt_tokens > 0, "{usage:?}");
    assert!((1..=16).contains(&usage.completion_tokens), "{usage:?}");
    assert!(matches!(first.finish_reason.as_deref(), Some("stop" | "length")), "{first:?}");

    let again = stream_chat(llama.addr(), &body).await.unwrap();
    assert_eq!(again.text(), text, "--temp 0 is greedy: the same request gives the same text");
    assert_eq!(again.usage, first.usage);

    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    let proxied = stream_chat(proxy.addr(), &body).await.unwrap();
    assert_eq!(proxied.text(), text, "the proxy passes the stream through");
    let recorded = proxy.chat_requests();
    assert_eq!(recorded, vec![body], "the proxy keeps the request as sent");
}

/// `(role, content)` of each entry of a Chat Completions request's `messages`.
fn messages_of(request: &Value) -> Vec<(String, String)> {
    let entry = |m: &Value| {
        (m["role"].as_str().unwrap_or_default().to_owned(), m["content"].as_str().unwrap_or_default().to_owned())
    };
    request["messages"].as_array().map(|all| all.iter().map(entry).collect()).unwrap_or_default()
}

fn pair(role: &str, content: &str) -> (String, String) {
    (role.to_owned(), content.to_owned())
}

/// Waits until the session is idle. A real model on a busy machine can take longer than the harness's 30 s
/// `WhenIdle` (the time is the model's, not Turnstile's), so this asks up to four times (2 min) before
/// the stream is settled.
async fn wait_idle(session: &Session, context: impl Fn() -> String) {
    for _ in 0..4 {
        match session.when_idle().await {
            Ok(_) => return,
            Err(status) if status.code() == Code::DeadlineExceeded => {}
            Err(status) => panic!("WhenIdle failed: {status}\n{}", context()),
        }
    }
    panic!("the session was not idle within 2 min\n{}", context());
}

/// Turn `turn` (one model step) as `Watch` delivered it: the live deltas came before the durable
/// `assistant/message` and concatenate to its text, which is not empty; the turn ended without error.
/// Returns the text.
fn check_answer(watch: &WatchRecorder, turn: u64, context: &str) -> String {
    let items = watch.items();
    let message_at = items
        .iter()
        .position(|i| {
            matches!(&i.item, Some(Item::Event(e))
                if matches!(&e.payload, Some(Durable::AssistantMessage(m)) if m.turn == turn && m.step == 1))
        })
        .unwrap_or_else(|| panic!("no assistant/message {turn}.1 in\n{}\n{context}", watch.lines().join("\n")));
    let deltas: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, i)| {
            matches!(&i.item, Some(Item::Live(l))
                if matches!(&l.payload, Some(Live::AssistantDelta(d)) if d.turn == turn && d.step == 1))
        })
        .map(|(at, _)| at)
        .collect();
    assert!(!deltas.is_empty(), "turn {turn}: no live assistant/delta\n{}", watch.lines_with_deltas().join("\n"));
    assert!(
        deltas.iter().all(|at| *at < message_at),
        "turn {turn}: a delta arrived after the durable assistant/message (items {deltas:?}, message {message_at})"
    );
    let message = watch.assistant_message(turn, 1).expect("assistant/message");
    assert!(!message.text.trim().is_empty(), "turn {turn}: the model's answer is empty: {message:?}\n{context}");
    assert_eq!(watch.delta_text(turn, 1), message.text, "turn {turn}: the deltas concatenate to the message text");
    assert!(!message.interrupted && message.tool_calls.is_empty(), "{message:?}");
    let lines = watch.lines();
    let end = format!("D turn/end {turn} ");
    let ended = lines.iter().find(|l| l.starts_with(&end)).unwrap_or_else(|| panic!("no {end:?} in {lines:#?}"));
    // `completed`, or `max-tokens` when the answer ran into `max_tokens`: either is a good answer here.
    assert!(ended.ends_with(" completed") || ended.ends_with(" max-tokens"), "{ended}\n{context}");
    message.text
}

/// `turnstile dev --config FILE` with an `openai` model on llama-server (through a recording proxy) as
/// the default agent: two followups on one session. Each answer streams as live deltas before its durable
/// message; the usage is recorded; the second model request carries the first turn; `turnstile watch`
/// shows the answer.
#[tokio::test]
async fn dev_with_a_real_model_keeps_history() {
    let llama = LlamaServer::start().await.unwrap();
    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    // docs/CONFIGURATION.md. Short answers keep CI quick; the model server decodes greedily (`--temp 0`:
    // the configuration has no temperature key). `retries = 0`: a failed request is a failed test.
    let toml = format!(
        r#"default_agent = "assistant"

[models.local]
provider = "openai"
base_url = "{base_url}"
model = "{SMOLLM2_MODEL}"
max_tokens = 32
retries = 0

[agents.assistant]
model = "local"
system = "{SYSTEM}"
"#,
        base_url = proxy.base_url(),
    );
    let (_dir, config) = config_file(&toml);
    let opts = DevOptions { extra_args: config_args(&config), ..DevOptions::default() };
    let server = DevServer::start_with(opts).await.unwrap();
    let context = || format!("--- turnstile dev\n{}\n--- llama-server\n{}", server.log_tail(), llama.log_tail());

    let session = server.session();
    let watch = session.watch().await.unwrap();
    // The second question is shorter than the first: see the token count check below.
    let (q1, q2) = ("Which planet in our solar system is the largest one?", "And the smallest?");

    session.followup(user_msg("q1", q1)).await.unwrap();
    wait_idle(&session, context).await;
    watch.settle(&session).await.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let a1 = check_answer(&watch, 1, &context());

    session.followup(user_msg("q2", q2)).await.unwrap();
    wait_idle(&session, context).await;
    watch.settle(&session).await.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let a2 = check_answer(&watch, 2, &context());

    // The model requests, as llama-server received them: the system prompt first; the second holds the
    // whole first turn (its user text and the answer) before the new question. This is the check that
    // fails if history were dropped: it compares the bytes the model got, not a count.
    let requests = proxy.chat_requests();
    assert_eq!(requests.len(), 2, "one model request per turn: {requests:#?}");
    assert_eq!(messages_of(&requests[0]), vec![pair("system", SYSTEM), pair("user", q1)], "{:#}", requests[0]);
    assert_eq!(
        messages_of(&requests[1]),
        vec![pair("system", SYSTEM), pair("user", q1), pair("assistant", &a1), pair("user", q2)],
        "the second request carries the first turn: {:#}",
        requests[1]
    );
    for request in &requests {
        assert_eq!(request["model"], SMOLLM2_MODEL);
        assert_eq!(request["max_tokens"], 32);
        assert_eq!(request["stream"], true);
    }

    // Usage as recorded on the durable messages (the provider's own counts).
    let u1 = watch.assistant_message(1, 1).and_then(|m| m.usage).expect("usage on assistant/message 1.1");
    let u2 = watch.assistant_message(2, 1).and_then(|m| m.usage).expect("usage on assistant/message 2.1");
    eprintln!("turn 1: {a1:?} {u1:?}\nturn 2: {a2:?} {u2:?}");
    for u in [&u1, &u2] {
        assert!(u.input_tokens > 0 && u.output_tokens > 0, "{u:?}");
        assert!(u.output_tokens <= 32, "max_tokens = 32: {u:?}");
    }
    // The same fact from the server's side: with the first turn in it, the second prompt holds the first
    // prompt, the first answer (output_tokens of it, give or take the tokenizer's re-split of the text)
    // and the second question with its chat-template tokens (at least ~8, more than the re-split can take
    // away). Without history it would be the first prompt less q1 plus the shorter q2, below u1.input.
    assert!(
        u2.input_tokens > u1.input_tokens + u1.output_tokens,
        "second prompt {u2:?} should contain the first prompt and answer {u1:?}"
    );

    // The CLI renders the answers (`assistant/message "TEXT"`, long texts cut with an ellipsis).
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let (url, id) = (server.url(), session.reference().id);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .args(["--addr", &url, "--tenant", TEST_TENANT, "watch", &id, "--until-idle", "--no-live"])
            .env("NO_COLOR", "1")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "turnstile watch failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    for (answer, usage) in [(&a1, &u1), (&a2, &u2)] {
        // The debug-quoted start of the answer, without its closing quote: what any cut of it begins with.
        let quoted = format!("{:?}", answer.chars().take(20).collect::<String>());
        let shown = format!("assistant/message {}", &quoted[..quoted.len() - 1]);
        let line = stdout.lines().find(|l| l.contains(&shown));
        let line = line.unwrap_or_else(|| panic!("`turnstile watch` does not show {shown:?}:\n{stdout}"));
        let counts = format!("usage in={} out={}", usage.input_tokens, usage.output_tokens);
        assert!(line.contains(&counts), "`turnstile watch` shows no {counts:?} in {line:?}");
    }
}
