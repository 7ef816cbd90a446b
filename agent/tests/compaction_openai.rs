//! SPEC §13 compaction through the real request builder and the OpenAI provider, against the fake
//! OpenAI server on loopback: the driver decides, `ChatModel` builds the HTTP body the server records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod provider_support;

use provider_support::{FakeServer, OPENAI_DONE, Reply, openai_chunk};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_agent::llm::chat_model::{ChatModel, connect};
use turnstile_agent::llm::endpoint::ProviderKind;
use turnstile_driver::{
    AgentCatalog, AgentProfile, Driver, Effect, Limits, ModelOutcome, PreStepDecision, PreStepOutcome, SUMMARY_PREFIX,
};
use turnstile_model::{Command, SessionRef, SessionState, Target, UserMessage};
use turnstile_worker::agent::{DeltaSink, Model, ModelError, ModelStep};

fn reply(text: &str) -> Reply {
    Reply::events(&[openai_chunk(json!({"content": text}), Some("stop")), OPENAI_DONE.to_owned()])
}

/// A driver of the agent `assistant` (system prompt, a budget of `budget` estimated tokens).
fn driver(budget: u64) -> Driver {
    let profile = AgentProfile {
        system: Some("Be brief.".into()),
        context_budget_tokens: Some(budget),
        ..AgentProfile::default()
    };
    let agents = AgentCatalog::new("assistant", [("assistant".to_owned(), profile)]).unwrap();
    let session = SessionRef::new("acme", "s1").unwrap();
    let mut driver = Driver::new(SessionState::new(session, 1_000), Limits::default(), agents, 1, "test");
    driver.recover(0);
    driver
}

/// Runs one followup to the end: pre-steps enter their batch, model requests go to `model`.
async fn followup(driver: &mut Driver, model: &ChatModel, id: &str, text: &str) {
    let message = UserMessage::user_text(id, text);
    let command =
        Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    driver.on_command(1, command, 1);
    loop {
        let effects = driver.ready();
        if effects.is_empty() {
            return;
        }
        for effect in effects {
            match effect {
                Effect::PreStep(r) => {
                    driver.on_pre_step(r.op, PreStepOutcome::Decided(PreStepDecision::Enter(r.messages)), 1)
                }
                Effect::Model(r) => {
                    let op = r.op;
                    let (tx, _rx) = mpsc::channel(64);
                    let outcome =
                        match model.step(ModelStep::new(*r, DeltaSink::new(tx), CancellationToken::new())).await {
                            Ok(output) => ModelOutcome::Finished(output),
                            Err(ModelError::Failed { message, code }) => {
                                ModelOutcome::Failed { message, code, spent: None }
                            }
                            Err(ModelError::Aborted) => ModelOutcome::Aborted { spent: None },
                        };
                    driver.on_model_done(op, outcome, 1);
                }
                Effect::Tool(t) => panic!("no tools here: {t:?}"),
                _ => {}
            }
        }
    }
}

fn messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected.iter().map(|(r, c)| ((*r).to_owned(), (*c).to_owned())).collect()
}

#[tokio::test]
async fn the_request_after_compaction_holds_system_summary_and_later_turns_only() {
    let server = FakeServer::openai(vec![reply("one"), reply("the gist of turn 1"), reply("two")]).await;
    let model = ChatModel::new(connect(server.endpoint(ProviderKind::OpenAi)).unwrap());
    // Turn 1 alone fits; turn 2's request (turn 1 + B) does not.
    let mut driver = driver(8);
    followup(&mut driver, &model, "A", "first question").await;
    followup(&mut driver, &model, "B", "second question").await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "turn 1, the compaction, turn 2");
    // The compaction request: the summarized turn, then the instruction; no system prompt, no tools.
    let compaction = &requests[1].body;
    let sent = messages(compaction);
    assert_eq!(sent[..2], pairs(&[("user", "first question"), ("assistant", "one")]));
    assert_eq!(sent.len(), 3);
    assert!(sent[2].1.starts_with("Summarize turns 1..1"), "{sent:?}");
    assert!(compaction.get("tools").is_none());
    // Turn 2: system, the summary as one marked user message, then turn 2 only.
    let summary = format!("{SUMMARY_PREFIX}the gist of turn 1");
    assert_eq!(
        messages(&requests[2].body),
        pairs(&[("system", "Be brief."), ("user", &summary), ("user", "second question")])
    );
    let compacted = driver.state().compaction.clone().unwrap();
    assert_eq!((compacted.upto_turn, compacted.summary.as_str()), (1, "the gist of turn 1"));
}

#[tokio::test]
async fn a_failed_compaction_request_leaves_the_request_uncompacted() {
    let server = FakeServer::openai(vec![reply("one"), Reply::error(400, "context too long"), reply("two")]).await;
    let model = ChatModel::new(connect(server.endpoint(ProviderKind::OpenAi)).unwrap());
    let mut driver = driver(8);
    followup(&mut driver, &model, "A", "first question").await;
    followup(&mut driver, &model, "B", "second question").await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "turn 1, the failed compaction, turn 2");
    assert_eq!(
        messages(&requests[2].body),
        pairs(&[
            ("system", "Be brief."),
            ("user", "first question"),
            ("assistant", "one"),
            ("user", "second question")
        ])
    );
    assert_eq!(driver.state().compaction, None);
    assert_eq!(driver.state().last_turn, 2);
}
