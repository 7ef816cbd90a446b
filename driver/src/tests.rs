//! Smoke tests of the driver's own plumbing; the SPEC scenarios live in `driver/tests/`.

use turnstile_model::{Command, CommandReply, SessionRef, SessionState, Target, UserMessage};

use super::*;
use crate::Limits;

fn driver() -> Driver {
    let session = SessionRef::new("t", "s").unwrap();
    let mut d =
        Driver::new(SessionState::new(session, 100), Limits::default(), crate::AgentCatalog::default(), 1, "test");
    d.recover(1);
    d
}

#[test]
fn idle_followup_claims_before_replying() {
    let mut d = driver();
    let msg = UserMessage::user_text("A", "hello");
    d.on_command(
        1,
        Command::Send { message: msg, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None },
        5,
    );
    let effects = d.ready();
    let kinds: Vec<String> = effects
        .iter()
        .map(|e| match e {
            Effect::Append(g) => {
                g.events().iter().map(|e| format!("D {}", e.event_type())).collect::<Vec<_>>().join(" + ")
            }
            Effect::Publish(l) => format!("L {}", l.event_type()),
            Effect::Reply { result, .. } => format!("R {result:?}"),
            Effect::PreStep(p) => format!("P {}", p.messages.len()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            // One group: the followup is answered after one journal round trip (decision 0021). Live
            // events keep their order and `after_seq`, published once the group is durable.
            "D agent/inbox/spliced + D agent/status + D turn/start + D agent/inbox/spliced",
            "L agent/inbox/inserted",
            "L agent/status",
            "L agent/inbox/claimed",
            "P 1",
            "R Ok(Sent { seq: 1, turn: Some(1) })",
        ]
    );
    let Some(Effect::PreStep(p)) = effects.iter().find(|e| matches!(e, Effect::PreStep(_))).cloned() else {
        panic!("no pre-step")
    };
    d.on_pre_step(p.op, PreStepOutcome::Decided(PreStepDecision::Enter(p.messages)), 6);
    let Some(Effect::Model(m)) = d.ready().into_iter().find(|e| matches!(e, Effect::Model(_))) else {
        panic!("no model request")
    };
    d.on_model_delta(m.op, "echo: ", false, 7);
    d.on_model_delta(m.op, "hello", false, 7);
    let output = ModelOutput::text("echo: hello");
    d.on_model_done(m.op, ModelOutcome::Finished(output), 8);
    d.on_command(2, Command::WhenIdle, 9);
    let tail: Vec<&'static str> = d
        .ready()
        .iter()
        .flat_map(|e| match e {
            Effect::Append(g) => g.events().iter().map(|e| e.event_type()).collect(),
            Effect::Reply { result: Ok(CommandReply::Idle(_)), .. } => vec!["idle"],
            _ => vec![],
        })
        .collect();
    assert_eq!(tail, ["assistant/message", "step/end", "turn/end", "agent/status", "idle"]);
    assert_eq!(d.state().last_seq, 10);
    assert!(d.is_quiescent());
    assert!(d.state().open_turn.is_none());
    assert_eq!(d.state().last_seq, 10);
}

/// The events one input writes are one group; an operation the driver starts (here the model request)
/// ends it: `step/start` + its `user/message` are one group, the step's end + `turn/end` + idle status
/// the next.
#[test]
fn a_step_start_and_its_user_messages_are_one_append_group() {
    let mut d = driver();
    let msg = UserMessage::user_text("A", "hello");
    d.on_command(
        1,
        Command::Send { message: msg, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None },
        5,
    );
    let Some(Effect::PreStep(p)) = d.ready().into_iter().find(|e| matches!(e, Effect::PreStep(_))) else {
        panic!("no pre-step")
    };
    d.on_pre_step(p.op, PreStepOutcome::Decided(PreStepDecision::Enter(p.messages)), 6);
    let groups = |effects: &[Effect]| -> Vec<(u64, Vec<&'static str>)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Append(g) => Some((g.expected_last_seq(), g.events().iter().map(|e| e.event_type()).collect())),
                _ => None,
            })
            .collect()
    };
    let effects = d.ready();
    assert_eq!(groups(&effects), [(4, vec!["step/start", "user/message"])]);
    let Some(Effect::Model(m)) = effects.into_iter().find(|e| matches!(e, Effect::Model(_))) else {
        panic!("no model request")
    };
    d.on_model_done(m.op, ModelOutcome::Finished(ModelOutput::text("hi")), 8);
    let effects = d.ready();
    assert_eq!(groups(&effects), [(6, vec!["assistant/message", "step/end", "turn/end", "agent/status"])]);
    // The live idle status still names the seq of its durable event.
    let after: Vec<u64> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(l) => Some(l.after_seq),
            _ => None,
        })
        .collect();
    assert_eq!(after, [10]);
}

/// A group never grows past [`MAX_GROUP_EVENTS`], except that a `user/message` stays with its
/// `step/start`.
#[test]
fn a_group_is_bounded_but_keeps_a_step_opening_whole() {
    let session = SessionRef::new("t", "s").unwrap();
    let event =
        |seq: u64, payload: EventPayload| Envelope { session: session.clone(), seq, time_ms: 1, epoch: 1, payload };
    let mut group = AppendGroup::new(event(1, EventPayload::Status(Status::Running)));
    assert!(!group.opens_step());
    group.push(event(2, EventPayload::StepStart { turn: 1, step: 1 }));
    assert!(group.opens_step(), "a step/start at the end opens a step");
    let message = UserMessage::user_text("A", "hello");
    group.push(event(3, EventPayload::UserMessage { message, turn: 1, step: 1 }));
    assert!(group.opens_step(), "and so do its user/messages after it");
    group.push(event(4, EventPayload::Status(Status::Idle)));
    assert!(!group.opens_step());
}
