//! Smoke tests of the driver's own plumbing; the SPEC scenarios live in `worker/tests/`.

use turnstile_journal::{Command, CommandReply, SessionRef, SessionState, Target, UserMessage};

use super::*;
use crate::config::Limits;

fn driver() -> Driver {
    let session = SessionRef::new("t", "s").unwrap();
    let mut d = Driver::new(SessionState::new(session, 100), Limits::default(), 1, "test");
    d.recover(1);
    d
}

#[test]
fn idle_followup_claims_before_replying() {
    let mut d = driver();
    let msg = UserMessage::user_text("A", "hello");
    d.on_command(1, Command::Send { message: msg, target: Target::NextTurn, wakeup: true, expected_turn: None }, 5);
    let effects = d.drain_effects();
    let kinds: Vec<String> = effects
        .iter()
        .map(|e| match e {
            Effect::Append(e) => format!("D {}", e.event_type()),
            Effect::Publish(l) => format!("L {}", l.event_type()),
            Effect::Reply { result, .. } => format!("R {result:?}"),
            Effect::PreStep(p) => format!("P {}", p.messages.len()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "D agent/inbox/spliced",
            "L agent/inbox/inserted",
            "D agent/status",
            "L agent/status",
            "D turn/start",
            "D agent/inbox/spliced",
            "L agent/inbox/claimed",
            "P 1",
            "R Ok(Sent { seq: 1, turn: Some(1) })",
        ]
    );
    let Some(Effect::PreStep(p)) = effects.iter().find(|e| matches!(e, Effect::PreStep(_))).cloned() else {
        panic!("no pre-step")
    };
    d.on_pre_step(p.op, PreStepOutcome::Decided(PreStepDecision::Enter(p.messages)), 6);
    let Some(Effect::Model(m)) = d.drain_effects().into_iter().find(|e| matches!(e, Effect::Model(_))) else {
        panic!("no model request")
    };
    d.on_model_delta(m.op, "echo: ", 7);
    d.on_model_delta(m.op, "hello", 7);
    let output = ModelOutput { text: "echo: hello".into(), tool_calls: vec![], max_tokens: false };
    d.on_model_done(m.op, ModelOutcome::Finished(output), 8);
    d.on_command(2, Command::WhenIdle, 9);
    let tail: Vec<&'static str> = d
        .drain_effects()
        .iter()
        .filter_map(|e| match e {
            Effect::Append(e) => Some(e.event_type()),
            Effect::Reply { result: Ok(CommandReply::Idle(_)), .. } => Some("idle"),
            _ => None,
        })
        .collect();
    assert_eq!(tail, ["assistant/message", "step/end", "turn/end", "agent/status", "idle"]);
    assert!(d.is_quiescent());
    assert!(d.state().open_turn.is_none());
    assert_eq!(d.state().last_seq, 10);
}
