//! AG-UI (SPEC §19, docs/PROTOCOLS.md) through the unmodified `@ag-ui/client` `HttpAgent`, run by node
//! (`tests/protocols/agui_client.mjs`, from `.ci/node` at the pin of scripts/setup-test-deps; AGUI_NODE_MODULES
//! overrides), against a real `turnstile dev` this test starts with two tenants' tokens, on the embedded
//! journal and on JetStream: a run with text, a frontend tool, an approval interrupt resumed, a reconnect
//! mid-run with nothing lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_tests::binary::workspace_root;
use turnstile_tests::{Backend, Cluster, ClusterOptions, DevOptions};

const TOKEN_A: &str = "agui-token-of-tenant-a-0123456789";
const TOKEN_B: &str = "agui-token-of-tenant-b-9876543210";

/// `guarded`: the scripted model with the built-in `echo` behind an approval (SPEC §9).
const GUARDED: &str = "[agents.guarded]\nmodel = \"scripted\"\ntools = [\"echo\"]\napproval = [\"echo\"]\n";

async fn agui_client(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, GUARDED).unwrap();
    let options = DevOptions {
        extra_args: vec!["--auth-tokens".into(), tokens.display().to_string()],
        env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())],
        ..DevOptions::default()
    };
    let server = backend.start_dev_with(options).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let url = format!("http://127.0.0.1:{}", http.port());
    let text = node(&[("AGUI_URL", url), ("TOKEN_A", TOKEN_A.into()), ("TOKEN_B", TOKEN_B.into())]).await;
    assert!(text.contains("all checks passed"), "{text}\n--- server log:\n{}", server.log_tail());
}

turnstile_tests::backend_tests!(agui_client);

/// Runs the AG-UI client checks with `env`; their output, or a panic with it when they failed.
async fn node(env: &[(&str, String)]) -> String {
    let modules = std::env::var("AGUI_NODE_MODULES")
        .unwrap_or_else(|_| workspace_root().join(".ci/node/node_modules").display().to_string());
    let script = workspace_root().join("tests/protocols/agui_client.mjs");
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("AGUI_NODE_MODULES", modules)
            .env("SUPPRESS_TRANSFORMATION_WARNINGS", "1")
            .envs(env)
            .output()
            .expect("node runs (scripts/setup-test-deps installs it)")
    })
    .await
    .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the AG-UI client checks failed ({}):\n{text}", output.status);
    text
}

/// `[protocols] agui = false` takes `/ag-ui/` off the `--http` port and leaves the rest served.
#[tokio::test]
async fn agui_can_be_switched_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, "[protocols]\nagui = false\n").unwrap();
    let options =
        DevOptions { env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())], ..DevOptions::default() };
    let off = turnstile_tests::DevServer::start_with(options).await.unwrap();
    let status = |addr: std::net::SocketAddr, path: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = r#"{"threadId":"t1","runId":"r1","messages":[]}"#;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        answer.split(' ').nth(1).and_then(|code| code.parse::<u16>().ok()).unwrap()
    };
    let addr = off.http_addr().unwrap();
    assert_eq!(status(addr, "/ag-ui/scripted").await, 404);
    assert_eq!(status(addr, "/v1/models").await, 405, "the OpenAI API stays served");
}

mod cluster {
    use super::*;

    /// The same checks on a cluster of one worker and two gateways (auth off): the frontend tool's answer, the
    /// interrupt's resume and the reconnect go through the other gateway than the run they continue.
    #[tokio::test]
    async fn any_gateway_answers_and_resumes_a_run() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("turnstile.toml");
        std::fs::write(&config, GUARDED).unwrap();
        let env = vec![("TURNSTILE_CONFIG".to_owned(), config.display().to_string())];
        let options = ClusterOptions { worker_env: env.clone(), gateway_env: env, ..ClusterOptions::new(1, 2) };
        let cluster = Cluster::start_with(options).await.unwrap();
        let url = |g: usize| format!("http://127.0.0.1:{}", cluster.gateway_http(g).unwrap().port());
        let text =
            node(&[("AGUI_URL", url(0)), ("AGUI_URL_OTHER", url(1)), ("TOKEN_A", "unused-auth-is-off".into())]).await;
        assert!(text.contains("all checks passed"), "{text}");
    }
}
