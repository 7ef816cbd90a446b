//! The agent profiles the driver needs (SPEC §8): their names, system prompts and history budgets.
//!
//! The driver validates `ConfigureSession` against these names and builds each step's model request
//! from the running agent's profile. The rest of a profile (model endpoint, tools, hooks) is the
//! runner's business, so it stays out of this sans-IO crate.

use std::collections::BTreeMap;

use turnstile_model::transcript::DEFAULT_TRANSCRIPT_TURNS;

/// The built-in agent of a process without a configuration file.
pub const SCRIPTED: &str = "scripted";

/// What the driver knows of one agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentProfile {
    /// Sent first in every model request of this agent.
    pub system: Option<String>,
    /// Whole turns before the current one that a model request carries.
    pub history_turns: u32,
}

impl Default for AgentProfile {
    fn default() -> Self {
        Self { system: None, history_turns: DEFAULT_TRANSCRIPT_TURNS }
    }
}

/// A catalog that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("the default agent {default:?} is not among the agents ({known})")]
    UnknownDefault { default: String, known: String },
}

/// The agents by name, and the one a session runs until `ConfigureSession` names another.
///
/// ```
/// let catalog = turnstile_driver::AgentCatalog::default();
/// assert_eq!(catalog.default_agent(), "scripted");
/// assert_eq!(catalog.get("scripted").unwrap().history_turns, 100);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCatalog {
    default_agent: String,
    agents: BTreeMap<String, AgentProfile>,
}

impl Default for AgentCatalog {
    /// The single agent `scripted`, with no system prompt and 100 turns of history.
    fn default() -> Self {
        Self {
            default_agent: SCRIPTED.to_owned(),
            agents: BTreeMap::from([(SCRIPTED.to_owned(), AgentProfile::default())]),
        }
    }
}

impl AgentCatalog {
    /// A catalog of `agents` whose default is `default_agent`, which must be one of them.
    pub fn new(
        default_agent: impl Into<String>,
        agents: impl IntoIterator<Item = (String, AgentProfile)>,
    ) -> Result<Self, CatalogError> {
        let default_agent = default_agent.into();
        let agents: BTreeMap<String, AgentProfile> = agents.into_iter().collect();
        if !agents.contains_key(&default_agent) {
            return Err(CatalogError::UnknownDefault {
                default: default_agent,
                known: agents.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(Self { default_agent, agents })
    }

    pub fn default_agent(&self) -> &str {
        &self.default_agent
    }

    pub fn get(&self, name: &str) -> Option<&AgentProfile> {
        self.agents.get(name)
    }

    /// The agent names, sorted (for messages that list them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// The largest history budget: how many turns the transcript must keep before the newest.
    pub fn max_history_turns(&self) -> u32 {
        self.agents.values().map(|a| a.history_turns).max().unwrap_or(DEFAULT_TRANSCRIPT_TURNS)
    }

    /// The agent a session runs: the configured one when this catalog knows it, else the default (a
    /// configuration that dropped an agent must not strand its sessions).
    pub fn resolve<'a>(&'a self, configured: Option<&'a str>) -> (&'a str, &'a AgentProfile) {
        if let Some(name) = configured
            && let Some(profile) = self.agents.get(name)
        {
            return (name, profile);
        }
        let profile = self.agents.get(&self.default_agent);
        match profile {
            Some(p) => (&self.default_agent, p),
            // `new` guarantees the default exists; an empty profile keeps this total anyway.
            None => (&self.default_agent, &FALLBACK),
        }
    }
}

static FALLBACK: AgentProfile = AgentProfile { system: None, history_turns: DEFAULT_TRANSCRIPT_TURNS };
