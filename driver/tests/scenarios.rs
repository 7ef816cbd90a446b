//! SPEC §7 scenarios 1–27 and the §2 limits, against the sans-IO driver in the simulated runner.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, msg, refused, render_durable, sent, written};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits, ToolRules};
use turnstile_driver::{PreStepDecision, PreStepOutcome};
use turnstile_model::state::SessionState;
use turnstile_model::{
    CancelCause, Command, CommandReply, ContentBlock, EventPayload, MessageSource, SpliceOutcome, Status, Target,
    UserMessage,
};

/// The rendered events of one plain echo turn `n` for message `id` answering `text`.
fn echo_turn(n: u64, id: &str, text: &str) -> Vec<String> {
    vec![
        format!("D turn/start {n}"),
        "D spliced next-turn 0 1 []".to_string(),
        format!("L claimed {id} {n}"),
        format!("D step/start {n}.1"),
        format!("D user/message {id} {n}.1"),
        format!("D assistant/message {n}.1 {:?}", format!("echo: {text}")),
        format!("D step/end {n}.1"),
        format!("D turn/end {n} completed"),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn cat(parts: &[&[&str]]) -> Vec<String> {
    parts.iter().flat_map(|p| p.iter().map(|s| s.to_string())).collect()
}

const RUNNING: [&str; 2] = ["D status running", "L status running"];
const IDLE: [&str; 2] = ["D status idle", "L status idle"];

// ----- 1 -----------------------------------------------------------------------------------------

#[test]
fn s01_idle_followup_is_the_canonical_order() {
    let mut sim = Sim::new();
    assert_eq!(sent(sim.followup("A", "hello")), (1, Some(1)));
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
        "D assistant/message 1.1 \"echo: hello\"",
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    // The reply comes after the turn-boundary claim and before the step (SPEC §2).
    let lines = sim.lines();
    let reply = lines.iter().position(|l| l == "R 1 sent 1 turn 1").unwrap();
    assert_eq!(lines[reply - 1], "L claimed A 1");
    assert_eq!(lines[reply + 1], "D step/start 1.1");
    // Deltas are published between the user/message and the assistant/message and concatenate to it.
    let first_delta = lines.iter().position(|l| l.starts_with("L delta 1.1 ")).unwrap();
    assert_eq!(lines[first_delta - 1], "D user/message A 1.1");
    assert_eq!(sim.delta_text(1, 1), "echo: hello");
    assert_eq!(sim.assistant_text(1, 1).unwrap(), "echo: hello");
    let live = &sim.live;
    assert!(live.iter().all(|e| e.after_seq <= sim.log.len() as u64));
    sim.check_full_fold();
}

#[test]
fn s01_when_idle_resolves_after_status_idle() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "hello"));
    let waiter = sim.when_idle();
    assert!(sim.reply(waiter).is_none(), "when_idle must wait while the turn runs");
    sim.decide_pre_steps();
    let lines = sim.lines();
    let at = lines.iter().position(|l| l.starts_with(&format!("R {waiter} idle"))).unwrap();
    assert_eq!(lines[at - 1], "L status idle");
    assert_eq!(at, lines.len() - 1);
    match sim.reply(waiter).unwrap() {
        Ok(CommandReply::Idle(s)) => {
            assert_eq!((s.status, s.last_seq, s.last_turn, s.epoch), (Status::Idle, 10, 1, 1));
            assert_eq!(s.owner, "node-1");
        }
        other => panic!("{other:?}"),
    }
    // Already idle: it resolves at once and writes nothing.
    let before = sim.log.len();
    let again = sim.when_idle();
    assert!(matches!(sim.reply(again), Some(Ok(CommandReply::Idle(_)))));
    assert_eq!(sim.log.len(), before);
}

// ----- 2, 3, 4 -----------------------------------------------------------------------------------

