//! A whole session on a real provider (a fake server on loopback) through the worker's host: the model's
//! reasoning and token usage land on the durable `assistant/message`, and the live `assistant/delta`s
//! keep reasoning apart from text (SPEC §8 "Streaming").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use provider_support::{
    FakeServer, OPENAI_DONE, Reply, anthropic_block_stop, anthropic_event, anthropic_message_delta,
    anthropic_message_start, anthropic_message_stop, anthropic_text_delta, anthropic_text_start, openai_chunk,
    openai_usage,
};
use serde_json::json;
use turnstile_cluster::CommandRouter;
use turnstile_config::Config;
use turnstile_journal::snapshot::NoSnapshots;
use turnstile_journal::{EmbeddedLog, LiveBus, LocalBus};
use turnstile_model::{
    Command, Envelope, EventPayload, LiveEvent, LivePayload, SessionRef, Target, TurnEndReason, Usage, UserMessage,
};
use turnstile_worker::agents::from_config_with_env;
use turnstile_worker::{SessionHost, WorkerConfig};

struct Run {
    events: Vec<Envelope>,
    live: Vec<LiveEvent>,
}

/// Runs one followup on the agent `assistant` of `provider` at `server`, until the session is idle.
async fn run_one_turn(provider: &str, server: &FakeServer, text: &str) -> Run {
    let config = Config::from_toml_str(&format!(
        "default_agent = \"assistant\"\n[models.fake]\nprovider = \"{provider}\"\nbase_url = \"{}\"\n\
         model = \"test-model\"\nretries = 0\n[agents.assistant]\nmodel = \"fake\"\n",
        server.base_url
    ))
    .unwrap();
    let setup = from_config_with_env(&config, |_| None).unwrap();
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    let host =
        SessionHost::with_agents(log.clone(), bus.clone(), Arc::new(NoSnapshots), None, setup, WorkerConfig::default());
    let session = SessionRef::new("acme", "s1").unwrap();
    let mut live = bus.subscribe(&session).await.unwrap();
    let message = UserMessage::user_text("m1", text);
    let send = Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None };
    host.execute(&session, send, None).await.unwrap();
    host.execute(&session, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap();
    let events = turnstile_journal::log::read_all(log.as_ref(), &session, 1).await.unwrap();
    let mut seen = Vec::new();
    // Live events are published before the durable ones that follow them are appended: all are in.
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(200), live.next()).await {
        let idle = matches!(event.payload, LivePayload::Status { status: turnstile_model::Status::Idle });
        seen.push(event);
        if idle {
            break;
        }
    }
    Run { events, live: seen }
}

impl Run {
    fn assistant(&self) -> &EventPayload {
        &self.events.iter().find(|e| e.event_type() == "assistant/message").expect("an assistant/message").payload
    }

    fn deltas(&self, of_reasoning: bool) -> String {
        self.live
            .iter()
            .filter_map(|e| match &e.payload {
                LivePayload::AssistantDelta { text, reasoning, .. } if *reasoning == of_reasoning => {
                    Some(text.as_str())
                }
                _ => None,
            })
            .collect()
    }

    fn turn_end(&self) -> &TurnEndReason {
        self.events
            .iter()
            .find_map(|e| match &e.payload {
                EventPayload::TurnEnd { reason, .. } => Some(reason),
                _ => None,
            })
            .expect("a turn/end")
    }
}

#[tokio::test]
async fn openai_reasoning_content_and_usage_land_in_the_durable_assistant_message() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": "", "reasoning_content": "The user "}), None),
        openai_chunk(json!({"reasoning_content": "greets me."}), None),
        openai_chunk(json!({"content": "Hello"}), None),
        openai_chunk(json!({"content": " there!"}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(42, 17),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let run = run_one_turn("openai", &server, "hi").await;
    match run.assistant() {
        EventPayload::AssistantMessage { text, reasoning, usage, interrupted: false, .. } => {
            assert_eq!(text, "Hello there!");
            assert_eq!(reasoning.as_deref(), Some("The user greets me."));
            assert_eq!(*usage, Some(Usage { input_tokens: 42, output_tokens: 17 }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run.turn_end(), &TurnEndReason::Completed);
    assert_eq!(run.deltas(false), "Hello there!");
    assert_eq!(run.deltas(true), "The user greets me.");
    // Reasoning is never sent back: the request carried the user's message only.
    assert_eq!(server.requests()[0].body["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[tokio::test]
async fn anthropic_thinking_and_usage_land_in_the_durable_assistant_message() {
    let server = FakeServer::anthropic(vec![Reply::events(&[
        anthropic_message_start(30),
        anthropic_event(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        anthropic_event(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Short answer."}}),
        ),
        anthropic_block_stop(0),
        anthropic_text_start(1),
        anthropic_text_delta(1, "Yes."),
        anthropic_block_stop(1),
        anthropic_message_delta("end_turn", 6),
        anthropic_message_stop(),
    ])])
    .await;
    let run = run_one_turn("anthropic", &server, "really?").await;
    match run.assistant() {
        EventPayload::AssistantMessage { text, reasoning, usage, .. } => {
            assert_eq!(text, "Yes.");
            assert_eq!(reasoning.as_deref(), Some("Short answer."));
            assert_eq!(*usage, Some(Usage { input_tokens: 30, output_tokens: 6 }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run.deltas(false), "Yes.");
    assert_eq!(run.deltas(true), "Short answer.");
}

#[tokio::test]
async fn a_reply_without_reasoning_or_usage_records_neither() {
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": "plain"}), None),
        openai_chunk(json!({}), Some("stop")),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    let run = run_one_turn("openai", &server, "hi").await;
    assert!(
        matches!(run.assistant(), EventPayload::AssistantMessage { reasoning: None, usage: None, text, .. } if text == "plain"),
        "{:?}",
        run.assistant()
    );
    assert_eq!(run.deltas(true), "");
}
