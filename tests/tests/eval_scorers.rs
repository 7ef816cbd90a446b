//! SPEC §20 evaluation's scorers that ask someone else, against the real binary: a remote hook (an HTTP
//! POST per reply) and a judge agent on llama.cpp's server (SmolLM2-135M), each scoring the recorded and
//! the new reply; an evaluation whose caller goes away mid-run leaves no scratch session behind; and the
//! tenant's request burst bounds how many turns run at once, its used-up token budget stops the reruns.
//!
//! The llama.cpp test needs `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (`source .ci/test-env.sh`), as the other
//! llama tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::evaluate_item::Item;
use turnstile_proto::v1::{
    ConfigureSessionRequest, DeliverRequest, EvaluateRequest, GetSessionRequest, GetUsageRequest, ListSessionsRequest,
    PutAgentRequest, SessionRef, WhenIdleRequest,
};
use turnstile_tests::binary::run_cli;
use turnstile_tests::llama::{LlamaServer, RecordingProxy, SMOLLM2_MODEL};
use turnstile_tests::{DevOptions, DevServer, user_msg};

fn own(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

async fn start(config: &str) -> (DevServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, config).unwrap();
    let opts = DevOptions { extra_args: vec!["--config".into(), path.display().to_string()], ..DevOptions::default() };
    (DevServer::start_with(opts).await.unwrap(), dir)
}

async fn put_agent(c: &mut AgentClient<Channel>, name: &str, definition: &str) {
    let req = PutAgentRequest { name: name.into(), definition: definition.into(), format: 0 };
    c.put_agent(req).await.unwrap();
}

/// Delivers each text as a turn of session `id` on `agent`, to its end.
async fn record(c: &mut AgentClient<Channel>, id: &str, agent: &str, texts: &[&str]) {
    let configure = ConfigureSessionRequest { session: own(id), agent: agent.into(), ..Default::default() };
    c.configure_session(configure).await.unwrap();
    for text in texts {
        let message = user_msg(&uuid::Uuid::new_v4().to_string(), text);
        c.followup(DeliverRequest { session: own(id), message: Some(message), output_schema: None }).await.unwrap();
        c.when_idle(WhenIdleRequest { session: own(id), timeout_ms: 20_000 }).await.unwrap();
    }
}

/// The tenant's sessions carrying the scratch label.
async fn scratch_sessions(c: &mut AgentClient<Channel>) -> Vec<String> {
    let req = ListSessionsRequest { label_selector: "turnstile/eval".into(), page_size: 1000, ..Default::default() };
    c.list_sessions(req).await.unwrap().into_inner().sessions.into_iter().map(|s| s.session.unwrap().id).collect()
}

/// A scorer on loopback: it scores a reply holding "v2" 1, anything else 0.25, and keeps each body.
#[derive(Clone, Default)]
struct Scorer {
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Scorer {
    async fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/score", listener.local_addr().unwrap());
        let bodies = self.bodies.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let bodies = bodies.clone();
                tokio::spawn(async move {
                    let Some(body) = read_body(&mut socket).await else { return };
                    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let v2 = value["reply"].as_str().is_some_and(|r| r.contains("v2"));
                    bodies.lock().unwrap().push(value);
                    let answer = if v2 { r#"{"score": 1}"# } else { r#"{"score": 0.25, "note": "old prompt"}"# };
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        url
    }
}

/// One request's body (head to the blank line, then `content-length` bytes).
async fn read_body(socket: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) else { continue };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + length {
            return Some(buf[end..end + length].to_vec());
        }
    }
}

const PINNED: &str = "version_policy = \"pin\"\n";

#[tokio::test]
async fn a_remote_hook_scores_the_recorded_and_the_new_reply() {
    let (server, _dir) = start("[webhooks]\nallow_private = true\n").await;
    let mut c = server.client();
    put_agent(&mut c, "support", &format!("system = \"You are v1.\"\n{PINNED}")).await;
    record(&mut c, "s1", "support", &["[[system]] first", "[[system]] second"]).await;
    put_agent(&mut c, "support", &format!("system = \"You are v2.\"\n{PINNED}")).await;
    let scorer = Scorer::default();
    let url = scorer.start().await;

    let out = run_cli(vec![
        "eval".into(),
        "--addr".into(),
        server.url(),
        "--json".into(),
        "--agent".into(),
        "support".into(),
        "s1".into(),
        "--scorer".into(),
        "hook".into(),
        "--hook".into(),
        url,
    ])
    .await;
    assert!(out.success, "{}", out.stderr);
    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["recorded"]["score"]["value"].as_f64(), Some(0.25), "{row}");
        assert_eq!(row["recorded"]["score"]["note"], "old prompt", "{row}");
        assert_eq!(row["candidate"]["score"]["value"].as_f64(), Some(1.0), "{row}");
        assert_eq!(row["candidate"]["text"], "system: You are v2.", "{row}");
    }
    assert_eq!(report["summary"]["recordedMean"].as_f64(), Some(0.25));
    assert_eq!(report["summary"]["candidatePassed"].as_u64(), Some(2));
    let bodies = scorer.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 4, "one POST per reply, both sides: {bodies:?}");
    let candidate = bodies.iter().find(|b| b["side"] == "candidate" && b["turn"] == 2).expect("turn 2's new reply");
    assert_eq!(candidate["session"], "default/s1");
    assert_eq!(candidate["input"], "[[system]] second");
    assert_eq!(candidate["reply"], "system: You are v2.");
    assert_eq!(candidate["recorded_reply"], "system: You are v1.");
    assert!(scratch_sessions(&mut c).await.is_empty());
}

