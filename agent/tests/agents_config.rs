//! `setup::from_config` against a fake OpenAI-compatible server on loopback: each agent's model gets the
//! agent's tools (name, description, JSON Schema), the endpoint settings and the key from `api_key_env`,
//! and steps are routed to the model of their agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use provider_support::{FakeServer, OPENAI_DONE, Reply, openai_chunk, openai_usage};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_agent::setup::{AgentSetup, from_config_with_env};
use turnstile_config::Config;
use turnstile_driver::{ModelOutput, ModelRequest};
use turnstile_model::UserMessage;
use turnstile_worker::agent::{DeltaSink, ModelError, ModelStep};

fn config(base_url: &str) -> Config {
    Config::from_toml_str(&format!(
        r#"
default_agent = "assistant"

[models.fake]
base_url = "{base_url}"
model = "test-model"
api_key_env = "FAKE_API_KEY"
max_tokens = 77
retries = 0

[models.other]
base_url = "{base_url}"
model = "other-model"
retries = 0

[agents.assistant]
model = "fake"
system = "Be brief."
tools = ["clock", "echo"]

[agents.assistant.overrides]
models = ["other"]
tools = true

[agents.local]
tools = ["sleep"]
"#
    ))
    .unwrap()
}

fn setup(base_url: &str) -> AgentSetup {
    from_config_with_env(&config(base_url), |v| (v == "FAKE_API_KEY").then(|| "sk-fake".to_owned())).unwrap()
}

fn request(agent: &str, system: Option<&str>, text: &str) -> ModelRequest {
    ModelRequest {
        agent_hash: String::new(),
        overrides: Default::default(),
        op: 1,
        session: turnstile_model::SessionRef { tenant: "default".into(), id: "s".into() },
        turn: 1,
        step: 1,
        agent: agent.into(),
        system: system.map(Into::into),
        history: vec![],
        messages: vec![UserMessage::user_text("m1", text)],
        tool_results: vec![],
        interrupted_prompt: vec![],
        goal: None,
        summary: None,
        output: None,
        compaction: None,
    }
}

async fn step(setup: &AgentSetup, request: ModelRequest) -> Result<ModelOutput, ModelError> {
    let (tx, mut rx) = mpsc::channel(64);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let out = setup.model.step(ModelStep::new(request, DeltaSink::new(tx), CancellationToken::new())).await;
    drain.await.unwrap();
    out
}

fn hello_reply() -> Reply {
    Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": "hello from the fake"}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(10, 4),
        OPENAI_DONE.to_owned(),
    ])
}

#[tokio::test]
async fn an_agents_model_is_offered_its_tools_with_their_schemas() {
    let server = FakeServer::openai(vec![hello_reply()]).await;
    let setup = setup(&server.base_url);
    let out = step(&setup, request("assistant", Some("Be brief."), "what time is it?")).await.unwrap();
    assert_eq!(out.text, "hello from the fake");

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], "Bearer sk-fake");
    assert_eq!(sent.body["model"], "test-model");
    assert_eq!(sent.body["max_tokens"], 77);
    assert_eq!(sent.body["messages"][0], json!({"role": "system", "content": "Be brief."}));
    let tools = sent.body["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["clock", "echo"]);
    for (tool, name) in tools.iter().zip(["clock", "echo"]) {
        let spec = setup.tools.spec(name).unwrap();
        assert_eq!(tool["type"], "function");
        assert_eq!(tool["function"]["description"], spec.description.as_str());
        assert_eq!(tool["function"]["parameters"], spec.input_schema);
    }
    assert_eq!(tools[1]["function"]["parameters"]["required"], json!(["text"]));
}

#[tokio::test]
async fn steps_are_routed_to_the_model_of_their_agent() {
    let server = FakeServer::openai(vec![hello_reply()]).await;
    let setup = setup(&server.base_url);
    // `local` runs on the built-in scripted model: nothing reaches the server.
    assert_eq!(step(&setup, request("local", None, "hi")).await.unwrap().text, "echo: hi");
    assert_eq!(step(&setup, request("scripted", None, "yo")).await.unwrap().text, "echo: yo");
    assert!(server.requests().is_empty());
    assert_eq!(step(&setup, request("assistant", None, "hi")).await.unwrap().text, "hello from the fake");
    assert_eq!(server.requests().len(), 1);
    assert_eq!(setup.catalog.default_agent(), "assistant");
}

/// SPEC §20: a session's overrides reach the provider: the model it chose from the agent's list, and only
/// the tools of its subset offered (a call of another is refused by the tools, not the model).
#[tokio::test]
async fn a_sessions_model_and_tool_subset_are_what_the_provider_is_asked_with() {
    let server = FakeServer::openai(vec![hello_reply(), hello_reply()]).await;
    let agents = turnstile_worker::agent::Agents::from(setup(&server.base_url));
    let mut narrowed = request("assistant", Some("Be brief."), "what time is it?");
    narrowed.overrides = turnstile_model::overrides::SessionOverrides {
        model: Some("other".into()),
        tools: Some(vec!["echo".into()]),
        ..Default::default()
    };
    let (tx, mut rx) = mpsc::channel(64);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let out = agents.model.step(ModelStep::new(narrowed, DeltaSink::new(tx), CancellationToken::new())).await.unwrap();
    drain.await.unwrap();
    assert_eq!(out.text, "hello from the fake");
    let sent = &server.requests()[0];
    assert_eq!(sent.body["model"], "other-model");
    let names: Vec<&str> =
        sent.body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo"], "clock is not offered");
    // Without overrides: the agent's model and every tool.
    step(&setup(&server.base_url), request("assistant", None, "again")).await.unwrap();
    let sent = &server.requests()[1];
    assert_eq!(sent.body["model"], "test-model");
    assert_eq!(sent.body["tools"].as_array().unwrap().len(), 2);
}
