//! Client tools over `ServeTools` (SPEC §9, docs/decisions/0013-client-tools.md), from the outside: real
//! `turnstile` processes on real nats-servers, executors written with tonic (`tool_executor.rs`) and with
//! Python grpcio (`fixtures/tool_executor.py`), sessions on the scripted model calling `lookup` with
//! `[[tool:lookup {"q":"x"}]]`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::Code;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::tool_executor::{
    LOOKUP_SCHEMA, ToolExecutor, answer_with, hold, open, result_message, tool, with_token,
};
use turnstile_tests::v1::InjectMode;
use turnstile_tests::v1::message_source::Kind;
use turnstile_tests::v1::session_event::Payload;
use turnstile_tests::v1::tool_task::Task;
use turnstile_tests::v1::{
    DeliverRequest, SessionEvent, SessionRef, ToolCallResult, ToolResult, WatchRequest, WhenIdleRequest,
    watch_item::Item,
};
use turnstile_tests::{
    Backend, Cluster, ClusterOptions, DEFAULT_WAIT, DevOptions, DevServer, NatsServer, Session, user_msg,
};

/// `helper` lists `lookup` with the default deadline; `quick` gives it 300 ms; `plain` does not list it.
const CONFIG: &str = r#"default_agent = "helper"

[agents.helper]
tools = ["echo", "client:lookup"]

[agents.quick]
tools = ["client:lookup"]
tool_deadline_ms = 300

[agents.plain]
tools = ["echo"]
"#;

const CALL_LOOKUP: &str = r#"[[tool:lookup {"q":"x"}]]"#;

/// `turnstile dev --config` on `backend` (with `extra` arguments), and the config's directory.
async fn start(backend: Backend, extra: Vec<String>) -> (DevServer, TempDir) {
    let (dir, path) = config_file(CONFIG);
    let mut args = config_args(&path);
    args.extend(extra);
    let server = match backend {
        Backend::Embedded => DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await,
        Backend::Nats => {
            let nats = NatsServer::start().await.unwrap();
            let opts = DevOptions { extra_args: args, ..DevOptions::nats(nats.url()) };
            let mut server = DevServer::start_with(opts).await.unwrap();
            server.own_nats(nats);
            Ok(server)
        }
    };
    (server.unwrap(), dir)
}

/// Follows up `text` and returns the session's durable events once it is idle.
async fn run_turn(session: &Session, text: &str) -> Vec<SessionEvent> {
    session.followup(user_msg(&uuid::Uuid::new_v4().to_string(), text)).await.unwrap();
    session.when_idle().await.unwrap();
    session.replay(0).await.unwrap().0
}

fn tool_results(events: &[SessionEvent]) -> Vec<ToolResult> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn only_result(events: &[SessionEvent]) -> ToolResult {
    let results = tool_results(events);
    assert_eq!(results.len(), 1, "{events:#?}");
    results[0].clone()
}

