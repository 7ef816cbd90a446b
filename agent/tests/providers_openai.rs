//! The OpenAI Chat Completions provider against a fake server on loopback: streaming, tool calls,
//! finish reasons, retries, timeouts, cancellation, errors and the request it sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use std::time::{Duration, Instant};

use provider_support::{
    FakeServer, OPENAI_DONE, Reply, SlammingServer, Step, openai_chunk, openai_usage, openai_usage_cached,
    stream_recorded,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_agent::llm::chat::{
    ChatContent, ChatMessage, ChatOutput, ChatProvider, ChatRequest, ChatToolCall, Finish, ProviderError, StreamDelta,
    TimeoutKind, ToolSpec, Usage,
};
use turnstile_agent::llm::chat_model::{ChatModel, connect};
use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
use turnstile_agent::llm::openai::OpenAiProvider;
use turnstile_driver::{ModelRequest, ToolOutcome};
use turnstile_model::{ContentBlock, MessageSource, Secret, UserMessage};
use turnstile_worker::agent::{DeltaSink, Model, ModelError, ModelStep};

fn hello() -> ChatRequest {
    ChatRequest { messages: vec![ChatMessage::user_text("hello")], ..Default::default() }
}

async fn run(endpoint: ModelEndpoint, request: &ChatRequest) -> (Result<ChatOutput, ProviderError>, Vec<StreamDelta>) {
    let provider = OpenAiProvider::new(endpoint).unwrap();
    stream_recorded(&provider, request, &CancellationToken::new(), |_| {}).await
}

fn texts(deltas: &[StreamDelta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            StreamDelta::Text(t) => Some(t.as_str()),
            StreamDelta::Reasoning(_) | StreamDelta::Usage(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn text_split_inside_utf8_characters_arrives_whole() {
    let raw = [
        openai_chunk(json!({"role": "assistant", "content": ""}), None),
        openai_chunk(json!({"content": "héllo 👍"}), None),
        openai_chunk(json!({"content": " wörld"}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(12, 5),
        OPENAI_DONE.to_owned(),
    ]
    .concat();
    // Cut inside "é" (2 bytes), inside "👍" (4 bytes), inside "ö", and inside the `data:` prefix.
    let cuts: Vec<usize> = ["é", "👍", "ö", "[DONE]"]
        .iter()
        .map(|needle| raw.find(needle).unwrap() + if *needle == "[DONE]" { 3 } else { 1 })
        .collect();
    let server = FakeServer::openai(vec![Reply::split(&raw, &cuts)]).await;
    let (result, deltas) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.text, "héllo 👍 wörld");
    assert_eq!(texts(&deltas), out.text);
    assert_eq!(out.finish, Finish::Stop);
    assert_eq!(out.usage, Some(Usage { input_tokens: 12, output_tokens: 5, ..Default::default() }));
    assert_eq!(out.reasoning, None);
    assert!(server.chunks_sent() >= 5, "the body did travel in pieces");
}

#[tokio::test]
async fn cached_prompt_tokens_are_reported_apart_within_the_input() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": "hi"}), Some("stop")),
        openai_usage_cached(1500, 4, 1280),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let usage = result.unwrap().usage.unwrap();
    assert_eq!(usage, Usage { input_tokens: 1500, output_tokens: 4, cached_input_tokens: 1280, cache_write_tokens: 0 });
}

#[tokio::test]
async fn two_tool_calls_assembled_from_pieces_split_mid_json() {
    let raw = [
        openai_chunk(json!({"role": "assistant", "content": "Let me check."}), None),
        openai_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "get_weather", "arguments": ""}}]}),
            None,
        ),
        openai_chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}), None),
        openai_chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}), None),
        openai_chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                    "function": {"name": "clock", "arguments": "{}"}}]}),
            None,
        ),
        openai_chunk(json!({}), Some("tool_calls")),
        OPENAI_DONE.to_owned(),
    ]
    .concat();
    // Cut in the middle of the escaped JSON of the arguments and in the middle of a tool name.
    let cuts = vec![raw.find("city").unwrap() + 2, raw.find("clock").unwrap() + 3];
    let server = FakeServer::openai(vec![Reply::split(&raw, &cuts)]).await;
    let (result, deltas) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.finish, Finish::ToolCalls);
    assert_eq!(out.text, "Let me check.");
    assert_eq!(texts(&deltas), "Let me check.");
    assert_eq!(
        out.tool_calls,
        vec![
            ChatToolCall {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments_json: r#"{"city": "Paris"}"#.into()
            },
            ChatToolCall { id: "call_b".into(), name: "clock".into(), arguments_json: "{}".into() },
        ]
    );
    let args: serde_json::Value = serde_json::from_str(&out.tool_calls[0].arguments_json).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(out.usage, None, "no usage chunk, no usage");
}

