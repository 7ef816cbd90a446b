//! SPEC §20 "Structured output": each model request carries the turn's schema (its own, else its agent's);
//! a final reply the runner found not to match is retried once with the problem shown to the model (a
//! durable next-step message), then the turn ends `error{invalid_output}`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::{ModelReply, Sim, sent};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits, ModelOutput, OUTPUT_PLUGIN};
use turnstile_model::output::{self, INVALID_OUTPUT, OutputSchema};
use turnstile_model::{EventPayload, MessageSource, TurnEndReason, UserMessage};

fn schema(name: &str) -> OutputSchema {
    OutputSchema::new(name, serde_json::json!({"type": "object", "required": ["city"]}))
}

fn agent_with_schema() -> Sim {
    let profile = AgentProfile { output: Some(schema("agent")), ..AgentProfile::default() };
    let agents = AgentCatalog::new("scripted", [("scripted".to_owned(), profile)]).unwrap();
    Sim::with_agents(Limits::default(), agents)
}

fn reply(text: &str, invalid: Option<&str>) -> ModelReply {
    ModelReply {
        deltas: vec![(false, text.to_owned())],
        output: ModelOutput { invalid_output: invalid.map(Into::into), ..ModelOutput::text(text) },
        delay: Duration::ZERO,
    }
}

fn last_turn_end(sim: &Sim) -> TurnEndReason {
    sim.log
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            EventPayload::TurnEnd { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_reply_that_does_not_match_is_retried_once_with_the_problem_then_the_turn_ends_invalid_output() {
    let mut sim = agent_with_schema();
    sim.model_replies.push_back(reply("Paris", Some("\"Paris\" is not of type \"object\"")));
    sim.model_replies.push_back(reply("still Paris", Some("\"still Paris\" is not of type \"object\"")));
    assert_eq!(sent(sim.followup("A", "where?")), (1, Some(1)));
    sim.settle();

    // Both requests carried the agent's schema; the second one shows the model what was wrong.
    assert_eq!(sim.model_requests.len(), 2, "one retry, no more");
    assert!(sim.model_requests.iter().all(|r| r.output == Some(schema("agent"))));
    let retry = &sim.model_requests[1].messages;
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].id.as_str(), "output-retry-1-1");
    assert_eq!(retry[0].source, MessageSource::Plugin { plugin: OUTPUT_PLUGIN.into(), form: Some("notice".into()) });
    assert!(retry[0].text().contains("is not of type \"object\""), "{}", retry[0].text());
    // The retry is durable: a user/message of step 2 of the same turn, and both replies are recorded.
    let entered: Vec<(String, u64, u32)> =
        sim.user_messages().into_iter().map(|(id, turn, step, _)| (id, turn, step)).collect();
    assert_eq!(entered, [("A".to_owned(), 1, 1), ("output-retry-1-1".to_owned(), 1, 2)]);
    assert_eq!(sim.assistant_text(1, 2).as_deref(), Some("still Paris"));
    match last_turn_end(&sim) {
        TurnEndReason::Error { code, message } => {
            assert_eq!(code, INVALID_OUTPUT);
            assert!(message.contains("still Paris"), "{message}");
        }
        other => panic!("expected error{{invalid_output}}, got {other:?}"),
    }
    sim.check_full_fold();
}

#[test]
fn a_retry_that_matches_completes_the_turn_and_the_next_turn_may_retry_again() {
    let mut sim = agent_with_schema();
    sim.model_replies.push_back(reply("Paris", Some("not an object")));
    sim.model_replies.push_back(reply("{\"city\":\"Paris\"}", None));
    sim.model_replies.push_back(reply("Lyon", Some("not an object")));
    sim.model_replies.push_back(reply("{\"city\":\"Lyon\"}", None));
    sent(sim.followup("A", "where?"));
    sim.settle();
    assert_eq!(last_turn_end(&sim), TurnEndReason::Completed);
    sent(sim.followup("B", "and now?"));
    sim.settle();
    assert_eq!(sim.model_requests.len(), 4, "each turn has its own retry");
    assert_eq!(last_turn_end(&sim), TurnEndReason::Completed);
    sim.check_full_fold();
}

#[test]
fn a_turns_own_schema_wins_and_a_turn_without_any_sends_none() {
    let mut sim = Sim::new();
    sim.model_replies.push_back(reply("x", None));
    sim.model_replies.push_back(reply("y", None));
    let mut message = UserMessage::user_text("A", "where?");
    message.push_block(output::block(&schema("turn")));
    sent(sim.send(message, turnstile_model::Target::NextTurn, true, None));
    sim.settle();
    sent(sim.followup("B", "plain"));
    sim.settle();
    assert_eq!(sim.model_requests[0].output, Some(schema("turn")));
    assert_eq!(sim.model_requests[1].output, None, "the schema was turn 1's alone");
    assert_eq!(last_turn_end(&sim), TurnEndReason::Completed);
}
