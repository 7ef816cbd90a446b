//! SPEC §10 goals against the sans-IO driver: continuation rounds on an idle, empty session, human
//! input first, pausing on blocked/error/aborted turns, the round budget, `goal_complete` run by the
//! driver itself, revisions, and a new owner that continues from the fold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, goal, refused, sent, written};
use turnstile_driver::{Limits, PreStepDecision, PreStepOutcome, PreStepRequest};
use turnstile_model::{CancelCause, EventPayload, GoalAction, GoalState, MessageSource};

const RUNNING: [&str; 2] = ["D status running", "L status running"];
const IDLE: [&str; 2] = ["D status idle", "L status idle"];

/// Delivery of continuation `id` (or any waking next-turn message) to an idle session, through the claim
/// of turn `turn`.
fn opens(turn: u64, id: &str) -> Vec<String> {
    let mut out = vec![format!("D spliced next-turn 0 0 [{id}] wake"), format!("L inserted {id}")];
    out.extend(RUNNING.iter().map(|s| s.to_string()));
    out.extend(claims(turn, id));
    out
}

/// `turn/start` and the claim of the head of next-turn.
fn claims(turn: u64, id: &str) -> Vec<String> {
    vec![format!("D turn/start {turn}"), "D spliced next-turn 0 1 []".into(), format!("L claimed {id} {turn}")]
}

/// The one step of turn `turn` entering `id`, answered with `echo: <text>`, and the turn's end.
fn echo_step(turn: u64, id: &str, text: &str) -> Vec<String> {
    vec![
        format!("D step/start {turn}.1"),
        format!("D user/message {id} {turn}.1"),
        format!("D assistant/message {turn}.1 {:?}", format!("echo: {text}")),
        format!("D step/end {turn}.1"),
        format!("D turn/end {turn} completed"),
    ]
}

fn idle() -> Vec<String> {
    IDLE.iter().map(|s| s.to_string()).collect()
}