#[tokio::test]
async fn a_hook_at_an_internal_address_is_refused_unless_the_operator_allows_it() {
    let (server, _dir) = start("").await;
    let mut c = server.client();
    record(&mut c, "s1", "scripted", &["hi"]).await;
    let scorer = Scorer::default();
    let url = scorer.start().await;
    let hook = turnstile_proto::v1::EvalScorer {
        kind: Some(turnstile_proto::v1::eval_scorer::Kind::Hook(turnstile_proto::v1::HookScorer {
            url,
            timeout_ms: 0,
        })),
    };
    let req = EvaluateRequest { agent: "scripted".into(), scorer: Some(hook), ..Default::default() };
    let e = c.evaluate(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("[webhooks] allow_private = true"), "{}", e.message());
    assert!(scorer.bodies.lock().unwrap().is_empty());
}

/// The caller goes away while four reruns stream slowly: the run stops and deletes every scratch session.
#[tokio::test]
async fn a_caller_that_goes_away_mid_run_leaves_no_scratch_session() {
    let (server, _dir) = start("").await;
    let mut c = server.client();
    let mut recording = Vec::new();
    for i in 0..4 {
        let mut c = c.clone();
        recording.push(tokio::spawn(async move {
            record(&mut c, &format!("slow-{i}"), "scripted", &[&format!("[[delay:1500]] slow {i}")]).await;
        }));
    }
    for r in recording {
        r.await.unwrap();
    }
    let req = EvaluateRequest { agent: "scripted".into(), parallel: 4, ..Default::default() };
    let mut stream = c.evaluate(req).await.unwrap().into_inner();
    let Some(Item::Started(started)) = stream.message().await.unwrap().unwrap().item else { panic!("no started") };
    assert_eq!(started.total, 4);
    // Wait until the reruns are running (their scratch sessions exist), then go away.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while scratch_sessions(&mut c).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no scratch session appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut left = scratch_sessions(&mut c).await;
        for index in 0..4 {
            let id = format!("eval-{}-{index}", started.run_id);
            if c.get_session(GetSessionRequest { session: own(&id) }).await.is_ok() {
                left.push(id);
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "scratch sessions left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The recorded sessions are untouched.
    for i in 0..4 {
        let info = c.get_session(GetSessionRequest { session: own(&format!("slow-{i}")) }).await.unwrap();
        assert_eq!(info.into_inner().last_turn, 1);
    }
}

/// A judge agent on llama.cpp scores both replies of each turn; its turns ask for `{"score": 0..10}` as
/// their output schema, which llama.cpp's `response_format` holds SmolLM2 to.
#[tokio::test]
async fn a_judge_on_llama_cpp_scores_both_sides() {
    let llama = LlamaServer::start().await.unwrap();
    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    let config = format!(
        r#"[models.local]
provider = "openai"
base_url = "{base_url}"
model = "{SMOLLM2_MODEL}"
max_tokens = 32
retries = 0

[agents.judge]
model = "local"
system = "You grade answers to questions. You answer with JSON."

[agents.support]
system = "v1"
version_policy = "pin"
"#,
        base_url = proxy.base_url(),
    );
    let (server, _dir) = start(&config).await;
    let mut c = server.client();
    record(&mut c, "s1", "support", &["What is the capital of France?", "What is 2 + 2?"]).await;
    let context = || format!("--- turnstile dev\n{}\n--- llama-server\n{}", server.log_tail(), llama.log_tail());

    let out = run_cli(vec![
        "eval".into(),
        "--addr".into(),
        server.url(),
        "--json".into(),
        "--agent".into(),
        "support".into(),
        "s1".into(),
        "--scorer".into(),
        "judge".into(),
        "--judge".into(),
        "judge".into(),
        "--instructions".into(),
        "a good reply answers the question".into(),
    ])
    .await;
    assert!(out.success, "{}\n{}", out.stderr, context());
    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        for side in ["recorded", "candidate"] {
            let score = &row[side]["score"];
            let note = score["note"].as_str().unwrap_or_default();
            assert!(note.starts_with("judge: "), "the judge answered: {row}\n{}", context());
            let value = score["value"].as_f64().unwrap_or(0.0);
            assert!((0.0..=1.0).contains(&value), "{row}");
        }
        eprintln!("judged turn {}: {} / {}", row["turn"], row["recorded"]["score"], row["candidate"]["score"]);
    }
    // Four judge turns (a reply that does not match is asked again once), each asking for the score schema.
    let requests = proxy.chat_requests();
    assert!(requests.len() >= 4, "{requests:?}");
    for request in &requests {
        assert_eq!(request["response_format"]["json_schema"]["name"], "score", "{request}");
    }
    assert!(scratch_sessions(&mut c).await.is_empty());
}

/// Every item of an evaluation's stream.
async fn evaluate(c: &mut AgentClient<Channel>, req: EvaluateRequest) -> Vec<Item> {
    let mut stream = c.evaluate(req).await.unwrap().into_inner();
    let mut items = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        items.push(item.item.unwrap());
    }
    items
}