#[test]
fn s02_three_followups_back_to_back_run_three_turns_in_one_running_period() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    assert_eq!(sent(sim.followup("A", "a")), (1, Some(1)));
    assert_eq!(sent(sim.followup("B", "b")), (5, None));
    assert_eq!(sent(sim.followup("C", "c")), (6, None));
    sim.hold_presteps = false;
    sim.decide_pre_steps();
    let expected = cat(&[
        &["D spliced next-turn 0 0 [A] wake", "L inserted A"],
        &RUNNING,
        &["D turn/start 1", "D spliced next-turn 0 1 []", "L claimed A 1"],
        &["D spliced next-turn 0 0 [B] wake", "L inserted B"],
        &["D spliced next-turn 1 0 [C] wake", "L inserted C"],
        &strs(&echo_turn(1, "A", "a"))[3..],
        &strs(&echo_turn(2, "B", "b")),
        &strs(&echo_turn(3, "C", "c")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    let msgs: Vec<(String, u64)> = sim.user_messages().into_iter().map(|(id, t, _, _)| (id, t)).collect();
    assert_eq!(msgs, vec![("A".into(), 1), ("B".into(), 2), ("C".into(), 3)]);
}

#[test]
fn s03_followup_while_streaming_is_taken_at_the_next_turn() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[delay:300]] alpha beta gamma"));
    assert!(sim.stream_one_delta());
    sim.take();
    assert_eq!(sent(sim.followup("B", "bravo")), (7, None));
    sim.expect(&["D spliced next-turn 0 0 [B] wake", "L inserted B"]);
    sim.finish_model();
    let expected = cat(&[
        &["D assistant/message 1.1 \"echo: alpha beta gamma\"", "D step/end 1.1", "D turn/end 1 completed"],
        &strs(&echo_turn(2, "B", "bravo")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    assert_eq!(sim.delta_text(1, 1), "echo: alpha beta gamma");
}

#[test]
fn s04_queue_parks_while_idle_and_runs_first() {
    let mut sim = Sim::new();
    assert_eq!(sent(sim.queue("Q", "queued")), (1, None));
    sim.expect(&["D spliced next-turn 0 0 [Q]", "L inserted Q"]);
    assert_eq!(sim.driver.state().status, Status::Idle);
    assert_eq!(sim.driver.state().last_turn, 0);
    assert!(sim.driver.is_quiescent());
    assert_eq!(sent(sim.followup("F", "fresh")), (2, Some(1)));
    let expected = cat(&[
        &["D spliced next-turn 1 0 [F] wake", "L inserted F"],
        &RUNNING,
        &strs(&echo_turn(1, "Q", "queued")),
        &strs(&echo_turn(2, "F", "fresh")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

// ----- 5, 6, 7, 8 --------------------------------------------------------------------------------

#[test]
fn s05_idle_steer_opens_a_turn_and_is_claimed_by_the_first_proposal() {
    let mut sim = Sim::new();
    assert_eq!(sent(sim.steer("S", "steer", None)), (1, Some(1)));
    sim.expect(&[
        "D spliced next-step 0 0 [S] wake",
        "L inserted S",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-step 0 1 []",
        "L claimed S 1",
        "D step/start 1.1",
        "D user/message S 1.1",
        "D assistant/message 1.1 \"echo: steer\"",
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(sim.prestep_requests[0].proposal, 1);
}

#[test]
fn s05_idle_steer_also_claims_the_head_of_next_turn() {
    let mut sim = Sim::new();
    sent(sim.queue("Q1", "first"));
    sent(sim.queue("Q2", "second"));
    sim.take();
    assert_eq!(sent(sim.steer("S", "steer", None)), (3, Some(1)));
    let expected = cat(&[
        &["D spliced next-step 0 0 [S] wake", "L inserted S"],
        &RUNNING,
        &[
            "D turn/start 1",
            "D spliced next-step 0 1 []",
            "D spliced next-turn 0 1 []",
            "L claimed S 1",
            "L claimed Q1 1",
            "D step/start 1.1",
            "D user/message S 1.1",
            "D user/message Q1 1.1",
            "D assistant/message 1.1 \"echo: steer\\nfirst\"",
            "D step/end 1.1",
            "D turn/end 1 completed",
        ],
        &strs(&echo_turn(2, "Q2", "second")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

#[test]
fn s06_steer_during_a_tool_call_joins_the_next_step() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 100]] go"));
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
        "D assistant/message 1.1 \"echo: go\" calls[sleep]",
        "D tool/call 1.1 sleep",
    ]);
    assert_eq!(sim.held_tools(), 1);
    assert_eq!(sent(sim.steer("S", "steer now", None)), (9, None));
    sim.expect(&["D spliced next-step 0 0 [S] wake", "L inserted S"]);
    sim.finish_tools();
    sim.expect(&[
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D spliced next-step 0 1 []",
        "L claimed S 1",
        "D step/start 1.2",
        "D user/message S 1.2",
        "D assistant/message 1.2 \"echo: steer now\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    let step2 = sim.model_requests.iter().find(|r| r.step == 2).unwrap();
    assert_eq!(step2.tool_results.len(), 1);
    assert_eq!(step2.tool_results[0].output, "slept 100");
    match &sim.log[9].payload {
        EventPayload::ToolResult { output, error, .. } => assert_eq!((output.as_str(), error), ("slept 100", &None)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn s06_tool_step_without_steer_runs_a_step_with_no_new_messages() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:echo hi there]] go"));
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
        "D tool/call 1.1 echo",
        "D tool/result 1.1 call-1-1-1",
        "D step/end 1.1",
        "D step/start 1.2",
        "D assistant/message 1.2 \"tool results: echo: hi there\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn s07_idle_inject_writes_only_its_splice_and_joins_the_next_followup() {
    let mut sim = Sim::new();
    assert_eq!(sent(sim.inject("I", "context")), (1, None));
    sim.expect(&["D spliced next-step 0 0 [I]", "L inserted I"]);
    assert_eq!(sim.driver.state().status, Status::Idle);
    assert_eq!(sim.driver.state().last_turn, 0);
    assert_eq!(sent(sim.followup("P", "prompt")), (2, Some(1)));
    sim.expect(&[
        "D spliced next-turn 0 0 [P] wake",
        "L inserted P",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-step 0 1 []",
        "D spliced next-turn 0 1 []",
        "L claimed I 1",
        "L claimed P 1",
        "D step/start 1.1",
        "D user/message I 1.1",
        "D user/message P 1.1",
        "D assistant/message 1.1 \"echo: context\\nprompt\"",
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    let batch: Vec<&str> = sim.prestep_requests[0].messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(batch, ["I", "P"]);
}

#[test]
fn s08_inject_while_running_adds_one_step_to_the_same_turn() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[delay:200]] long answer"));
    sim.take();
    assert_eq!(sent(sim.inject("I", "more context")), (7, None));
    sim.expect(&["D spliced next-step 0 0 [I]", "L inserted I"]);
    sim.finish_model();
    sim.expect(&[
        "D assistant/message 1.1 \"echo: long answer\"",
        "D step/end 1.1",
        "D spliced next-step 0 1 []",
        "L claimed I 1",
        "D step/start 1.2",
        "D user/message I 1.2",
        "D assistant/message 1.2 \"echo: more context\"",
        "D step/end 1.2",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(sim.prestep_requests.iter().map(|r| r.proposal).collect::<Vec<_>>(), [1, 2]);
}

// ----- 9, 10, 11, 12 -----------------------------------------------------------------------------

#[test]
fn s09_reject_blocks_the_turn_and_a_queued_prompt_parks() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    assert_eq!(sent(sim.followup("A", "[[reject]] bad")), (1, Some(1)));
    sent(sim.queue("B", "later"));
    sim.hold_presteps = false;
    sim.decide_pre_steps();
    sim.expect(&[
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "D spliced next-turn 0 0 [B]",
        "L inserted B",
        "D turn/end 1 blocked",
        "D status idle",
        "L status idle",
    ]);
    assert!(sim.model_requests.is_empty(), "a rejected proposal runs no step");
    assert_eq!(sim.pending_ids().0, ["B"]);
    assert!(sim.driver.is_quiescent());
    // The parked prompt is claimed first by the turn the next waking delivery opens.
    assert_eq!(sent(sim.followup("C", "now")), (8, Some(2)));
    let expected = cat(&[
        &["D spliced next-turn 1 0 [C] wake", "L inserted C"],
        &RUNNING,
        &strs(&echo_turn(2, "B", "later")),
        &strs(&echo_turn(3, "C", "now")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    assert!(sim.user_messages().iter().all(|(id, ..)| id != "A"), "a rejected message never becomes a user/message");
}

#[test]
fn s10_empty_first_batch_completes_with_no_step_and_the_queue_parks() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "[[drop]] gone"));
    sent(sim.queue("B", "later"));
    sim.take();
    sim.hold_presteps = false;
    sim.decide_pre_steps();
    sim.expect(&["D turn/end 1 completed", "D status idle", "L status idle"]);
    assert!(sim.model_requests.is_empty());
    assert_eq!(sim.pending_ids().0, ["B"]);
    assert!(sim.driver.is_quiescent());
}

#[test]
fn s10_enter_nothing_at_a_later_proposal_after_a_completed_step_ends_the_turn() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[delay:100]] first"));
    sent(sim.inject("I", "[[drop]] noise"));
    sim.take();
    sim.finish_model();
    sim.expect(&[
        "D assistant/message 1.1 \"echo: first\"",
        "D step/end 1.1",
        "D spliced next-step 0 1 []",
        "L claimed I 1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn s11_enter_with_rewritten_content_keeps_the_id() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[rewrite:clean words]] dirty words"));
    let msgs = sim.user_messages();
    assert_eq!(msgs.len(), 1);
    let (id, turn, step, m) = &msgs[0];
    assert_eq!((id.as_str(), *turn, *step), ("A", 1, 1));
    assert_eq!(m.content, vec![ContentBlock::text("clean words")].into());
    assert_eq!(m.source, MessageSource::User);
    assert_eq!(sim.assistant_text(1, 1).unwrap(), "echo: clean words");
}

#[test]
fn s11_a_hook_may_enter_a_batch_of_its_own() {
    // A pre-step decision other than the content guard: enter a rewritten batch.
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "original"));
    sim.take();
    sim.decide_pre_steps_with(PreStepOutcome::Decided(PreStepDecision::Enter(vec![msg("A", "replaced")])));
    sim.expect(&[
        "D step/start 1.1",
        "D user/message A 1.1",
        "D assistant/message 1.1 \"echo: replaced\"",
        "D step/end 1.1",
        "D turn/end 1 completed",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(sim.user_messages()[0].3, msg("A", "replaced"));
}

#[test]
fn s12_hook_failure_is_an_error_turn_and_the_next_followup_runs() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[hook-fail]] x"));
    sim.expect(&[
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "L error 1.1 pre-step hook failed: hook content-guard: failed on message A ([[hook-fail]])",
        "D turn/end 1 error{hook_failed}",
        "D status idle",
        "L status idle",
    ]);
    match &sim.log[4].payload {
        EventPayload::TurnEnd { reason: turnstile_model::TurnEndReason::Error { message, code }, .. } => {
            assert_eq!(code, "hook_failed");
            assert!(message.contains("message A"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sent(sim.followup("B", "fine")), (7, Some(2)));
    let expected = cat(&[
        &["D spliced next-turn 0 0 [B] wake", "L inserted B"],
        &RUNNING,
        &strs(&echo_turn(2, "B", "fine")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

#[test]
fn s12_model_failure_closes_the_step_and_ends_the_turn_with_error() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[fail]] x"));
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
        "D step/end 1.1",
        "L error 1.1 model request failed: the scripted model was told to fail ([[fail]])",
        "D turn/end 1 error{model_failed}",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn max_tokens_is_sticky_and_truncated_calls_never_run() {
    let mut sim = Sim::new();
    sent(sim.queue("B", "next"));
    sent(sim.followup("A", "[[max-tokens]] [[tool:sleep 5]] hi"));
    let expected = cat(&[
        &["D spliced next-turn 0 0 [B]", "L inserted B", "D spliced next-turn 1 0 [A] wake", "L inserted A"],
        &RUNNING,
        &strs(&echo_turn(1, "B", "next")),
        &[
            "D turn/start 2",
            "D spliced next-turn 0 1 []",
            "L claimed A 2",
            "D step/start 2.1",
            "D user/message A 2.1",
            "D assistant/message 2.1 \"echo: hi\" max-tokens",
            "D step/end 2.1",
            "D turn/end 2 max-tokens",
        ],
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    assert!(sim.tool_requests.is_empty());
}

// ----- 13–18: cancel -----------------------------------------------------------------------------

const SLOW: &str = "[[delay:1000]] one two three four five six seven eight nine ten eleven twelve";

fn start_slow(sim: &mut Sim) {
    assert_eq!(sent(sim.followup("A", SLOW)), (1, Some(1)));
    assert_eq!(sim.held_models(), 1);
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
    ]);
}

#[test]
fn s13_cancel_mid_stream_keeps_the_delivered_prefix_and_discards_the_queue() {
    let mut sim = Sim::new();
    start_slow(&mut sim);
    assert!(sim.stream_one_delta());
    assert!(sim.stream_one_delta());
    let delivered = sim.delta_text(1, 1);
    assert_eq!(delivered, "echo: one two three ");
    sent(sim.queue("Q1", "q1"));
    sent(sim.queue("Q2", "q2"));
    sim.take();
    let id_before = sim.recs.len();
    let seq = written(sim.cancel(CancelCause::User, false));
    assert_eq!(seq, 9, "cancel replies with the seq of its own splice");
    sim.expect(&[
        "D spliced next-turn 0 2 [] canceled",
        "L discarded Q1",
        "L discarded Q2",
        "D assistant/message 1.1 \"echo: one two three \" interrupted",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    // The reply went out once the splice was durable, before the turn converged.
    let lines: Vec<String> = sim.recs[id_before..].iter().map(support::render).collect();
    let reply = lines.iter().position(|l| l.starts_with("R ") && l.ends_with("written 9")).unwrap();
    let converged = lines.iter().position(|l| l.starts_with("D assistant/message")).unwrap();
    assert!(reply < converged, "{lines:#?}");
    assert!(sim.driver.state().inbox.is_empty());
    assert!(sim.driver.is_quiescent());
}

#[test]
fn s13_cancel_before_any_delta_writes_no_assistant_message() {
    let mut sim = Sim::new();
    start_slow(&mut sim);
    assert_eq!(written(sim.cancel(CancelCause::User, false)), 6);
    sim.expect(&["D step/end 1.1", "D turn/end 1 aborted{user}", "D status idle", "L status idle"]);
}

#[test]
fn s13_cancel_during_a_tool_call_finishes_it_and_skips_the_rest() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 1000]] [[tool:echo late]] go"));
    sim.take();
    sim.advance(250);
    assert_eq!(sim.held_tools(), 1);
    written(sim.cancel(CancelCause::User, false));
    sim.expect(&[
        "D tool/result 1.1 call-1-1-1 error",
        "D tool/call 1.1 echo",
        "D tool/result 1.1 call-1-1-2 error",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    let errors: Vec<String> = sim
        .log
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::ToolResult { error: Some(e), .. } => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors[0], "aborted after 250 of 1000 ms");
    assert_eq!(sim.tool_requests.len(), 1, "the unstarted call never runs");
}

#[test]
fn s13_cancel_before_step_start_is_a_no_step_aborted_turn() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "hello"));
    sim.take();
    written(sim.cancel(CancelCause::Hook { reason: "policy".into() }, false));
    sim.expect(&["D turn/end 1 aborted{hook(policy)}", "D status idle", "L status idle"]);
    assert!(sim.user_messages().is_empty());
}

#[test]
fn s14_cancel_keeping_the_inbox_parks_the_queue() {
    let mut sim = Sim::new();
    start_slow(&mut sim);
    assert!(sim.stream_one_delta());
    sent(sim.queue("B", "bee"));
    sim.take();
    assert_eq!(written(sim.cancel(CancelCause::User, true)), 7);
    sim.expect(&[
        "D assistant/message 1.1 \"echo: one \" interrupted",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
    ]);
    assert_eq!(sim.pending_ids().0, ["B"]);
    assert!(sim.driver.is_quiescent());
    assert_eq!(sent(sim.followup("C", "sea")), (12, Some(2)));
    let expected = cat(&[
        &["D spliced next-turn 1 0 [C] wake", "L inserted C"],
        &RUNNING,
        &strs(&echo_turn(2, "B", "bee")),
        &strs(&echo_turn(3, "C", "sea")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

#[test]
fn s15_followup_during_an_abort_latches_and_runs_as_the_next_turn() {
    let mut sim = Sim::new();
    sim.delay_aborts = true;
    start_slow(&mut sim);
    assert_eq!(written(sim.cancel(CancelCause::User, true)), 6);
    sim.expect_nothing();
    assert_eq!(sim.held_aborts(), 1);
    assert_eq!(sent(sim.followup("B", "bee")), (7, None));
    sim.expect(&["D spliced next-turn 0 0 [B] wake", "L inserted B"]);
    let waiter = sim.when_idle();
    sim.deliver_aborts();
    let expected = cat(&[
        &["D step/end 1.1", "D turn/end 1 aborted{user}"],
        &IDLE,
        &RUNNING,
        &strs(&echo_turn(2, "B", "bee")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    // when_idle waits for the latched turn, not the first idle.
    let lines = sim.lines();
    let at = lines.iter().position(|l| l.starts_with(&format!("R {waiter} idle"))).unwrap();
    assert_eq!(at, lines.len() - 1);
    assert_eq!(lines.iter().filter(|l| *l == "L status idle").count(), 2);
}

#[test]
fn s15_steer_during_an_abort_is_forced_to_next_turn_and_retries_the_same() {
    let mut sim = Sim::new();
    sim.delay_aborts = true;
    start_slow(&mut sim);
    written(sim.cancel(CancelCause::User, true));
    assert_eq!(sent(sim.steer("S", "steer", None)), (7, None));
    sim.expect(&["D spliced next-turn 0 0 [S] wake asked:next-step", "L inserted S"]);
    assert_eq!(sent(sim.steer("S", "steer", None)), (7, None), "a retry of a forced steer is still a retry");
    sim.expect_nothing();
    sim.deliver_aborts();
    let expected = cat(&[
        &["D step/end 1.1", "D turn/end 1 aborted{user}"],
        &IDLE,
        &RUNNING,
        &strs(&echo_turn(2, "S", "steer")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

#[test]
fn s16_plain_cancel_after_a_latched_wake_clears_latch_and_inbox() {
    let mut sim = Sim::new();
    sim.delay_aborts = true;
    start_slow(&mut sim);
    written(sim.cancel(CancelCause::User, true));
    sent(sim.followup("B", "bee"));
    sim.take();
    assert_eq!(written(sim.cancel(CancelCause::User, false)), 8);
    sim.expect(&["D spliced next-turn 0 1 [] canceled", "L discarded B"]);
    assert_eq!(sim.held_aborts(), 1, "the second cancel signals nothing new");
    sim.deliver_aborts();
    sim.expect(&["D step/end 1.1", "D turn/end 1 aborted{user}", "D status idle", "L status idle"]);
    assert_eq!(sim.driver.state().last_turn, 1, "only the first turn ran");
    assert!(sim.driver.is_quiescent());
    let w = sim.when_idle();
    assert!(matches!(sim.reply(w), Some(Ok(CommandReply::Idle(_)))));
}

#[test]
fn s17_idle_cancel_with_an_empty_inbox_writes_nothing() {
    let mut sim = Sim::new();
    assert_eq!(written(sim.cancel(CancelCause::User, false)), 0);
    assert_eq!(written(sim.cancel(CancelCause::Parent, true)), 0);
    sim.expect_nothing();
    assert!(sim.log.is_empty());
    sent(sim.followup("A", "hello"));
    sim.take();
    assert_eq!(written(sim.cancel(CancelCause::Disposed, false)), 10);
    sim.expect_nothing();
    // An idle cancel keeping the inbox writes nothing; without keep_inbox it clears durably.
    sent(sim.queue("Q", "q"));
    sim.take();
    assert_eq!(written(sim.cancel(CancelCause::User, true)), 11);
    sim.expect_nothing();
    assert_eq!(written(sim.cancel(CancelCause::User, false)), 12);
    sim.expect(&["D spliced next-turn 0 1 [] canceled", "L discarded Q"]);
}

#[test]
fn s18_the_first_cancel_cause_wins() {
    let mut sim = Sim::new();
    sim.delay_aborts = true;
    start_slow(&mut sim);
    written(sim.cancel(CancelCause::Parent, true));
    written(sim.cancel(CancelCause::User, true));
    assert_eq!(sim.held_aborts(), 1);
    sim.deliver_aborts();
    sim.expect(&["D step/end 1.1", "D turn/end 1 aborted{parent}", "D status idle", "L status idle"]);
}

// ----- 19–24: edits, retries, preconditions, interrupt -------------------------------------------

#[test]
fn s19_replace_across_lists() {
    let mut sim = Sim::new();
    sent(sim.queue("A", "a"));
    sent(sim.inject("I", "i"));
    sent(sim.queue("B", "b"));
    sim.take();
    // The id is found in next-step; the new message has a new id.
    assert_eq!(written(sim.replace("I", msg("I2", "i2"))), 4);
    sim.expect(&["D spliced next-step 0 1 [I2] canceled", "L discarded I", "L inserted I2"]);
    // Replacing with an id already pending in the other list fails and writes nothing.
    let (kind, message) = refused(sim.replace("B", msg("I2", "x")));
    assert_eq!(kind, "already-exists");
    assert!(message.contains("I2"), "{message}");
    let (kind, message) = refused(sim.replace("I2", msg("A", "x")));
    assert_eq!(kind, "already-exists");
    assert!(message.contains("message id A "), "{message}");
    sim.expect_nothing();
    // Rewriting content keeps the id.
    assert_eq!(written(sim.replace("B", msg("B", "b v2"))), 5);
    sim.expect(&["D spliced next-turn 1 1 [B] canceled", "L discarded B", "L inserted B"]);
    let (kind, message) = refused(sim.replace("nope", msg("N", "x")));
    assert_eq!(kind, "not-found");
    assert!(message.contains("nope"), "{message}");
    sim.expect_nothing();
    assert_eq!(sim.pending_ids(), (vec!["A".to_string(), "B".into()], vec!["I2".to_string()]));
    assert_eq!(sim.driver.state().inbox.next_turn[1], msg("B", "b v2"));
}

#[test]
fn s20_remove_unknown_id_is_not_found() {
    let mut sim = Sim::new();
    sent(sim.queue("A", "a"));
    sim.take();
    let (kind, message) = refused(sim.remove("ghost"));
    assert_eq!(kind, "not-found");
    assert!(message.contains("ghost"), "{message}");
    sim.expect_nothing();
    assert_eq!(written(sim.remove("A")), 2);
    sim.expect(&["D spliced next-turn 0 1 [] canceled", "L discarded A"]);
    assert_eq!(refused(sim.remove("A")).0, "not-found");
}

#[test]
fn s21_clear_is_next_step_then_next_turn_and_idempotent() {
    let mut sim = Sim::new();
    sent(sim.queue("Q1", "a"));
    sent(sim.inject("I", "i"));
    sent(sim.queue("Q2", "b"));
    sim.take();
    assert_eq!(written(sim.clear()), 5);
    sim.expect(&[
        "D spliced next-step 0 1 [] canceled",
        "L discarded I",
        "D spliced next-turn 0 2 [] canceled",
        "L discarded Q1",
        "L discarded Q2",
    ]);
    assert_eq!(written(sim.clear()), 5);
    sim.expect_nothing();
}

#[test]
fn client_splice_is_one_normalized_splice() {
    let mut sim = Sim::new();
    sent(sim.queue("A", "a"));
    sent(sim.queue("B", "b"));
    sim.take();
    let r = sim.command(Command::Splice {
        target: Target::NextTurn,
        start: 1,
        delete_count: 1,
        inserted: vec![msg("C", "c"), msg("D", "d")],
    });
    assert_eq!(written(r), 3);
    sim.expect(&["D spliced next-turn 1 1 [C,D] canceled", "L discarded B", "L inserted C", "L inserted D"]);
    let r = sim.command(Command::Splice { target: Target::NextTurn, start: 0, delete_count: 0, inserted: vec![] });
    assert_eq!(written(r), 3, "an empty splice is not written");
    sim.expect_nothing();
}

/// SPEC §3: a client splice is normalized like `Array.prototype.splice` and the durable record holds the
/// normalized values; one that then changes nothing writes nothing.
#[test]
fn client_splice_past_the_end_is_normalized() {
    let mut sim = Sim::new();
    sent(sim.queue("A", "a"));
    sent(sim.queue("B", "b"));
    sim.take();
    // start 9 of 2 is the end: an append.
    let r = sim.command(Command::Splice {
        target: Target::NextTurn,
        start: 9,
        delete_count: 5,
        inserted: vec![msg("C", "c")],
    });
    assert_eq!(written(r), 3);
    sim.expect(&["D spliced next-turn 2 0 [C]", "L inserted C"]);
    // delete 7 from 1 removes the 2 that are there.
    let r = sim.command(Command::Splice { target: Target::NextTurn, start: 1, delete_count: 7, inserted: vec![] });
    assert_eq!(written(r), 4);
    sim.expect(&["D spliced next-turn 1 2 [] canceled", "L discarded B", "L discarded C"]);
    // Past the end and deleting nothing there: no change, nothing written, the last seq.
    let r = sim.command(Command::Splice {
        target: Target::NextTurn,
        start: u32::MAX,
        delete_count: u32::MAX,
        inserted: vec![],
    });
    assert_eq!(written(r), 4);
    sim.expect_nothing();
    assert_eq!(sim.driver.state().inbox.next_turn.len(), 1);
}

#[test]
fn s22_retried_followup_returns_the_same_seq_and_writes_nothing() {
    let mut sim = Sim::new();
    assert_eq!(sent(sim.followup("A", "hello")), (1, Some(1)));
    let len = sim.log.len();
    sim.take();
    // After the message ran: still a retry.
    assert_eq!(sent(sim.followup("A", "hello")), (1, Some(1)));
    sim.expect_nothing();
    assert_eq!(sim.log.len(), len);
    // The same id with other content, routing or source is already-exists.
    for reply in [
        sim.followup("A", "other"),
        sim.queue("A", "hello"),
        sim.steer("A", "hello", None),
        sim.send(
            UserMessage { source: MessageSource::Plugin { plugin: "p".into(), form: None }, ..msg("A", "hello") },
            Target::NextTurn,
            true,
            None,
        ),
    ] {
        let (kind, message) = refused(reply);
        assert_eq!(kind, "already-exists");
        assert!(message.contains("message id A "), "{message}");
    }
    sim.expect_nothing();
    // While pending: a retry too.
    assert_eq!(sent(sim.queue("Q", "q")), (len as u64 + 1, None));
    assert_eq!(sent(sim.queue("Q", "q")), (len as u64 + 1, None));
    sim.expect(&["D spliced next-turn 0 0 [Q]", "L inserted Q"]);
}

#[test]
fn s22_retry_of_a_followup_accepted_while_running_has_no_turn() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 10]] go"));
    assert_eq!(sent(sim.followup("B", "bee")), (9, None));
    sim.take();
    assert_eq!(sent(sim.followup("B", "bee")), (9, None));
    sim.expect_nothing();
}

#[test]
fn s23_steer_with_a_stale_expected_turn_fails_and_names_the_running_turn() {
    let mut sim = Sim::new();
    let (kind, message) = refused(sim.steer("S0", "s", Some(1)));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("idle"), "{message}");
    sent(sim.followup("A", "[[tool:sleep 100]] go"));
    sim.take();
    let (kind, message) = refused(sim.steer("S", "s", Some(2)));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("running turn 1"), "{message}");
    sim.expect_nothing();
    // The refused id was not accepted: the same id may be sent for the right turn.
    assert_eq!(sent(sim.steer("S", "s", Some(1))), (9, None));
    sim.expect(&["D spliced next-step 0 0 [S] wake", "L inserted S"]);
    sim.finish_tools();
    assert_eq!(
        sim.user_messages().iter().map(|(id, t, s, _)| (id.as_str(), *t, *s)).collect::<Vec<_>>(),
        [("A", 1, 1), ("S", 1, 2)]
    );
    let (kind, message) = refused(sim.steer("S2", "s", Some(1)));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("idle"), "{message}");
}

#[test]
fn s24_interrupt_aborts_the_turn_and_runs_first() {
    let mut sim = Sim::new();
    start_slow(&mut sim);
    sent(sim.queue("B", "bee"));
    assert!(sim.stream_one_delta());
    sim.take();
    assert_eq!(sent(sim.interrupt("X", "stop")), (8, None));
    let expected = cat(&[
        &[
            "D spliced next-turn 0 0 [X] wake",
            "L inserted X",
            "D assistant/message 1.1 \"echo: one \" interrupted",
            "D step/end 1.1",
            "D turn/end 1 aborted{user}",
        ],
        &IDLE,
        &RUNNING,
        &strs(&echo_turn(2, "X", "stop")),
        &strs(&echo_turn(3, "B", "bee")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
}

#[test]
fn s24_interrupt_on_an_idle_session_is_a_followup_at_the_head() {
    let mut sim = Sim::new();
    sent(sim.queue("B", "bee"));
    sim.take();
    assert_eq!(sent(sim.interrupt("X", "now")), (2, Some(1)));
    let expected = cat(&[
        &["D spliced next-turn 0 0 [X] wake", "L inserted X"],
        &RUNNING,
        &strs(&echo_turn(1, "X", "now")),
        &strs(&echo_turn(2, "B", "bee")),
        &IDLE,
    ]);
    sim.expect(&strs(&expected));
    // A retried interrupt is a retry.
    assert_eq!(sent(sim.interrupt("X", "now")), (2, Some(1)));
    sim.expect_nothing();
}

// ----- 25: projection on another node ------------------------------------------------------------

/// A busy session: every kind of splice, claims, an abort and a latched wake.
fn busy_session() -> Sim {
    let mut sim = Sim::new();
    sent(sim.queue("Q", "queued"));
    sent(sim.inject("I", "ctx"));
    sent(sim.followup("A", "[[tool:sleep 50]] go"));
    sent(sim.steer("S", "steer", None));
    sent(sim.queue("Q2", "q2"));
    written(sim.replace("Q2", msg("Q3", "q3")));
    sim.finish_tools();
    sent(sim.followup("B", "[[delay:100]] slow"));
    sim.delay_aborts = true;
    sim.stream_one_delta();
    written(sim.cancel(CancelCause::User, true));
    sent(sim.followup("C", "after"));
    sim.deliver_aborts();
    sim.delay_aborts = false;
    sim.hold_presteps = true;
    sent(sim.followup("D", "[[reject]]"));
    sent(sim.queue("E", "e"));
    sim.decide_pre_steps();
    sim.hold_presteps = false;
    written(sim.clear());
    sim.settle();
    sim
}

#[test]
fn s25_projection_matches_the_owner_after_every_input() {
    let sim = busy_session();
    sim.check_full_fold();
    assert!(sim.inbox_at.len() > 20);
    for (seq, inbox) in &sim.inbox_at {
        let folded = SessionState::fold(support::session(), 10_000, &sim.log[..*seq as usize]).unwrap();
        assert_eq!(&folded.inbox, inbox, "projection differs at seq {seq}");
    }
}

#[test]
fn s25_another_node_folds_the_wire_log_event_by_event() {
    let sim = busy_session();
    // The other node sees each event through the codec, one at a time.
    let mut replica = SessionState::new(support::session(), 10_000);
    let mut boundaries = sim.inbox_at.iter().peekable();
    for e in &sim.log {
        let wire = support::wire_round_trip(e);
        assert_eq!(&wire, e, "the codec round-trips event {}", e.seq);
        replica.apply(&wire).unwrap_or_else(|err| panic!("replica refused {}: {err}", render_durable(e)));
        // The projection rule of SPEC §3 by hand, independent of the fold.
        while let Some((seq, inbox)) = boundaries.peek() {
            if *seq > e.seq {
                break;
            }
            if *seq == e.seq {
                assert_eq!(&replica.inbox, inbox, "replica differs from the owner at seq {seq}");
            }
            boundaries.next();
        }
    }
    assert_eq!(&replica, sim.driver.state());
    // The same by the projection rule alone.
    let (mut next_turn, mut next_step) = (Vec::new(), Vec::new());
    for e in &sim.log {
        if let EventPayload::InboxSpliced(s) = &e.payload {
            let list = if s.target == Target::NextTurn { &mut next_turn } else { &mut next_step };
            let start = s.start as usize;
            list.splice(start..start + s.removed_count as usize, s.inserted.iter().cloned());
        }
    }
    assert_eq!(next_turn, sim.driver.state().inbox.next_turn);
    assert_eq!(next_step, sim.driver.state().inbox.next_step);
}

#[test]
fn s25_a_projection_refuses_an_invalid_splice_and_names_the_seq() {
    let sim = busy_session();
    let mut log = sim.log.clone();
    let bad =
        log.iter().position(|e| matches!(&e.payload, EventPayload::InboxSpliced(s) if s.removed_count > 0)).unwrap();
    if let EventPayload::InboxSpliced(s) = &mut log[bad].payload {
        s.start = 99;
    }
    let err = SessionState::fold(support::session(), 10_000, &log).unwrap_err();
    assert!(err.to_string().contains(&format!("event {}", bad + 1)), "{err}");
}

// ----- 26, 27: recovery --------------------------------------------------------------------------

#[test]
fn s26_owner_killed_mid_stream_resumes_and_answers_the_prompt() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[delay:400]] are you there"));
    assert!(sim.stream_one_delta());
    let log = sim.log.clone();
    drop(sim);
    let mut next = Sim::recover(log, Limits::default(), 2, 5_000);
    assert_eq!(next.held_models(), 1);
    next.finish_model();
    next.expect(&[
        "D step/end 1.1",
        "D turn/end 1 interrupted",
        "D turn/start 2",
        "D step/start 2.1",
        "D assistant/message 2.1 \"echo: are you there\"",
        "D step/end 2.1",
        "D turn/end 2 completed",
        "D status idle",
        "L status idle",
    ]);
    let req = &next.model_requests[0];
    assert_eq!((req.turn, req.step), (2, 1));
    assert!(req.messages.is_empty());
    assert_eq!(req.interrupted_prompt, vec![msg("A", "[[delay:400]] are you there")]);
    assert!(next.log[6..].iter().all(|e| e.epoch == 2 && e.time_ms >= 5_000));
    assert_eq!(next.user_messages().len(), 1, "the prompt is answered, not entered again");
    next.check_full_fold();
}

/// SPEC §6, §20: a call cut by its owner's death is ended interrupted (`tool/repaired`, then its error
/// result) and never run again: the resumed turn answers the step's results, not its prompt. Asking the
/// prompt again is what made the model call the tool a second time (decision 0143).
#[test]
fn s26_owner_killed_during_a_tool_call() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 1000]] go"));
    sent(sim.queue("B", "bee"));
    assert_eq!(sim.held_tools(), 1);
    let log = sim.log.clone();
    drop(sim);
    let mut next = Sim::recover(log, Limits::default(), 2, 100);
    let expected = cat(&[
        &[
            "D tool/repaired 1.1 call-1-1-1 interrupted",
            "D tool/result 1.1 call-1-1-1 error",
            "D step/end 1.1",
            "D turn/end 1 interrupted",
            "D turn/start 2",
            "D step/start 2.1",
            "D assistant/message 2.1 \"tool results: sleep failed: interrupted: the worker running this call stopped before it finished\"",
            "D step/end 2.1",
            "D turn/end 2 completed",
        ],
        &strs(&echo_turn(3, "B", "bee")),
        &IDLE,
    ]);
    next.expect(&strs(&expected));
    assert_eq!(next.held_tools(), 0, "the interrupted call is never run again");
    match &next.log[10].payload {
        EventPayload::ToolResult { error: Some(e), .. } => assert!(e.starts_with("interrupted:"), "{e}"),
        other => panic!("{other:?}"),
    }
    let admitted: Vec<String> = next.user_messages().into_iter().map(|(id, ..)| id).collect();
    assert_eq!(admitted, ["A", "B"]);
    next.check_full_fold();
}

/// SPEC §20: a call of a tool its agent runs again after a repair (`retry_after_repair`) runs again in the
/// same turn and step, under the same idempotency key, and the turn completes once.
#[test]
fn s26_owner_killed_during_a_retried_tool_call_runs_it_again_with_the_same_key() {
    let retry_sleep = || {
        let profile = AgentProfile { retry_after_repair: ToolRules::new(|t| t == "sleep"), ..AgentProfile::default() };
        AgentCatalog::new("scripted", [("scripted".to_owned(), profile)]).unwrap()
    };
    let mut sim = Sim::with_agents(Limits::default(), retry_sleep());
    sent(sim.followup("A", "[[tool:sleep 1000]] [[tool:echo after]] go"));
    sent(sim.queue("B", "bee"));
    let first_key = sim.held_tool_keys();
    assert_eq!(first_key, [format!("{}/1/1/call-1-1-1", support::session())]);
    let log = sim.log.clone();
    drop(sim);
    let mut next = Sim::recover_with_agents(log, Limits::default(), retry_sleep(), 2, 100);
    next.expect(&["D tool/repaired 1.1 call-1-1-1 retried"]);
    assert_eq!(next.held_tool_keys(), first_key, "the same call, the same key");
    next.finish_tools();
    let expected = cat(&[
        &[
            "D tool/result 1.1 call-1-1-1",
            "D tool/call 1.1 echo",
            "D tool/result 1.1 call-1-1-2",
            "D step/end 1.1",
            "D step/start 1.2",
            "D assistant/message 1.2 \"tool results: sleep: slept 1000; echo: after\"",
            "D step/end 1.2",
            "D turn/end 1 completed",
        ],
        &strs(&echo_turn(2, "B", "bee")),
        &IDLE,
    ]);
    next.expect(&strs(&expected));
    let ends: Vec<String> = next.lines().into_iter().filter(|l| l.starts_with("D turn/end 1 ")).collect();
    assert_eq!(ends, ["D turn/end 1 completed"], "the turn ends once");
    next.check_full_fold();
}

/// The retry holds for the tools the agent names only: another tool's call in the same position is ended
/// interrupted.
#[test]
fn s26_retry_after_repair_is_per_tool() {
    let profile = AgentProfile { retry_after_repair: ToolRules::new(|t| t == "echo"), ..AgentProfile::default() };
    let agents = AgentCatalog::new("scripted", [("scripted".to_owned(), profile)]).unwrap();
    let mut sim = Sim::with_agents(Limits::default(), agents.clone());
    sent(sim.followup("A", "[[tool:sleep 1000]] go"));
    let log = sim.log.clone();
    drop(sim);
    let mut next = Sim::recover_with_agents(log, Limits::default(), agents, 2, 100);
    let lines = next.take();
    assert_eq!(lines[..2], ["D tool/repaired 1.1 call-1-1-1 interrupted", "D tool/result 1.1 call-1-1-1 error"]);
    assert_eq!(next.held_tools(), 0);
}

#[test]
fn s27_owner_killed_between_claim_and_step_start_restores_the_message() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "hello"));
    sent(sim.queue("B", "bee"));
    let log = sim.log.clone();
    assert_eq!(render_durable(&log[3]), "D spliced next-turn 0 1 []");
    drop(sim);
    let mut next = Sim::recover(log, Limits::default(), 2, 10);
    let expected = cat(&[
        &["D turn/end 1 interrupted", "D spliced next-turn 0 0 [A] restored", "L inserted A"],
        &strs(&echo_turn(2, "A", "hello")),
        &strs(&echo_turn(3, "B", "bee")),
        &IDLE,
    ]);
    next.expect(&strs(&expected));
    match &next.log[6].payload {
        EventPayload::InboxSpliced(s) => assert_eq!(s.outcome, SpliceOutcome::Restored),
        other => panic!("{other:?}"),
    }
    // The restored message is still the original acceptance: a retry returns its seq.
    assert_eq!(sent(next.followup("A", "hello")), (1, Some(1)));
}

#[test]
fn s27_owner_killed_after_a_later_proposal_claimed_a_steer() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 10]] go"));
    sent(sim.steer("S", "steer", None));
    sim.hold_presteps = true;
    sim.finish_tools();
    sim.take();
    let log = sim.log.clone();
    drop(sim);
    let mut next = Sim::recover(log, Limits::default(), 2, 10);
    next.expect(&[
        "D turn/end 1 interrupted",
        "D spliced next-step 0 0 [S] restored",
        "L inserted S",
        "D turn/start 2",
        "D spliced next-step 0 1 []",
        "L claimed S 2",
        "D step/start 2.1",
        "D user/message S 2.1",
        "D assistant/message 2.1 \"echo: steer\"",
        "D step/end 2.1",
        "D turn/end 2 completed",
        "D status idle",
        "L status idle",
    ]);
}

#[test]
fn s27_crash_before_status_running_resumes_the_wake() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "hello"));
    let log = sim.log[..1].to_vec();
    let mut next = Sim::recover(log, Limits::default(), 2, 10);
    let expected = cat(&[&RUNNING, &strs(&echo_turn(1, "A", "hello")), &IDLE]);
    next.expect(&strs(&expected));
}

#[test]
fn s27_crash_between_turn_end_and_status_idle_goes_idle() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "hello"));
    let log = sim.log[..sim.log.len() - 1].to_vec();
    let mut next = Sim::recover(log, Limits::default(), 2, 10);
    next.expect(&IDLE);
    assert!(next.driver.is_quiescent());
}

/// A log with tool steps, a steer, an inject, a parked-then-woken turn and a streamed reply.
fn crash_corpus() -> Sim {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 30]] first"));
    sent(sim.queue("B", "bee"));
    sent(sim.steer("S", "steer", None));
    sim.finish_tools();
    sent(sim.inject("I", "ctx"));
    sent(sim.followup("C", "[[delay:50]] sea"));
    sim.stream_one_delta();
    sim.settle();
    sim
}

