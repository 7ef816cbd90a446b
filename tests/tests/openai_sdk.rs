//! The OpenAI Responses and Conversations API (SPEC §19, docs/PROTOCOLS.md) through the official `openai`
//! Python SDK, unmodified: `tests/protocols/test_openai_sdk.py` runs with the interpreter of `.ci/venv`
//! (`TURNSTILE_TEST_PYTHON`, with `openai` at the pin of scripts/setup-test-deps) against a real
//! `turnstile dev` this test starts with two tenants' tokens, on the embedded journal and on JetStream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use turnstile_tests::binary::workspace_root;
use turnstile_tests::{Backend, DevOptions};

const TOKEN_A: &str = "openai-token-of-tenant-a-0123456789";
const TOKEN_B: &str = "openai-token-of-tenant-b-9876543210";

async fn openai_sdk(backend: Backend) {
    let python = std::env::var("TURNSTILE_TEST_PYTHON")
        .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let options =
        DevOptions { extra_args: vec!["--auth-tokens".into(), tokens.display().to_string()], ..DevOptions::default() };
    let server = backend.start_dev_with(options).await.unwrap();
    let http = server.http_addr().expect("the harness starts dev with --http");
    let script = workspace_root().join("tests/protocols");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-m", "unittest", "-v", "test_openai_sdk"])
            .current_dir(script)
            .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{}/v1", http.port()))
            .env("TOKEN_A", TOKEN_A)
            .env("TOKEN_B", TOKEN_B)
            .env("PYTHONUNBUFFERED", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the openai SDK tests failed ({}):\n{text}\n--- server log:\n{}",
        output.status,
        server.log_tail()
    );
    assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    println!("{text}");
}

turnstile_tests::backend_tests!(openai_sdk);
