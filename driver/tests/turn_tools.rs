//! SPEC §19 against the sans-IO driver: client tools of a turn (declared by a message the turn entered)
//! wait for `CompleteToolCall`, survive a failover, refuse `Decide`, and end like unstarted calls on cancel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, refused, sent, written};
use turnstile_driver::Limits;
use turnstile_model::turn_tools::{self, TurnTool};
use turnstile_model::{CancelCause, Command, Status, Target, UserMessage};

/// A followup that declares the client tool `get_weather` and whose step calls it: the call waits.
fn waiting_call() -> Sim {
    let mut sim = Sim::new();
    let mut message = UserMessage::user_text("A", "[[tool:get_weather {\"city\":\"Paris\"}]] go");
    let tool = TurnTool { name: "get_weather".into(), description: String::new(), parameters: serde_json::json!({}) };
    message.push_block(turn_tools::block(&[tool]));
    sent(sim.send(message, Target::NextTurn, true, None));
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
        "D assistant/message 1.1 \"echo: go\" calls[get_weather]",
        "D tool/call 1.1 get_weather awaiting-client",
    ]);
    assert_eq!(sim.tool_requests.len(), 0, "nothing runs a client tool server-side");
    assert!(sim.driver.is_parked(), "a session waiting for its client can be handed over");
    assert_eq!(sim.driver.state().status, Status::Running);
    sim
}

fn complete(sim: &mut Sim, call_id: &str, output: &str) -> support::Reply {
    sim.command(Command::CompleteToolCall { call_id: call_id.into(), output: output.into(), error: None })
}

#[test]
fn the_clients_result_is_recorded_and_the_turn_goes_on() {
    let mut sim = waiting_call();
    written(complete(&mut sim, "call-1-1-1", "sunny"));
    sim.expect(&[
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: get_weather: sunny\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    let (kind, _) = refused(complete(&mut sim, "call-1-1-1", "again"));
    assert_eq!(kind, "failed-precondition");
    let (kind, _) = refused(complete(&mut sim, "call-9", "x"));
    assert_eq!(kind, "not-found");
}

#[test]
fn a_client_call_is_not_decided_and_an_approval_is_not_completed() {
    let mut sim = waiting_call();
    let reply = sim.command(Command::Decide { call_id: "call-1-1-1".into(), approve: true, reason: String::new() });
    assert_eq!(refused(reply).0, "failed-precondition");
    sim.expect_nothing();
    written(complete(&mut sim, "call-1-1-1", "ok"));
}

#[test]
fn a_new_owner_waits_for_the_same_result() {
    let sim = waiting_call();
    let log = sim.log.clone();
    let mut next = Sim::recover(log.clone(), Limits::default(), 2, 10_000);
    next.expect_nothing();
    assert_eq!(next.log.len(), log.len());
    assert_eq!(next.driver.running_turn(), Some(1));
    written(complete(&mut next, "call-1-1-1", "cloudy"));
    next.expect(&[
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: get_weather: cloudy\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn cancel_ends_a_waiting_client_call_like_an_unstarted_one() {
    let mut sim = waiting_call();
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D tool/result 1.1 call-1-1-1 error",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(refused(complete(&mut sim, "call-1-1-1", "late")).0, "failed-precondition");
}

#[test]
fn a_turn_resumed_after_a_failover_mid_step_keeps_the_client_tools_of_the_turn_it_repairs() {
    let sim = waiting_call();
    // The owner died right after the step entered its message: no reply, no call yet.
    let entered = sim.log.iter().position(|e| e.event_type() == "user/message").unwrap();
    let log = sim.log[..=entered].to_vec();
    let mut next = Sim::recover(log, Limits::default(), 2, 10_000);
    next.expect(&[
        "D step/end 1.1",
        "D turn/end 1 interrupted",
        "D turn/start 2",
        "D step/start 2.1",
        "D assistant/message 2.1 \"echo: go\" calls[get_weather]",
        "D tool/call 2.1 get_weather awaiting-client",
    ]);
    assert_eq!(next.tool_requests.len(), 0, "the resumed turn's call of the declared tool waits for its client");
    written(complete(&mut next, "call-2-1-1", "rain"));
}
