//! SPEC §13 against the sans-IO driver: compaction (automatic and `Compact`) and `session/forked`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, refused, written};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits};
use turnstile_model::{CancelCause, Command, Fork, SessionRef, TranscriptEntry};

/// The scripted agent with a context budget of `budget` estimated tokens.
fn budgeted(budget: u64) -> AgentCatalog {
    AgentCatalog::new(
        "scripted",
        [("scripted".to_owned(), AgentProfile { context_budget_tokens: Some(budget), ..AgentProfile::default() })],
    )
    .unwrap()
}

fn turns_of<E: std::borrow::Borrow<TranscriptEntry>>(history: &[E]) -> Vec<u64> {
    let mut turns: Vec<u64> = history.iter().map(|e| e.borrow().turn()).collect();
    turns.dedup();
    turns
}

fn compact(sim: &mut Sim) -> support::Reply {
    let id = sim.submit(Command::Compact);
    sim.reply(id).cloned().expect("Compact answers once its summary is back")
}

#[test]
fn compact_while_idle_summarizes_every_finished_turn_and_later_requests_carry_the_summary() {
    let mut sim = Sim::new();
    sim.followup("A", "first").unwrap();
    sim.followup("B", "second").unwrap();
    sim.take();
    let seq = written(compact(&mut sim));
    assert_eq!(seq, sim.log.len() as u64);
    sim.expect(&[r#"D context/compacted 2 "summary of turns 1..2" 2"#]);
    sim.followup("C", "third").unwrap();
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.summary.as_deref(), Some("summary of turns 1..2"));
    assert!(request.history.is_empty(), "the summarized turns are not sent again: {:?}", request.history);
    assert_eq!(request.messages[0].id.0, "C");
    // The log keeps every event: both summarized turns are still there.
    assert_eq!(sim.user_messages().len(), 3);
    sim.check_full_fold();
}

#[test]
fn compact_with_nothing_to_summarize_writes_nothing() {
    let mut sim = Sim::new();
    // A session never written does not exist: NOT_FOUND, as for every other call that needs one.
    let (kind, message) = refused(compact(&mut sim));
    assert_eq!(kind, "not-found");
    assert!(message.ends_with("does not exist: it has no accepted writes yet"), "{message}");
    sim.expect_nothing();
    sim.followup("A", "first").unwrap();
    written(compact(&mut sim));
    sim.take();
    let last = sim.log.len() as u64;
    assert_eq!(written(compact(&mut sim)), last, "turn 1 is already summarized");
    sim.expect_nothing();
}

#[test]
fn compact_while_running_is_a_precondition_error_naming_the_turn() {
    let mut sim = Sim::new();
    sim.followup("A", "[[delay:100]] slow").unwrap();
    let (kind, message) = refused(sim.command(Command::Compact));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("running turn 1"), "{message}");
    sim.settle();
}

