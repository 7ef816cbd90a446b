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
use turnstile_agent::setup::from_config_with_env;
use turnstile_cluster::CommandRouter;
use turnstile_config::Config;
use turnstile_journal::{EmbeddedLog, LiveBus, LocalBus};
use turnstile_model::{
    Command, Envelope, EventPayload, LiveEvent, LivePayload, SessionRef, Target, TurnEndReason, Usage, UserMessage,
};
use turnstile_worker::SessionHost;

struct Run {
    events: Vec<Envelope>,
    live: Vec<LiveEvent>,
}

/// Runs one followup on the agent `assistant` of `provider` at `server`, until the session is idle.
async fn run_one_turn(provider: &str, server: &FakeServer, text: &str) -> Run {
    run_turn_on(provider, server, "test-model", text).await
}

/// [`run_one_turn`] naming the model at the provider (metrics tests count apart by it).
async fn run_turn_on(provider: &str, server: &FakeServer, model: &str, text: &str) -> Run {
    let config = Config::from_toml_str(&format!(
        "default_agent = \"assistant\"\n[models.fake]\nprovider = \"{provider}\"\nbase_url = \"{}\"\n\
         model = \"{model}\"\nretries = 0\n[agents.assistant]\nmodel = \"fake\"\n",
        server.base_url
    ))
    .unwrap();
    let setup = from_config_with_env(&config, |_| None).unwrap();
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    let host = SessionHost::builder(log.clone(), bus.clone(), setup.into()).build();
    let session = SessionRef::new("acme", "s1").unwrap();
    let mut live = bus.subscribe(&session).await.unwrap();
    let message = UserMessage::user_text("m1", text);
    let send = Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
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
            assert_eq!(*usage, Some(Usage { input_tokens: 42, output_tokens: 17, ..Default::default() }));
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
            assert_eq!(*usage, Some(Usage { input_tokens: 30, output_tokens: 6, ..Default::default() }));
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

#[tokio::test]
async fn model_requests_tokens_errors_and_first_token_time_are_counted_by_tenant_agent_and_model() {
    turnstile_ops::install_metrics().unwrap();
    let server = FakeServer::openai(vec![
        Reply::events(&[
            openai_chunk(json!({"role": "assistant", "content": "counted"}), None),
            openai_chunk(json!({}), Some("stop")),
            openai_usage(12, 3),
            OPENAI_DONE.to_owned(),
        ]),
        Reply::error(403, "forbidden"),
    ])
    .await;
    run_turn_on("openai", &server, "metrics-model", "one").await;
    let failed = run_turn_on("openai", &server, "metrics-model", "two").await;
    assert!(matches!(failed.turn_end(), TurnEndReason::Error { code, .. } if code == "model_refused"));

    let text = turnstile_ops::render_metrics().unwrap();
    let line = |name: &str, extra: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(r#"model="metrics-model""#) && l.contains(extra))
            .unwrap_or_else(|| panic!("no {name} {extra} in\n{text}"))
            .to_owned()
    };
    let who = r#"agent="assistant",provider="openai""#;
    let requests = line("turnstile_model_requests_total", r#"outcome="ok""#);
    assert!(requests.contains(r#"tenant="acme""#) && requests.contains(who), "{requests}");
    assert!(requests.ends_with(" 1"), "{requests}");
    assert!(line("turnstile_model_requests_total", r#"outcome="model_refused""#).ends_with(" 1"));
    assert!(line("turnstile_model_tokens_total", r#"kind="input""#).ends_with(" 12"));
    assert!(line("turnstile_model_tokens_total", r#"kind="output""#).ends_with(" 3"));
    let errors = line("turnstile_model_errors_total", r#"code="model_refused""#);
    assert!(errors.contains(r#"tenant="acme""#) && errors.ends_with(" 1"), "{errors}");
    // Only the request that streamed has a first token.
    assert!(line("turnstile_model_time_to_first_token_seconds_count", who).ends_with(" 1"));
    assert!(line("turnstile_model_request_duration_seconds_count", r#"outcome="ok""#).ends_with(" 1"));
    assert!(line("turnstile_model_request_duration_seconds_count", r#"outcome="model_refused""#).ends_with(" 1"));
}

#[tokio::test]
async fn the_scripted_model_is_counted_as_provider_scripted() {
    turnstile_ops::install_metrics().unwrap();
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    let setup = from_config_with_env(&Config::default(), |_| None).unwrap();
    let host = SessionHost::builder(log, bus, setup.into()).build();
    let session = SessionRef::new("scripted-tenant", "s1").unwrap();
    let message = UserMessage::user_text("m1", "hi");
    let send = Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    host.execute(&session, send, None).await.unwrap();
    host.execute(&session, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap();
    let text = turnstile_ops::render_metrics().unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("turnstile_model_requests_total") && l.contains(r#"tenant="scripted-tenant""#))
        .unwrap_or_else(|| panic!("no scripted request in\n{text}"));
    for label in [r#"agent="scripted""#, r#"provider="scripted""#, r#"model="scripted""#, r#"outcome="ok""#] {
        assert!(line.contains(label), "{label} in {line}");
    }
}

mod spans {
    //! A layer that keeps every span's name, parent and fields.

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::registry::LookupSpan;

    #[derive(Clone, Debug, Default)]
    pub struct Seen {
        pub name: String,
        pub parent: Option<String>,
        pub fields: BTreeMap<String, String>,
    }

    #[derive(Clone, Default)]
    pub struct Capture(pub Arc<Mutex<BTreeMap<u64, Seen>>>);

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name().to_owned());
            let mut seen = Seen { name: attrs.metadata().name().to_owned(), parent, fields: BTreeMap::new() };
            attrs.record(&mut Fields(&mut seen.fields));
            self.0.lock().unwrap().insert(id.into_u64(), seen);
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
            if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
                values.record(&mut Fields(&mut seen.fields));
            }
        }
    }
}

#[tokio::test]
async fn each_model_request_has_a_span_with_provider_model_and_token_counts() {
    use tracing_subscriber::layer::SubscriberExt as _;

    let capture = spans::Capture::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let server = FakeServer::openai(vec![Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": "spanned"}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(21, 4),
        OPENAI_DONE.to_owned(),
    ])])
    .await;
    run_one_turn("openai", &server, "hi").await;
    let seen = capture.0.lock().unwrap().clone();
    let request = seen.values().find(|s| s.name == "model.request").expect("a model.request span");
    assert_eq!(request.parent.as_deref(), Some("step"));
    for (field, value) in [
        ("agent", "assistant"),
        ("provider", "openai"),
        ("model", "test-model"),
        ("outcome", "ok"),
        ("input_tokens", "21"),
        ("output_tokens", "4"),
        ("session", "acme/s1"),
    ] {
        assert_eq!(request.fields.get(field).map(String::as_str), Some(value), "{field} in {request:?}");
    }
    assert!(request.fields.contains_key("first_token_ms"), "{request:?}");
    let http = seen.values().find(|s| s.name == "model.http").expect("a model.http span");
    assert_eq!(http.parent.as_deref(), Some("model.request"));
    assert_eq!(http.fields.get("attempts").map(String::as_str), Some("1"));
}