#[tokio::test]
async fn the_tenants_burst_bounds_the_turns_run_at_once_and_every_turn_is_still_run() {
    let (server, _dir) = start("[tenants.default]\nrequests_per_s = 1000\nrequest_burst = 2\n").await;
    let mut c = server.client();
    record(&mut c, "s1", "scripted", &["one", "two", "three"]).await;
    let items = evaluate(&mut c, EvaluateRequest { agent: "scripted".into(), parallel: 8, ..Default::default() }).await;
    let Some(Item::Started(started)) = items.first() else { panic!("{items:?}") };
    assert_eq!((started.total, started.parallel), (3, 2));
    let Some(Item::Summary(summary)) = items.last() else { panic!("{items:?}") };
    assert_eq!((summary.evaluated, summary.failed, summary.candidate_passed), (3, 0, 3), "{summary:?}");
}

#[tokio::test]
async fn no_rerun_starts_once_the_tenants_token_budget_is_used_up() {
    let (server, _dir) = start("[tenants.default]\ntoken_budget = 28\n").await;
    let mut c = server.client();
    record(&mut c, "s1", "scripted", &["[[usage:10,4]] one", "[[usage:10,4]] two"]).await;
    // The usage is folded from the log: wait until it counts both turns.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let usage =
            c.get_usage(GetUsageRequest { tenant: String::new(), since_unix_ms: 0 }).await.unwrap().into_inner();
        if usage.used_today >= 28 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "usage never reached the budget: {usage:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let items = evaluate(&mut c, EvaluateRequest { agent: "scripted".into(), ..Default::default() }).await;
    let rows: Vec<_> = items
        .iter()
        .filter_map(|i| match i {
            Item::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert!(row.candidate.is_none(), "{row:?}");
        assert!(row.error.starts_with("not run: the tenant's daily token budget is used up"), "{}", row.error);
    }
    let Some(Item::Summary(summary)) = items.last() else { panic!("{items:?}") };
    assert_eq!((summary.evaluated, summary.failed, summary.skipped_for_budget), (0, 2, 2), "{summary:?}");
    assert_eq!(summary.scratch_deleted, 0, "no scratch session was made");
    assert!(scratch_sessions(&mut c).await.is_empty());
}