#[tokio::test]
async fn finish_length_is_reported_as_length() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"content": "a truncated ans"}), None),
        openai_chunk(
            json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "x", "arguments": "{\"a"}}]}),
            None,
        ),
        openai_chunk(json!({}), Some("length")),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.finish, Finish::Length);
    assert_eq!(out.text, "a truncated ans");
    // The truncated call is kept as delivered (the driver never runs it).
    assert_eq!(out.tool_calls[0].arguments_json, "{\"a");
}

#[tokio::test]
async fn deepseek_reasoning_content_streams_as_reasoning() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": null, "reasoning_content": "The user greets; "}), None),
        openai_chunk(json!({"content": null, "reasoning_content": "greet back."}), None),
        openai_chunk(json!({"content": "Hi!", "reasoning_content": null}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(3, 9),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let (result, deltas) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.reasoning.as_deref(), Some("The user greets; greet back."));
    assert_eq!(out.text, "Hi!");
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Reasoning("The user greets; ".into()),
            StreamDelta::Reasoning("greet back.".into()),
            StreamDelta::Text("Hi!".into()),
        ]
    );
}

#[tokio::test]
async fn rate_limited_429_waits_retry_after_then_succeeds() {
    let server = FakeServer::openai(vec![
        Reply::Status {
            status: 429,
            headers: vec![("retry-after", "1".into()), ("content-type", "application/json".into())],
            body: json!({"error": {"message": "Rate limit reached"}}).to_string(),
        },
        Reply::events(&[openai_chunk(json!({"content": "ok"}), Some("stop")), OPENAI_DONE.to_owned()]),
    ])
    .await;
    let started = Instant::now();
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    assert_eq!(result.unwrap().text, "ok");
    assert_eq!(server.requests().len(), 2, "one retry");
    // The backoff alone is at most 20 ms here: only honouring `Retry-After: 1` makes it wait this long.
    assert!(started.elapsed() >= Duration::from_secs(1), "waited {:?}", started.elapsed());
}

