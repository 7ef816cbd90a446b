//! `turnstile acp` (SPEC §19, docs/PROTOCOLS.md) with the official, unmodified `agent-client-protocol` Python
//! SDK as the editor (`tests/protocols/test_acp.py`, with the interpreter of `.ci/venv`,
//! `TURNSTILE_TEST_PYTHON`, at the pin of scripts/setup-test-deps): it spawns `turnstile acp` against a real
//! `turnstile dev` with a tenant's token, on the embedded journal and on JetStream: new, a prompt with a
//! streamed reply, a tool call whose permission request is answered, cancel, and a fresh process that
//! `session/load`s the session and sees the same history.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_tests::binary::{turnstile_bin, workspace_root};
use turnstile_tests::{Backend, DevOptions};

const TOKEN: &str = "acp-token-of-tenant-a-0123456789";

/// `guarded` runs the built-in `echo` behind an approval (SPEC §9).
const CONFIG: &str = "[agents.guarded]\nmodel = \"scripted\"\ntools = [\"echo\"]\napproval = [\"echo\"]\n";

async fn acp_sdk(backend: Backend) {
    let python = std::env::var("TURNSTILE_TEST_PYTHON")
        .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN} tenant-a\n")).unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let options = DevOptions {
        extra_args: vec!["--auth-tokens".into(), tokens.display().to_string()],
        env: vec![("TURNSTILE_CONFIG".into(), config.display().to_string())],
        ..DevOptions::default()
    };
    let server = backend.start_dev_with(options).await.unwrap();
    let (addr, bin) = (server.url(), turnstile_bin().unwrap());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-W", "ignore::ResourceWarning", "-m", "unittest", "-v", "test_acp"])
            .current_dir(workspace_root().join("tests/protocols"))
            .env("TURNSTILE_BIN", bin)
            .env("ADDR", addr)
            .env("TOKEN", TOKEN)
            .env("PYTHONUNBUFFERED", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the agent-client-protocol SDK tests failed ({}):\n{text}\n--- server log:\n{}",
        output.status,
        server.log_tail()
    );
    assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    println!("{text}");
}

turnstile_tests::backend_tests!(acp_sdk);