/// Recovers from `log[..k]` for every `k` in `points`: every accepted message is admitted exactly once
/// or still pending (only when nothing woke the session), never lost or entered twice.
fn crash_failures(full: &[turnstile_model::Envelope], points: impl IntoIterator<Item = usize>) -> Vec<String> {
    let mut failures = Vec::new();
    for k in points {
        let mut next = Sim::recover(full[..k].to_vec(), Limits::default(), 2, 1_000);
        next.settle();
        assert!(next.driver.is_quiescent(), "crash after {k}: not idle");
        let mut accepted: Vec<String> = full[..k]
            .iter()
            .filter_map(|e| match &e.payload {
                EventPayload::InboxSpliced(s) if s.outcome == SpliceOutcome::None => {
                    Some(s.inserted.iter().map(|m| m.id.0.clone()).collect::<Vec<_>>())
                }
                _ => None,
            })
            .flatten()
            .collect();
        accepted.sort();
        let mut admitted: Vec<String> = next.user_messages().into_iter().map(|(id, ..)| id).collect();
        let (next_turn, next_step) = next.pending_ids();
        admitted.extend(next_turn);
        admitted.extend(next_step);
        admitted.sort();
        if admitted != accepted {
            failures.push(format!(
                "crash after seq {k}: admitted or pending {admitted:?}, accepted {accepted:?}, recovery wrote {:?}",
                next.take()
            ));
        }
        next.check_full_fold();
    }
    failures
}

