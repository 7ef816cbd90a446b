//! The agent profiles the driver needs (SPEC §8): their names, system prompts and history budgets.
//!
//! The driver validates `ConfigureSession` against these names and builds each step's model request
//! from the running agent's profile. The rest of a profile (model endpoint, tools, hooks) is the
//! runner's business, so it stays out of this sans-IO crate.

use std::collections::BTreeMap;
use std::sync::Arc;

use turnstile_model::TenantScope;
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
    /// The tool calls that wait for a human's decision before they run (SPEC §9).
    pub approval: ApprovalRules,
    /// Estimated request size (UTF-8 bytes / 4) above which a step first compacts the oldest whole
    /// turns (SPEC §13); `None` never compacts by itself.
    pub context_budget_tokens: Option<u64>,
    /// The tenants whose sessions may run this agent (decision 0091); to any other tenant it does not exist.
    pub tenants: TenantScope,
    /// How long a call waits for a decision before the driver decides it (SPEC §21); `None`: for ever.
    pub approval_timeout: Option<ApprovalTimeout>,
}

/// An agent's approval deadline: `after_ms` after its `tool/call`, a waiting call is approved or denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApprovalTimeout {
    pub after_ms: u64,
    /// The `on_timeout = "approve"` of the agent; denied otherwise.
    pub approve: bool,
}

impl Default for AgentProfile {
    fn default() -> Self {
        Self {
            system: None,
            history_turns: DEFAULT_TRANSCRIPT_TURNS,
            approval: ApprovalRules::default(),
            context_budget_tokens: None,
            tenants: TenantScope::All,
            approval_timeout: None,
        }
    }
}

/// Which calls of an agent wait for a human's decision (SPEC §9), asked by the name the model calls the
/// tool by (a built-in by its name, an MCP tool as `SERVER__TOOL`, a client tool by its name).
///
/// The rule is a pure function the worker builds from the agent's `approval` patterns, which only it can
/// read (it knows which name is which kind of tool); the driver just asks it.
///
/// ```
/// use turnstile_driver::ApprovalRules;
///
/// let rules = ApprovalRules::new(|tool| tool.starts_with("files__write"));
/// assert!(rules.requires("files__write_file"));
/// assert!(!rules.requires("clock"));
/// assert!(!ApprovalRules::default().requires("files__write_file"));
/// ```
#[derive(Clone, Default)]
pub struct ApprovalRules(Option<Arc<ApprovalRule>>);

/// Whether a call of the named tool waits for a decision.
type ApprovalRule = dyn Fn(&str) -> bool + Send + Sync;

impl ApprovalRules {
    pub fn new(requires: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(requires)))
    }

    /// A call of `tool` waits for a decision.
    pub fn requires(&self, tool: &str) -> bool {
        self.0.as_ref().is_some_and(|rule| rule(tool))
    }
}

impl std::fmt::Debug for ApprovalRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ApprovalRules(..)" } else { "ApprovalRules(none)" })
    }
}

impl PartialEq for ApprovalRules {
    /// The same rule object (rules are functions; two built apart are never equal).
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for ApprovalRules {}

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

    /// The agent `name` as `tenant`'s sessions see it: `None` when it does not exist or does not serve
    /// `tenant` (the two are one answer, so a tenant learns nothing of agents confined to others).
    pub fn get_for(&self, name: &str, tenant: &str) -> Option<&AgentProfile> {
        self.agents.get(name).filter(|a| a.tenants.allows(tenant))
    }

    /// The agent names, sorted (for messages that list them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// The names of the agents `tenant`'s sessions may run, sorted.
    pub fn names_for<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a str> {
        self.agents.iter().filter(move |(_, a)| a.tenants.allows(tenant)).map(|(name, _)| name.as_str())
    }

    /// The largest history budget: how many turns the transcript must keep before the newest.
    pub fn max_history_turns(&self) -> u32 {
        self.agents.values().map(|a| a.history_turns).max().unwrap_or(DEFAULT_TRANSCRIPT_TURNS)
    }

    /// The agent a session of `tenant` runs: the configured one when this catalog knows it and it serves
    /// `tenant`, else the default (a configuration that dropped an agent, or confined it to other tenants,
    /// must not strand its sessions, nor run another tenant's agent for them).
    pub fn resolve<'a>(&'a self, configured: Option<&'a str>, tenant: &str) -> (&'a str, &'a AgentProfile) {
        if let Some(name) = configured
            && let Some(profile) = self.get_for(name, tenant)
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

static FALLBACK: AgentProfile = AgentProfile {
    system: None,
    history_turns: DEFAULT_TRANSCRIPT_TURNS,
    approval: ApprovalRules(None),
    context_budget_tokens: None,
    tenants: TenantScope::All,
    approval_timeout: None,
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use turnstile_model::{Tenant, TenantScope};

    use super::*;

    /// Decision 0091: to another tenant an agent confined to `a` does not exist: not found, not listed, and a
    /// session of that tenant recorded as running it (an import, an older configuration) runs the default.
    #[test]
    fn an_agent_confined_to_a_tenant_does_not_exist_for_the_others() {
        let only_a = AgentProfile {
            tenants: TenantScope::only([Tenant::new("a").unwrap()]),
            history_turns: 7,
            ..AgentProfile::default()
        };
        let catalog = AgentCatalog::new(
            SCRIPTED,
            [(SCRIPTED.to_owned(), AgentProfile::default()), ("only-a".to_owned(), only_a)],
        )
        .unwrap();
        assert!(catalog.get_for("only-a", "a").is_some());
        assert!(catalog.get_for("only-a", "b").is_none());
        assert_eq!(catalog.names_for("a").collect::<Vec<_>>(), ["only-a", SCRIPTED]);
        assert_eq!(catalog.names_for("b").collect::<Vec<_>>(), [SCRIPTED]);
        assert_eq!(catalog.resolve(Some("only-a"), "a").0, "only-a");
        assert_eq!(catalog.resolve(Some("only-a"), "b").0, SCRIPTED);
    }
}
