//! SPEC §8 against the sans-IO driver: `ConfigureSession` and the context of model requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, msg, refused, sent, written};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits};
use turnstile_model::{Command, InjectMode, ToolCallSpec, TranscriptEntry};

/// A request's history as plain entries, to compare with expected ones.
fn entries(history: &[std::sync::Arc<TranscriptEntry>]) -> Vec<TranscriptEntry> {
    history.iter().map(|e| TranscriptEntry::clone(e)).collect()
}

fn configure(sim: &mut Sim, agent: &str, inject_mode: InjectMode) -> support::Reply {
    sim.command(Command::Configure { agent: agent.into(), inject_mode, version: None, overrides: Default::default() })
}

fn two_agents(history_turns: u32) -> AgentCatalog {
    AgentCatalog::new(
        "scripted",
        [
            ("scripted".to_owned(), AgentProfile::default()),
            (
                "short".to_owned(),
                AgentProfile { system: Some("Be brief.".into()), history_turns, ..AgentProfile::default() },
            ),
        ],
    )
    .unwrap()
}

fn user(turn: u64, step: u32, id: &str, text: &str) -> TranscriptEntry {
    TranscriptEntry::User { turn, step, message: msg(id, text) }
}

fn assistant(turn: u64, step: u32, text: &str) -> TranscriptEntry {
    TranscriptEntry::Assistant { turn, step, text: text.into(), tool_calls: vec![], interrupted: false }
}

#[test]
fn configure_writes_one_durable_event_and_a_repeat_writes_nothing() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents(1));
    assert_eq!(written(configure(&mut sim, "short", InjectMode::OutOfTurn)), 1);
    sim.expect(&["D session/configured short out-of-turn"]);
    assert_eq!(written(configure(&mut sim, "short", InjectMode::OutOfTurn)), 1);
    sim.expect_nothing();
    assert_eq!(sim.driver.state().agent.as_deref(), Some("short"));
    assert_eq!(sim.driver.state().inject_mode, InjectMode::OutOfTurn);
    assert_eq!(sim.driver.summary().agent, "short");
    sim.check_full_fold();
}

#[test]
fn configuring_the_default_on_a_new_session_is_recorded() {
    let mut sim = Sim::new();
    assert_eq!(sim.driver.summary().agent, "scripted");
    assert_eq!(written(configure(&mut sim, "scripted", InjectMode::Pending)), 1);
    sim.expect(&["D session/configured scripted pending"]);
}

#[test]
fn unknown_agent_is_invalid_and_lists_the_known_ones() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents(1));
    let (kind, message) = refused(configure(&mut sim, "nope", InjectMode::Pending));
    assert_eq!(kind, "invalid-argument");
    assert_eq!(message, "agent \"nope\" is not configured; known agents: scripted, short");
    sim.expect_nothing();
}

#[test]
fn configure_while_running_fails_naming_the_turn() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents(1));
    sent(sim.followup("A", "[[delay:1000]] slow answer"));
    sim.take();
    let (kind, message) = refused(configure(&mut sim, "short", InjectMode::Pending));
    assert_eq!(kind, "failed-precondition");
    assert!(message.contains("is running turn 1"), "{message}");
    sim.expect_nothing();
}

#[test]
fn a_configured_agent_applies_from_the_next_turn_with_its_system_prompt() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents(5));
    sent(sim.followup("A", "hello"));
    assert_eq!(written(configure(&mut sim, "short", InjectMode::Pending)), 11);
    sent(sim.followup("B", "again"));
    let requests = &sim.model_requests;
    assert_eq!(requests.len(), 2);
    assert_eq!((requests[0].agent.as_str(), requests[0].system.as_deref()), ("scripted", None));
    assert_eq!((requests[1].agent.as_str(), requests[1].system.as_deref()), ("short", Some("Be brief.")));
}

#[test]
fn the_second_turn_sees_the_first_turns_prompt_and_reply_in_order() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "hello"));
    sent(sim.followup("B", "again"));
    let requests = &sim.model_requests;
    assert_eq!(requests[0].history, vec![]);
    assert_eq!(entries(&requests[1].history), vec![user(1, 1, "A", "hello"), assistant(1, 1, "echo: hello")]);
    assert_eq!(requests[1].messages, vec![msg("B", "again")]);
    // The scripted model still answers the step alone.
    assert_eq!(sim.assistant_text(2, 1).unwrap(), "echo: again");
}

#[test]
fn tool_calls_pair_with_their_results_in_the_history() {
    let mut sim = Sim::new();
    sent(sim.followup("A", "[[tool:echo hi there]] go"));
    sent(sim.followup("B", "next"));
    let call = ToolCallSpec { call_id: "call-1-1-1".into(), name: "echo".into(), arguments: "hi there".into() };
    let turn1 = vec![
        user(1, 1, "A", "[[tool:echo hi there]] go"),
        TranscriptEntry::Assistant {
            turn: 1,
            step: 1,
            text: "echo: go".into(),
            tool_calls: vec![call],
            interrupted: false,
        },
        TranscriptEntry::ToolResult {
            turn: 1,
            step: 1,
            call_id: "call-1-1-1".into(),
            name: "echo".into(),
            output: "hi there".into(),
            error: None,
        },
    ];
    let requests = &sim.model_requests;
    assert_eq!(requests.len(), 3);
    // Step 1.2 answers the tool result: its history is the whole turn so far, current turn uncut.
    assert_eq!(entries(&requests[1].history), turn1);
    let mut expected = turn1;
    expected.push(assistant(1, 2, "tool results: echo: hi there"));
    assert_eq!(entries(&requests[2].history), expected);
}

