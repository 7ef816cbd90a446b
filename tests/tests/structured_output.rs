//! SPEC §20 "Structured output" end to end through the real `turnstile` binary: a turn's schema
//! (`DeliverRequest.output_schema`) on llama.cpp's server returns JSON that validates; on the scripted model
//! (which answers a structured turn with the entered text as it is) a reply that does not validate is
//! retried once with the problem shown to the model, then the turn ends `error{invalid_output}`; an agent's
//! own schema (`PutAgent`) applies to its turns; a bad schema is refused naming the field.
//!
//! The llama.cpp test needs `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF` (`source .ci/test-env.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use tonic::Code;
use turnstile_config::output::OutputValidator;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::{DeliverRequest, OutputSchema, SessionEvent};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::llama::{LlamaServer, RecordingProxy, SMOLLM2_MODEL};
use turnstile_tests::{DevOptions, DevServer, Session, user_msg};

fn city_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": false
    })
}

fn output_schema(schema: &serde_json::Value) -> OutputSchema {
    OutputSchema { name: "city".into(), schema_json: schema.to_string(), strict: true }
}

/// A followup whose turn must answer with `schema`.
async fn structured_followup(
    session: &Session,
    id: &str,
    text: &str,
    schema: Option<OutputSchema>,
) -> Result<(), tonic::Status> {
    let request =
        DeliverRequest { session: Some(session.reference()), message: Some(user_msg(id, text)), output_schema: schema };
    session.client().followup(request).await.map(|_| ())
}

