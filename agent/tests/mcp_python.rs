//! MCP client tools against a tiny server written with the `mcp` Python SDK (`agent/tests/mcp_server.py`,
//! run by `TURNSTILE_TEST_PYTHON`): the server itself records that a cancelled call reached it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use turnstile_agent::setup::{AgentSetup, McpServers, from_config_with_mcp, start_mcp_with_env};
use turnstile_agent::tools::mcp::TOOL_TIMEOUT;
use turnstile_config::Config;

/// Starts the server with a fresh marker file; the agent's calls are bounded by `deadline_ms`.
async fn start(test: &str, deadline_ms: u64) -> (McpServers, AgentSetup, PathBuf) {
    let python = std::env::var("TURNSTILE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_server.py");
    let marker = std::env::temp_dir().join(format!("turnstile-mcp-{}-{test}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let config = Config::from_toml_str(&format!(
        "[mcp.py]\ncommand = {python:?}\nargs = [{:?}, {:?}]\n\
         [agents.a]\ntools = [\"mcp:py/*\"]\ntool_deadline_ms = {deadline_ms}\n",
        script.display().to_string(),
        marker.display().to_string(),
    ))
    .unwrap();
    let mcp = start_mcp_with_env(&config, |_| None).await.unwrap();
    let setup = from_config_with_mcp(&config, |_| None, &mcp).unwrap();
    (mcp, setup, marker)
}

/// Waits (at most 10 s) for the server to write the marker.
async fn cancelled_on_the_server(marker: &PathBuf) -> bool {
    for _ in 0..500 {
        if std::fs::read_to_string(marker).is_ok_and(|s| s == "cancelled") {
            let _ = std::fs::remove_file(marker);
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_sends_the_server_a_cancellation() {
    let (_mcp, setup, marker) = start("abort", 60_000).await;
    let abort = CancellationToken::new();
    let (tools, token) = (setup.tools.clone(), abort.clone());
    let running = tokio::spawn(async move { tools.call("py__wait", r#"{"seconds": 60}"#, &token).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    abort.cancel();
    let r = tokio::time::timeout(Duration::from_secs(5), running).await.unwrap().unwrap();
    assert!(r.error.as_deref().is_some_and(|e| e.starts_with("aborted after")), "{r:?}");
    assert!(cancelled_on_the_server(&marker).await, "the server saw notifications/cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_sends_the_server_a_cancellation() {
    let (_mcp, setup, marker) = start("timeout", 500).await;
    let r = setup.tools.call("py__wait", r#"{"seconds": 60}"#, &CancellationToken::new()).await;
    assert_eq!(r.error.as_deref(), Some(TOOL_TIMEOUT), "{r:?}");
    assert!(cancelled_on_the_server(&marker).await, "the server saw notifications/cancelled");
    let r = setup.tools.call("py__wait", r#"{"seconds": 0.01}"#, &CancellationToken::new()).await;
    assert_eq!((r.output.as_str(), r.error), ("waited", None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_is_error_result_is_a_tool_error() {
    let (_mcp, setup, _marker) = start("fail", 60_000).await;
    let spec = setup.tools.spec("py__wait").unwrap();
    assert!(spec.input_schema["properties"]["seconds"].is_object(), "{}", spec.input_schema);
    let r = setup.tools.call("py__fail", "{}", &CancellationToken::new()).await;
    assert!(r.error.as_deref().is_some_and(|e| e.contains("it broke")), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_too_long_for_a_model_is_skipped_by_a_wildcard_and_refused_by_name() {
    let (mcp, setup, marker) = start("long", 60_000).await;
    let long = format!("py__{}", "a_tool_whose_name_is_longer_than_what_any_model_provider_accepts"[..61].to_owned());
    assert_eq!(long.len(), 65);
    assert!(setup.tools.contains("py__wait"), "the other tools are offered");
    assert!(!setup.tools.contains(&long), "`mcp:py/*` leaves out a name no model accepts");

    let python = std::env::var("TURNSTILE_TEST_PYTHON").unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_server.py");
    let config = Config::from_toml_str(&format!(
        "[mcp.py]\ncommand = {python:?}\nargs = [{:?}, {:?}]\n[agents.a]\ntools = [\"mcp:py/{}\"]\n",
        script.display().to_string(),
        marker.display().to_string(),
        &long[4..],
    ))
    .unwrap();
    let err = from_config_with_mcp(&config, |_| None, &mcp).unwrap_err().to_string();
    assert!(err.contains(&format!("the model would call it {long:?}")), "{err}");
    assert!(err.contains("use a shorter [mcp.*] name"), "{err}");
}