#[tokio::test]
async fn rate_limited_until_the_retries_run_out() {
    let server = FakeServer::openai(vec![Reply::error(429, "slow down"), Reply::error(429, "slow down again")]).await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.retries = 1;
    let (result, _) = run(endpoint, &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_rate_limited");
    assert!(
        matches!(&error, ProviderError::RateLimited { attempts: 2, message } if message.contains("slow down again"))
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn server_errors_are_retried_then_give_up_as_unavailable() {
    let server = FakeServer::openai(vec![
        Reply::error(500, "boom 1"),
        Reply::error(502, "boom 2"),
        Reply::error(503, "boom 3"),
        Reply::events(&[openai_chunk(json!({"content": "too late"}), Some("stop")), OPENAI_DONE.to_owned()]),
    ])
    .await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.retries = 2;
    let (result, deltas) = run(endpoint, &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_unavailable");
    match &error {
        ProviderError::Unavailable { attempts, message } => {
            assert_eq!(*attempts, 3);
            assert!(message.contains("503") && message.contains("boom 3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests().len(), 3, "the first attempt and two retries");
    assert_eq!(server.unused_replies(), 1);
    assert!(deltas.is_empty());
}

#[tokio::test]
async fn connections_closed_before_any_byte_are_retried_then_unavailable() {
    let server = SlammingServer::start().await;
    let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "m");
    endpoint.base_url = server.base_url.clone();
    endpoint.retries = 2;
    endpoint.backoff.base = Duration::from_millis(5);
    endpoint.backoff.max = Duration::from_millis(5);
    let (result, _) = run(endpoint, &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_unavailable", "{error}");
    assert!(matches!(error, ProviderError::Unavailable { attempts: 3, .. }));
    assert_eq!(server.accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_stream_cut_after_the_first_byte_is_broken_and_not_retried() {
    let server = FakeServer::openai(vec![
        Reply::Stream(vec![
            Step::Send(openai_chunk(json!({"content": "Hel"}), None).into_bytes()),
            Step::Pause(Duration::from_millis(20)),
            Step::Cut,
        ]),
        Reply::events(&[openai_chunk(json!({"content": "retried"}), Some("stop")), OPENAI_DONE.to_owned()]),
    ])
    .await;
    let (result, deltas) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_stream_broken", "{error}");
    assert_eq!(error.partial().unwrap().text, "Hel");
    assert_eq!(texts(&deltas), "Hel");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_stream_that_ends_without_done_or_finish_is_broken() {
    let server = FakeServer::openai(vec![Reply::events(&[openai_chunk(json!({"content": "half"}), None)])]).await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    assert_eq!(result.unwrap_err().code(), "model_stream_broken");
}

#[tokio::test]
async fn an_error_chunk_mid_stream_breaks_it_with_the_message() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"content": "so"}), None),
        format!("data: {}\n\n", json!({"error": {"message": "upstream model crashed", "code": 500}})),
    ])])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    match result.unwrap_err() {
        ProviderError::StreamBroken { message, partial } => {
            assert!(message.contains("upstream model crashed"), "{message}");
            assert_eq!(partial.text, "so");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_first_byte_is_a_timeout_and_not_retried() {
    for silence in [Reply::Silent, Reply::Stream(vec![Step::Hang])] {
        let server = FakeServer::openai(vec![
            silence.clone(),
            Reply::events(&[openai_chunk(json!({"content": "x"}), Some("stop")), OPENAI_DONE.to_owned()]),
        ])
        .await;
        let mut endpoint = server.endpoint(ProviderKind::OpenAi);
        endpoint.first_byte_timeout = Duration::from_millis(300);
        let (result, _) = run(endpoint, &hello()).await;
        let error = result.unwrap_err();
        assert_eq!(error.code(), "model_timeout", "{silence:?}: {error}");
        assert!(matches!(error, ProviderError::Timeout { kind: TimeoutKind::FirstByte, .. }), "{silence:?}");
        assert_eq!(server.requests().len(), 1, "{silence:?}");
    }
}

#[tokio::test]
async fn a_stream_gone_quiet_is_an_idle_timeout_with_what_came() {
    let server = FakeServer::openai(vec![Reply::Stream(vec![
        Step::Send(openai_chunk(json!({"content": "partial "}), None).into_bytes()),
        Step::Hang,
    ])])
    .await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.idle_timeout = Duration::from_millis(300);
    let (result, _) = run(endpoint, &hello()).await;
    match result.unwrap_err() {
        ProviderError::Timeout { kind: TimeoutKind::Idle, partial, .. } => assert_eq!(partial.text, "partial "),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_slow_stream_past_the_request_timeout_is_a_timeout() {
    let mut steps = Vec::new();
    for _ in 0..400 {
        steps.push(Step::Send(openai_chunk(json!({"content": "."}), None).into_bytes()));
        steps.push(Step::Pause(Duration::from_millis(25)));
    }
    let server = FakeServer::openai(vec![Reply::Stream(steps)]).await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.timeout = Duration::from_millis(500);
    let (result, deltas) = run(endpoint, &hello()).await;
    match result.unwrap_err() {
        ProviderError::Timeout { kind: TimeoutKind::Request, partial, .. } => {
            assert!(!partial.text.is_empty());
            assert_eq!(partial.text, texts(&deltas));
        }
        other => panic!("{other:?}"),
    }
    assert!(server.chunks_sent() < 400);
}

#[tokio::test]
async fn cancel_mid_stream_aborts_at_once_and_closes_the_connection() {
    let mut steps = Vec::new();
    for i in 0..200 {
        steps.push(Step::Send(openai_chunk(json!({"content": format!("w{i} ")}), None).into_bytes()));
        steps.push(Step::Pause(Duration::from_millis(50)));
    }
    let server = FakeServer::openai(vec![Reply::Stream(steps)]).await;
    let provider = OpenAiProvider::new(server.endpoint(ProviderKind::OpenAi)).unwrap();
    let cancel = CancellationToken::new();
    let mut seen = String::new();
    let (result, _) = stream_recorded(&provider, &hello(), &cancel, |delta| {
        if let StreamDelta::Text(t) = delta {
            seen.push_str(t);
        }
        if seen.len() >= "w0 w1 ".len() {
            cancel.cancel();
        }
    })
    .await;
    match result {
        Err(ProviderError::Aborted { partial }) => {
            assert_eq!(partial.text, "w0 w1 ", "the text delivered before the cancel, nothing after");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(seen, "w0 w1 ");
    server.wait_stream_abandoned().await;
    assert!(server.chunks_sent() < 200, "the server stopped streaming long before its end");
}

#[tokio::test]
async fn cancelled_before_the_start_sends_nothing() {
    let server = FakeServer::openai(vec![Reply::Silent]).await;
    let provider = OpenAiProvider::new(server.endpoint(ProviderKind::OpenAi)).unwrap();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let result = provider.stream(&hello(), &DeltaSink::discard(), &cancel).await;
    assert_eq!(result.unwrap_err().code(), "aborted");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn unauthorized_is_refused_with_the_providers_message() {
    let server = FakeServer::openai(vec![
        Reply::error(401, "Incorrect API key provided: sk-wr***ng."),
        Reply::events(&[openai_chunk(json!({"content": "x"}), Some("stop")), OPENAI_DONE.to_owned()]),
    ])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_refused");
    assert_eq!(
        error,
        ProviderError::Refused { status: Some(401), message: "Incorrect API key provided: sk-wr***ng.".into() }
    );
    assert!(error.to_string().contains("HTTP 401"), "{error}");
    assert_eq!(server.requests().len(), 1, "a refusal is not retried");
}

#[tokio::test]
async fn a_plain_text_error_body_is_the_message() {
    let server =
        FakeServer::openai(vec![Reply::Status { status: 404, headers: vec![], body: "model 'nope' not found".into() }])
            .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    assert_eq!(
        result.unwrap_err(),
        ProviderError::Refused { status: Some(404), message: "model 'nope' not found".into() }
    );
}

#[tokio::test]
async fn the_request_carries_system_history_tools_and_the_key() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"content": "done"}), Some("stop")),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.api_key = Some(Secret::new("sk-test-123"));
    endpoint.max_tokens = Some(512);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let request = ChatRequest {
        system: Some("You are terse.".into()),
        messages: vec![
            ChatMessage::User {
                content: vec![
                    ChatContent::Text("What is in this picture, and the weather?".into()),
                    ChatContent::Data { mime: "image/png".into(), bytes: vec![0x89, b'P', b'N', b'G'] },
                    ChatContent::Data { mime: "text/csv".into(), bytes: b"a,b".to_vec() },
                ],
            },
            ChatMessage::Assistant {
                text: String::new(),
                reasoning: Some("think".into()),
                tool_calls: vec![
                    ChatToolCall {
                        id: "call_1".into(),
                        name: "weather".into(),
                        arguments_json: r#"{"city":"Oslo"}"#.into(),
                    },
                    ChatToolCall { id: "call_2".into(), name: "clock".into(), arguments_json: "{}".into() },
                ],
            },
            ChatMessage::ToolResult { call_id: "call_1".into(), output: "rain".into(), is_error: false },
            ChatMessage::ToolResult { call_id: "call_2".into(), output: "clock broke".into(), is_error: true },
            ChatMessage::assistant_text("A cat; rainy."),
            ChatMessage::user_text("Thanks"),
        ],
        tools: vec![ToolSpec {
            name: "weather".into(),
            description: "Weather by city".into(),
            input_schema: schema.clone(),
        }],
        max_tokens: Some(77),
        output: None,
        history_len: 0,
    };
    let (result, _) = run(endpoint, &request).await;
    assert_eq!(result.unwrap().text, "done");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], "Bearer sk-test-123");
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(sent.headers["accept"], "text/event-stream");
    let body = &sent.body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["max_tokens"], 77, "the request's limit wins over the endpoint's");
    let roles: Vec<&str> = body["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool", "assistant", "user"]);
    let messages = &body["messages"];
    assert_eq!(messages[0]["content"], "You are terse.");
    assert_eq!(
        messages[1]["content"],
        json!([
            {"type": "text", "text": "What is in this picture, and the weather?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            {"type": "text", "text": "[data text/csv]\na,b"},
        ])
    );
    assert_eq!(messages[2]["content"], serde_json::Value::Null);
    assert_eq!(
        messages[2]["tool_calls"],
        json!([
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
        ])
    );
    assert!(messages[2].get("reasoning_content").is_none(), "reasoning is not sent back");
    assert_eq!(messages[3], json!({"role": "tool", "tool_call_id": "call_1", "content": "rain"}));
    assert_eq!(messages[4], json!({"role": "tool", "tool_call_id": "call_2", "content": "error: clock broke"}));
    assert_eq!(messages[5]["content"], "A cat; rainy.");
    assert!(messages[5].get("tool_calls").is_none());
    assert_eq!(messages[6]["content"], "Thanks");
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {"name": "weather", "description": "Weather by city", "parameters": schema}}])
    );
}

