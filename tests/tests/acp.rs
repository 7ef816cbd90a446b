//! `turnstile acp` (SPEC §19, docs/PROTOCOLS.md) with the official, unmodified `agent-client-protocol` Python
//! SDK as the editor (`tests/protocols/test_acp.py`, with the interpreter of `.ci/venv`,
//! `TURNSTILE_TEST_PYTHON`, at the pin of scripts/setup-test-deps): it spawns `turnstile acp` against a real
//! `turnstile dev` with a tenant's token, on the embedded journal and on JetStream: new, a prompt with a
//! streamed reply, a tool call whose permission request is answered, cancel, and a fresh process that
//! `session/load`s the session and sees the same history.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_tests::Backend;
use turnstile_tests::binary::turnstile_bin;
use turnstile_tests::protocol_clients::{dev_with_tokens, python_unittest};

const TOKEN: &str = "acp-token-of-tenant-a-0123456789";

/// `guarded` runs the built-in `echo` behind an approval (SPEC §9).
const CONFIG: &str = "[agents.guarded]\nmodel = \"scripted\"\ntools = [\"echo\"]\napproval = [\"echo\"]\n";

async fn acp_sdk(backend: Backend) {
    let (server, _dir) = dev_with_tokens(backend, CONFIG, &[(TOKEN, "tenant-a")]).await.unwrap();
    let env = vec![
        ("TURNSTILE_BIN".to_owned(), turnstile_bin().unwrap().display().to_string()),
        ("ADDR".to_owned(), server.url()),
        ("TOKEN".to_owned(), TOKEN.to_owned()),
    ];
    python_unittest(&server, "agent-client-protocol SDK", &["test_acp"], env).await;
}

turnstile_tests::backend_tests!(acp_sdk);