/// A runner that appends each input's events as one batch can only stop between inputs.
#[test]
fn s26_crash_at_any_input_boundary_loses_and_duplicates_nothing() {
    let sim = crash_corpus();
    let points: Vec<usize> = sim.inbox_at.iter().map(|(seq, _)| *seq as usize).collect();
    assert!(points.len() > 10);
    let failures = crash_failures(&sim.log, points);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The runner writes each append group atomically (one message on JetStream, decision 0021), so a crash
/// can cut the log after any group. An input's events are one group unless it starts an operation between
/// two of them, so the cuts are input ends and those places (none of which may lose or duplicate input).
#[test]
fn s26_crash_after_any_append_batch_loses_and_duplicates_nothing() {
    let sim = crash_corpus();
    let points = sim.batch_ends.clone();
    assert!(points.len() > 10, "the corpus has groups to cut after: {points:?}");
    let failures = crash_failures(&sim.log, points);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn s26_resume_answers_the_interrupted_steps_prompt_not_the_whole_turn() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 30]] first"));
    sent(sim.steer("S", "[[delay:100]] steer", None));
    sim.finish_tools();
    // Mid-stream in step 1.2, which entered S.
    assert_eq!(sim.held_models(), 1);
    let log = sim.log.clone();
    let mut next = Sim::recover(log, Limits::default(), 2, 1_000);
    let req = next.model_requests[0].clone();
    assert_eq!(req.interrupted_prompt, vec![msg("S", "[[delay:100]] steer")]);
    next.settle();
    assert!(next.tool_requests.is_empty(), "step 1.1's tool call must not run again");
}

