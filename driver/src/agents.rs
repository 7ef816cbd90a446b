//! The agent profiles the driver needs (SPEC §8): their names, system prompts and history budgets.
//!
//! The driver validates `ConfigureSession` against these names and builds each step's model request
//! from the running agent's profile. The rest of a profile (model endpoint, tools, hooks) is the
//! runner's business, so it stays out of this sans-IO crate.

use std::collections::BTreeMap;
use std::sync::Arc;

use turnstile_model::TenantScope;
use turnstile_model::output::OutputSchema;
use turnstile_model::overrides::{OverrideError, OverridePolicy, SessionOverrides};
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
    /// Which version of the agent this is (SPEC §20): 1, 2, …; 0 for a catalog built without a store.
    pub version: u64,
    /// The content hash of this version's definition (empty without a store): what the worker's models,
    /// tools and hooks are looked up by.
    pub hash: String,
    /// `version_policy = "pin"`: a session recorded on this version keeps it when the agent changes.
    pub pin: bool,
    /// The tools whose call, found running by the repair of SPEC §6, is run again under the same
    /// idempotency key instead of being ended as interrupted (SPEC §20 `retry_after_repair`).
    pub retry_after_repair: ToolRules,
    /// The JSON Schema its turns' final replies must match (SPEC §20), unless a turn gives its own.
    pub output: Option<OutputSchema>,
    /// Its tools as it lists them (`clock`, `mcp:files/*`, `client:deploy`): what a session's tool subset
    /// is taken from (SPEC §20).
    pub tools: Vec<String>,
    /// What its sessions may override with `ConfigureSession` (SPEC §20).
    pub overrides: OverridePolicy,
}

impl AgentProfile {
    /// The profile of an agent that sets nothing: `Default`, and what a catalog without its default agent
    /// falls back to.
    pub const DEFAULT: Self = Self {
        system: None,
        history_turns: DEFAULT_TRANSCRIPT_TURNS,
        approval: ToolRules(None),
        context_budget_tokens: None,
        tenants: TenantScope::All,
        approval_timeout: None,
        version: 0,
        hash: String::new(),
        pin: false,
        retry_after_repair: ToolRules(None),
        output: None,
        tools: Vec::new(),
        overrides: OverridePolicy { system_prompt: false, models: Vec::new(), tools: false },
    };

    /// Checks the overrides a session of agent `name` asks for against what this version allows.
    pub fn check_overrides(&self, name: &str, overrides: &SessionOverrides) -> Result<(), OverrideError> {
        self.overrides.check(name, &self.tools, overrides)
    }
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
        Self::DEFAULT
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
///
/// The same shape answers any per-tool yes-or-no of an agent ([`ToolRules`]): `retry_after_repair` too.
#[derive(Clone, Default)]
pub struct ToolRules(Option<Arc<ToolRule>>);

/// Which calls of an agent wait for a human's decision: [`ToolRules`] asked "does this call wait?".
pub type ApprovalRules = ToolRules;

/// Whether the rule holds for a call of the named tool.
type ToolRule = dyn Fn(&str) -> bool + Send + Sync;

impl ToolRules {
    pub fn new(requires: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(requires)))
    }

    /// The rule holds for a call of `tool` (for approvals: the call waits for a decision).
    pub fn requires(&self, tool: &str) -> bool {
        self.0.as_ref().is_some_and(|rule| rule(tool))
    }
}

impl std::fmt::Debug for ToolRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ToolRules(..)" } else { "ToolRules(none)" })
    }
}

impl PartialEq for ToolRules {
    /// The same rule object (rules are functions; two built apart are never equal).
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for ToolRules {}

/// A catalog that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("the default agent {default:?} is not among the agents ({known})")]
    UnknownDefault { default: String, known: String },
}

/// Who owns an agent (SPEC §20): the configuration file, whose agents serve the tenants their profile
/// lists, or one tenant, whose agents no other tenant can see.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AgentOwner {
    Shared,
    Tenant(String),
}

/// Every version of one agent.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AgentEntry {
    versions: BTreeMap<u64, AgentProfile>,
    /// Hidden from new sessions and lists; its versions still run the sessions recorded on them.
    deleted: bool,
}