/// A whole continuation turn: delivered on idle, one echo step, back to idle.
fn round(turn: u64, id: &str, round: u64, max: u32, objective: &str) -> Vec<String> {
    let text = format!("Continue working toward the goal (round {round} of {max}): {objective}");
    [opens(turn, id), echo_step(turn, id, &text), idle()].concat()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn goal_state(sim: &Sim) -> (GoalState, u64, u64) {
    let g = &sim.driver.state().goals.current.as_ref().expect("the session has a goal").info;
    (g.state, g.revision, g.round)
}

/// Goal-sourced `user/message`s: (revision, round) in log order.
fn admitted_rounds(sim: &Sim) -> Vec<(u64, u64)> {
    sim.user_messages()
        .into_iter()
        .filter_map(|(_, _, _, m)| match m.source {
            MessageSource::Goal { revision, round, .. } => Some((revision, round)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_goal_set_on_an_idle_session_runs_rounds_until_goal_complete() {
    let mut sim = Sim::new();
    let objective = "ship it [[complete-goal-at:3]]";
    // The reply is the goal as the command left it: revision 1, active, no round admitted yet.
    let (seq, set) = goal(sim.set_goal("g1", objective, 5));
    assert_eq!(
        (set.goal_id.as_str(), set.revision, set.state, set.round, set.max_rounds),
        ("g1", 1, GoalState::Active, 0, 5)
    );
    assert!(seq >= 1, "the reply names the goal/change at seq 1 or a later event of the same command: {seq}");
    let step3 = "echo: Continue working toward the goal (round 3 of 5): ship it";
    let expected = [
        vec!["D goal/change g1.1 active 0/5".to_string()],
        round(1, "goal-g1-1-1", 1, 5, "ship it"),
        round(2, "goal-g1-1-2", 2, 5, "ship it"),
        opens(3, "goal-g1-1-3"),
        vec![
            "D step/start 3.1".into(),
            "D user/message goal-g1-1-3 3.1".into(),
            format!("D assistant/message 3.1 {step3:?} calls[goal_complete]"),
            // The driver runs goal_complete itself: no tool request reaches the runner.
            "D tool/call 3.1 goal_complete".into(),
            "D tool/result 3.1 call-3-1-1".into(),
            "D goal/change g1.1 completed 3/5 summary:\"done in round 3\"".into(),
            // The call concludes the turn: no step answers it, and no round follows.
            "D step/end 3.1".into(),
            "D turn/end 3 completed".into(),
        ],
        idle(),
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert!(sim.tool_requests.is_empty(), "goal_complete never reaches the runner");
    assert_eq!(goal_state(&sim), (GoalState::Completed, 1, 3));
    // The tool is offered in every step while the goal is active, with the round admitted so far.
    let offered: Vec<Option<u64>> = sim.model_requests.iter().map(|r| r.goal.as_ref().map(|g| g.round)).collect();
    assert_eq!(offered, vec![Some(1), Some(2), Some(3)]);
    // The continuation names its goal, revision and round.
    let (_, _, _, first) = &sim.user_messages()[0];
    assert_eq!(first.source, MessageSource::Goal { goal_id: "g1".into(), revision: 1, round: 1 });
    let id = sim.when_idle();
    assert!(sim.reply(id).is_some(), "a completed goal leaves the session quiescent");
    sim.check_full_fold();
    for e in &sim.log {
        assert_eq!(&support::wire_round_trip(e), e, "event {} survives the wire", e.seq);
    }
    // A later turn is not offered the tool any more.
    sent(sim.followup("A", "thanks"));
    assert_eq!(sim.model_requests.last().unwrap().goal, None);
}

#[test]
fn reaching_max_rounds_without_goal_complete_is_budget_limited() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "ship it", 2));
    let expected = [
        vec!["D goal/change g1.1 active 0/2".to_string()],
        round(1, "goal-g1-1-1", 1, 2, "ship it"),
        round(2, "goal-g1-1-2", 2, 2, "ship it"),
        vec!["D goal/change g1.1 budget-limited 2/2 reason:\"2 rounds admitted without goal_complete\"".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert_eq!(goal_state(&sim), (GoalState::BudgetLimited, 1, 2));
    // Nothing more happens on its own; human input still runs, and no round follows it.
    sent(sim.followup("A", "hi"));
    sim.expect(&strs(&[opens(3, "A"), echo_step(3, "A", "hi"), idle()].concat()));
    sim.check_full_fold();
}

#[test]
fn a_followup_sent_during_round_two_runs_before_round_three() {
    let mut sim = Sim::new();
    // `[[delay]]` holds each continuation's model reply until the test streams it.
    let objective = "work [[delay:50]]";
    goal(sim.set_goal("g1", objective, 3));
    sim.finish_model();
    let text = |r: u64| format!("Continue working toward the goal (round {r} of 3): work");
    let expected = [
        vec!["D goal/change g1.1 active 0/3".to_string()],
        round(1, "goal-g1-1-1", 1, 3, "work"),
        opens(2, "goal-g1-1-2"),
        vec!["D step/start 2.1".into(), "D user/message goal-g1-1-2 2.1".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    sent(sim.followup("H", "human first"));
    sim.expect(&["D spliced next-turn 0 0 [H] wake", "L inserted H"]);
    sim.finish_model();
    let expected = [
        vec![
            format!("D assistant/message 2.1 {:?}", format!("echo: {}", text(2))),
            "D step/end 2.1".into(),
            "D turn/end 2 completed".into(),
        ],
        // Pending human input drains first; the session never goes idle in between.
        claims(3, "H"),
        echo_step(3, "H", "human first"),
        idle(),
        opens(4, "goal-g1-1-3"),
        vec!["D step/start 4.1".into(), "D user/message goal-g1-1-3 4.1".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    sim.finish_model();
    sim.expect(&[
        &format!("D assistant/message 4.1 {:?}", format!("echo: {}", text(3))),
        "D step/end 4.1",
        "D turn/end 4 completed",
        "D status idle",
        "L status idle",
        "D goal/change g1.1 budget-limited 3/3 reason:\"3 rounds admitted without goal_complete\"",
    ]);
    assert_eq!(admitted_rounds(&sim), vec![(1, 1), (1, 2), (1, 3)]);
    sim.check_full_fold();
}

/// The content guard, except that the first continuation of round 2 is rejected.
fn reject_round_two_once(req: &PreStepRequest) -> PreStepOutcome {
    if req.messages.iter().any(|m| m.id.0 == "goal-g1-1-2") {
        return PreStepOutcome::Decided(PreStepDecision::Reject { reason: Some("not now".into()) });
    }
    support::guard(req)
}

#[test]
fn a_rejected_continuation_pauses_the_goal_without_advancing_the_round() {
    let mut sim = Sim::new();
    sim.decide = reject_round_two_once;
    goal(sim.set_goal("g1", "ship it", 3));
    let expected = [
        vec!["D goal/change g1.1 active 0/3".to_string()],
        round(1, "goal-g1-1-1", 1, 3, "ship it"),
        opens(2, "goal-g1-1-2"),
        vec![
            "D turn/end 2 blocked{not now}".into(),
            "D goal/change g1.1 paused 1/3 reason:\"turn 2 ended blocked{not now}\"".into(),
        ],
        idle(),
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert_eq!(goal_state(&sim), (GoalState::Paused, 1, 1));
    // Resume delivers round 2 again; its MessageId is new because an accepted id is never reused.
    goal(sim.update_goal("g1", GoalAction::Resume));
    let expected = [
        vec!["D goal/change g1.1 active 1/3".to_string()],
        round(3, "goal-g1-1-2.2", 2, 3, "ship it"),
        round(4, "goal-g1-1-3", 3, 3, "ship it"),
        vec!["D goal/change g1.1 budget-limited 3/3 reason:\"3 rounds admitted without goal_complete\"".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert_eq!(admitted_rounds(&sim), vec![(1, 1), (1, 2), (1, 3)]);
    sim.check_full_fold();
}

#[test]
fn a_dropped_continuation_parks_without_advancing_the_round() {
    let mut sim = Sim::new();
    // `[[drop]]` in the objective: the content guard drops every continuation, so the first batch is
    // empty and the turn ends completed with no step; the driver parks rather than deliver again.
    goal(sim.set_goal("g1", "[[drop]] ship it", 3));
    let expected = [
        vec!["D goal/change g1.1 active 0/3".to_string()],
        opens(1, "goal-g1-1-1"),
        vec!["D turn/end 1 completed".into()],
        idle(),
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert_eq!(goal_state(&sim), (GoalState::Active, 1, 0));
    // The next completed turn goes on with the same round, under a new id.
    sent(sim.followup("A", "hi"));
    let expected = [
        opens(2, "A"),
        echo_step(2, "A", "hi"),
        idle(),
        opens(3, "goal-g1-1-1.2"),
        vec!["D turn/end 3 completed".into()],
        idle(),
    ]
    .concat();
    sim.expect(&strs(&expected));
    assert_eq!(goal_state(&sim), (GoalState::Active, 1, 0));
}

#[test]
fn cancel_pauses_the_goal_and_resume_continues_from_the_same_round() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "work [[delay:50]]", 3));
    sim.finish_model();
    sim.take();
    // Round 2 is admitted and its model reply is streaming when the user cancels.
    assert_eq!(goal_state(&sim), (GoalState::Active, 1, 2));
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D step/end 2.1",
        "D turn/end 2 aborted{user}",
        "D goal/change g1.1 paused 2/3 reason:\"turn 2 ended aborted{user}\"",
        "D status idle",
        "L status idle",
    ]);
    let id = sim.when_idle();
    assert!(sim.reply(id).is_some(), "a paused goal leaves the session quiescent");
    // Resume keeps R = 2: the next continuation is round 3.
    goal(sim.update_goal("g1", GoalAction::Resume));
    let expected = [
        vec!["D goal/change g1.1 active 2/3".to_string()],
        opens(3, "goal-g1-1-3"),
        vec!["D step/start 3.1".into(), "D user/message goal-g1-1-3 3.1".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    sim.finish_model();
    let lines = sim.take();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("D goal/change g1.1 budget-limited 3/3 reason:\"3 rounds admitted without goal_complete\"")
    );
    assert_eq!(admitted_rounds(&sim), vec![(1, 1), (1, 2), (1, 3)]);
    sim.check_full_fold();
}

#[test]
fn a_continuation_cancelled_before_it_was_admitted_is_delivered_again_on_resume() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    goal(sim.set_goal("g1", "ship it", 3));
    sim.take();
    // Round 1 is claimed, its pre-step decision pending.
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D turn/end 1 aborted{user}",
        "D goal/change g1.1 paused 0/3 reason:\"turn 1 ended aborted{user}\"",
        "D status idle",
        "L status idle",
    ]);
    sim.hold_presteps = false;
    goal(sim.update_goal("g1", GoalAction::Resume));
    let expected = [
        vec!["D goal/change g1.1 active 0/3".to_string()],
        round(2, "goal-g1-1-1.2", 1, 3, "ship it"),
        round(3, "goal-g1-1-2", 2, 3, "ship it"),
        round(4, "goal-g1-1-3", 3, 3, "ship it"),
        vec!["D goal/change g1.1 budget-limited 3/3 reason:\"3 rounds admitted without goal_complete\"".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
}

#[test]
fn pause_lets_the_running_round_finish_and_starts_no_other() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "work [[delay:50]]", 3));
    sim.take();
    goal(sim.update_goal("g1", GoalAction::Pause));
    sim.expect(&["D goal/change g1.1 paused 1/3 reason:\"paused by UpdateGoal\""]);
    // A second pause changes nothing and writes nothing.
    let (seq, again) = goal(sim.update_goal("g1", GoalAction::Pause));
    assert_eq!((seq, again.state), (sim.log.len() as u64, GoalState::Paused));
    sim.finish_model();
    let text = "Continue working toward the goal (round 1 of 3): work";
    sim.expect(&[
        &format!("D assistant/message 1.1 {:?}", format!("echo: {text}")),
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    // A cleared goal is gone for good: a later turn runs no round and is not offered goal_complete.
    goal(sim.update_goal("g1", GoalAction::Clear));
    sim.expect(&["D goal/change g1.1 cleared 1/3 reason:\"cleared by UpdateGoal\""]);
    sent(sim.followup("A", "hi"));
    sim.expect(&strs(&[opens(2, "A"), echo_step(2, "A", "hi"), idle()].concat()));
    assert_eq!(sim.model_requests.last().unwrap().goal, None);
    assert_eq!(refused(sim.update_goal("g1", GoalAction::Resume)).0, "failed-precondition");
    sim.check_full_fold();
}

#[test]
fn goal_complete_without_an_active_goal_is_an_error_result() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:goal_complete {\"summary\":\"x\"}]] done"));
    sim.expect(&strs(
        &[
            opens(1, "A"),
            vec![
                "D step/start 1.1".into(),
                "D user/message A 1.1".into(),
                "D assistant/message 1.1 \"echo: done\" calls[goal_complete]".into(),
                "D tool/call 1.1 goal_complete".into(),
                "D tool/result 1.1 call-1-1-1 error".into(),
                "D step/end 1.1".into(),
                // Not concluded: the model answers the error in another step.
                "D step/start 1.2".into(),
                "D assistant/message 1.2 \"tool results: goal_complete failed: the session has no active goal to complete\"".into(),
                "D step/end 1.2".into(),
                "D turn/end 1 completed".into(),
            ],
            idle(),
        ]
        .concat(),
    ));
    assert!(sim.tool_requests.is_empty());
    assert!(sim.driver.state().goals.current.is_none());
}

#[test]
fn a_revision_during_a_round_starts_its_own_rounds_after_it() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "work [[delay:50]]", 3));
    sim.take();
    // The caller minted another id; a revision keeps the goal's own.
    goal(sim.set_goal("g2", "new aim", 2));
    sim.expect(&["D goal/change g1.2 active 0/2"]);
    sim.finish_model();
    let text = "Continue working toward the goal (round 1 of 3): work";
    let expected = [
        vec![
            format!("D assistant/message 1.1 {:?}", format!("echo: {text}")),
            "D step/end 1.1".into(),
            "D turn/end 1 completed".into(),
        ],
        idle(),
        round(2, "goal-g1-2-1", 1, 2, "new aim"),
        round(3, "goal-g1-2-2", 2, 2, "new aim"),
        vec!["D goal/change g1.2 budget-limited 2/2 reason:\"2 rounds admitted without goal_complete\"".into()],
    ]
    .concat();
    sim.expect(&strs(&expected));
    // Revision 1's round counts for revision 1 only.
    assert_eq!(admitted_rounds(&sim), vec![(1, 1), (2, 1), (2, 2)]);
    assert_eq!(goal_state(&sim), (GoalState::BudgetLimited, 2, 2));
    // The same SetGoal again while active is a retry: nothing is written.
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "work [[delay:50]]", 3));
    let before = sim.log.len();
    goal(sim.set_goal("g9", "work [[delay:50]]", 3));
    assert_eq!(sim.log.len(), before);
}