// ----- §2 limits ---------------------------------------------------------------------------------

#[test]
fn limits_oversized_content_is_invalid() {
    // "big" counts its id (3), its blocks' fields (10; 9 + 7) and 64 per block: 157.
    let mut sim = Sim::with_limits(Limits { max_message_bytes: 156, ..Limits::default() });
    let big = UserMessage {
        id: "big".into(),
        content: vec![
            ContentBlock::text("0123456789"),
            ContentBlock::Data { mime: "image/png".into(), bytes: vec![0; 7] },
        ]
        .into(),
        source: MessageSource::User,
    };
    let (kind, message) = refused(sim.send(big.clone(), Target::NextTurn, true, None));
    assert_eq!(kind, "invalid-argument");
    assert!(
        message.contains("big")
            && message.contains("157")
            && message.contains("156")
            && message.contains("limits.max_message_bytes"),
        "{message}"
    );
    assert!(sim.log.is_empty());
    // At the limit it is accepted.
    let fits = UserMessage {
        content: vec![ContentBlock::text("0123456789"), ContentBlock::text("abcdefghijklmno")].into(),
        ..big
    };
    assert_eq!(sent(sim.send(fits, Target::NextTurn, false, None)), (1, None));
    // Edits and interrupts check the size too.
    let (kind, _) = refused(sim.replace("big", msg("r", &"x".repeat(92))));
    assert_eq!(kind, "invalid-argument");
    let (kind, _) = refused(sim.interrupt("x", &"x".repeat(92)));
    assert_eq!(kind, "invalid-argument");
}