impl AgentEntry {
    fn latest(&self) -> Option<&AgentProfile> {
        self.versions.values().next_back()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entries {
    default_agent: String,
    agents: BTreeMap<(AgentOwner, String), AgentEntry>,
}

/// The agents by owner and name, each with its versions, and the one a session runs until
/// `ConfigureSession` names another. Cheap to clone (shared); a worker hands its drivers a new catalog
/// as an input when agents change ([`crate::Driver::set_agents`]).
///
/// ```
/// let catalog = turnstile_driver::AgentCatalog::default();
/// assert_eq!(catalog.default_agent(), "scripted");
/// assert_eq!(catalog.get("scripted").unwrap().history_turns, 100);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCatalog(Arc<Entries>);

impl Default for AgentCatalog {
    /// The single agent `scripted`, with no system prompt and 100 turns of history.
    fn default() -> Self {
        let mut catalog = Self(Arc::new(Entries { default_agent: SCRIPTED.to_owned(), agents: BTreeMap::new() }));
        catalog.add_version(AgentOwner::Shared, SCRIPTED, AgentProfile::default());
        catalog
    }
}

impl AgentCatalog {
    /// A catalog of shared `agents` (one version each) whose default is `default_agent`, which must be one
    /// of them.
    pub fn new(
        default_agent: impl Into<String>,
        agents: impl IntoIterator<Item = (String, AgentProfile)>,
    ) -> Result<Self, CatalogError> {
        let default_agent = default_agent.into();
        let mut catalog = Self(Arc::new(Entries { default_agent: default_agent.clone(), agents: BTreeMap::new() }));
        for (name, profile) in agents {
            catalog.add_version(AgentOwner::Shared, &name, profile);
        }
        if catalog.get(&default_agent).is_none() {
            return Err(CatalogError::UnknownDefault {
                default: default_agent,
                known: catalog.names().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(catalog)
    }

    /// A catalog with no agents yet whose default is `default_agent` (add it with
    /// [`AgentCatalog::add_version`]).
    pub fn with_default(default_agent: impl Into<String>) -> Self {
        Self(Arc::new(Entries { default_agent: default_agent.into(), agents: BTreeMap::new() }))
    }

    /// Adds (or replaces) version `profile.version` of `owner`'s agent `name`.
    pub fn add_version(&mut self, owner: AgentOwner, name: &str, profile: AgentProfile) {
        let entries = Arc::make_mut(&mut self.0);
        let entry = entries
            .agents
            .entry((owner, name.to_owned()))
            .or_insert_with(|| AgentEntry { versions: BTreeMap::new(), deleted: false });
        entry.versions.insert(profile.version, profile);
    }

    /// Hides `owner`'s agent `name` from new sessions and lists (its versions keep running their sessions).
    pub fn set_deleted(&mut self, owner: &AgentOwner, name: &str, deleted: bool) {
        if let Some(entry) = Arc::make_mut(&mut self.0).agents.get_mut(&(owner.clone(), name.to_owned())) {
            entry.deleted = deleted;
        }
    }

    pub fn default_agent(&self) -> &str {
        &self.0.default_agent
    }

    /// The very same catalog (a clone of it), not an equal one built apart: what a runner checks before
    /// handing its driver the worker's current catalog.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The newest version of the shared agent `name`.
    pub fn get(&self, name: &str) -> Option<&AgentProfile> {
        self.0.agents.get(&(AgentOwner::Shared, name.to_owned())).and_then(AgentEntry::latest)
    }

    /// The agent `name` as `tenant`'s sessions see it, deleted ones included: the tenant's own, else a
    /// shared one that serves `tenant` (by its newest version's tenants).
    fn entry_for(&self, name: &str, tenant: &str) -> Option<&AgentEntry> {
        let agents = &self.0.agents;
        agents.get(&(AgentOwner::Tenant(tenant.to_owned()), name.to_owned())).or_else(|| {
            agents
                .get(&(AgentOwner::Shared, name.to_owned()))
                .filter(|e| e.latest().is_some_and(|p| p.tenants.allows(tenant)))
        })
    }

    /// The newest version of agent `name` as `tenant`'s sessions see it: `None` when it does not exist, is
    /// deleted, or does not serve `tenant` (one answer, so a tenant learns nothing of other tenants' agents).
    pub fn get_for(&self, name: &str, tenant: &str) -> Option<&AgentProfile> {
        self.entry_for(name, tenant).filter(|e| !e.deleted).and_then(AgentEntry::latest)
    }

    /// Version `version` of agent `name` as `tenant`'s sessions see it (a deleted agent's too: sessions
    /// recorded on it keep running it).
    pub fn version_for(&self, name: &str, tenant: &str, version: u64) -> Option<&AgentProfile> {
        self.entry_for(name, tenant).and_then(|e| e.versions.get(&version))
    }

    /// The names of the shared agents, sorted (for messages that list them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0
            .agents
            .iter()
            .filter(|((owner, _), e)| *owner == AgentOwner::Shared && !e.deleted)
            .map(|((_, name), _)| name.as_str())
    }

    /// The names of the agents `tenant`'s sessions may run, sorted: its own and the shared ones it is served.
    pub fn names_for<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a str> {
        let names: std::collections::BTreeSet<&str> = self
            .0
            .agents
            .keys()
            .filter(|(_, name)| self.get_for(name, tenant).is_some())
            .map(|(_, name)| name.as_str())
            .collect();
        names.into_iter()
    }

    /// The largest history budget of any version: how many turns the transcript must keep before the newest.
    pub fn max_history_turns(&self) -> u32 {
        self.0
            .agents
            .values()
            .flat_map(|e| e.versions.values())
            .map(|a| a.history_turns)
            .max()
            .unwrap_or(DEFAULT_TRANSCRIPT_TURNS)
    }

    /// The profile of version `version` of `name`, which a turn of `tenant` started on; when that version
    /// is gone from this catalog, what the session would resolve to now.
    pub fn turn_profile<'a>(&'a self, name: &'a str, tenant: &str, version: u64) -> &'a AgentProfile {
        self.version_for(name, tenant, version).unwrap_or_else(|| self.resolve(Some(name), tenant).1)
    }

    /// [`AgentCatalog::resolve_version`] of a session that recorded no version.
    pub fn resolve<'a>(&'a self, configured: Option<&'a str>, tenant: &str) -> (&'a str, &'a AgentProfile) {
        self.resolve_version(configured, None, tenant)
    }

    /// The agent and version a session of `tenant` runs (SPEC §20): the configured agent when this catalog
    /// knows it for `tenant`, else the default (a configuration that dropped an agent, or confined it to
    /// other tenants, must not strand its sessions, nor run another tenant's agent for them). Of its
    /// versions: the `recorded` one when that version pins (`version_policy = "pin"`), else the newest.
    pub fn resolve_version<'a>(
        &'a self,
        configured: Option<&'a str>,
        recorded: Option<u64>,
        tenant: &str,
    ) -> (&'a str, &'a AgentProfile) {
        if let Some(name) = configured
            && let Some(entry) = self.entry_for(name, tenant)
            && let Some(latest) = entry.latest()
        {
            let pinned = recorded.and_then(|v| entry.versions.get(&v)).filter(|p| p.pin);
            return (name, pinned.unwrap_or(latest));
        }
        let default = &self.0.default_agent;
        match self.get(default) {
            Some(p) => {
                let pinned = match configured {
                    Some(name) if name == default => recorded.and_then(|v| self.version_for(name, tenant, v)),
                    _ => None,
                };
                (default, pinned.filter(|p| p.pin).unwrap_or(p))
            }
            // `new` guarantees the default exists; an empty profile keeps this total anyway.
            None => (default, &FALLBACK),
        }
    }
}

static FALLBACK: AgentProfile = AgentProfile::DEFAULT;

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

    fn version(version: u64, system: &str, pin: bool) -> AgentProfile {
        AgentProfile {
            version,
            system: Some(system.into()),
            pin,
            hash: format!("h{version}"),
            ..AgentProfile::default()
        }
    }

    /// SPEC §20: a tenant's agent is invisible to every other tenant; a pinned version stays what a session
    /// runs, a `latest` one follows the newest; a deleted agent runs its sessions but takes no new ones.
    #[test]
    fn versions_pin_or_follow_and_a_tenants_agents_are_its_own() {
        let mut catalog = AgentCatalog::default();
        let a = AgentOwner::Tenant("a".into());
        catalog.add_version(a.clone(), "helper", version(1, "one", true));
        catalog.add_version(a.clone(), "helper", version(2, "two", true));
        assert_eq!(catalog.get_for("helper", "a").unwrap().version, 2);
        assert!(catalog.get_for("helper", "b").is_none());
        assert_eq!(catalog.names_for("b").collect::<Vec<_>>(), [SCRIPTED]);
        assert_eq!(catalog.names_for("a").collect::<Vec<_>>(), ["helper", SCRIPTED]);
        assert_eq!(catalog.resolve_version(Some("helper"), Some(1), "a").1.version, 1, "pinned");
        assert_eq!(catalog.resolve_version(Some("helper"), None, "a").1.version, 2, "nothing recorded: the newest");
        assert_eq!(catalog.resolve_version(Some("helper"), Some(1), "b").0, SCRIPTED, "another tenant's: the default");
        catalog.add_version(a.clone(), "follower", version(1, "one", false));
        catalog.add_version(a.clone(), "follower", version(2, "two", false));
        assert_eq!(catalog.resolve_version(Some("follower"), Some(1), "a").1.version, 2, "latest policy");
        catalog.set_deleted(&a, "helper", true);
        assert!(catalog.get_for("helper", "a").is_none());
        assert_eq!(catalog.resolve_version(Some("helper"), Some(1), "a").1.version, 1, "still runs its sessions");
        assert!(catalog.version_for("helper", "a", 2).is_some());
    }
}