#[tokio::test]
async fn without_a_key_or_tools_none_is_sent() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"content": "x"}), Some("stop")),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::OpenAi), &hello()).await;
    result.unwrap();
    let sent = &server.requests()[0];
    assert!(sent.headers.get("authorization").is_none());
    assert!(sent.body.get("tools").is_none());
    assert!(sent.body.get("max_tokens").is_none(), "no limit named: the server's default");
    assert_eq!(sent.body["messages"], json!([{"role": "user", "content": "hello"}]));
}

#[tokio::test]
async fn the_key_never_shows_in_debug_output_or_errors() {
    let server = FakeServer::openai(vec![Reply::error(401, "bad key")]).await;
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.api_key = Some(Secret::new("sk-very-secret"));
    let provider = OpenAiProvider::new(endpoint.clone()).unwrap();
    assert!(!format!("{endpoint:?} {provider:?}").contains("sk-very-secret"));
    let error = provider.stream(&hello(), &DeltaSink::discard(), &CancellationToken::new()).await.unwrap_err();
    assert!(!format!("{error:?} {error}").contains("sk-very-secret"));
}

#[tokio::test]
async fn bad_endpoints_are_refused_before_any_request() {
    let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "m");
    endpoint.base_url = "ftp://example.invalid/v1".into();
    assert!(OpenAiProvider::new(endpoint.clone()).is_err());
    endpoint.base_url = "not a url".into();
    assert!(OpenAiProvider::new(endpoint.clone()).is_err());
    endpoint.base_url = "http://127.0.0.1:1/v1".into();
    endpoint.api_key = Some(Secret::new("line\nbreak"));
    let error = OpenAiProvider::new(endpoint).unwrap_err().to_string();
    assert!(error.contains("API key") && !error.contains("line"), "{error}");
}