#[test]
fn limits_count_mime_types_and_empty_blocks() {
    // A MIME type is a field like any other, and a block with nothing in it still counts 64 bytes: a
    // message that carries its weight there is refused as one whose text is that large.
    let mut sim = Sim::with_limits(Limits { max_message_bytes: 1000, max_pending_bytes: 1000, ..Limits::default() });
    let mime_heavy = UserMessage {
        id: "m1".into(),
        content: vec![ContentBlock::Data { mime: "m".repeat(934), bytes: vec![1] }].into(),
        source: MessageSource::User,
    };
    let (kind, message) = refused(sim.send(mime_heavy, Target::NextTurn, false, None));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("1001") && message.contains("limits.max_message_bytes"), "{message}");
    let empties = |id: &str| UserMessage {
        id: id.into(),
        content: std::iter::once(ContentBlock::text("x")).chain(vec![ContentBlock::text(""); 6]).collect(),
        source: MessageSource::User,
    };
    // 2 + 1 + 7 × 64 = 451: two fit the pending bytes, the third is refused.
    sent(sim.send(empties("e1"), Target::NextTurn, false, None));
    sent(sim.send(empties("e2"), Target::NextTurn, false, None));
    let (kind, message) = refused(sim.send(empties("e3"), Target::NextTurn, false, None));
    assert_eq!(kind, "resource-exhausted");
    assert!(message.contains("limits.max_pending_bytes") && message.contains("902 bytes pending"), "{message}");
    assert_eq!(sim.driver.state().inbox.counted_bytes(), 902);
}