#[test]
fn history_turns_drops_the_oldest_whole_turns() {
    let mut sim = Sim::with_agents(Limits::default(), two_agents(1));
    written(configure(&mut sim, "short", InjectMode::Pending));
    sent(sim.followup("A", "one"));
    sent(sim.followup("B", "[[tool:echo x]] two"));
    sent(sim.followup("C", "three"));
    let requests = &sim.model_requests;
    assert_eq!(requests.len(), 4);
    let turn3 = &requests[3];
    assert_eq!((turn3.turn, turn3.step), (3, 1));
    // Only turn 2 is left, whole: its call and result stay together; turn 1 is gone.
    let turns: Vec<(u64, u32)> = turn3.history.iter().map(|e| (e.turn(), e.step())).collect();
    assert_eq!(turns, vec![(2, 1), (2, 1), (2, 1), (2, 2)]);
    assert!(
        matches!(turn3.history[2].as_ref(), TranscriptEntry::ToolResult { call_id, .. } if call_id == "call-2-1-1")
    );
    // The second step of turn 2 still saw turn 1 (one earlier turn) and all of turn 2 so far.
    let turn2_step2: Vec<(u64, u32)> = requests[2].history.iter().map(|e| (e.turn(), e.step())).collect();
    assert_eq!(turn2_step2, vec![(1, 1), (1, 1), (2, 1), (2, 1), (2, 1)]);
}

/// A catalog whose tenant-owned agent `helper` has versions 1..=n, each with system prompt `vN`.
fn helper_versions(n: u64, pin: bool) -> AgentCatalog {
    let mut catalog = AgentCatalog::default();
    for version in 1..=n {
        let owner = turnstile_driver::AgentOwner::Tenant(support::session().tenant);
        let profile = AgentProfile {
            system: Some(format!("v{version}")),
            version,
            hash: format!("hash{version}"),
            pin,
            ..AgentProfile::default()
        };
        catalog.add_version(owner, "helper", profile);
    }
    catalog
}

fn configure_version(sim: &mut Sim, version: Option<u64>) -> support::Reply {
    sim.command(Command::Configure {
        agent: "helper".into(),
        inject_mode: InjectMode::Pending,
        version,
        overrides: Default::default(),
    })
}

fn last_request(sim: &Sim) -> (Option<String>, String) {
    let r = sim.model_requests.last().unwrap();
    (r.system.clone(), r.agent_hash.clone())
}

/// SPEC §20: a session configured on a pinning version keeps it when the agent changes; `MigrateSessions`
/// moves it, durably and from its next turn.
#[test]
fn a_pinned_session_keeps_its_version_until_migrated() {
    let mut sim = Sim::with_agents(Limits::default(), helper_versions(1, true));
    written(configure_version(&mut sim, Some(1)));
    sim.expect(&["D session/configured helper pending version=1"]);
    sim.driver.set_agents(helper_versions(2, true));
    sent(sim.followup("a", "hi"));
    sim.finish_model();
    assert_eq!(last_request(&sim), (Some("v1".into()), "hash1".into()));
    written(sim.command(Command::Migrate { agent: "helper".into(), version: 2 }));
    assert_eq!(sim.driver.state().agent_version, Some(2));
    sent(sim.followup("b", "again"));
    sim.finish_model();
    assert_eq!(last_request(&sim), (Some("v2".into()), "hash2".into()));
    let (kind, _) = refused(sim.command(Command::Migrate { agent: "helper".into(), version: 9 }));
    assert_eq!(kind, "invalid-argument");
    let (kind, _) = refused(sim.command(Command::Migrate { agent: "other".into(), version: 1 }));
    assert_eq!(kind, "failed-precondition");
    sim.check_full_fold();
}

/// `version_policy = "latest"`: the next turn runs the newest version and records it before `turn/start`.
#[test]
fn a_latest_session_records_the_newest_version_at_its_next_turn() {
    let mut sim = Sim::with_agents(Limits::default(), helper_versions(1, false));
    written(configure_version(&mut sim, Some(1)));
    sim.take();
    sim.driver.set_agents(helper_versions(2, false));
    sent(sim.followup("a", "hi"));
    sim.finish_model();
    assert_eq!(last_request(&sim), (Some("v2".into()), "hash2".into()));
    assert_eq!(sim.driver.state().agent_version, Some(2));
    let lines = sim.take();
    let configured = lines.iter().position(|l| l == "D session/configured helper pending version=2").unwrap();
    let start = lines.iter().position(|l| l == "D turn/start 1").unwrap();
    assert!(configured < start, "{lines:?}");
    sim.check_full_fold();
}
