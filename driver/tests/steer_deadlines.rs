//! SPEC §11 steer deadlines against the sans-IO driver: time is an input ([`Driver::on_timer`]), the
//! deadline is recorded in the steer's splice, `interrupt` and `drop` act only on a steer still pending,
//! and a new owner re-arms them from the log (one that passed during the failover fires at once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, sent};
use turnstile_driver::{AgentCatalog, Driver, Limits};
use turnstile_model::{EventPayload, MessageId, OnDeadline, SessionState, SteerDeadline};

/// Turn 1 runs a 1 s tool call; at t=0 a steer S with a 100 ms deadline arrives.
fn steer_during_a_tool_call(on_deadline: OnDeadline) -> Sim {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 1000]] go"));
    sim.take();
    sent(sim.steer_with_deadline("S", "hurry", 100, on_deadline));
    sim.expect(&["D spliced next-step 0 0 [S] wake", "L inserted S"]);
    let recorded = sim.log.last().map(|e| match &e.payload {
        EventPayload::InboxSpliced(s) => s.deadline,
        _ => None,
    });
    assert_eq!(recorded, Some(Some(SteerDeadline { at_ms: 100, on_deadline })), "the splice records the deadline");
    assert_eq!(sim.driver.next_timer(), Some(100));
    sim
}

#[test]
fn nothing_happens_before_the_deadline() {
    let mut sim = steer_during_a_tool_call(OnDeadline::Interrupt);
    sim.fire_timers(99);
    sim.expect_nothing();
    assert_eq!(sim.driver.next_timer(), Some(100));
}

#[test]
fn interrupt_cancels_the_turn_and_runs_the_steer_next() {
    let mut sim = steer_during_a_tool_call(OnDeadline::Interrupt);
    sim.fire_timers(100);
    sim.settle();
    // As `interrupt(S)` (SPEC §7 24): the turn ends aborted, then S runs as the next turn.
    sim.expect(&[
        "D spliced next-step 0 1 [] canceled",
        "L discarded S",
        "D spliced next-turn 0 0 [S] wake",
        "L inserted S",
        "D tool/result 1.1 call-1-1-1 error",
        "D step/end 1.1",
        "D turn/end 1 aborted{steer-deadline}",
        "D status idle",
        "L status idle",
        "D status running",
        "L status running",
        "D turn/start 2",
        "D spliced next-turn 0 1 []",
        "L claimed S 2",
        "D step/start 2.1",
        "D user/message S 2.1",
        "D assistant/message 2.1 \"echo: hurry\"",
        "D step/end 2.1",
        "D turn/end 2 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(sim.driver.next_timer(), None);
}

#[test]
fn drop_removes_the_steer_and_the_turn_goes_on() {
    let mut sim = steer_during_a_tool_call(OnDeadline::Drop);
    sim.fire_timers(150);
    sim.expect(&["D spliced next-step 0 1 [] canceled", "L discarded S"]);
    assert_eq!(sim.driver.next_timer(), None);
    sim.settle();
    let lines = sim.lines();
    assert!(!lines.iter().any(|l| l.starts_with("D user/message S")), "a dropped steer never enters: {lines:#?}");
    assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:#?}");
}

#[test]
fn a_steer_claimed_in_time_has_no_deadline_left() {
    let mut sim = steer_during_a_tool_call(OnDeadline::Interrupt);
    sim.advance(1000); // the tool finishes; the next proposal claims S
    let lines = sim.lines();
    assert!(lines.contains(&"D user/message S 1.2".to_owned()), "{lines:#?}");
    assert_eq!(sim.driver.next_timer(), None);
    sim.fire_timers(5000);
    sim.settle();
    assert!(!sim.lines().iter().any(|l| l.contains("steer-deadline")));
}

#[test]
fn a_new_owner_re_arms_a_deadline_from_the_log() {
    let sim = steer_during_a_tool_call(OnDeadline::Drop);
    // What a new owner loads: the fold of the log holds the pending steer's deadline, so its driver's
    // timer is armed before it does anything.
    let state = SessionState::fold(sim.session.clone(), Limits::default().dedup_horizon, &sim.log).unwrap();
    assert_eq!(
        state.steer_deadlines.get(&MessageId("S".into())),
        Some(&SteerDeadline { at_ms: 100, on_deadline: OnDeadline::Drop })
    );
    let driver = Driver::new(state, Limits::default(), AgentCatalog::default(), 2, "node-2");
    assert_eq!(driver.next_timer(), Some(100));
    // Loaded before the deadline, the resumed turn claims S at its first proposal: nothing is left to fire.
    let next = Sim::recover(sim.log.clone(), Limits::default(), 2, 60);
    assert_eq!(next.driver.next_timer(), None);
    assert!(next.lines().contains(&"D user/message S 2.1".to_owned()), "{:#?}", next.lines());
}

#[test]
fn a_deadline_that_passed_during_failover_fires_at_once() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 1000]] go"));
    sent(sim.steer_with_deadline("S", "hurry", 100, OnDeadline::Drop));
    // The new owner loads the log long after the deadline: the steer is dropped before the turn resumes.
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, 10_000);
    let lines = next.render_all();
    assert_eq!(lines[..2], ["D spliced next-step 0 1 [] canceled", "L discarded S"], "{lines:#?}");
    next.settle();
    assert!(!next.lines().iter().any(|l| l.starts_with("D user/message S")));
}

/// A steer parked by an aborted turn keeps its deadline; when an `interrupt` deadline passes while no
/// owner runs the idle session, the new owner moves the steer and runs it as the next turn. Before the fix
/// the timer opened that turn inside recovery and the repair that followed took it for a crashed one and
/// ended it `interrupted` (found by the driver proptest with crashes).
#[test]
fn an_interrupt_deadline_that_passed_while_idle_runs_the_steer_after_failover() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[delay:100]] go"));
    sent(sim.steer_with_deadline("S", "hurry", 500, OnDeadline::Interrupt));
    sim.cancel(turnstile_model::CancelCause::User, true).unwrap();
    sim.settle();
    assert!(sim.driver.is_quiescent());
    assert_eq!(sim.pending_ids(), (vec![], vec!["S".to_owned()]), "the steer parks with its deadline");
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, 10_000);
    next.expect(&[
        "D spliced next-step 0 1 [] canceled",
        "L discarded S",
        "D spliced next-turn 0 0 [S] wake",
        "L inserted S",
        "D status running",
        "L status running",
        "D turn/start 2",
        "D spliced next-turn 0 1 []",
        "L claimed S 2",
        "D step/start 2.1",
        "D user/message S 2.1",
        "D assistant/message 2.1 \"echo: hurry\"",
        "D step/end 2.1",
        "D turn/end 2 completed",
        "D status idle",
        "L status idle",
    ]);
}
