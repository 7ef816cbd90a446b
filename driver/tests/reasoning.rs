//! SPEC §8 "Streaming": reasoning deltas are live `assistant/delta`s marked reasoning, kept apart from the
//! text on `assistant/message`, which also records the provider's token usage; an abort keeps what was
//! delivered of both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::{ModelReply, Sim, sent, written};
use turnstile_driver::ModelOutput;
use turnstile_model::{CancelCause, EventPayload, Usage};

const OPENING: [&str; 9] = [
    "D spliced next-turn 0 0 [A] wake",
    "L inserted A",
    "D status running",
    "L status running",
    "D turn/start 1",
    "D spliced next-turn 0 1 []",
    "L claimed A 1",
    "D step/start 1.1",
    "D user/message A 1.1",
];

fn reply(deltas: &[(bool, &str)], output: ModelOutput, delay_ms: u64) -> ModelReply {
    ModelReply {
        deltas: deltas.iter().map(|(r, t)| (*r, (*t).to_owned())).collect(),
        output,
        delay: Duration::from_millis(delay_ms),
    }
}

#[test]
fn reasoning_and_usage_land_on_the_assistant_message_and_deltas_stay_apart() {
    let mut sim = Sim::new();
    sim.model_replies.push_back(reply(
        &[(true, "The user "), (false, "It is "), (true, "wants the time."), (false, "noon.")],
        ModelOutput {
            reasoning: Some("The user wants the time.".into()),
            usage: Some(Usage { input_tokens: 120, output_tokens: 9, ..Default::default() }),
            ..ModelOutput::text("It is noon.")
        },
        0,
    ));
    assert_eq!(sent(sim.followup("A", "time?")), (1, Some(1)));
    let mut expected = OPENING.to_vec();
    expected.extend([
        "L reasoning 1.1 The user ",
        "L delta 1.1 It is ",
        "L reasoning 1.1 wants the time.",
        "L delta 1.1 noon.",
        "D assistant/message 1.1 \"It is noon.\" reasoning:\"The user wants the time.\" usage:120/9",
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    sim.expect_with_deltas(&expected);
    assert_eq!(sim.delta_text(1, 1), "It is noon.");
    assert_eq!(sim.delta_reasoning(1, 1), "The user wants the time.");
    // Every live delta follows the user/message it answers.
    assert!(sim.live.iter().filter(|e| e.event_type() == "assistant/delta").all(|e| e.after_seq == 6));
    // The durable event survives the wire format whole.
    for event in &sim.log {
        assert_eq!(&support::wire_round_trip(event), event);
    }
    sim.check_full_fold();

    // The next turn's request carries the reply's text in its history, never its reasoning.
    sent(sim.followup("B", "thanks"));
    let history = &sim.model_requests[1].history;
    assert!(history.iter().any(
        |e| matches!(e.as_ref(), turnstile_model::TranscriptEntry::Assistant { text, .. } if text == "It is noon.")
    ));
    assert!(!format!("{history:?}").contains("wants the time"));
}

#[test]
fn a_reply_without_reasoning_or_usage_records_neither() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "hello"));
    let message = sim.log.iter().find(|e| e.event_type() == "assistant/message").unwrap();
    assert!(
        matches!(&message.payload, EventPayload::AssistantMessage { reasoning: None, usage: None, .. }),
        "{message:?}"
    );
    assert!(
        sim.live
            .iter()
            .all(|e| !matches!(e.payload, turnstile_model::LivePayload::AssistantDelta { reasoning: true, .. }))
    );
}

#[test]
fn cancel_mid_reasoning_keeps_the_delivered_reasoning_without_usage() {
    let mut sim = Sim::new();
    sim.model_replies.push_back(reply(
        &[(true, "Let me "), (true, "think "), (true, "hard."), (false, "Done.")],
        ModelOutput {
            reasoning: Some("Let me think hard.".into()),
            usage: Some(Usage { input_tokens: 5, output_tokens: 5, ..Default::default() }),
            ..ModelOutput::text("Done.")
        },
        1000,
    ));
    sent(sim.followup("A", "think"));
    assert!(sim.stream_one_delta() && sim.stream_one_delta());
    let mut expected = OPENING.to_vec();
    expected.extend(["L reasoning 1.1 Let me ", "L reasoning 1.1 think "]);
    sim.expect_with_deltas(&expected);
    assert_eq!(written(sim.cancel(CancelCause::User, false)), 6);
    sim.expect_with_deltas(&[
        "D assistant/message 1.1 \"\" reasoning:\"Let me think \" interrupted",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    sim.check_full_fold();
}

#[test]
fn cancel_after_reasoning_and_text_keeps_both_prefixes() {
    let mut sim = Sim::new();
    sim.model_replies.push_back(reply(
        &[(true, "Plan: greet."), (false, "Hel"), (false, "lo!")],
        ModelOutput { reasoning: Some("Plan: greet.".into()), ..ModelOutput::text("Hello!") },
        1000,
    ));
    sent(sim.followup("A", "hi"));
    assert!(sim.stream_one_delta() && sim.stream_one_delta());
    sim.take_with_deltas();
    written(sim.cancel(CancelCause::User, false));
    // Deltas that arrive after the abort are not delivered and not recorded.
    assert!(!sim.stream_one_delta(), "the aborted request is gone");
    sim.expect_with_deltas(&[
        "D assistant/message 1.1 \"Hel\" reasoning:\"Plan: greet.\" interrupted",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn usage_is_recorded_on_a_tool_calling_reply_and_each_step_has_its_own() {
    let mut sim = Sim::new();
    // Step 1: the scripted reply calls echo; step 2 (after the result) is scripted too. Give both usage.
    let first = turnstile_agent::scripted::plan(&turnstile_driver::ModelRequest {
        agent_hash: String::new(),
        overrides: Default::default(),
        op: 0,
        session: turnstile_model::SessionRef { tenant: "default".into(), id: "s".into() },
        turn: 1,
        step: 1,
        agent: "scripted".into(),
        system: None,
        history: vec![],
        messages: vec![support::msg("A", "[[tool:echo hi]]")],
        tool_results: vec![],
        interrupted_prompt: vec![],
        goal: None,
        summary: None,
        output: None,
        compaction: None,
    });
    let mut first = ModelReply::scripted(first);
    first.output.usage = Some(Usage { input_tokens: 10, output_tokens: 3, ..Default::default() });
    sim.model_replies.push_back(first);
    sim.model_replies.push_back(reply(
        &[(false, "hi back")],
        ModelOutput {
            usage: Some(Usage { input_tokens: 20, output_tokens: 2, ..Default::default() }),
            ..ModelOutput::text("hi back")
        },
        0,
    ));
    sent(sim.followup("A", "[[tool:echo hi]]"));
    let usages: Vec<(u32, Option<Usage>)> = sim
        .log
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::AssistantMessage { step, usage, .. } => Some((*step, *usage)),
            _ => None,
        })
        .collect();
    assert_eq!(
        usages,
        [
            (1, Some(Usage { input_tokens: 10, output_tokens: 3, ..Default::default() })),
            (2, Some(Usage { input_tokens: 20, output_tokens: 2, ..Default::default() }))
        ]
    );
}
