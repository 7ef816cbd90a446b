//! Turnstile's MCP server (SPEC §19, docs/PROTOCOLS.md) through the official, unmodified `mcp` Python SDK
//! client (`tests/protocols/test_mcp_server.py`, with the interpreter of `.ci/venv`, `TURNSTILE_TEST_PYTHON`,
//! at the pin of scripts/setup-test-deps), against a real `turnstile dev` with two tenants' tokens, on the
//! embedded journal and on JetStream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_proto::v1 as pb;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_tests::binary::workspace_root;
use turnstile_tests::protocol_clients::{GUARDED_AND_ONLY_B, dev_with_tokens, python_unittest};
use turnstile_tests::tool_executor::with_token;
use turnstile_tests::{Backend, DevOptions};

const TOKEN_A: &str = "mcp-token-of-tenant-a-0123456789";
const TOKEN_B: &str = "mcp-token-of-tenant-b-9876543210";

/// The shared agents: `guarded` (echo behind an approval) and `only-b` (tenant B alone).
const CONFIG: &str = GUARDED_AND_ONLY_B;

async fn mcp_sdk(backend: Backend) {
    let (server, dir) =
        dev_with_tokens(backend, CONFIG, &[(TOKEN_A, "tenant-a"), (TOKEN_B, "tenant-b")]).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let cancelled = dir.path().join("cancelled.txt");
    let env = vec![
        ("MCP_URL".to_owned(), format!("http://127.0.0.1:{}/mcp", http.port())),
        ("TOKEN_A".to_owned(), TOKEN_A.to_owned()),
        ("TOKEN_B".to_owned(), TOKEN_B.to_owned()),
        ("MCP_CANCELLED".to_owned(), cancelled.display().to_string()),
    ];
    python_unittest(&server, "mcp SDK", &["test_mcp_server", "test_mcp_resume", "test_mcp_tasks"], env).await;

    // The call the client cancelled: its turn ends aborted by the user (its tool sleeps for 10 minutes).
    let session = std::fs::read_to_string(&cancelled).expect("the cancel test names its session");
    let request = pb::WatchRequest {
        session: Some(pb::SessionRef { tenant: String::new(), id: session.clone() }),
        live: true,
        ..Default::default()
    };
    let mut watch = server.client().watch(with_token(request, Some(TOKEN_A))).await.unwrap().into_inner();
    let reason = loop {
        let item = watch.message().await.unwrap().expect("the watch ends only when the turn does");
        if let Some(pb::watch_item::Item::Event(pb::SessionEvent { payload: Some(Payload::TurnEnd(end)), .. })) =
            item.item
        {
            break end.reason.and_then(|r| r.reason);
        }
    };
    assert!(matches!(reason, Some(Reason::Aborted(_))), "session {session}'s turn ended {reason:?}, not aborted");
}

turnstile_tests::backend_tests!(mcp_sdk);

/// `[protocols] mcp = false` takes `/mcp` off the `--http` port and leaves the rest served.
#[tokio::test]
async fn the_mcp_server_can_be_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, "[protocols]\nmcp = false\n").unwrap();
    let options =
        DevOptions { env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())], ..DevOptions::default() };
    let off = turnstile_tests::DevServer::start_with(options).await.unwrap();
    let on = turnstile_tests::DevServer::start().await.unwrap();
    let (off, on) = (off.http_addr().unwrap(), on.http_addr().unwrap());
    assert_eq!(post_status(on, "/mcp").await, 200);
    assert_eq!(post_status(off, "/mcp").await, 404);
    assert_eq!(post_status(off, "/v1/responses").await, 400, "the OpenAI API is still served");
}

/// The status of a `tools/list` POSTed to `path` over plain HTTP/1.1 (auth off: loopback callers only).
async fn post_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("no status line: {answer}"))
}

mod cluster {
    use super::*;
    use turnstile_tests::{Cluster, ClusterOptions};

    /// A session and an approval's elicitation round go on through the other gateway
    /// (`tests/protocols/test_mcp_cluster.py`).
    #[tokio::test]
    async fn mcp_calls_are_answered_by_any_gateway() {
        let python = std::env::var("TURNSTILE_TEST_PYTHON")
            .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("turnstile.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let env = vec![("TURNSTILE_CONFIG".to_owned(), config.display().to_string())];
        let options = ClusterOptions { worker_env: env.clone(), gateway_env: env, ..ClusterOptions::new(1, 2) };
        let cluster = Cluster::start_with(options).await.unwrap();
        let url = |g: usize| format!("http://127.0.0.1:{}/mcp", cluster.gateway_http(g).unwrap().port());
        let (url0, url1) = (url(0), url(1));
        let output = tokio::task::spawn_blocking(move || {
            Command::new(python)
                .args(["-W", "ignore::ResourceWarning", "-m", "unittest", "-v", "test_mcp_cluster"])
                .current_dir(workspace_root().join("tests/protocols"))
                .env("MCP_URL_0", url0)
                .env("MCP_URL_1", url1)
                .env("PYTHONUNBUFFERED", "1")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "the cluster mcp tests failed ({}):\n{text}", output.status);
        assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    }
}