#[test]
fn a_new_owner_goes_on_with_the_next_round_after_a_cut_before_it() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "ship it [[complete-goal-at:3]]", 5));
    // Cut right after round 1's `status idle`, before round 2 was delivered.
    let cut = sim
        .log
        .iter()
        .position(|e| matches!(&e.payload, EventPayload::InboxSpliced(s) if s.inserted.iter().any(|m| m.id.0 == "goal-g1-1-2")))
        .unwrap();
    let mut next = Sim::recover(sim.log[..cut].to_vec(), Limits::default(), 2, 1_000);
    let expected = [round(2, "goal-g1-1-2", 2, 5, "ship it"), opens(3, "goal-g1-1-3")].concat();
    let got = next.take();
    assert_eq!(strs(&got[..expected.len()]), strs(&expected));
    assert_eq!(got.last().map(String::as_str), Some("L status idle"));
    assert_eq!(goal_state(&next), (GoalState::Completed, 1, 3));
}

#[test]
fn a_new_owner_at_any_cut_runs_every_round_once() {
    let mut sim = Sim::new();
    goal(sim.set_goal("g1", "ship it [[complete-goal-at:3]]", 5));
    let whole = sim.log.clone();
    for &cut in &sim.batch_ends {
        let mut next = Sim::recover(whole[..cut].to_vec(), Limits::default(), 2, 1_000);
        next.settle();
        next.check_full_fold();
        let rounds = admitted_rounds(&next);
        assert_eq!(rounds, vec![(1, 1), (1, 2), (1, 3)], "cut at {cut}: every round is admitted once");
        assert_eq!(goal_state(&next), (GoalState::Completed, 1, 3), "cut at {cut}");
        let completions = next
            .log
            .iter()
            .filter(|e| matches!(&e.payload, EventPayload::GoalChange(g) if g.state == GoalState::Completed))
            .count();
        assert_eq!(completions, 1, "cut at {cut}: the goal completes once");
    }
}

