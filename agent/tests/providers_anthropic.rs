//! The Anthropic Messages provider against a fake server on loopback: text, thinking and tool use
//! streams, stop reasons, error events, retries, cancellation and the request it sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use std::time::Duration;

use provider_support::{
    FakeServer, Reply, Step, anthropic_block_stop, anthropic_event, anthropic_message_delta, anthropic_message_start,
    anthropic_message_stop, anthropic_text_delta, anthropic_text_start, stream_recorded,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_agent::llm::anthropic::AnthropicProvider;
use turnstile_agent::llm::chat::{
    ChatContent, ChatMessage, ChatOutput, ChatRequest, ChatToolCall, Finish, ProviderError, StreamDelta, ToolSpec,
    Usage,
};
use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
use turnstile_model::Secret;

fn hello() -> ChatRequest {
    ChatRequest { messages: vec![ChatMessage::user_text("hello")], ..Default::default() }
}

async fn run(endpoint: ModelEndpoint, request: &ChatRequest) -> (Result<ChatOutput, ProviderError>, Vec<StreamDelta>) {
    let provider = AnthropicProvider::new(endpoint).unwrap();
    stream_recorded(&provider, request, &CancellationToken::new(), |_| {}).await
}

/// A whole text reply: start, one text block with `pieces`, stop reason, stop.
fn text_reply(pieces: &[&str], stop_reason: &str) -> Vec<String> {
    let mut events = vec![anthropic_message_start(25), anthropic_text_start(0)];
    events.extend(pieces.iter().map(|p| anthropic_text_delta(0, p)));
    events.extend([anthropic_block_stop(0), anthropic_message_delta(stop_reason, 9), anthropic_message_stop()]);
    events
}

#[tokio::test]
async fn text_split_inside_utf8_characters_with_usage() {
    let mut events = text_reply(&["Grüße ", "aus 東京"], "end_turn");
    events.insert(2, anthropic_event(json!({"type": "ping"})));
    let raw = events.concat();
    let cuts = vec![raw.find('ü').unwrap() + 1, raw.find('東').unwrap() + 1, raw.find('京').unwrap() + 2];
    let server = FakeServer::anthropic(vec![Reply::split(&raw, &cuts)]).await;
    let (result, deltas) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.text, "Grüße aus 東京");
    assert_eq!(deltas, vec![StreamDelta::Text("Grüße ".into()), StreamDelta::Text("aus 東京".into())]);
    assert_eq!(out.finish, Finish::Stop);
    assert_eq!(out.usage, Some(Usage { input_tokens: 25, output_tokens: 9, ..Default::default() }));
    assert_eq!(out.reasoning, None);
}