#[test]
fn limits_an_event_larger_than_the_journals_largest_is_invalid() {
    // The journal stores events of at most 2,000 bytes (1,024 of them the event's envelope): each message
    // below fits alone, a splice of two does not.
    let mut sim = Sim::with_limits(Limits { max_event_bytes: Some(2_000), ..Limits::default() });
    let (kind, message) = refused(sim.queue("big", &"x".repeat(1_000)));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("max_payload") && message.contains("2000"), "{message}");
    sent(sim.queue("a", &"x".repeat(480)));
    let (kind, _) = refused(sim.command(Command::Splice {
        target: Target::NextTurn,
        start: 0,
        delete_count: 0,
        inserted: vec![msg("b", &"x".repeat(480)), msg("c", &"x".repeat(480))],
    }));
    assert_eq!(kind, "invalid-argument");
    assert_eq!(sim.driver.state().inbox.len(), 1, "nothing of the refused splice was written");
}

#[test]
fn limits_default_max_message_is_one_mib() {
    let mut sim = Sim::new();
    // "ok" counts its id, its text and 64 for its block.
    let largest = 1024 * 1024 - 2 - 64;
    let (kind, message) = refused(sim.followup("ok", &"x".repeat(largest + 1)));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("1048577"), "{message}");
    assert_eq!(sent(sim.queue("ok", &"x".repeat(largest))), (1, None));
}

