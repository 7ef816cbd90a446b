//! SPEC §20 "Structured output" at the providers, against fake servers on loopback: the schema goes to an
//! OpenAI-compatible server as `response_format` and to Anthropic as a forced tool whose input becomes the
//! reply; every final reply is judged against the schema on its way back to the driver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use std::sync::Arc;

use provider_support::{
    FakeServer, OPENAI_DONE, Reply, anthropic_block_stop, anthropic_event, anthropic_message_delta,
    anthropic_message_start, anthropic_message_stop, openai_chunk,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_agent::llm::chat::ToolSpec;
use turnstile_agent::llm::chat_model::{ChatModel, connect};
use turnstile_agent::llm::endpoint::ProviderKind;
use turnstile_agent::output::StructuredOutput;
use turnstile_driver::{ModelOutput, ModelRequest};
use turnstile_model::UserMessage;
use turnstile_model::output::OutputSchema;
use turnstile_worker::agent::{DeltaSink, Model, ModelStep, StreamDelta};

fn schema() -> OutputSchema {
    OutputSchema {
        name: "city".into(),
        schema: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": false}),
        strict: true,
    }
}

fn request() -> ModelRequest {
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
        messages: vec![UserMessage::user_text("m1", "Where is the Louvre?")],
        tool_results: vec![],
        interrupted_prompt: vec![],
        goal: None,
        summary: None,
        output: Some(schema()),
        compaction: None,
    }
}

/// Runs one step on `model`: its output and the text deltas it streamed.
async fn step(model: &dyn Model, request: ModelRequest) -> (ModelOutput, Vec<String>) {
    let (tx, mut rx) = mpsc::channel(64);
    let out = model.step(ModelStep::new(request, DeltaSink::new(tx), CancellationToken::new())).await.unwrap();
    let mut texts = Vec::new();
    while let Ok(delta) = rx.try_recv() {
        if let StreamDelta::Text(text) = delta {
            texts.push(text);
        }
    }
    (out, texts)
}

fn openai_text(pieces: &[&str]) -> Reply {
    let mut events: Vec<String> = pieces.iter().map(|p| openai_chunk(json!({"content": p}), None)).collect();
    events.push(openai_chunk(json!({}), Some("stop")));
    events.push(OPENAI_DONE.to_owned());
    Reply::events(&events)
}

#[tokio::test]
async fn openai_compatible_servers_get_the_schema_as_response_format_and_replies_are_judged() {
    let server =
        FakeServer::openai(vec![openai_text(&["{\"city\": ", "\"Paris\"}"]), openai_text(&["Paris, of course."])])
            .await;
    let chat = ChatModel::new(connect(server.endpoint(ProviderKind::OpenAi)).unwrap());
    let model = StructuredOutput::new(Arc::new(chat));
    let (out, deltas) = step(&model, request()).await;
    assert_eq!(out.text, "{\"city\": \"Paris\"}");
    assert_eq!(deltas.concat(), out.text);
    assert_eq!(out.invalid_output, None);
    let body = &server.requests()[0].body;
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema().schema, "strict": true}})
    );

    let (out, _) = step(&model, request()).await;
    let problem = out.invalid_output.expect("prose is not the JSON asked for");
    assert!(problem.starts_with("the reply is not JSON"), "{problem}");

    // A request without a schema sends no response format.
    let mut plain = request();
    plain.output = None;
    let server = FakeServer::openai(vec![openai_text(&["hi"])]).await;
    let chat = ChatModel::new(connect(server.endpoint(ProviderKind::OpenAi)).unwrap());
    let (out, _) = step(&StructuredOutput::new(Arc::new(chat)), plain).await;
    assert_eq!((out.text.as_str(), out.invalid_output), ("hi", None));
    assert!(server.requests()[0].body.get("response_format").is_none());
}

fn anthropic_forced_tool(input_pieces: &[&str]) -> Reply {
    let mut events = vec![
        anthropic_message_start(12),
        anthropic_event(json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "city", "input": {}}})),
    ];
    for piece in input_pieces {
        events.push(anthropic_event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece}}),
        ));
    }
    events.extend([anthropic_block_stop(0), anthropic_message_delta("tool_use", 9), anthropic_message_stop()]);
    Reply::events(&events)
}

#[tokio::test]
async fn anthropic_is_made_to_call_the_output_tool_and_its_input_is_the_reply() {
    let server = FakeServer::anthropic(vec![
        anthropic_forced_tool(&["{\"city\": \"Pa", "ris\"}"]),
        anthropic_forced_tool(&["{\"town\": \"Paris\"}"]),
        anthropic_forced_tool(&["{\"city\": \"Lyon\"}"]),
    ])
    .await;
    let chat = ChatModel::new(connect(server.endpoint(ProviderKind::Anthropic)).unwrap());
    let model = StructuredOutput::new(Arc::new(chat));
    let (out, deltas) = step(&model, request()).await;
    assert_eq!(out.text, "{\"city\": \"Paris\"}");
    assert!(out.tool_calls.is_empty(), "the output tool's call is the answer, not a call to run");
    assert_eq!(deltas, std::slice::from_ref(&out.text), "the answer streams as the reply's text");
    assert_eq!(out.invalid_output, None);
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "city"}));
    assert_eq!(body["tools"][0]["name"], "city");
    assert_eq!(body["tools"][0]["input_schema"], schema().schema);

    let (out, _) = step(&model, request()).await;
    assert!(out.invalid_output.is_some(), "the input is judged like any reply");

    // With tools of its own the agent may still call them: any tool, the output one among them.
    let clock = ToolSpec { name: "clock".into(), description: "now".into(), input_schema: json!({"type": "object"}) };
    let chat = ChatModel::new(connect(server.endpoint(ProviderKind::Anthropic)).unwrap()).with_tools(vec![clock]);
    let (out, _) = step(&StructuredOutput::new(Arc::new(chat)), request()).await;
    assert_eq!(out.text, "{\"city\": \"Lyon\"}");
    let body = &server.requests()[2].body;
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    let names: Vec<&str> = body["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["clock", "city"]);
}