// The bridge to today's `Model` trait.

fn model_request(messages: Vec<UserMessage>, tool_results: Vec<ToolOutcome>) -> ModelRequest {
    ModelRequest {
        agent_hash: String::new(),
        overrides: Default::default(),
        op: 1,
        session: turnstile_model::SessionRef { tenant: "default".into(), id: "s".into() },
        turn: 1,
        step: 1,
        agent: "assistant".into(),
        system: None,
        history: vec![],
        messages,
        tool_results,
        interrupted_prompt: vec![],
        goal: None,
        summary: None,
        output: None,
        compaction: None,
    }
}

#[tokio::test]
async fn chat_model_streams_deltas_and_maps_the_output() {
    let server = FakeServer::openai(vec![
        Reply::events(&[
            openai_chunk(json!({"content": "Checking "}), None),
            openai_chunk(json!({"content": "now."}), None),
            openai_chunk(
                json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "clock", "arguments": "{}"}}]}),
                None,
            ),
            openai_chunk(json!({}), Some("tool_calls")),
            OPENAI_DONE.to_owned(),
        ]),
        Reply::error(400, "context too long"),
    ])
    .await;
    let model = ChatModel::new(connect(server.endpoint(ProviderKind::OpenAi)).unwrap()).with_system("Be brief.");
    let (tx, mut rx) = mpsc::channel(16);
    let message = UserMessage {
        id: turnstile_model::MessageId("m1".into()),
        content: vec![ContentBlock::text("what time is it?")].into(),
        source: MessageSource::User,
    };
    let out = model
        .step(ModelStep::new(model_request(vec![message], vec![]), DeltaSink::new(tx), CancellationToken::new()))
        .await
        .unwrap();
    assert_eq!(out.text, "Checking now.");
    assert!(!out.max_tokens);
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!((out.tool_calls[0].call_id.as_str(), out.tool_calls[0].name.as_str()), ("c1", "clock"));
    let mut deltas = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        deltas.push(delta);
    }
    assert_eq!(deltas, [StreamDelta::Text("Checking ".into()), StreamDelta::Text("now.".into())]);
    let sent = &server.requests()[0].body;
    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(sent["messages"][1], json!({"role": "user", "content": "what time is it?"}));

    let (tx, _rx) = mpsc::channel(16);
    let results = vec![ToolOutcome::new("c1", "clock", "12:00".into(), None)];
    let error = model
        .step(ModelStep::new(model_request(vec![], results), DeltaSink::new(tx), CancellationToken::new()))
        .await
        .unwrap_err();
    match error {
        ModelError::Failed { message, code } => {
            assert_eq!(code, "model_refused");
            assert!(message.contains("context too long"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests()[1].body["messages"][1]["content"], "Tool results:\n- clock (c1): 12:00");
}

#[tokio::test]
async fn retries_are_counted_by_reason() {
    // Requests, tokens and timings are counted by the worker's runner for every kind of model
    // (`providers_session.rs`); the retries before the first byte only the HTTP engine sees.
    turnstile_ops::install_metrics().unwrap();
    let server = FakeServer::openai(vec![
        Reply::error(429, "slow down"),
        Reply::events(&[
            openai_chunk(json!({"content": "hi"}), Some("stop")),
            openai_usage(12, 3),
            OPENAI_DONE.to_owned(),
        ]),
    ])
    .await;
    // A model name of its own: the other tests of this binary may count into the same recorder.
    let mut endpoint = server.endpoint(ProviderKind::OpenAi);
    endpoint.model = "metrics-model".into();
    let provider = OpenAiProvider::new(endpoint).unwrap();
    provider.stream(&hello(), &DeltaSink::discard(), &CancellationToken::new()).await.unwrap();

    let text = turnstile_ops::render_metrics().unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("turnstile_model_retries_total") && l.contains("metrics-model"))
        .unwrap_or_else(|| panic!("no retries line in\n{text}"));
    assert!(line.contains(r#"provider="openai""#) && line.contains(r#"reason="rate_limited""#), "{line}");
    assert!(line.ends_with(" 1"), "{line}");
}
