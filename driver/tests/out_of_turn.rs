//! SPEC §11 `inject_mode = out-of-turn` (seed 004) against the sans-IO driver: an idle inject is one
//! `user/message {turn: 0, step: 0}` and nothing else, later model requests see it at its place, retries
//! are deduplicated, and an inject to a running session behaves as SPEC §4.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, refused, sent, written};
use turnstile_driver::Limits;
use turnstile_model::{Command, InjectMode, SessionState, Status, Target, TranscriptEntry};

fn out_of_turn() -> Sim {
    let mut sim = Sim::new();
    written(sim.command(Command::Configure {
        agent: "scripted".into(),
        inject_mode: InjectMode::OutOfTurn,
        version: None,
        overrides: Default::default(),
    }));
    sim.take();
    sim
}

fn ids(entries: &[std::sync::Arc<TranscriptEntry>]) -> Vec<String> {
    entries
        .iter()
        .map(|e| match e.as_ref() {
            TranscriptEntry::User { turn, step, message } => format!("user {} {turn}.{step}", message.id),
            TranscriptEntry::Assistant { turn, step, .. } => format!("assistant {turn}.{step}"),
            TranscriptEntry::ToolResult { turn, step, .. } => format!("tool {turn}.{step}"),
        })
        .collect()
}

#[test]
fn an_idle_inject_is_one_message_between_turns_and_nothing_else() {
    let mut sim = out_of_turn();
    let (seq, turn) = sent(sim.inject("I", "the build is green"));
    assert_eq!(turn, None);
    sim.expect(&["D user/message I 0.0"]);
    assert_eq!(sim.log[seq as usize - 1].event_type(), "user/message");
    assert_eq!(sim.driver.state().status, Status::Idle, "no status change");
    assert!(sim.driver.state().inbox.is_empty(), "nothing pending");
    assert!(sim.model_requests.is_empty(), "no model run");

    // A retry of the same delivery gets the same seq and writes nothing; the id cannot be reused.
    assert_eq!(sent(sim.inject("I", "the build is green")), (seq, None));
    sim.expect_nothing();
    let (kind, _) = refused(sim.inject("I", "other text"));
    assert_eq!(kind, "already-exists");
    let (kind, _) = refused(sim.followup("I", "the build is green"));
    assert_eq!(kind, "already-exists");
}

#[test]
fn later_model_requests_see_it_at_its_place_in_history() {
    let mut sim = out_of_turn();
    sent(sim.followup("A", "first"));
    sim.settle();
    sent(sim.inject("I", "between"));
    sent(sim.followup("B", "second"));
    sim.settle();
    let last = sim.model_requests.last().unwrap();
    assert_eq!(ids(&last.history), ["user A 1.1", "assistant 1.1", "user I 0.0"]);
    assert_eq!(last.messages.iter().map(|m| m.id.0.as_str()).collect::<Vec<_>>(), ["B"]);
    // A reader's fold of the log holds the same history.
    let fold = SessionState::fold(sim.session.clone(), Limits::default().dedup_horizon, &sim.log).unwrap();
    assert_eq!(fold.transcript, sim.driver.state().transcript);
}

#[test]
fn an_inject_to_a_running_session_waits_in_next_step_as_in_pending_mode() {
    let mut sim = out_of_turn();
    sent(sim.followup("A", "[[tool:sleep 100]] go"));
    sim.take();
    sent(sim.inject("I", "context"));
    sim.expect(&["D spliced next-step 0 0 [I]", "L inserted I"]);
    sim.finish_tools();
    let lines = sim.lines();
    assert!(lines.contains(&"D user/message I 1.2".to_owned()), "{lines:#?}");
}

#[test]
fn pending_mode_keeps_an_idle_inject_pending() {
    let mut sim = Sim::new();
    sent(sim.inject("I", "context"));
    sim.expect(&["D spliced next-step 0 0 [I]", "L inserted I"]);
    assert_eq!(sim.driver.state().inbox.list(Target::NextStep).len(), 1);
}

#[test]
fn a_new_owner_folds_messages_between_turns_and_runs_on() {
    let mut sim = out_of_turn();
    sent(sim.inject("I", "between"));
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, 5_000);
    next.expect_nothing();
    sent(next.followup("B", "go"));
    next.settle();
    let last = next.model_requests.last().unwrap();
    assert_eq!(ids(&last.history), ["user I 0.0"]);
}