#[tokio::test]
async fn thinking_then_text_then_two_tool_uses_with_input_json_deltas() {
    let events = vec![
        anthropic_message_start(40),
        anthropic_event(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Need the "}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "weather."}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
        ),
        anthropic_block_stop(0),
        anthropic_text_start(1),
        anthropic_text_delta(1, "Checking."),
        anthropic_block_stop(1),
        anthropic_event(json!({"type": "content_block_start", "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}})),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ris\", \"unit\": \"c\"}"}}),
        ),
        anthropic_block_stop(2),
        anthropic_event(json!({"type": "content_block_start", "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}}})),
        anthropic_block_stop(3),
        anthropic_message_delta("tool_use", 60),
        anthropic_message_stop(),
    ];
    let raw = events.concat();
    let cuts = vec![raw.find("Pa").unwrap() + 1];
    let server = FakeServer::anthropic(vec![Reply::split(&raw, &cuts)]).await;
    let (result, deltas) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.reasoning.as_deref(), Some("Need the weather."));
    assert_eq!(out.text, "Checking.");
    assert_eq!(
        deltas,
        vec![
            StreamDelta::Reasoning("Need the ".into()),
            StreamDelta::Reasoning("weather.".into()),
            StreamDelta::Text("Checking.".into()),
        ]
    );
    assert_eq!(out.finish, Finish::ToolCalls);
    assert_eq!(
        out.tool_calls,
        vec![
            ChatToolCall {
                id: "toolu_1".into(),
                name: "get_weather".into(),
                arguments_json: r#"{"city": "Paris", "unit": "c"}"#.into(),
            },
            ChatToolCall { id: "toolu_2".into(), name: "clock".into(), arguments_json: "{}".into() },
        ]
    );
    assert_eq!(out.usage, Some(Usage { input_tokens: 40, output_tokens: 60, ..Default::default() }));
}

#[tokio::test]
async fn max_tokens_stop_is_length() {
    let server = FakeServer::anthropic(vec![Reply::events(&text_reply(&["cut sh"], "max_tokens"))]).await;
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    let out = result.unwrap();
    assert_eq!(out.finish, Finish::Length);
    assert_eq!(out.text, "cut sh");
}

#[tokio::test]
async fn an_error_event_mid_stream_breaks_it_with_the_message() {
    let events = vec![
        anthropic_message_start(5),
        anthropic_text_start(0),
        anthropic_text_delta(0, "Partial"),
        anthropic_event(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ];
    let server =
        FakeServer::anthropic(vec![Reply::events(&events), Reply::events(&text_reply(&["x"], "end_turn"))]).await;
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    match result.unwrap_err() {
        ProviderError::StreamBroken { message, partial } => {
            assert!(message.contains("overloaded_error: Overloaded"), "{message}");
            assert_eq!(partial.text, "Partial");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests().len(), 1, "after the first byte nothing is retried");
}

#[tokio::test]
async fn a_stream_cut_before_its_stop_reason_is_broken() {
    let mut events = text_reply(&["abc"], "end_turn");
    events.truncate(3);
    let mut steps: Vec<Step> = events.iter().map(|e| Step::Send(e.clone().into_bytes())).collect();
    // Let the events leave before the cut (a cut before any byte is a retried connection failure).
    steps.push(Step::Pause(Duration::from_millis(20)));
    steps.push(Step::Cut);
    let server = FakeServer::anthropic(vec![Reply::Stream(steps)]).await;
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_stream_broken", "{error}");
    assert_eq!(error.partial().unwrap().text, "abc");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn overloaded_before_the_first_byte_is_retried() {
    let server = FakeServer::anthropic(vec![
        Reply::Status {
            status: 529,
            headers: vec![],
            body: json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
        },
        Reply::events(&text_reply(&["fine"], "end_turn")),
    ])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    assert_eq!(result.unwrap().text, "fine");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_bad_request_is_refused_with_the_providers_message() {
    let server = FakeServer::anthropic(vec![Reply::Status {
        status: 400,
        headers: vec![("content-type", "application/json".into())],
        body: json!({"type": "error", "error": {"type": "invalid_request_error",
                     "message": "messages: roles must alternate between \"user\" and \"assistant\""}})
        .to_string(),
    }])
    .await;
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &hello()).await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "model_refused");
    assert_eq!(
        error,
        ProviderError::Refused {
            status: Some(400),
            message: "messages: roles must alternate between \"user\" and \"assistant\"".into()
        }
    );
}

#[tokio::test]
async fn cancel_mid_stream_aborts_and_closes_the_connection() {
    let mut steps =
        vec![Step::Send(anthropic_message_start(1).into_bytes()), Step::Send(anthropic_text_start(0).into_bytes())];
    for i in 0..200 {
        steps.push(Step::Send(anthropic_text_delta(0, &format!("t{i} ")).into_bytes()));
        steps.push(Step::Pause(Duration::from_millis(50)));
    }
    let server = FakeServer::anthropic(vec![Reply::Stream(steps)]).await;
    let provider = AnthropicProvider::new(server.endpoint(ProviderKind::Anthropic)).unwrap();
    let cancel = CancellationToken::new();
    let (result, _) = stream_recorded(&provider, &hello(), &cancel, |_| cancel.cancel()).await;
    match result {
        Err(ProviderError::Aborted { partial }) => assert_eq!(partial.text, "t0 "),
        other => panic!("{other:?}"),
    }
    server.wait_stream_abandoned().await;
    assert!(server.chunks_sent() < 200);
}

/// A request with every kind of message, whose first five messages repeat the session's history.
fn conversation() -> (ChatRequest, serde_json::Value) {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let request = ChatRequest {
        system: Some("You are terse.".into()),
        messages: vec![
            ChatMessage::user_text("first"),
            ChatMessage::User {
                content: vec![
                    ChatContent::Text("and this image".into()),
                    ChatContent::Data { mime: "image/jpeg".into(), bytes: vec![0xff, 0xd8, 0xff] },
                    ChatContent::Text(String::new()),
                ],
            },
            ChatMessage::Assistant {
                text: "Looking.".into(),
                reasoning: Some("private thoughts".into()),
                tool_calls: vec![
                    ChatToolCall {
                        id: "toolu_1".into(),
                        name: "weather".into(),
                        arguments_json: r#"{"city":"Oslo"}"#.into(),
                    },
                    ChatToolCall { id: "toolu_2".into(), name: "clock".into(), arguments_json: "{\"trunc".into() },
                ],
            },
            ChatMessage::ToolResult { call_id: "toolu_1".into(), output: "rain".into(), is_error: false },
            ChatMessage::ToolResult { call_id: "toolu_2".into(), output: "broken".into(), is_error: true },
            ChatMessage::user_text("thanks"),
            // An interrupted reply that delivered nothing: no content, so no message.
            ChatMessage::assistant_text(""),
            ChatMessage::user_text("still there?"),
        ],
        tools: vec![ToolSpec {
            name: "weather".into(),
            description: "Weather by city".into(),
            input_schema: schema.clone(),
        }],
        max_tokens: None,
        output: None,
        history_len: 5,
    };
    (request, schema)
}

#[tokio::test]
async fn the_request_alternates_roles_pairs_tool_results_and_carries_the_headers() {
    let server = FakeServer::anthropic(vec![Reply::events(&text_reply(&["ok"], "end_turn"))]).await;
    let mut endpoint = server.endpoint(ProviderKind::Anthropic);
    endpoint.api_key = Some(Secret::new("sk-ant-test"));
    let (request, schema) = conversation();
    let (result, _) = run(endpoint, &request).await;
    assert_eq!(result.unwrap().text, "ok");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], "sk-ant-test");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert!(sent.headers.get("authorization").is_none());
    let body = &sent.body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 4096, "Anthropic requires a limit: the default when none is named");
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "and this image"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "broken", "is_error": true},
                {"type": "text", "text": "thanks"},
                {"type": "text", "text": "still there?"},
            ]},
        ])
    );
    assert_eq!(body["tools"], json!([{"name": "weather", "description": "Weather by city", "input_schema": schema}]));
}

