//! SPEC §13 child sessions against the sans-IO driver: what the child's driver does with `spawn_agent`'s
//! [`Command::Spawn`], and how a parent's cancel ends the child's turn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, msg, refused, sent, session, written};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits};
use turnstile_model::{CancelCause, Command, SessionRef, Spawn, UserMessage};

fn parent() -> SessionRef {
    SessionRef::new("tenant", "planner").unwrap()
}

fn spawn(agent: &str, prompt: UserMessage) -> Command {
    Command::Spawn(Box::new(Spawn { parent: parent(), agent: agent.into(), prompt }))
}

/// The scripted agent and a second one, `researcher`, with its own system prompt.
fn two_agents() -> AgentCatalog {
    AgentCatalog::new(
        "scripted",
        [
            ("scripted".to_owned(), AgentProfile::default()),
            ("researcher".to_owned(), AgentProfile { system: Some("You research.".into()), ..AgentProfile::default() }),
        ],
    )
    .unwrap()
}

#[test]
fn a_spawn_configures_the_child_with_its_parent_and_runs_the_prompt_in_one_group() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    assert_eq!(sent(sim.command(spawn("researcher", msg("spawn:call-1-1-1", "find it")))), (2, Some(1)));
    let lines = sim.take();
    assert_eq!(lines[0], "D session/configured researcher pending parent=tenant/planner");
    assert_eq!(lines[1], "D spliced next-turn 0 0 [spawn:call-1-1-1] wake");
    assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:?}");
    // The child runs the agent it was given from its first turn.
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.system.as_deref(), Some("You research."));
    assert_eq!(sim.driver.state().parent, Some(parent()));
    assert_eq!(sim.driver.state().agent.as_deref(), Some("researcher"));
    // The configuration, the splice, status, turn/start and the claim are durable together.
    assert_eq!(sim.batch_ends[0], 5, "{:?}", sim.batch_ends);
    sim.check_full_fold();
}

#[test]
fn a_retried_spawn_gets_its_first_acceptance_and_writes_nothing() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    let first = sent(sim.command(spawn("researcher", msg("spawn:c1", "find it"))));
    sim.take();
    assert_eq!(sent(sim.command(spawn("researcher", msg("spawn:c1", "find it")))), first);
    sim.expect_nothing();
}

#[test]
fn a_spawn_onto_a_session_that_is_not_the_parents_child_is_already_exists() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    sim.followup("A", "mine").unwrap();
    sim.take();
    let (kind, message) = refused(sim.command(spawn("researcher", msg("spawn:c1", "take over"))));
    assert_eq!(kind, "already-exists");
    assert_eq!(
        message,
        format!(
            "session {} already exists (last seq {}) and is not a child of tenant/planner; a child session is \
             created by its parent's spawn_agent call only",
            session(),
            sim.log.len()
        )
    );
    sim.expect_nothing();
}

#[test]
fn a_spawn_naming_an_unknown_agent_or_no_other_session_is_refused_and_writes_nothing() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    let (kind, message) = refused(sim.command(spawn("writer", msg("spawn:c1", "write"))));
    assert_eq!(kind, "invalid-argument");
    assert_eq!(message, "agent \"writer\" is not configured; known agents: researcher, scripted");
    let own = Command::Spawn(Box::new(Spawn { parent: session(), agent: "scripted".into(), prompt: msg("p", "x") }));
    let (kind, message) = refused(sim.command(own));
    assert_eq!(kind, "invalid-argument");
    assert!(message.contains("a child is another session of the same tenant"), "{message}");
    let elsewhere = SessionRef::new("other-tenant", "planner").unwrap();
    let across = Command::Spawn(Box::new(Spawn { parent: elsewhere, agent: "scripted".into(), prompt: msg("p", "x") }));
    assert_eq!(refused(sim.command(across)).0, "invalid-argument");
    // A prompt that is not a valid message is refused before the configuration is written.
    let too_long = msg("spawn:c2", &"x".repeat(Limits::default().max_message_bytes + 1));
    assert_eq!(refused(sim.command(spawn("scripted", too_long))).0, "invalid-argument");
    sim.expect_nothing();
    assert_eq!(sim.log.len(), 0);
}

#[test]
fn a_parents_cancel_ends_the_childs_turn_aborted_parent() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    sent(sim.command(spawn("researcher", msg("spawn:c1", "[[tool:sleep 5000]] dig"))));
    assert_eq!(sim.held_tools(), 1, "the child's tool call runs");
    written(sim.cancel(CancelCause::Parent, false));
    sim.settle();
    let lines = sim.take();
    assert!(lines.contains(&"D turn/end 1 aborted{parent}".to_owned()), "{lines:?}");
    // The child stays a child: its link survives the cancel and a later reconfiguration.
    written(sim.command(Command::Configure {
        agent: "scripted".into(),
        inject_mode: Default::default(),
        version: None,
        overrides: Default::default(),
    }));
    assert_eq!(sim.driver.state().parent, Some(parent()));
    sim.check_full_fold();
}

#[test]
fn a_new_owner_of_a_child_keeps_its_parent_and_agent() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents());
    sent(sim.command(spawn("researcher", msg("spawn:c1", "find it"))));
    let recovered = Sim::recover_with_agents(sim.log.clone(), Limits::default(), two_agents(), 2, 10_000);
    assert_eq!(recovered.driver.state().parent, Some(parent()));
    assert_eq!(recovered.driver.state().agent.as_deref(), Some("researcher"));
}