/// The code of turn `turn`'s `turn/end error`, or what else it ended with.
fn turn_end(events: &[SessionEvent], turn: u64) -> Result<String, String> {
    let reason = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Durable::TurnEnd(end)) if end.turn == turn => end.reason.as_ref().and_then(|r| r.reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no turn/end {turn} in {events:#?}"));
    match reason {
        Reason::Error(error) => Ok(error.code),
        other => Err(format!("{other:?}")),
    }
}

/// `(turn, step, text)` of an `assistant/message`.
type Reply = (u64, u32, String);
/// `(id, turn, step)` of a `user/message`.
type Prompt = (String, u64, u32);

/// Every `assistant/message` and every `user/message`, in log order.
fn replies_and_prompts(events: &[SessionEvent]) -> (Vec<Reply>, Vec<Prompt>) {
    let mut replies = Vec::new();
    let mut prompts = Vec::new();
    for e in events {
        match &e.payload {
            Some(Durable::AssistantMessage(m)) => replies.push((m.turn, m.step, m.text.clone())),
            Some(Durable::UserMessage(m)) => {
                prompts.push((m.message.as_ref().map(|m| m.id.clone()).unwrap_or_default(), m.turn, m.step))
            }
            _ => {}
        }
    }
    (replies, prompts)
}

#[tokio::test]
async fn a_reply_that_does_not_validate_is_retried_once_then_the_turn_ends_invalid_output() {
    let server = DevServer::start().await.unwrap();
    let session = server.session();
    let schema = Some(output_schema(&city_schema()));

    // Turn 1: prose, then (the retry's text, echoed) prose again: error{invalid_output} after one retry.
    structured_followup(&session, "q1", "Paris, of course.", schema.clone()).await.unwrap();
    session.when_idle().await.unwrap();
    // Turn 2: JSON that matches: completed at the first step.
    structured_followup(&session, "q2", r#"{"city": "Paris"}"#, schema.clone()).await.unwrap();
    session.when_idle().await.unwrap();
    // Turn 3: no schema of its own, and the agent has none: never judged.
    session.followup(user_msg("q3", "just talk")).await.unwrap();
    session.when_idle().await.unwrap();

    let (events, _) = session.replay(0).await.unwrap();
    assert_eq!(turn_end(&events, 1), Ok("invalid_output".to_owned()));
    assert_eq!(turn_end(&events, 2), Err("Completed(Empty)".to_owned()));
    assert_eq!(turn_end(&events, 3), Err("Completed(Empty)".to_owned()));
    let (replies, prompts) = replies_and_prompts(&events);
    let prompt = |id: &str, turn: u64, step: u32| (id.to_owned(), turn, step);
    assert_eq!(
        prompts,
        [prompt("q1", 1, 1), prompt("output-retry-1-1", 1, 2), prompt("q2", 2, 1), prompt("q3", 3, 1)],
        "the retry is a durable message of a second step of the same turn"
    );
    assert_eq!(replies[0], (1, 1, "Paris, of course.".to_owned()));
    assert_eq!((replies[1].0, replies[1].1), (1, 2));
    assert!(replies[1].2.starts_with("Your reply does not match the required JSON schema: the reply is not JSON"));
    assert_eq!(replies[2], (2, 1, r#"{"city": "Paris"}"#.to_owned()));
    assert_eq!(replies[3], (3, 1, "echo: just talk".to_owned()));

    // A bad schema is refused before anything is written, naming the field.
    for (bad, field) in [
        (OutputSchema { name: "a b".into(), schema_json: "{}".into(), strict: false }, "output_schema.name: "),
        (OutputSchema { name: "x".into(), schema_json: "{".into(), strict: false }, "output_schema.schema_json: "),
        (output_schema(&json!({"type": "objekt"})), "output_schema.schema_json: not a valid JSON Schema"),
    ] {
        let err = structured_followup(&session, "bad", "x", Some(bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(field), "{}", err.message());
    }
}

#[tokio::test]
async fn an_agents_own_schema_applies_to_its_turns_unless_the_turn_gives_one() {
    use turnstile_proto::v1::{ConfigureSessionRequest, PutAgentRequest};
    let server = DevServer::start().await.unwrap();
    // With auth off an agent is put in the default tenant: the session is of that tenant too.
    let reference = turnstile_proto::v1::SessionRef { tenant: "default".into(), id: "s-extractor".into() };
    let session = Session::with_ref(server.client(), reference);
    let definition = json!({"output": {"name": "city", "schema": city_schema()}}).to_string();
    let put = PutAgentRequest { name: "extractor".into(), definition, ..Default::default() };
    let mut client = session.client();
    client.put_agent(put).await.unwrap();
    let configure =
        ConfigureSessionRequest { session: Some(session.reference()), agent: "extractor".into(), ..Default::default() };
    client.configure_session(configure).await.unwrap();

    session.followup(user_msg("q1", "not JSON")).await.unwrap();
    session.when_idle().await.unwrap();
    session.followup(user_msg("q2", r#"{"city": "Lyon"}"#)).await.unwrap();
    session.when_idle().await.unwrap();
    // The turn's own schema wins: any JSON string is fine for it, the agent's would refuse it.
    let any_string = OutputSchema { name: "s".into(), schema_json: r#"{"type": "string"}"#.into(), strict: false };
    structured_followup(&session, "q3", r#""Lyon""#, Some(any_string)).await.unwrap();
    session.when_idle().await.unwrap();

    let (events, _) = session.replay(0).await.unwrap();
    assert_eq!(turn_end(&events, 1), Ok("invalid_output".to_owned()));
    assert_eq!(turn_end(&events, 2), Err("Completed(Empty)".to_owned()));
    assert_eq!(turn_end(&events, 3), Err("Completed(Empty)".to_owned()));
}

/// llama.cpp reads `response_format: {type: json_schema}` and constrains its sampling to the schema: the
/// reply of SmolLM2-135M is JSON that validates, at the first step.
#[tokio::test]
async fn a_structured_turn_on_llama_cpp_returns_json_that_validates() {
    let llama = LlamaServer::start().await.unwrap();
    let proxy = RecordingProxy::start(llama.addr()).await.unwrap();
    let toml = format!(
        r#"default_agent = "assistant"

[models.local]
provider = "openai"
base_url = "{base_url}"
model = "{SMOLLM2_MODEL}"
max_tokens = 64
retries = 0

[agents.assistant]
model = "local"
system = "You answer with JSON."
"#,
        base_url = proxy.base_url(),
    );
    let (_dir, config) = config_file(&toml);
    let opts = DevOptions { extra_args: config_args(&config), ..DevOptions::default() };
    let server = DevServer::start_with(opts).await.unwrap();
    let context = || format!("--- turnstile dev\n{}\n--- llama-server\n{}", server.log_tail(), llama.log_tail());
    let session = server.session();

    let schema = output_schema(&city_schema());
    structured_followup(&session, "q1", "Which city is the capital of France?", Some(schema.clone())).await.unwrap();
    // A real model on a busy machine may need more than one WhenIdle wait.
    let mut idle = false;
    for _ in 0..4 {
        match session.when_idle().await {
            Ok(_) => {
                idle = true;
                break;
            }
            Err(status) if status.code() == Code::DeadlineExceeded => {}
            Err(status) => panic!("{status}\n{}", context()),
        }
    }
    assert!(idle, "not idle within 2 min\n{}", context());

    let (events, _) = session.replay(0).await.unwrap();
    assert_eq!(turn_end(&events, 1), Err("Completed(Empty)".to_owned()), "{}", context());
    let (replies, _) = replies_and_prompts(&events);
    assert_eq!(replies.len(), 1, "valid at the first step, no retry: {replies:?}");
    let validator = OutputValidator::new(&turnstile_model::output::OutputSchema {
        name: schema.name.clone(),
        schema: city_schema(),
        strict: true,
    })
    .unwrap();
    assert_eq!(validator.check(&replies[0].2), Ok(()), "{:?}", replies[0].2);
    eprintln!("llama.cpp answered {:?}", replies[0].2);

    let requests = proxy.chat_requests();
    assert_eq!(
        requests[0]["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": city_schema(), "strict": true}})
    );
}
