//! The tools issue's whole story in one turn (SPEC §9): an agent whose tools come from all three places —
//! the built-in `echo`, the `echo` tool of the MCP reference server `@modelcontextprotocol/server-everything`
//! over stdio, and the client tool `lookup` served over `ServeTools` by a tonic executor — with `lookup`
//! gated by approval and a remote pre-step hook written in Python (grpcio) that rewrites every batch.
//! One followup calls the three tools (scripted `[[tool:...]]` directives), a human approves `lookup`, its
//! context message enters the next step, and the hook's rewrite is what the model saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_proto::v1::session_event::Payload;
use turnstile_tests::tool_executor::{LOOKUP_SCHEMA, ToolExecutor, answer_with, tool};
use turnstile_tests::{DevOptions, DevServer, PythonHookServer, text_of, user_msg};

const TAG: &str = "[checked by the python hook] ";

fn everything_bin() -> String {
    std::env::var("MCP_EVERYTHING_BIN").unwrap_or_else(|_| {
        panic!("MCP_EVERYTHING_BIN is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_calls_a_builtin_an_mcp_and_a_client_tool_with_an_approval_and_a_python_hook() {
    let hook = PythonHookServer::start(&["--tag", TAG]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        format!(
            "default_agent = \"full\"\n\n[mcp.everything]\ncommand = {:?}\nargs = [\"stdio\"]\n\n\
             [agents.full]\ntools = [\"echo\", \"mcp:everything/echo\", \"client:lookup\"]\n\
             approval = [\"client:lookup\"]\n\
             hooks = [{{ url = {:?}, deadline_ms = 5000, on_failure = \"error\" }}]\n",
            everything_bin(),
            hook.url(),
        ),
    )
    .unwrap();
    let args = vec!["--config".to_owned(), config.display().to_string()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let executor = ToolExecutor::connect(
        server.client(),
        None,
        vec![tool("lookup", LOOKUP_SCHEMA)],
        answer_with("found", &["lookup: the answer came from the client's own process"]),
    )
    .await
    .unwrap();
    assert_eq!(executor.registered, ["lookup"]);

    let s = server.session();
    let watch = s.watch().await.unwrap();
    let prompt = r#"[[tool:echo hi]] [[tool:everything__echo {"message": "from mcp"}]] [[tool:lookup {"q":"x"}]] go"#;
    s.followup(user_msg("P", prompt)).await.unwrap();

    // The built-in and the MCP tool run; the client tool waits for a human.
    watch.wait_line(r#"D tool/call 1.1 lookup {"q":"x"} awaiting-approval"#).await.unwrap();
    let lines = watch.lines();
    assert!(lines.contains(&"D tool/result 1.1 \"hi\"".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D tool/result 1.1 \"Echo: from mcp\"".to_owned()), "{lines:#?}");
    let (events, _) = s.replay(0).await.unwrap();
    let call_id = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolCall(c)) if c.awaiting_approval => Some(c.call_id.clone()),
            _ => None,
        })
        .unwrap();
    s.decide(&call_id, true, "the lookup is read-only").await.unwrap();
    // Idle, and the watch has everything up to it (WhenIdle can answer before the stream delivers).
    let lines = watch.settle(&s).await.unwrap();
    let (events, _) = s.replay(0).await.unwrap();
    let at = |line: &str| lines.iter().position(|l| l == line).unwrap_or_else(|| panic!("no {line:?} in {lines:#?}"));
    assert!(
        at(&format!("D tool/decision 1.1 {call_id} approved \"the lookup is read-only\""))
            < at(r#"D tool/result 1.1 "found {\"q\":\"x\"}""#),
        "the approval ran the client tool"
    );
    assert!(at("D turn/end 1 completed") > at("D step/start 1.2"));

    // The hook rewrote the prompt (same id) and the tool's context message, which entered step 2 after the
    // results with source tool{call_id}.
    let entered: Vec<(String, u32, String, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::UserMessage(u)) => {
                let m = u.message.as_ref().unwrap();
                let tool_call = match m.source.as_ref().and_then(|s| s.kind.as_ref()) {
                    Some(turnstile_proto::v1::message_source::Kind::Tool(t)) => Some(t.call_id.clone()),
                    _ => None,
                };
                Some((m.id.clone(), u.step, text_of(m), tool_call))
            }
            _ => None,
        })
        .collect();
    assert_eq!(entered.len(), 2, "{entered:#?}");
    assert_eq!(entered[0], ("P".to_owned(), 1, format!("{TAG}{prompt}"), None));
    assert_eq!(
        entered[1],
        (
            format!("{call_id}.ctx0"),
            2,
            format!("{TAG}lookup: the answer came from the client's own process"),
            Some(call_id.clone())
        )
    );
    let tool_calls: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::ToolCall(c)) => Some(c.name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tool_calls, ["echo", "everything__echo", "lookup"]);
}