#[test]
fn limits_message_ids_and_sources() {
    let mut sim = Sim::new();
    let (kind, message) = refused(sim.followup(&"a".repeat(129), "x"));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("129"), "{message}");
    let (kind, _) = refused(sim.followup("", "x"));
    assert_eq!(kind, "invalid-argument");
    let goal = UserMessage {
        source: MessageSource::Goal { goal_id: "g".into(), revision: 1, round: 0 },
        ..msg("g0", "continue")
    };
    let (kind, message) = refused(sim.send(goal.clone(), Target::NextStep, false, None));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("round"), "{message}");
    let form = UserMessage {
        source: MessageSource::Plugin { plugin: "p".into(), form: Some("bogus".into()) },
        ..msg("p0", "x")
    };
    let (kind, message) = refused(sim.send(form, Target::NextStep, false, None));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("bogus"), "{message}");
    assert!(sim.log.is_empty());
    // Valid forms of each are accepted verbatim.
    assert_eq!(sent(sim.queue(&"a".repeat(128), "x")), (1, None));
    let goal1 = UserMessage { source: MessageSource::Goal { goal_id: "g".into(), revision: 1, round: 1 }, ..goal };
    assert_eq!(sent(sim.send(goal1.clone(), Target::NextStep, false, None)), (2, None));
    assert_eq!(sim.driver.state().inbox.next_step, vec![goal1]);
}

#[test]
fn limits_pending_items_across_both_lists() {
    let mut sim = Sim::with_limits(Limits { max_pending: 3, ..Limits::default() });
    sent(sim.queue("Q1", "a"));
    sent(sim.inject("I1", "b"));
    sent(sim.queue("Q2", "c"));
    sim.take();
    for reply in [
        sim.queue("Q3", "d"),
        sim.inject("I2", "e"),
        sim.followup("F", "f"),
        sim.steer("S", "s", None),
        sim.interrupt("X", "x"),
        sim.command(Command::Splice {
            target: Target::NextStep,
            start: 0,
            delete_count: 0,
            inserted: vec![msg("Z", "z")],
        }),
    ] {
        let (kind, message) = refused(reply);
        assert_eq!(kind, "resource-exhausted");
        assert!(message.contains("limit is 3"), "{message}");
    }
    sim.expect_nothing();
    assert_eq!(sim.driver.state().last_turn, 0, "a refused followup opens no turn");
    // A replace keeps the count.
    written(sim.replace("Q2", msg("Q2b", "c2")));
    // The refused ids were never accepted: after room is made they are new messages.
    written(sim.remove("Q1"));
    assert_eq!(sent(sim.queue("Q3", "d")), (6, None));
}

#[test]
fn limits_pending_content_bytes_across_both_lists() {
    // Each message counts its id, its text and 64 for its block. 208 bytes pending at most: "aaaa" (70) +
    // "bbbb" (70) leaves room for 68 more.
    let mut sim = Sim::with_limits(Limits { max_pending_bytes: 208, ..Limits::default() });
    sent(sim.queue("Q1", "aaaa"));
    sent(sim.inject("I1", "bbbb"));
    sim.take();
    for reply in [
        sim.queue("Q2", "cccc"),
        sim.inject("I2", "cccc"),
        sim.followup("F", "cccc"),
        sim.steer("S", "cccc", None),
        sim.interrupt("X", "cccc"),
        sim.replace("Q1", msg("Q1b", &"a".repeat(75))),
        sim.command(Command::Splice {
            target: Target::NextTurn,
            start: 0,
            delete_count: 0,
            inserted: vec![msg("Z1", "z"), msg("Z2", "zz")],
        }),
    ] {
        let (kind, message) = refused(reply);
        assert_eq!(kind, "resource-exhausted");
        assert!(
            message.contains("limits.max_pending_bytes") && message.contains("above the limit of 208"),
            "{message}"
        );
    }
    sim.expect_nothing();
    assert_eq!(sim.driver.state().inbox.counted_bytes(), 140, "a refused delivery adds nothing");
    assert_eq!(sim.driver.state().last_turn, 0, "a refused followup opens no turn");
    // Exactly at the limit is accepted; a splice that removes as much as it inserts too.
    sent(sim.queue("Q3", "cc"));
    written(sim.command(Command::Splice {
        target: Target::NextTurn,
        start: 0,
        delete_count: 1,
        inserted: vec![msg("Z3", "zzzz")],
    }));
    assert_eq!(sim.driver.state().inbox.counted_bytes(), 208);
    // The refused ids were never accepted: once room is made they are new messages.
    written(sim.remove("Z3"));
    assert_eq!(sim.driver.state().inbox.counted_bytes(), 138);
    sent(sim.queue("Q2", "ccc"));
    assert_eq!(sim.driver.state().inbox.counted_bytes(), 207);
}

// ----- handoff: cut after a tool step, and drain -------------------------------------------------

#[test]
fn s26_cut_after_a_tool_step_resumes_by_answering_its_results() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 30]] first"));
    sim.hold_presteps = true;
    sim.finish_tools();
    assert_eq!(sim.held_pre_steps(), 1, "the next proposal waits for its decision");
    let log = sim.log.clone();
    assert_eq!(log.last().map(|e| e.event_type()), Some("step/end"));

    let mut next = Sim::recover(log, Limits::default(), 2, 1_000);
    next.settle();
    let lines = next.lines();
    assert!(lines.contains(&"D turn/end 1 interrupted".to_owned()), "{lines:#?}");
    let req = &next.model_requests[0];
    assert_eq!((req.turn, req.step), (2, 1));
    assert!(req.messages.is_empty() && req.interrupted_prompt.is_empty());
    assert_eq!(req.tool_results.iter().map(|r| r.output.as_str()).collect::<Vec<_>>(), ["slept 30"]);
    assert_eq!(next.assistant_text(2, 1).as_deref(), Some("tool results: sleep: slept 30"));
    assert!(next.tool_requests.is_empty(), "the tool does not run again");
    assert!(next.driver.is_quiescent());
}

#[test]
fn drain_finishes_the_running_step_then_stops_without_claiming() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:sleep 30]] first"));
    sent(sim.queue("B", "bee"));
    sim.driver.on_drain();
    assert!(!sim.driver.is_parked(), "a tool call is running");
    sim.finish_tools();
    assert!(sim.driver.is_parked());
    assert_eq!(sim.held_pre_steps(), 0, "no proposal after the drain");
    let log = sim.log.clone();
    let tail: Vec<&str> = log.iter().rev().take(2).map(|e| e.event_type()).collect();
    assert_eq!(tail, ["step/end", "tool/result"], "the step finished and nothing was claimed");

    // The next owner repairs, answers the tool results, then runs the queued prompt.
    let mut next = Sim::recover(log, Limits::default(), 2, 1_000);
    next.settle();
    assert_eq!(next.assistant_text(2, 1).as_deref(), Some("tool results: sleep: slept 30"));
    assert_eq!(next.assistant_text(3, 1).as_deref(), Some("echo: bee"));
    assert!(next.driver.is_quiescent());
}

#[test]
fn drain_during_a_pre_step_leaves_the_claim_for_the_next_owner_to_restore() {
    let mut sim = Sim::new();
    sim.hold_presteps = true;
    sent(sim.followup("A", "hello"));
    sim.driver.on_drain();
    assert!(sim.driver.is_parked());
    sim.decide_pre_steps();
    assert!(sim.model_requests.is_empty(), "a decision after the drain starts no step");
    let mut next = Sim::recover(sim.log.clone(), Limits::default(), 2, 1_000);
    next.settle();
    let lines = next.lines();
    assert!(lines.contains(&"D turn/end 1 interrupted".to_owned()), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.starts_with("D spliced next-turn 0 0 [A]") && l.ends_with("restored")),
        "{lines:#?}"
    );
    assert_eq!(next.assistant_text(2, 1).as_deref(), Some("echo: hello"));
}
