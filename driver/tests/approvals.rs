//! SPEC §9 against the sans-IO driver: calls awaiting approval, `Decide`, failover and cancel while a
//! call waits, and context messages returned by tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, refused, render_reply, sent, written};
use turnstile_driver::{AgentCatalog, AgentProfile, ApprovalRules, ApprovalTimeout, Limits};
use turnstile_model::{CancelCause, Command, CommandReply, EventPayload, MessageSource, OnDeadline, Status};

/// The scripted agent, with `echo` gated by approval.
fn gated_echo() -> AgentCatalog {
    let approval = ApprovalRules::new(|tool| tool == "echo");
    AgentCatalog::new("scripted", [("scripted".to_owned(), AgentProfile { approval, ..AgentProfile::default() })])
        .unwrap()
}

fn decide(sim: &mut Sim, call_id: &str, approve: bool, reason: &str) -> support::Reply {
    sim.command(Command::Decide { call_id: call_id.into(), approve, reason: reason.into() })
}

/// A followup whose step calls `echo hi`, on a driver that gates echo: the call waits.
fn waiting_call() -> Sim {
    let mut sim = Sim::with_agents(Limits::default(), gated_echo());
    sent(sim.followup("A", "[[tool:echo hi]] go"));
    sim.expect(&[
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "D step/start 1.1",
        "D user/message A 1.1",
        "D assistant/message 1.1 \"echo: go\" calls[echo]",
        "D tool/call 1.1 echo awaiting-approval",
    ]);
    assert_eq!(sim.tool_requests.len(), 0, "a call awaiting approval must not run");
    assert!(sim.is_blocked_on_nothing());
    assert_eq!(sim.driver.state().status, Status::Running);
    sim
}