#[tokio::test]
async fn tool_results_lead_their_user_message_and_limits_pass_through() {
    let server = FakeServer::anthropic(vec![Reply::events(&text_reply(&["ok"], "end_turn"))]).await;
    let mut endpoint = server.endpoint(ProviderKind::Anthropic);
    endpoint.max_tokens = Some(1000);
    let request = ChatRequest {
        messages: vec![
            ChatMessage::Assistant {
                text: String::new(),
                reasoning: None,
                tool_calls: vec![ChatToolCall { id: "t".into(), name: "x".into(), arguments_json: "{}".into() }],
            },
            // A message entered before the result was written: the result still leads.
            ChatMessage::user_text("meanwhile"),
            ChatMessage::ToolResult { call_id: "t".into(), output: String::new(), is_error: false },
        ],
        ..Default::default()
    };
    let (result, _) = run(endpoint, &request).await;
    result.unwrap();
    let body = &server.requests()[0].body;
    assert_eq!(body["max_tokens"], 1000);
    assert!(body.get("system").is_none());
    assert!(body.get("tools").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t"},
                {"type": "text", "text": "meanwhile"},
            ]},
        ])
    );
}

#[tokio::test]
async fn prompt_cache_marks_the_system_prompt_the_tools_and_the_end_of_the_history_and_counts_cached_tokens() {
    // SPEC §17: what the next request of the session repeats is marked; the usage reports cache reads
    // and writes (both are part of the input).
    let start = anthropic_event(json!({
        "type": "message_start",
        "message": {
            "id": "msg_test", "type": "message", "role": "assistant", "model": "test-model", "content": [],
            "usage": {"input_tokens": 12, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 300,
                      "output_tokens": 1},
        },
    }));
    let mut events = text_reply(&["ok"], "end_turn");
    events[0] = start;
    let server = FakeServer::anthropic(vec![Reply::events(&events)]).await;
    let mut endpoint = server.endpoint(ProviderKind::Anthropic);
    endpoint.prompt_cache = true;
    let (request, schema) = conversation();
    let (result, _) = run(endpoint, &request).await;
    let out = result.unwrap();
    assert_eq!(
        out.usage,
        Some(Usage { input_tokens: 2312, output_tokens: 9, cached_input_tokens: 2000, cache_write_tokens: 300 })
    );

    let body = &server.requests()[0].body;
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(body["system"], json!([{"type": "text", "text": "You are terse.", "cache_control": ephemeral}]));
    assert_eq!(
        body["tools"],
        json!([{"name": "weather", "description": "Weather by city", "input_schema": schema, "cache_control": ephemeral}])
    );
    // The history is the first five messages: its last block is toolu_2's result, marked; nothing after it.
    let marked: Vec<(usize, usize)> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .flat_map(|(m, message)| {
            let blocks = message["content"].as_array().unwrap().clone();
            blocks.into_iter().enumerate().filter(|(_, b)| b.get("cache_control").is_some()).map(move |(b, _)| (m, b))
        })
        .collect();
    assert_eq!(marked, [(2, 1)]);
    assert_eq!(body["messages"][2]["content"][1]["tool_use_id"], "toolu_2");
    assert_eq!(body["messages"][2]["content"][1]["cache_control"], ephemeral);
}

#[tokio::test]
async fn without_prompt_cache_nothing_is_marked() {
    let server = FakeServer::anthropic(vec![Reply::events(&text_reply(&["ok"], "end_turn"))]).await;
    let (request, _) = conversation();
    let (result, _) = run(server.endpoint(ProviderKind::Anthropic), &request).await;
    result.unwrap();
    assert!(!server.requests()[0].body.to_string().contains("cache_control"));
}
