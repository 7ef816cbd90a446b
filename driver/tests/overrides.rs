//! SPEC §20 against the sans-IO driver: session overrides through `ConfigureSession`, within what the
//! agent allows, applied from the next turn and by every later owner.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Sim, refused, sent, written};
use turnstile_driver::{AgentCatalog, AgentProfile, Limits};
use turnstile_model::overrides::{OverridePolicy, SessionOverrides};
use turnstile_model::{Command, InjectMode};

/// `helper`: system prompt "Be brief.", tools clock and echo, sessions may add a prompt, run `large` and
/// narrow its tools (when `allow`), or nothing.
fn catalog(allow: bool) -> AgentCatalog {
    let overrides = if allow {
        OverridePolicy { system_prompt: true, models: vec!["small".into(), "large".into()], tools: true }
    } else {
        OverridePolicy::default()
    };
    let helper = AgentProfile {
        system: Some("Be brief.".into()),
        tools: vec!["clock".into(), "echo".into()],
        overrides,
        ..AgentProfile::default()
    };
    AgentCatalog::new("scripted", [("scripted".to_owned(), AgentProfile::default()), ("helper".to_owned(), helper)])
        .unwrap()
}

fn configure(sim: &mut Sim, overrides: SessionOverrides) -> support::Reply {
    sim.command(Command::Configure {
        agent: "helper".into(),
        inject_mode: InjectMode::Pending,
        version: None,
        overrides,
    })
}

fn french_large_echo() -> SessionOverrides {
    SessionOverrides {
        system_prompt: Some("Answer in French.".into()),
        model: Some("large".into()),
        tools: Some(vec!["echo".into()]),
    }
}

#[test]
fn overrides_are_recorded_once_and_a_repeat_writes_nothing() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(true));
    written(configure(&mut sim, french_large_echo()));
    sim.expect(&[
        "D session/configured helper pending",
        "D session/overridden system=Some(\"Answer in French.\") model=Some(\"large\") tools=Some([\"echo\"])",
    ]);
    written(configure(&mut sim, french_large_echo()));
    sim.expect_nothing();
    assert_eq!(sim.driver.state().overrides, french_large_echo());
    // All of them at once: a configure without overrides clears them, and writes only that.
    written(configure(&mut sim, SessionOverrides::default()));
    sim.expect(&["D session/overridden system=None model=None tools=None"]);
    assert!(sim.driver.state().overrides.is_empty());
    sim.check_full_fold();
}

#[test]
fn the_next_turn_runs_the_extra_prompt_the_model_and_the_subset() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(true));
    written(configure(&mut sim, french_large_echo()));
    sent(sim.followup("a", "[[tool:echo hi]] go"));
    sim.settle();
    let request = &sim.model_requests[0];
    assert_eq!(request.system.as_deref(), Some("Be brief.\n\nAnswer in French."));
    assert_eq!(request.overrides.model.as_deref(), Some("large"));
    assert_eq!(request.overrides.tools, Some(vec!["echo".to_owned()]));
    assert_eq!(sim.tool_requests[0].tools, Some(vec!["echo".to_owned()]), "the runner refuses any other tool");
}

#[test]
fn overrides_survive_a_new_owner() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(true));
    written(configure(&mut sim, french_large_echo()));
    let mut next = Sim::recover_with_agents(sim.log.clone(), Limits::default(), catalog(true), 2, 1_000);
    assert_eq!(next.driver.state().overrides, french_large_echo());
    sent(next.followup("a", "hello"));
    let request = next.model_requests.last().unwrap();
    assert_eq!(request.system.as_deref(), Some("Be brief.\n\nAnswer in French."));
    assert_eq!(request.overrides.model.as_deref(), Some("large"));
}

#[test]
fn an_override_the_agent_does_not_allow_is_a_failed_precondition_naming_the_field() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(false));
    for (overrides, field) in [
        (SessionOverrides { system_prompt: Some("x".into()), ..SessionOverrides::default() }, "system_prompt"),
        (SessionOverrides { model: Some("large".into()), ..SessionOverrides::default() }, "model"),
        (SessionOverrides { tools: Some(vec![]), ..SessionOverrides::default() }, "tools"),
    ] {
        let (kind, message) = refused(configure(&mut sim, overrides));
        assert_eq!(kind, "failed-precondition");
        assert!(message.starts_with(&format!("overrides.{field}: agent \"helper\" does not allow")), "{message}");
    }
    sim.expect_nothing();
}

#[test]
fn a_model_or_tool_the_agent_does_not_have_is_invalid() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(true));
    let (kind, message) =
        refused(configure(&mut sim, SessionOverrides { model: Some("huge".into()), ..SessionOverrides::default() }));
    assert_eq!(kind, "invalid-argument");
    assert_eq!(
        message,
        "overrides.model: \"huge\" is not one of the models agent \"helper\" allows (allowed: small, large)"
    );
    let tools = SessionOverrides { tools: Some(vec!["echo".into(), "sleep".into()]), ..SessionOverrides::default() };
    let (kind, message) = refused(configure(&mut sim, tools));
    assert_eq!(kind, "invalid-argument");
    assert_eq!(
        message,
        "overrides.tools[1]: \"sleep\" is not one of agent \"helper\"'s tools (its tools: clock, echo)"
    );
    sim.expect_nothing();
}

#[test]
fn a_version_that_stops_allowing_an_override_stops_applying_it() {
    let mut sim = Sim::with_agents(Limits::default(), catalog(true));
    written(configure(&mut sim, french_large_echo()));
    sim.driver.set_agents(catalog(false));
    sent(sim.followup("a", "hello"));
    let request = sim.model_requests.last().unwrap();
    assert_eq!(request.system.as_deref(), Some("Be brief."));
    assert!(request.overrides.is_empty());
    // Still recorded: an agent that allows them again applies them again.
    assert_eq!(sim.driver.state().overrides, french_large_echo());
}