/// The call, its result, the context messages right after it in the next step, and the model's answer.
async fn a_tonic_executor_serves_a_call_with_context(backend: Backend) {
    let (server, _dir) = start(backend, Vec::new()).await;
    let mut executor = ToolExecutor::connect(
        server.client(),
        None,
        vec![tool("lookup", LOOKUP_SCHEMA)],
        answer_with("found", &["remember: x is 42", "second note"]),
    )
    .await
    .unwrap();
    assert_eq!(executor.registered, vec!["lookup".to_owned()]);
    let session = server.session();
    let events = run_turn(&session, CALL_LOOKUP).await;

    let call = executor.next_call().await.unwrap();
    assert_eq!(call.name, "lookup");
    assert_eq!(call.arguments_json, r#"{"q":"x"}"#);
    assert_eq!(call.session, Some(session.reference()));
    assert!(call.deadline_unix_ms > 0);
    // SPEC §20: the executor gets the call's idempotency key, the one its `tool/call` event carries.
    let reference = session.reference();
    let key = format!("{}/{}/1/1/{}", reference.tenant, reference.id, call.call_id);
    assert_eq!(call.idempotency_key, key);
    let logged: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(turnstile_proto::v1::session_event::Payload::ToolCall(c)) => Some(c.idempotency_key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(logged, [key.as_str()]);
    let result = only_result(&events);
    assert_eq!(result.call_id, call.call_id);
    assert_eq!(result.output, r#"found {"q":"x"}"#);
    assert_eq!(result.error, None);

    // The context messages: user/messages of the next step with source tool{call_id}, after the result.
    let at = events.iter().position(|e| matches!(&e.payload, Some(Payload::ToolResult(_)))).unwrap();
    let context: Vec<(String, u32)> = events[at..]
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::UserMessage(m)) => {
                let message = m.message.as_ref()?;
                match message.source.as_ref()?.kind.as_ref()? {
                    Kind::Tool(t) if t.call_id == call.call_id => Some((turnstile_tests::text_of(message), m.step)),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        context,
        vec![("remember: x is 42".to_owned(), result.step + 1), ("second note".to_owned(), result.step + 1)],
        "{events:#?}"
    );
}

turnstile_tests::backend_tests!(a_tonic_executor_serves_a_call_with_context);

/// `turnstile dev --nats` with the config, for the tests that run once.
async fn dev_on_nats() -> (DevServer, TempDir) {
    start(Backend::Nats, Vec::new()).await
}

#[tokio::test]
async fn with_no_executor_the_call_fails_at_once() {
    let (server, _dir) = dev_on_nats().await;
    let started = Instant::now();
    let events = run_turn(&server.session(), CALL_LOOKUP).await;
    let result = only_result(&events);
    assert_eq!(result.error.as_deref(), Some("no executor for tool lookup"));
    // "At once": far below the 60 s deadline (a bound for a hang, not a timing assertion).
    assert!(started.elapsed() < DEFAULT_WAIT);

    // An executor that came and left leaves no executor behind either.
    let executor =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], answer_with("found", &[]))
            .await
            .unwrap();
    let session = server.session();
    assert_eq!(only_result(&run_turn(&session, CALL_LOOKUP).await).error, None);
    executor.disconnect();
    let events = run_turn(&session, CALL_LOOKUP).await;
    assert_eq!(tool_results(&events)[1].error.as_deref(), Some("no executor for tool lookup"));

    // The calls are counted by kind, tool and outcome.
    let (status, body) = turnstile_tests::nats::http_get(server.http_addr().unwrap(), "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let count = |outcome: &str| {
        body.lines()
            .find(|l| {
                l.starts_with("turnstile_tool_calls_total{")
                    && l.contains(r#"kind="client""#)
                    && l.contains(r#"tool="lookup""#)
                    && l.contains(&format!(r#"outcome="{outcome}""#))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(count("no_executor").as_deref(), Some("2"), "{body}");
    assert_eq!(count("ok").as_deref(), Some("1"), "{body}");
}

#[tokio::test]
async fn a_tool_the_agent_does_not_list_is_refused_at_call_time() {
    let (server, _dir) = dev_on_nats().await;
    let mut executor =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], answer_with("found", &[]))
            .await
            .unwrap();
    let session = server.session();
    session.configure("plain", InjectMode::Unspecified).await.unwrap();
    let result = only_result(&run_turn(&session, CALL_LOOKUP).await);
    assert_eq!(
        result.error.as_deref(),
        Some("tool lookup is not available to agent plain (its tools: echo); call one of those")
    );
    // Nothing reached the executor: the first call it is sent is the one of a later turn whose agent lists
    // the tool (the gateway sends one stream's tasks in order, so a stray call would come before it).
    session.configure("helper", InjectMode::Unspecified).await.unwrap();
    run_turn(&session, r#"[[tool:lookup {"q":"listed"}]]"#).await;
    let first = executor.next_call().await.unwrap();
    assert_eq!(first.arguments_json, r#"{"q":"listed"}"#, "{first:?}");
}

#[tokio::test]
async fn an_executor_that_disconnects_mid_call_fails_the_call_at_once() {
    let (server, _dir) = dev_on_nats().await;
    let mut executor =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], hold()).await.unwrap();
    let session = server.session();
    session.followup(user_msg("m1", CALL_LOOKUP)).await.unwrap();
    executor.next_call().await.unwrap();
    executor.disconnect();
    session.when_idle().await.unwrap();
    let result = only_result(&session.replay(0).await.unwrap().0);
    assert_eq!(result.error.as_deref(), Some("executor of tool lookup disconnected mid-call"));
}

#[tokio::test]
async fn past_the_deadline_the_call_is_a_tool_timeout_and_the_executor_gets_a_cancel() {
    let (server, _dir) = dev_on_nats().await;
    let mut executor =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], hold()).await.unwrap();
    let session = server.session();
    session.configure("quick", InjectMode::Unspecified).await.unwrap();
    let events = run_turn(&session, CALL_LOOKUP).await;
    let call = executor.next_call().await.unwrap();
    assert_eq!(only_result(&events).error.as_deref(), Some("tool_timeout"));
    match executor.next_task().await.unwrap() {
        Task::Cancel(cancel) => assert_eq!(cancel.call_id, call.call_id),
        other => panic!("expected a cancel, got {other:?}"),
    }
    // A late result is refused, and the stream keeps working.
    executor
        .send_result(ToolCallResult { call_id: call.call_id.clone(), output: "late".into(), ..Default::default() })
        .await
        .unwrap();
    match executor.next_task().await.unwrap() {
        Task::Rejected(r) => assert_eq!(r.call_id, call.call_id),
        other => panic!("expected rejected, got {other:?}"),
    }
}

#[tokio::test]
async fn cancelling_the_turn_sends_cancel_to_the_executor() {
    let (server, _dir) = dev_on_nats().await;
    let mut executor =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], hold()).await.unwrap();
    let session = server.session();
    session.followup(user_msg("m1", CALL_LOOKUP)).await.unwrap();
    let call = executor.next_call().await.unwrap();
    session.cancel(false).await.unwrap();
    match executor.next_task().await.unwrap() {
        Task::Cancel(cancel) => assert_eq!(cancel.call_id, call.call_id),
        other => panic!("expected a cancel, got {other:?}"),
    }
    session.when_idle().await.unwrap();
    let result = only_result(&session.replay(0).await.unwrap().0);
    assert!(result.error.as_deref().unwrap().starts_with("aborted after"), "{result:?}");
}

#[tokio::test]
async fn bad_registrations_are_refused_with_what_to_fix() {
    let (server, _dir) = dev_on_nats().await;
    let refused = |tools| {
        let client = server.client();
        async move { ToolExecutor::connect(client, None, tools, hold()).await.unwrap_err() }
    };
    let e = refused(vec![tool("lookup", "{not json")]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("input_schema_json is not JSON"), "{e:?}");
    let e = refused(vec![tool("lookup", r#"{"type":"string"}"#)]).await;
    assert!(e.message().contains("\"type\": \"object\""), "{e:?}");
    let e = refused(vec![tool("echo", LOOKUP_SCHEMA)]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("built-in tool's name"), "{e:?}");
    let e = refused(vec![tool("srv__t", LOOKUP_SCHEMA)]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("reserved for MCP"), "{e:?}");
    let e = refused(vec![tool("lookup", LOOKUP_SCHEMA), tool("lookup", LOOKUP_SCHEMA)]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("listed twice"), "{e:?}");

    // The first message must be `register`.
    let result = result_message(ToolCallResult { call_id: "c".into(), ..Default::default() });
    let e = open(server.client(), None, result).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("first ServeTools message must be `register"), "{e:?}");

    // The same name with another schema, while the first executor is connected.
    let mut first =
        ToolExecutor::connect(server.client(), None, vec![tool("lookup", LOOKUP_SCHEMA)], answer_with("found", &[]))
            .await
            .unwrap();
    let e = refused(vec![tool("lookup", r#"{"type":"object"}"#)]).await;
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("\"lookup\"") && e.message().contains("different input schema"), "{e:?}");
    // The same schema (keys in another order) is a second executor of the same tool.
    let same = r#"{"required":["q"],"properties":{"q":{"type":"string"}},"type":"object"}"#;
    let _second = ToolExecutor::connect(server.client(), None, vec![tool("lookup", same)], answer_with("found", &[]))
        .await
        .unwrap();

    // A result for an unknown call id is rejected; the stream still serves calls.
    first
        .send_result(ToolCallResult { call_id: "no-such-call".into(), output: "x".into(), ..Default::default() })
        .await
        .unwrap();
    match first.next_task().await.unwrap() {
        Task::Rejected(r) => {
            assert_eq!(r.call_id, "no-such-call");
            assert!(r.reason.contains("no call"), "{r:?}");
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    let events = run_turn(&server.session(), CALL_LOOKUP).await;
    assert_eq!(only_result(&events).error, None, "{events:#?}");
}

const TOKEN_A: &str = "token-of-tenant-a-0123456789";
const TOKEN_B: &str = "token-of-tenant-b-9876543210";

#[tokio::test]
async fn tenants_only_reach_their_own_executors() {
    let tokens = tempfile::tempdir().unwrap();
    let path = tokens.path().join("tokens.txt");
    std::fs::write(&path, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let (server, _dir) = start(Backend::Nats, vec!["--auth-tokens".into(), path.display().to_string()]).await;
    let schema_b = r#"{"type":"object","properties":{"other":{"type":"string"}}}"#;
    let mut a = ToolExecutor::connect(
        server.client(),
        Some(TOKEN_A),
        vec![tool("lookup", LOOKUP_SCHEMA)],
        answer_with("a", &[]),
    )
    .await
    .unwrap();
    // Another tenant may serve the same name with another schema.
    let mut b =
        ToolExecutor::connect(server.client(), Some(TOKEN_B), vec![tool("lookup", schema_b)], answer_with("b", &[]))
            .await
            .unwrap();
    let mut client = server.client();
    let session = Some(SessionRef { tenant: String::new(), id: "iso".into() });
    for (token, expected) in [(TOKEN_B, r#"b {"q":"x"}"#), (TOKEN_A, r#"a {"q":"x"}"#)] {
        let req = DeliverRequest {
            session: session.clone(),
            message: Some(user_msg(&uuid::Uuid::new_v4().to_string(), CALL_LOOKUP)),
            output_schema: None,
        };
        client.followup(with_token(req, Some(token))).await.unwrap();
        let req = WhenIdleRequest { session: session.clone(), timeout_ms: 20_000 };
        client.when_idle(with_token(req, Some(token))).await.unwrap();
        let req = WatchRequest { session: session.clone(), after_seq: 0, live: false, resume: None };
        let mut stream = client.watch(with_token(req, Some(token))).await.unwrap().into_inner();
        let mut events = Vec::new();
        while let Some(item) = stream.message().await.unwrap() {
            match item.item {
                Some(Item::Event(e)) => events.push(e),
                Some(Item::CaughtUp(_)) => break,
                _ => {}
            }
        }
        let results = tool_results(&events);
        assert_eq!(results.last().unwrap().output, expected, "{events:#?}");
    }
    let call_b = b.next_call().await.unwrap();
    assert_eq!(call_b.session.unwrap().tenant, "tenant-b");
    let call_a = a.next_call().await.unwrap();
    assert_eq!(call_a.session.unwrap().tenant, "tenant-a");
    // Each executor saw only its own tenant's call: a marker call of each tenant is the next task each gets
    // (one stream's tasks arrive in order, so a stray call of the other tenant would come first).
    for (token, marker) in [(TOKEN_A, "marker-a"), (TOKEN_B, "marker-b")] {
        let text = format!(r#"[[tool:lookup {{"q":"{marker}"}}]]"#);
        let req = DeliverRequest {
            session: session.clone(),
            message: Some(user_msg(&uuid::Uuid::new_v4().to_string(), &text)),
            output_schema: None,
        };
        client.followup(with_token(req, Some(token))).await.unwrap();
        let req = WhenIdleRequest { session: session.clone(), timeout_ms: 20_000 };
        client.when_idle(with_token(req, Some(token))).await.unwrap();
    }
    let next_a = a.next_call().await.unwrap();
    assert_eq!(next_a.arguments_json, r#"{"q":"marker-a"}"#, "A saw only its own calls: {next_a:?}");
    let next_b = b.next_call().await.unwrap();
    assert_eq!(next_b.arguments_json, r#"{"q":"marker-b"}"#, "B saw only its own calls: {next_b:?}");
}

/// In the `cluster` test group (docs/TESTING.md).
mod cluster {
    use super::*;

    #[tokio::test]
    async fn an_executor_on_one_gateway_serves_a_session_driven_through_the_other() {
        let (_dir, path) = config_file(CONFIG);
        let mut opts = ClusterOptions::new(2, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let cluster = Cluster::start_with(opts).await.unwrap();
        let mut executor = ToolExecutor::connect(
            cluster.client(0),
            None,
            vec![tool("lookup", LOOKUP_SCHEMA)],
            answer_with("found", &["ctx"]),
        )
        .await
        .unwrap();
        // A second gateway refuses the same name with another schema (it asks the first).
        let e = ToolExecutor::connect(cluster.client(1), None, vec![tool("lookup", r#"{"type":"object"}"#)], hold())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        for _ in 0..4 {
            let session = cluster.session(1);
            let result = only_result(&run_turn(&session, CALL_LOOKUP).await);
            assert_eq!(result.output, r#"found {"q":"x"}"#);
            let call = executor.next_call().await.unwrap();
            assert_eq!(call.session, Some(session.reference()));
        }
    }
}

/// The Python grpcio executor (`fixtures/tool_executor.py`) serves `lookup` for a session.
#[tokio::test]
async fn a_python_grpcio_executor_serves_a_call() {
    let python = python_with_grpc()
        .expect("a python with grpcio and grpcio-tools: source .ci/test-env.sh (TURNSTILE_TEST_PYTHON) or set PYTHON");
    let (server, _dir) = dev_on_nats().await;
    let stubs = tempfile::tempdir().unwrap();
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let protos: Vec<String> = std::fs::read_dir(proto_root.join("turnstile/v1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".proto"))
        .map(|name| format!("turnstile/v1/{name}"))
        .collect();
    let status = std::process::Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto_root)
        .arg(format!("--python_out={}", stubs.path().display()))
        .arg(format!("--grpc_python_out={}", stubs.path().display()))
        .args(&protos)
        .status()
        .unwrap();
    assert!(status.success(), "protoc of the Python stubs");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/tool_executor.py");
    let log = stubs.path().join("executor.log");
    let mut child = std::process::Command::new(&python)
        .arg(&script)
        .arg(server.addr().to_string())
        .arg(turnstile_tests::msg::TEST_TENANT)
        .env("PYTHONPATH", stubs.path())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    // Wait for the executor's `registered` line.
    let deadline = Instant::now() + DEFAULT_WAIT;
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("registered lookup") {
        assert!(Instant::now() < deadline, "the Python executor did not register");
        assert!(child.try_wait().unwrap().is_none(), "the Python executor exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let session = server.session();
    let events = run_turn(&session, CALL_LOOKUP).await;
    let _ = child.kill();
    let _ = child.wait();
    let result = only_result(&events);
    assert_eq!(result.output, r#"python found {"q":"x"}"#, "{}", std::fs::read_to_string(&log).unwrap_or_default());
    let context = events.iter().any(|e| match &e.payload {
        Some(Payload::UserMessage(m)) => {
            m.message.as_ref().is_some_and(|m| turnstile_tests::text_of(m) == "from python")
        }
        _ => false,
    });
    assert!(context, "{events:#?}");
}

/// `python3` from `.ci/venv` (or `PYTHON`) when it can import grpc and grpc_tools.
fn python_with_grpc() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("PYTHON").map(PathBuf::from),
        std::env::var_os("TURNSTILE_TEST_PYTHON").map(PathBuf::from),
        Some(root.join(".ci/venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    candidates.into_iter().flatten().find(|python| {
        std::process::Command::new(python)
            .args(["-c", "import grpc, grpc_tools"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}
