//! Turnstile's A2A v1.0 agents (SPEC §19, docs/PROTOCOLS.md) through the official, unmodified `a2a-sdk`
//! Python client (`tests/protocols/test_a2a_sdk.py`, with the interpreter of `.ci/venv`,
//! `TURNSTILE_TEST_PYTHON`, at the pin of scripts/setup-test-deps), against a real `turnstile dev` with two
//! tenants' tokens, on the embedded journal and on JetStream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_tests::binary::workspace_root;
use turnstile_tests::protocol_clients::{GUARDED_AND_ONLY_B, dev_with_tokens, python_unittest};
use turnstile_tests::{Backend, DevOptions};

const TOKEN_A: &str = "a2a-token-of-tenant-a-0123456789";
const TOKEN_B: &str = "a2a-token-of-tenant-b-9876543210";

/// The shared agents: `guarded` (echo behind an approval) and `only-b` (tenant B alone).
const CONFIG: &str = GUARDED_AND_ONLY_B;

async fn a2a_sdk(backend: Backend) {
    let (server, _dir) =
        dev_with_tokens(backend, CONFIG, &[(TOKEN_A, "tenant-a"), (TOKEN_B, "tenant-b")]).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let env = vec![
        ("A2A_BASE".to_owned(), format!("http://127.0.0.1:{}", http.port())),
        ("TOKEN_A".to_owned(), TOKEN_A.to_owned()),
        ("TOKEN_B".to_owned(), TOKEN_B.to_owned()),
    ];
    python_unittest(&server, "a2a-sdk", &["test_a2a_sdk"], env).await;
}

/// A2A push notifications (decision 0155) through the `a2a-sdk` client's push configuration flow
/// (`tests/protocols/test_a2a_push.py`): a receiver on loopback, so this server allows internal webhook
/// targets (the other one refuses them).
async fn a2a_push(backend: Backend) {
    let config = format!("{CONFIG}\n[webhooks]\nallow_private = true\n");
    let (server, _dir) =
        dev_with_tokens(backend, &config, &[(TOKEN_A, "tenant-a"), (TOKEN_B, "tenant-b")]).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let env = vec![
        ("A2A_BASE".to_owned(), format!("http://127.0.0.1:{}", http.port())),
        ("TOKEN_A".to_owned(), TOKEN_A.to_owned()),
        ("TOKEN_B".to_owned(), TOKEN_B.to_owned()),
    ];
    python_unittest(&server, "a2a-sdk push", &["test_a2a_push"], env).await;
}

turnstile_tests::backend_tests!(a2a_sdk, a2a_push);

/// `[protocols] a2a = false` takes `/a2a/...` off the `--http` port and leaves the rest served.
#[tokio::test]
async fn a2a_can_be_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, "[protocols]\na2a = false\n").unwrap();
    let options =
        DevOptions { env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())], ..DevOptions::default() };
    let off = turnstile_tests::DevServer::start_with(options).await.unwrap();
    let on = turnstile_tests::DevServer::start().await.unwrap();
    let (off, on) = (off.http_addr().unwrap(), on.http_addr().unwrap());
    let card = "/a2a/scripted/.well-known/agent-card.json";
    assert_eq!(get_status(on, card).await, 200);
    assert_eq!(get_status(off, card).await, 404);
    assert_eq!(get_status(off, "/v1/models").await, 200, "the OpenAI API is still served");
}

/// The status line's code of a plain HTTP/1.1 GET of `path` (auth off: loopback callers only).
async fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("no status line: {answer}"))
}

mod cluster {
    use super::*;
    use turnstile_tests::Cluster;

    /// A subscriber that lost its gateway to a kill -9 resumes through the other with `Last-Event-ID` and
    /// misses nothing (`tests/protocols/test_a2a_cluster.py`).
    #[tokio::test]
    async fn a_subscription_resumes_through_another_gateway_after_a_kill() {
        let python = std::env::var("TURNSTILE_TEST_PYTHON")
            .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
        let mut cluster = Cluster::start(1, 2).await.unwrap();
        let base = |g: usize| format!("http://127.0.0.1:{}", cluster.gateway_http(g).unwrap().port());
        let dir = tempfile::tempdir().unwrap();
        let (ready, killed) = (dir.path().join("ready"), dir.path().join("killed"));
        let child = Command::new(python)
            .args(["-W", "ignore::ResourceWarning", "-m", "unittest", "-v", "test_a2a_cluster"])
            .current_dir(workspace_root().join("tests/protocols"))
            .env("A2A_BASE_0", base(0))
            .env("A2A_BASE_1", base(1))
            .env("READY_FILE", &ready)
            .env("KILLED_FILE", &killed)
            .env("PYTHONUNBUFFERED", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let output = tokio::task::spawn_blocking(move || child.wait_with_output());
        // The script writes READY once part of the reply came through gateway 0.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while !ready.exists() && !output.is_finished() {
            assert!(tokio::time::Instant::now() < deadline, "the script never got part of the reply");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        cluster.kill9_gateway(0);
        std::fs::write(&killed, "").unwrap();
        let output = output.await.unwrap().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "the cluster a2a test failed ({}):\n{text}", output.status);
        assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    }
}
