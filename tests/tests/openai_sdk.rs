//! The OpenAI Responses and Conversations API (SPEC §19, docs/PROTOCOLS.md) through the official SDKs,
//! unmodified, against a real `turnstile dev` this test starts with two tenants' tokens, on the embedded
//! journal and on JetStream: the `openai` Python SDK and the OpenAI Agents SDK
//! (`tests/protocols/test_openai_sdk.py`, `test_openai_agents.py`, with the interpreter of `.ci/venv`,
//! `TURNSTILE_TEST_PYTHON`), then the `openai` npm package (`tests/protocols/openai_sdk.mjs`, from
//! `.ci/node`), all at the pins of scripts/setup-test-deps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_tests::binary::workspace_root;
use turnstile_tests::protocol_clients::{dev_with_tokens, node_script, python_unittest};
use turnstile_tests::{Backend, Cluster, DevOptions};

const TOKEN_A: &str = "openai-token-of-tenant-a-0123456789";
const TOKEN_B: &str = "openai-token-of-tenant-b-9876543210";

/// `guarded`: the scripted model with the built-in `echo` behind an approval (SPEC §9).
const CONFIG: &str = "[agents.guarded]\nmodel = \"scripted\"\ntools = [\"echo\"]\napproval = [\"echo\"]\n";

async fn openai_sdk(backend: Backend) {
    let (server, _dir) =
        dev_with_tokens(backend, CONFIG, &[(TOKEN_A, "tenant-a"), (TOKEN_B, "tenant-b")]).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let env = || {
        vec![
            ("OPENAI_BASE_URL".to_owned(), format!("http://127.0.0.1:{}/v1", http.port())),
            ("TOKEN_A".to_owned(), TOKEN_A.to_owned()),
            ("TOKEN_B".to_owned(), TOKEN_B.to_owned()),
        ]
    };
    python_unittest(&server, "openai SDK", &["test_openai_sdk", "test_openai_agents"], env()).await;

    // The npm package, from .ci/node (OPENAI_NODE_MODULES overrides).
    let modules = std::env::var("OPENAI_NODE_MODULES")
        .unwrap_or_else(|_| workspace_root().join(".ci/node/node_modules").display().to_string());
    let mut node_env = env();
    node_env.push(("OPENAI_NODE_MODULES".to_owned(), modules));
    let text = node_script(&server, "openai npm", "tests/protocols/openai_sdk.mjs", node_env).await;
    assert!(text.contains("all checks passed"), "{text}");
}

turnstile_tests::backend_tests!(openai_sdk);

/// The status line's code of a plain HTTP/1.1 GET of `path`.
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

/// `[protocols] openai = false` takes the OpenAI paths off the `--http` port and leaves the rest served.
#[tokio::test]
async fn the_openai_api_can_be_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, "[protocols]\nopenai = false\n").unwrap();
    let options =
        DevOptions { env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())], ..DevOptions::default() };
    let off = turnstile_tests::DevServer::start_with(options).await.unwrap();
    let on = turnstile_tests::DevServer::start().await.unwrap();
    let (off, on) = (off.http_addr().unwrap(), on.http_addr().unwrap());
    assert_eq!(get_status(on, "/v1/models").await, 200);
    assert_eq!(get_status(off, "/v1/models").await, 404);
    assert_eq!(get_status(off, "/healthz").await, 200);
}

mod cluster {
    use super::*;

    /// A response streamed in part through one gateway resumes through another, and a conversation made
    /// through one is used through the other (`tests/protocols/test_openai_cluster.py`).
    #[tokio::test]
    async fn openai_objects_are_answered_by_any_gateway() {
        let python = std::env::var("TURNSTILE_TEST_PYTHON")
            .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
        let cluster = Cluster::start(1, 2).await.unwrap();
        let url = |g: usize| format!("http://127.0.0.1:{}/v1", cluster.gateway_http(g).unwrap().port());
        let (url0, url1) = (url(0), url(1));
        let output = tokio::task::spawn_blocking(move || {
            Command::new(python)
                .args(["-m", "unittest", "-v", "test_openai_cluster"])
                .current_dir(workspace_root().join("tests/protocols"))
                .env("OPENAI_BASE_URL_0", url0)
                .env("OPENAI_BASE_URL_1", url1)
                .env("PYTHONUNBUFFERED", "1")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "the cluster openai tests failed ({}):\n{text}", output.status);
        assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    }

    /// A background response streamed through gateway 0 is streamed again with `starting_after` through
    /// gateway 1 after gateway 0 was killed (-9) mid-reply: every byte once, in order
    /// (`tests/protocols/openai_gateway_kill.py`).
    #[tokio::test]
    async fn a_response_resumes_through_another_gateway_after_its_gateway_was_killed() {
        let mut cluster = Cluster::start(1, 2).await.unwrap();
        let mut script = Handshake::start(&cluster, "openai_gateway_kill.py", "CUT").await;
        cluster.kill9_gateway(0);
        script.finish().await;
    }

    /// A function call returned through gateway 0 is answered through gateway 1 after the session's owner
    /// was killed (-9) and started again: the new owner waits for the same call
    /// (`tests/protocols/openai_owner_kill.py`).
    #[tokio::test]
    async fn a_function_call_is_answered_after_its_owner_was_killed() {
        let mut cluster = Cluster::start(1, 2).await.unwrap();
        let mut script = Handshake::start(&cluster, "openai_owner_kill.py", "WAITING").await;
        cluster.kill9_worker(0);
        cluster.restart_worker(0).await.unwrap();
        script.finish().await;
    }

    /// A Python script of tests/protocols run against the cluster's two gateways that prints `ready` once it
    /// wants the test to act, then waits for a line on stdin, then prints `OK`.
    struct Handshake {
        child: std::process::Child,
        stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
    }

    impl Handshake {
        async fn start(cluster: &Cluster, script: &str, ready: &str) -> Self {
            use std::io::BufRead;
            use std::process::Stdio;
            let python = std::env::var("TURNSTILE_TEST_PYTHON")
                .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
            let url = |g: usize| format!("http://127.0.0.1:{}/v1", cluster.gateway_http(g).unwrap().port());
            let mut child = Command::new(python)
                .arg(script)
                .current_dir(workspace_root().join("tests/protocols"))
                .env("OPENAI_BASE_URL_0", url(0))
                .env("OPENAI_BASE_URL_1", url(1))
                .env("PYTHONUNBUFFERED", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let (stdout, line) = tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                stdout.read_line(&mut line).unwrap();
                (stdout, line)
            })
            .await
            .unwrap();
            let mut handshake = Self { child, stdout: Some(stdout) };
            if line.trim() != ready {
                let rest = handshake.rest().await;
                panic!("{script} did not get to {ready}: {line:?}\n{rest}");
            }
            handshake
        }

        /// Lets the script go on; panics with its output unless it ends with `OK`.
        async fn finish(&mut self) {
            use std::io::Write;
            self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
            let rest = self.rest().await;
            assert!(rest.starts_with("OK"), "the script failed:\n{rest}");
        }

        /// What the script prints from here on (stdout, then stderr), once it ended.
        async fn rest(&mut self) -> String {
            let mut stdout = self.stdout.take().unwrap();
            let mut stderr = self.child.stderr.take().unwrap();
            tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let (mut out, mut err) = (String::new(), String::new());
                stdout.read_to_string(&mut out).unwrap();
                stderr.read_to_string(&mut err).unwrap();
                format!("{out}{err}")
            })
            .await
            .unwrap()
        }
    }

    impl Drop for Handshake {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