#[test]
fn an_approved_call_runs_and_the_turn_goes_on() {
    let mut sim = waiting_call();
    let seq = written(decide(&mut sim, "call-1-1-1", true, "looks fine"));
    sim.expect(&[
        "D tool/decision 1.1 call-1-1-1 approved looks fine",
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo: hi\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    // The reply names the last event the decision wrote before the tool ran (the decision itself).
    assert_eq!(sim.log[seq as usize - 1].event_type(), "tool/decision");
    assert_eq!(sim.tool_requests.len(), 1);
    assert_eq!(sim.tool_requests[0].agent, "scripted");
}

#[test]
fn a_denied_call_gets_an_error_result_the_model_sees() {
    let mut sim = waiting_call();
    written(decide(&mut sim, "call-1-1-1", false, "not today"));
    sim.expect(&[
        "D tool/decision 1.1 call-1-1-1 denied not today",
        "D tool/result 1.1 call-1-1-1 error",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo failed: denied: not today\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert!(sim.tool_requests.is_empty(), "a denied call never runs");
    let step2 = sim.model_requests.last().unwrap();
    assert_eq!(step2.tool_results[0].error.as_deref(), Some("denied: not today"));
}

#[test]
fn a_denial_without_a_reason_says_so() {
    let mut sim = waiting_call();
    written(decide(&mut sim, "call-1-1-1", false, " "));
    let result = sim.model_requests.last().unwrap().tool_results[0].error.clone();
    assert_eq!(result.as_deref(), Some("denied: no reason given"));
}

#[test]
fn deciding_twice_or_an_unknown_call_is_refused_and_writes_nothing() {
    let mut sim = waiting_call();
    let (kind, message) = refused(decide(&mut sim, "call-9-9-9", true, ""));
    assert_eq!(kind, "not-found", "{message}");
    assert!(message.contains("has no tool call call-9-9-9"), "{message}");
    sim.expect_nothing();

    written(decide(&mut sim, "call-1-1-1", true, ""));
    sim.take();
    let (kind, message) = refused(decide(&mut sim, "call-1-1-1", false, "changed my mind"));
    assert_eq!(kind, "failed-precondition", "{message}");
    assert!(message.contains("not awaiting approval"), "{message}");
    sim.expect_nothing();
}

#[test]
fn a_call_that_never_needed_approval_cannot_be_decided() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:echo hi]] go"));
    sim.take();
    let (kind, message) = refused(decide(&mut sim, "call-1-1-1", true, ""));
    assert_eq!(kind, "failed-precondition", "{message}");
}

#[test]
fn cancel_while_a_call_waits_ends_it_like_an_unstarted_call() {
    let mut sim = waiting_call();
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D tool/result 1.1 call-1-1-1 error",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    assert!(sim.tool_requests.is_empty());
    let error = sim.log.iter().rev().find_map(|e| match &e.payload {
        EventPayload::ToolResult { error, .. } => error.clone(),
        _ => None,
    });
    assert_eq!(error.as_deref(), Some("not run: the turn was aborted"));
    let (kind, _) = refused(decide(&mut sim, "call-1-1-1", true, ""));
    assert_eq!(kind, "failed-precondition");
}

/// An interrupt is one command: its cancel half ends a turn that only waited for a decision at once, but a
/// `when_idle` caller must not see the instant between that end and the interrupt's own turn (found by the
/// driver proptest once it gated calls).
#[test]
fn an_interrupt_while_a_call_waits_does_not_resolve_when_idle_before_its_turn() {
    let mut sim = waiting_call();
    let waiter = sim.when_idle();
    assert!(sim.reply(waiter).is_none());
    // The interrupt's own turn waits for its model, so the session is running when the command returns.
    let (_, turn) = sent(sim.interrupt("B", "[[delay:100]] hi"));
    assert_eq!(turn, Some(2), "the aborted turn ended at once, so the interrupt opened the next one");
    assert_eq!(sim.reply(waiter), None, "when_idle resolved in the middle of the interrupt: {:#?}", sim.lines());
    sim.settle();
    let last = sim.log.len() as u64;
    assert!(matches!(sim.reply(waiter), Some(Ok(CommandReply::Idle(s))) if s.last_seq == last), "{:#?}", sim.lines());
    let lines = sim.lines();
    let at = lines.iter().position(|l| *l == render_reply(waiter, sim.reply(waiter).unwrap())).unwrap();
    assert_eq!(lines[at - 1], "L status idle");
    assert_eq!(sim.assistant_text(2, 1).as_deref(), Some("echo: hi"));
}

/// The same for a steer deadline's `interrupt` (SPEC §11), which is an interrupt the driver makes itself.
#[test]
fn a_steer_deadline_interrupt_while_a_call_waits_does_not_resolve_when_idle_before_its_turn() {
    let mut sim = waiting_call();
    sent(sim.steer_with_deadline("S", "[[delay:100]] hurry", 50, OnDeadline::Interrupt));
    let waiter = sim.when_idle();
    sim.take();
    sim.fire_timers(sim.now + 50);
    assert_eq!(sim.driver.running_turn(), Some(2), "{:#?}", sim.lines());
    assert_eq!(sim.reply(waiter), None, "when_idle resolved in the middle of the interrupt: {:#?}", sim.lines());
    sim.settle();
    let last = sim.log.len() as u64;
    assert!(matches!(sim.reply(waiter), Some(Ok(CommandReply::Idle(s))) if s.last_seq == last), "{:#?}", sim.lines());
}

#[test]
fn calls_after_a_waiting_call_wait_for_it_and_an_abort_skips_them() {
    let mut sim = Sim::with_agents(Limits::default(), gated_echo());
    sent(sim.followup("A", "[[tool:sleep 5]] [[tool:echo hi]] [[tool:sleep 7]] go"));
    sim.take();
    assert_eq!(sim.held_tools(), 1);
    sim.finish_tools();
    sim.expect(&["D tool/result 1.1 call-1-1-1", "D tool/call 1.1 echo awaiting-approval"]);
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D tool/result 1.1 call-1-1-2 error",
        "D tool/call 1.1 sleep",
        "D tool/result 1.1 call-1-1-3 error",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn a_new_owner_waits_for_the_same_decision_and_the_approval_runs_the_tool() {
    let sim = waiting_call();
    assert!(sim.driver.is_parked(), "a session waiting for approval can be handed over");
    let log = sim.log.clone();
    let mut next = Sim::recover_with_agents(log.clone(), Limits::default(), gated_echo(), 2, 10_000);
    // Nothing ran, so nothing is interrupted: the turn is taken over in place.
    next.expect_nothing();
    assert_eq!(next.log.len(), log.len());
    assert_eq!(next.driver.running_turn(), Some(1));
    written(decide(&mut next, "call-1-1-1", true, "approved after failover"));
    next.expect(&[
        "D tool/decision 1.1 call-1-1-1 approved approved after failover",
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo: hi\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(next.tool_requests.len(), 1);
}

#[test]
fn an_owner_cut_after_an_approval_but_before_the_result_repairs_the_started_call() {
    let mut sim = waiting_call();
    // Approve a sleep so the call is still running when the owner dies.
    let mut gated_sleep = Sim::with_agents(
        Limits::default(),
        AgentCatalog::new(
            "scripted",
            [(
                "scripted".to_owned(),
                AgentProfile { approval: ApprovalRules::new(|t| t == "sleep"), ..AgentProfile::default() },
            )],
        )
        .unwrap(),
    );
    sent(gated_sleep.followup("A", "[[tool:sleep 50]] go"));
    gated_sleep.take();
    written(decide(&mut gated_sleep, "call-1-1-1", true, ""));
    assert_eq!(gated_sleep.held_tools(), 1);
    let next = Sim::recover(gated_sleep.log.clone(), Limits::default(), 2, 10_000);
    // The approved call had started: it is repaired like any call a crash cut (SPEC §6).
    let lines = next.render_all();
    assert_eq!(
        lines[..4],
        [
            "D tool/repaired 1.1 call-1-1-1 interrupted",
            "D tool/result 1.1 call-1-1-1 error",
            "D step/end 1.1",
            "D turn/end 1 interrupted"
        ]
    );
    // The first session is unaffected by the second.
    written(decide(&mut sim, "call-1-1-1", true, ""));
}

#[test]
fn context_from_a_tool_enters_the_next_step_with_source_tool() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:context the file has 3 lines|it was edited today]] go"));
    sim.expect(&[
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "D step/start 1.1",
        "D user/message A 1.1",
        "D assistant/message 1.1 \"echo: go\" calls[context]",
        "D tool/call 1.1 context",
        "D tool/result 1.1 call-1-1-1",
        "D spliced next-step 0 0 [call-1-1-1.ctx0,call-1-1-1.ctx1]",
        "L inserted call-1-1-1.ctx0",
        "L inserted call-1-1-1.ctx1",
        "D step/end 1.1",
        "D spliced next-step 0 2 []",
        "L claimed call-1-1-1.ctx0 1",
        "L claimed call-1-1-1.ctx1 1",
        "D step/start 1.2",
        "D user/message call-1-1-1.ctx0 1.2",
        "D user/message call-1-1-1.ctx1 1.2",
        "D assistant/message 1.2 \"echo: the file has 3 lines\\nit was edited today\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    let step2 = sim.model_requests.last().unwrap();
    assert_eq!(step2.tool_results.len(), 1, "the result comes first, then its context");
    assert_eq!(step2.messages.len(), 2);
    for m in &step2.messages {
        assert_eq!(m.source, MessageSource::Tool { call_id: "call-1-1-1".into() });
    }
}

#[test]
fn context_with_a_reused_id_is_dropped_and_the_turn_goes_on() {
    let mut sim = Sim::new();
    // The context message's id collides with the prompt's id, which was accepted before.
    sent(sim.followup("call-1-1-1.ctx0", "[[tool:context again]] go"));
    sim.settle();
    let lines = sim.lines();
    assert!(!lines.iter().any(|l| l.starts_with("D spliced next-step")), "{lines:#?}");
    assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:#?}");
}

/// The scripted agent, with `echo` gated by approval for at most `after_ms`, then decided by `approve`.
fn gated_echo_for(after_ms: u64, approve: bool) -> AgentCatalog {
    let profile = AgentProfile {
        approval: ApprovalRules::new(|tool| tool == "echo"),
        approval_timeout: Some(ApprovalTimeout { after_ms, approve }),
        ..AgentProfile::default()
    };
    AgentCatalog::new("scripted", [("scripted".to_owned(), profile)]).unwrap()
}

/// SPEC §21: past its agent's `approval_timeout_ms` a waiting call is decided by `on_timeout`, durably, as
/// a person's decision would be, marked `timed_out`; before it, nothing happens.
#[test]
fn a_call_waiting_past_its_approval_timeout_is_denied_by_it() {
    let mut sim = Sim::with_agents(Limits::default(), gated_echo_for(2_000, false));
    sent(sim.followup("A", "[[tool:echo hi]] go"));
    sim.take();
    let since = sim.log.last().unwrap().time_ms;
    assert_eq!(sim.driver.next_timer(), Some(since + 2_000), "the deadline is the call's time plus the timeout");
    sim.fire_timers(since + 1_999);
    sim.expect_nothing();
    sim.fire_timers(since + 2_000);
    sim.expect(&[
        "D tool/decision 1.1 call-1-1-1 denied timed-out no decision within approval_timeout_ms (2000 ms)",
        "D tool/result 1.1 call-1-1-1 error",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo failed: denied: no decision within approval_timeout_ms (2000 ms)\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert!(sim.tool_requests.is_empty(), "a denied call never runs");
    assert_eq!(sim.driver.next_timer(), None);
    let (kind, _) = refused(decide(&mut sim, "call-1-1-1", true, "too late"));
    assert_eq!(kind, "failed-precondition");
}

/// The deadline comes from the log: a new owner (after a kill -9) decides it once, at the same time,
/// and `on_timeout = approve` runs the call.
#[test]
fn a_new_owner_keeps_the_approval_deadline_and_approves_on_it() {
    let mut sim = Sim::with_agents(Limits::default(), gated_echo_for(5_000, true));
    sent(sim.followup("A", "[[tool:echo hi]] go"));
    sim.take();
    let since = sim.log.last().unwrap().time_ms;
    let log = sim.log.clone();
    let mut next = Sim::recover_with_agents(log.clone(), Limits::default(), gated_echo_for(5_000, true), 2, since + 10);
    next.expect_nothing();
    assert_eq!(next.driver.next_timer(), Some(since + 5_000));
    next.fire_timers(since + 60_000);
    next.expect(&[
        "D tool/decision 1.1 call-1-1-1 approved timed-out no decision within approval_timeout_ms (5000 ms)",
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo: hi\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(next.tool_requests.len(), 1, "approved by the timeout, the call ran once");
    next.fire_timers(since + 120_000);
    next.expect_nothing();
}