#[test]
fn a_step_over_the_budget_compacts_the_earlier_turns_before_step_start() {
    // Turn 2 fits (13 estimated tokens); turn 3 (28) does not.
    let mut sim = Sim::with_agents(Limits::default(), budgeted(25));
    sim.followup("A", "first question").unwrap();
    sim.followup("B", "second question").unwrap();
    assert_eq!(sim.driver.state().compaction, None);
    let from = sim.recs.len();
    sim.followup("C", "the third question, long enough to matter").unwrap();
    let lines: Vec<String> = sim.render_all()[from..].to_vec();
    let at = |needle: &str| {
        lines.iter().position(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle}: {lines:#?}"))
    };
    assert!(at("X pre-step 3.1") < at("X compact 1..2"));
    assert!(at("X compact 1..2") < at("D context/compacted 2"));
    assert!(at("D context/compacted 2") < at("D step/start 3.1"));
    assert!(lines.contains(&r#"D context/compacted 2 "summary of turns 1..2" 2"#.to_owned()), "{lines:#?}");
    let request = sim.model_requests.last().unwrap();
    assert!(request.compaction.is_none());
    assert_eq!(request.summary.as_deref(), Some("summary of turns 1..2"));
    assert!(request.history.is_empty());
    sim.check_full_fold();
}

#[test]
fn the_current_turn_is_never_summarized_and_a_second_compaction_folds_the_first_in() {
    let mut sim = Sim::with_agents(Limits::default(), budgeted(4));
    sim.followup("A", "first question here").unwrap();
    // Turn 1 alone is the only earlier turn: summarized before turn 2's step.
    sim.followup("B", "second question here").unwrap();
    assert_eq!(sim.driver.state().compaction.as_ref().map(|c| c.upto_turn), Some(1));
    sim.followup("C", "[[tool:echo a long tool argument]] third").unwrap();
    let compactions: Vec<_> = sim.model_requests.iter().filter_map(|r| r.compaction).collect();
    assert_eq!(compactions.len(), 2, "one per turn at most, even with a tool step");
    let last = sim.driver.state().compaction.clone().unwrap();
    assert_eq!((last.from_turn, last.upto_turn, last.summarized_turns), (1, 2, 1));
    assert_eq!(last.summary, "summary of turns 1..2");
    // The compaction request of turn 3 carried the earlier summary and turn 2 only.
    let request = sim.model_requests.iter().rfind(|r| r.compaction.is_some()).unwrap();
    assert_eq!(request.summary.as_deref(), Some("summary of turns 1..1"));
    assert_eq!(turns_of(&request.history), vec![2]);
    // Turn 3's second step (after the tool) keeps turn 3 whole.
    let step2 = sim.model_requests.last().unwrap();
    assert_eq!((step2.turn, step2.step), (3, 2));
    assert_eq!(turns_of(&step2.history), vec![3]);
    sim.check_full_fold();
}

#[test]
fn a_failed_compaction_changes_nothing_and_the_step_goes_on() {
    let mut sim = Sim::with_agents(Limits::default(), budgeted(2));
    sim.followup("A", "[[compact-fail]] first question").unwrap();
    let from = sim.recs.len();
    sim.followup("B", "second").unwrap();
    let lines: Vec<String> = sim.render_all()[from..].to_vec();
    assert!(lines.iter().any(|l| l == "X compact 1..1"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.starts_with("D context/compacted")), "{lines:#?}");
    assert!(lines.iter().any(|l| l == "D turn/end 2 completed"), "{lines:#?}");
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.summary, None);
    assert_eq!(turns_of(&request.history), vec![1], "the request is uncompacted");
    // `Compact` reports the failure and writes nothing.
    let before = sim.log.len();
    let (kind, message) = refused(compact(&mut sim));
    assert_eq!(kind, "unavailable");
    assert!(message.contains("nothing was written"), "{message}");
    assert_eq!(sim.log.len(), before);
    assert_eq!(sim.driver.state().compaction, None);
}

#[test]
fn cancel_during_a_compaction_ends_the_turn_aborted_with_no_step() {
    let mut sim = Sim::with_agents(Limits::default(), budgeted(2));
    sim.followup("A", "first question").unwrap();
    // Hold the next model request (the compaction) so the cancel lands while it runs.
    let plan = turnstile_agent::scripted::ScriptedPlan {
        deltas: vec!["summary".into()],
        output: turnstile_driver::ModelOutput::text("summary"),
        delay: std::time::Duration::from_millis(50),
        fail: None,
    };
    sim.model_replies.push_back(support::ModelReply::scripted(plan));
    sim.followup("B", "second").unwrap();
    sim.take();
    sim.cancel(CancelCause::User, false).unwrap();
    sim.settle();
    let lines = sim.take();
    assert!(lines.iter().any(|l| l == "D turn/end 2 aborted{user}"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.starts_with("D step/start 2") || l.starts_with("D context/compacted")));
}

#[test]
fn a_new_owner_keeps_the_compaction() {
    let mut sim = Sim::new();
    sim.followup("A", "first").unwrap();
    written(compact(&mut sim));
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, sim.now);
    next.followup("B", "second").unwrap();
    let request = next.model_requests.last().unwrap();
    assert_eq!(request.summary.as_deref(), Some("summary of turns 1..1"));
    assert!(request.history.is_empty());
}

fn fork_of(source: &Sim, at_turn: u64) -> Fork {
    let state = source.driver.state();
    Fork {
        from: SessionRef::new("tenant", "source").unwrap(),
        at_turn,
        at_seq: state.last_seq,
        agent: None,
        compacted: state.compaction.clone(),
        transcript: state.transcript.entries().filter(|e| e.turn() <= at_turn).cloned().collect(),
    }
}

#[test]
fn a_fork_starts_with_the_copied_transcript_and_numbers_its_turns_after_it() {
    let mut source = Sim::new();
    source.followup("A", "first").unwrap();
    source.followup("B", "[[tool:echo hi]] second").unwrap();
    let fork = fork_of(&source, 2);
    let copied = fork.transcript.len();
    let mut sim = Sim::new();
    assert_eq!(written(sim.command(Command::Fork(Box::new(fork)))), 1);
    sim.expect(&[&format!("D session/forked tenant/source 2 {} {copied}", source.log.len())]);
    assert_eq!(sim.pending_ids(), (vec![], vec![]), "the fork's inbox starts empty");
    sim.followup("C", "third").unwrap();
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.turn, 3, "the fork's first turn follows at_turn");
    assert!(request.history.iter().map(AsRef::as_ref).eq(source.driver.state().transcript.entries()));
    sim.check_full_fold();
}

#[test]
fn a_fork_onto_a_session_with_events_is_already_exists_and_writes_nothing() {
    let mut source = Sim::new();
    source.followup("A", "first").unwrap();
    let mut sim = Sim::new();
    sim.followup("X", "mine").unwrap();
    let (kind, message) = refused(sim.command(Command::Fork(Box::new(fork_of(&source, 1)))));
    assert_eq!(kind, "already-exists");
    assert!(message.contains("already has events"), "{message}");
}

#[test]
fn a_fork_keeps_the_sources_compaction() {
    let mut source = Sim::new();
    source.followup("A", "first").unwrap();
    source.followup("B", "second").unwrap();
    written(compact(&mut source));
    source.followup("C", "third").unwrap();
    let fork = fork_of(&source, 3);
    assert_eq!(turns_of(&fork.transcript), vec![3]);
    let mut sim = Sim::new();
    written(sim.command(Command::Fork(Box::new(fork))));
    sim.followup("D", "fourth").unwrap();
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.summary.as_deref(), Some("summary of turns 1..2"));
    assert_eq!(turns_of(&request.history), vec![3]);
}
