//! MCP client tools against a real server: `@modelcontextprotocol/server-everything` over stdio
//! (`MCP_EVERYTHING_BIN`, installed by scripts/setup-test-deps). Its tools are registered as
//! `everything__TOOL`; `trigger-long-running-operation` is the slow tool.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use turnstile_agent::setup::{AgentSetup, AgentSetupError, McpServers, from_config_with_mcp, start_mcp_with_env};
use turnstile_agent::tools::mcp::TOOL_TIMEOUT;
use turnstile_config::Config;

const SLOW: &str = "everything__trigger-long-running-operation";

fn everything_bin() -> String {
    std::env::var("MCP_EVERYTHING_BIN").unwrap_or_else(|_| {
        panic!("MCP_EVERYTHING_BIN is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
    })
}

/// One agent with every tool of the everything server, calls bounded by `deadline_ms`.
fn config(deadline_ms: u64) -> Config {
    Config::from_toml_str(&format!(
        "[mcp.everything]\ncommand = {:?}\nargs = [\"stdio\"]\n\
         [agents.a]\ntools = [\"echo\", \"mcp:everything/*\"]\ntool_deadline_ms = {deadline_ms}\n",
        everything_bin()
    ))
    .unwrap()
}

/// [`config`], with the server started through bash, which copies every line the client writes to the
/// server's stdin (its JSON-RPC messages) into `wire` and then becomes the server (`exec`, so the server's
/// pid is the one the supervisor knows).
fn recorded_config(deadline_ms: u64, wire: &Path) -> Config {
    let script = r#"exec "$1" stdio < <(tee -a "$0")"#;
    Config::from_toml_str(&format!(
        "[mcp.everything]\ncommand = \"bash\"\nargs = [\"-c\", {script:?}, {:?}, {:?}]\n\
         [agents.a]\ntools = [\"echo\", \"mcp:everything/*\"]\ntool_deadline_ms = {deadline_ms}\n",
        wire.display().to_string(),
        everything_bin()
    ))
    .unwrap()
}

/// The JSON-RPC messages the client has written to the server so far.
fn written(wire: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(wire).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Waits (bounded) until the client has written a message that `wanted` picks, and returns it.
async fn wait_written(wire: &Path, what: &str, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let found = async {
        loop {
            if let Some(message) = written(wire).into_iter().find(|m| wanted(m)) {
                return message;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), found)
        .await
        .unwrap_or_else(|_| panic!("the client never wrote {what}"))
}

/// The `tools/call` request of `tool` (by its server-side name), once the client has written it.
async fn call_request(wire: &Path, tool: &str) -> serde_json::Value {
    wait_written(wire, "the tools/call request", |m| m["method"] == "tools/call" && m["params"]["name"] == tool).await
}

/// A fresh file in a directory removed at the end of the test.
fn wire_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let wire = dir.path().join("to-server.jsonl");
    (dir, wire)
}

async fn start(config: &Config) -> (McpServers, AgentSetup) {
    let started = Instant::now();
    let mcp = start_mcp_with_env(config, |_| None).await.unwrap();
    println!("server-everything started and listed its tools in {} ms", started.elapsed().as_millis());
    let setup = from_config_with_mcp(config, |_| None, &mcp).unwrap();
    (mcp, setup)
}

async fn call(setup: &AgentSetup, tool: &str, arguments: &str) -> turnstile_worker::agent::ToolReturn {
    let abort = CancellationToken::new();
    let r = tokio::time::timeout(Duration::from_secs(20), setup.tools.call(tool, arguments, &abort));
    r.await.expect("a call never hangs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_with_the_server_prefix_and_echo_answers() {
    let (_mcp, setup) = start(&config(60_000)).await;
    let names: Vec<&str> = setup.tools.names().collect();
    assert!(names.contains(&"everything__echo") && names.contains(&SLOW), "{names:?}");
    assert!(names.contains(&"echo"), "built-ins stay: {names:?}");
    let spec = setup.tools.spec("everything__echo").unwrap();
    assert_eq!(spec.description, "Echoes back the input string");
    assert_eq!(spec.input_schema["type"], "object");
    assert!(spec.input_schema["properties"]["message"].is_object(), "{}", spec.input_schema);

    let r = call(&setup, "everything__echo", r#"{"message": "hello over stdio"}"#).await;
    assert_eq!((r.output.as_str(), r.error), ("Echo: hello over stdio", None));

    // Arguments the tool refuses come back as an MCP `isError` result: a tool error.
    let r = call(&setup, "everything__echo", r#"{"message": 42}"#).await;
    assert!(r.error.as_deref().is_some_and(|e| !e.is_empty()), "{r:?}");
    // Arguments that are not a JSON object never reach the server.
    let r = call(&setup, "everything__echo", "plain text").await;
    assert_eq!(r.error.as_deref(), Some("everything__echo: the arguments must be a JSON object, got \"plain text\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_a_tool_timeout_and_the_server_still_answers() {
    let (_mcp, setup) = start(&config(300)).await;
    let started = Instant::now();
    let r = call(&setup, SLOW, r#"{"duration": 10, "steps": 10}"#).await;
    assert_eq!(r.error.as_deref(), Some(TOOL_TIMEOUT), "{r:?}");
    assert!(r.output.contains("within 300 ms"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "returned before the operation would have ended");
    let r = call(&setup, "everything__echo", r#"{"message": "after the timeout"}"#).await;
    assert_eq!(r.output, "Echo: after the timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_mid_call_returns_promptly_and_cancels_the_request_at_the_server() {
    let (_dir, wire) = wire_file();
    let (_mcp, setup) = start(&recorded_config(60_000, &wire)).await;
    let abort = CancellationToken::new();
    let tools = setup.tools.clone();
    let token = abort.clone();
    let running = tokio::spawn(async move { tools.call(SLOW, r#"{"duration": 30, "steps": 30}"#, &token).await });
    // Mid-call: the server has the request.
    let request = call_request(&wire, "trigger-long-running-operation").await;
    let aborted_at = Instant::now();
    abort.cancel();
    let r = tokio::time::timeout(Duration::from_secs(5), running).await.expect("the abort ends the call").unwrap();
    println!("abort to result: {} µs", aborted_at.elapsed().as_micros());
    assert!(r.error.as_deref().is_some_and(|e| e.starts_with("aborted after")), "{r:?}");
    // The abort reached the server as a cancellation of that very request.
    let cancelled = wait_written(&wire, "notifications/cancelled", |m| m["method"] == "notifications/cancelled").await;
    assert_eq!(cancelled["params"]["requestId"], request["id"], "{cancelled}");
    let r = call(&setup, "everything__echo", r#"{"message": "after the abort"}"#).await;
    assert_eq!(r.output, "Echo: after the abort");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_gives_an_error_and_is_restarted() {
    let (_dir, wire) = wire_file();
    let (mcp, setup) = start(&recorded_config(60_000, &wire)).await;
    let server = mcp.get("everything").unwrap().clone();
    let pid = server.pid().expect("a stdio server has a pid");
    let tools = setup.tools.clone();
    let running =
        tokio::spawn(
            async move { tools.call(SLOW, r#"{"duration": 30, "steps": 30}"#, &CancellationToken::new()).await },
        );
    // Mid-call: the server has the request.
    call_request(&wire, "trigger-long-running-operation").await;
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let r = tokio::time::timeout(Duration::from_secs(5), running).await.expect("a dead server ends the call").unwrap();
    assert!(r.error.as_deref().is_some_and(|e| e.contains("closed the connection")), "{r:?}");

    // The supervisor restarts it (a new process) and a later call works.
    let restarted = Instant::now();
    let new_pid = async {
        loop {
            match server.pid() {
                Some(new) if new != pid => return new,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    let new_pid = tokio::time::timeout(Duration::from_secs(20), new_pid).await.expect("restarted");
    println!("restarted (pid {pid} -> {new_pid}) {} ms after the failed call", restarted.elapsed().as_millis());
    let r = call(&setup, "everything__echo", r#"{"message": "after the restart"}"#).await;
    assert_eq!((r.output.as_str(), r.error), ("Echo: after the restart", None));
}

/// A hundred calls over one stdio connection each get their own answer, in order (a reply matched to the
/// wrong request would show here). The call latency is a figure of `turnstile-bench`, not of this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_echo_calls_over_stdio_each_get_their_own_answer() {
    let (_mcp, setup) = start(&config(60_000)).await;
    let abort = CancellationToken::new();
    for i in 0..100 {
        let r = setup.tools.call("everything__echo", &format!(r#"{{"message": "n{i}"}}"#), &abort).await;
        assert_eq!((r.output.as_str(), r.error), (format!("Echo: n{i}").as_str(), None));
    }
}

#[tokio::test]
async fn an_unlisted_tool_and_a_server_that_cannot_start_are_setup_errors() {
    let config = Config::from_toml_str(&format!(
        "[mcp.everything]\ncommand = {:?}\n[agents.a]\ntools = [\"mcp:everything/no_such_tool\"]\n",
        everything_bin()
    ))
    .unwrap();
    let mcp = start_mcp_with_env(&config, |_| None).await.unwrap();
    let err = from_config_with_mcp(&config, |_| None, &mcp).unwrap_err();
    assert!(
        matches!(&err, AgentSetupError::UnknownTool { reason, .. } if reason.contains("does not list it")),
        "{err}"
    );

    let config = Config::from_toml_str(
        "[mcp.ghost]\ncommand = \"/nonexistent/mcp-server\"\n[agents.a]\ntools = [\"mcp:ghost/*\"]\n",
    )
    .unwrap();
    let err = start_mcp_with_env(&config, |_| None).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("MCP server \"ghost\" did not start: cannot run \"/nonexistent/mcp-server\""),
        "{message}"
    );
}

/// The everything server in its streamable HTTP mode on a free loopback port, killed on drop.
struct HttpServer {
    child: tokio::process::Child,
    url: String,
}

impl HttpServer {
    async fn start() -> Self {
        use tokio::io::AsyncBufReadExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = tokio::process::Command::new(everything_bin())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let listening = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("listening on port") {
                    return;
                }
            }
            panic!("the HTTP server ended before listening");
        };
        tokio::time::timeout(Duration::from_secs(30), listening).await.expect("the HTTP server listens");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_lists_and_calls_with_headers_from_the_environment() {
    let mut server = HttpServer::start().await;
    let config = Config::from_toml_str(&format!(
        "[mcp.web]\nurl = {:?}\nheaders_env = {{ X-Turnstile-Test = \"WEB_TOKEN\" }}\n\
         [agents.a]\ntools = [\"mcp:web/echo\", \"mcp:web/trigger-long-running-operation\"]\ntool_deadline_ms = 300\n",
        server.url
    ))
    .unwrap();
    let env = |v: &str| (v == "WEB_TOKEN").then(|| "secret-value".to_owned());
    let started = Instant::now();
    let mcp = start_mcp_with_env(&config, env).await.unwrap();
    println!("streamable HTTP connected and listed in {} ms", started.elapsed().as_millis());
    let setup = from_config_with_mcp(&config, env, &mcp).unwrap();
    assert_eq!(
        setup.tools.names().collect::<Vec<_>>(),
        [
            "clock",
            "echo",
            "memory_get",
            "memory_put",
            "memory_search",
            "sleep",
            "spawn_agent",
            "web__echo",
            "web__trigger-long-running-operation"
        ]
    );
    let r = call(&setup, "web__echo", r#"{"message": "over http"}"#).await;
    assert_eq!((r.output.as_str(), r.error), ("Echo: over http", None));
    let r = call(&setup, "web__trigger-long-running-operation", r#"{"duration": 10, "steps": 10}"#).await;
    assert_eq!(r.error.as_deref(), Some(TOOL_TIMEOUT), "{r:?}");

    // A header variable that is unset is named before anything connects.
    let err = start_mcp_with_env(&config, |_| None).await.unwrap_err().to_string();
    assert!(err.contains("WEB_TOKEN") && err.contains("X-Turnstile-Test"), "{err}");

    // The server goes away: a call fails (an error result, not a hang).
    server.child.kill().await.unwrap();
    let r = call(&setup, "web__echo", r#"{"message": "anyone?"}"#).await;
    assert!(r.error.is_some(), "{r:?}");
}
