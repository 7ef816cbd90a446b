//! A real model end to end: llama.cpp's `llama-server` with SmolLM2-135M-Instruct (the harness's
//! [`LlamaServer`]), first on its own, then behind `turnstile dev --config FILE` as an `openai` model.
//!
//! Needs `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (`scripts/setup-test-deps`, `source .ci/test-env.sh`).
//! Nothing here asserts on durations or on the exact words of the model: the server runs greedy
//! (`--temp 0`), but the tests only rely on what holds for any answer (non-empty, deltas before the
//! durable message, token counts, what the requests carried).

use serde_json::{Value, json};
use turnstile_tests::llama::{LlamaServer, RecordingProxy, chat_body, stream_chat};

const SYSTEM: &str = "You are a helpful assistant. Answer in one short sentence.";

/// The server starts on a port it picked, is healthy, and streams a short answer with usage; the same
/// request gives the same text (greedy decoding); the recording proxy forwards the stream unchanged and
/// keeps the request exactly as sent.
#[tokio::test]
async fn llama_server_streams_deterministically() {
    let llama = LlamaServer::start().await.unwrap();
    assert!(llama.addr().ip().is_loopback());
    assert_eq!(llama.health().await, Some(200));

    let body = chat_body(SYSTEM, "What colour is the sky on a clear day?", 16);
    let first = stream_chat(llama.addr(), &body).await.unwrap();
    let text = first.text();
    assert!(!text.trim().is_empty(), "an empty answer: {first:?}\n{}", llama.log_tail());
    assert!(first.deltas.len() > 1, "streamed in one piece: {first:?}");
    let usage = first.usage.expect("usage in the last chunk (stream_options.include_usage)");
    assert!(usage.prompt_tokens > 0, "{usage:?}");
    assert!((1..=16).contains(&usage.completion_tokens), "{usage:?}");
    assert!(matches!(first.finish_reason.as_deref(), Some("stop" | "length")), "{first:?}");

    let again = stream_chat(llama.addr(), &body).await.unwrap();
    assert_eq!(again.text(), text, "--temp 0 is greedy: the same request gives the same text");
    assert_eq!(again.usage, first.usage);

    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    let proxied = stream_chat(proxy.addr(), &body).await.unwrap();
    assert_eq!(proxied.text(), text, "the proxy passes the stream through");
    let recorded = proxy.chat_requests();
    assert_eq!(recorded, vec![body], "the proxy keeps the request as sent");
}

/// What one `messages` entry says, for comparisons: `(role, content)`.
fn role_content(message: &Value) -> (String, String) {
    (message["role"].as_str().unwrap_or_default().to_owned(), message["content"].as_str().unwrap_or_default().to_owned())
}

#[allow(dead_code)]
fn messages_of(request: &Value) -> Vec<(String, String)> {
    request["messages"].as_array().map(|m| m.iter().map(role_content).collect()).unwrap_or_default()
}

#[allow(dead_code)]
fn _uses_json() -> Value {
    json!({})
}