#[test]
fn a_new_owner_writes_the_pause_a_cut_lost() {
    let mut sim = Sim::new();
    sim.decide = reject_round_two_once;
    goal(sim.set_goal("g1", "ship it", 3));
    let cut = sim
        .log
        .iter()
        .position(|e| matches!(&e.payload, EventPayload::GoalChange(g) if g.state == GoalState::Paused))
        .unwrap();
    let mut next = Sim::recover(sim.log[..cut].to_vec(), Limits::default(), 2, 1_000);
    next.expect(&[
        "D goal/change g1.1 paused 1/3 reason:\"turn 2 ended blocked{not now}\"",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn bad_goal_input_is_refused_with_nothing_written() {
    let mut sim = Sim::with_limits(Limits { max_message_bytes: 200, max_goal_rounds: 10, ..Limits::default() });
    let (kind, message) = refused(sim.set_goal("g1", "ship it", 11));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("cap of 10"), "{message}");
    let cases = [
        (sim.set_goal("g1", "", 3), "invalid-argument"),
        (sim.set_goal("g1", "   ", 3), "invalid-argument"),
        (sim.set_goal("g1", "ship it", 0), "invalid-argument"),
        (sim.set_goal("", "ship it", 3), "invalid-argument"),
        (sim.set_goal("g 1", "ship it", 3), "invalid-argument"),
        (sim.set_goal(&"g".repeat(65), "ship it", 3), "invalid-argument"),
        (sim.set_goal("g1", &"x".repeat(190), 3), "invalid-argument"),
        (sim.update_goal("g1", GoalAction::Pause), "not-found"),
    ];
    for (reply, kind) in cases {
        assert_eq!(refused(reply).0, kind);
    }
    assert!(sim.log.is_empty());
    goal(sim.set_goal("g1", "ship it", 1));
    sim.take();
    assert_eq!(goal_state(&sim), (GoalState::BudgetLimited, 1, 1));
    let before = sim.log.len();
    let (kind, message) = refused(sim.update_goal("g2", GoalAction::Clear));
    assert_eq!(kind, "not-found");
    assert!(message.contains("its goal is g1"), "{message}");
    let (kind, message) = refused(sim.update_goal("g1", GoalAction::Resume));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("budget-limited"), "{message}");
    assert_eq!(refused(sim.set_goal("g1", "again", 2)).0, "already-exists");
    assert_eq!(sim.log.len(), before);
    // A new id starts a new goal at revision 1.
    goal(sim.set_goal("g2", "again", 1));
    assert_eq!(goal_state(&sim), (GoalState::BudgetLimited, 1, 1));
    assert_eq!(sim.driver.state().goals.current.as_ref().map(|g| g.info.goal_id.as_str()), Some("g2"));
}
