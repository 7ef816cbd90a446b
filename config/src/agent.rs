//! `[agents.NAME]`: the profiles sessions run (SPEC §8).

use std::time::Duration;

use serde::Deserialize;
use turnstile_model::{Tenant, TenantScope};

use crate::names::SCRIPTED;
use crate::names::keyword_enum;
use crate::tools::{Builtin, ToolId, ToolPattern, ToolRef};
use crate::url::HttpUrl;

keyword_enum! {
    /// Which version of an agent its sessions run after the agent changes (SPEC §20, decision 0121).
    /// Default `latest`.
    #[derive(Default)]
    pub enum VersionPolicy ("version_policy") {
        /// A session takes the agent's newest version at its next turn.
        #[default]
        Latest = "latest",
        /// A session keeps the version it runs until `MigrateSessions` moves it.
        Pin = "pin",
    }
}

keyword_enum! {
    /// What a remote pre-step hook's timeout or error does to the turn (SPEC §9). Default `error`.
    #[derive(Default)]
    pub enum OnFailure ("on_failure") {
        /// Live `agent/error`, the turn ends `error`.
        #[default]
        Error = "error",
        /// As if the hook rejected: the turn ends `blocked`.
        Reject = "reject",
        /// The hook is left out: the batch goes on as it came in.
        Skip = "skip",
    }
}

/// A remote pre-step hook: the gRPC service `turnstile.hooks.v1.PreStepHook` at `url`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Where the service listens (http or https).
    pub url: HttpUrl,
    /// Deadline of one call, in ms. Default 1,000.
    #[serde(default = "HookConfig::default_deadline_ms")]
    pub deadline_ms: u64,
    /// What a timeout or error does. Default `error`.
    #[serde(default)]
    pub on_failure: OnFailure,
}

impl HookConfig {
    fn default_deadline_ms() -> u64 {
        1000
    }

    /// `deadline_ms` as a duration.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

/// A webhook of an agent profile (SPEC §15): the session's owner POSTs each durable event of `events` to
/// `url`, signed with the secret in the environment variable `secret_env`, retried until `max_age_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where to POST (http or https).
    pub url: HttpUrl,
    /// The durable types delivered (SPEC §5 names: `turn/end`, `tool/call`, `goal/change`, …). Default
    /// `["turn/end"]`.
    #[serde(default = "WebhookConfig::default_events")]
    pub events: Vec<String>,
    /// The environment variable holding the HMAC-SHA256 key of `Turnstile-Signature`. Default: unsigned.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// How long an event is retried before it is given up on (counted and logged), in ms. Default 24 h.
    #[serde(default = "WebhookConfig::default_max_age_ms")]
    pub max_age_ms: u64,
    /// The tenants whose sessions' events this webhook receives, each one the agent serves (decision
    /// 0091). Default: every tenant the agent serves.
    #[serde(default)]
    pub tenants: Option<Vec<Tenant>>,
}

impl WebhookConfig {
    fn default_events() -> Vec<String> {
        vec!["turn/end".to_owned()]
    }

    fn default_max_age_ms() -> u64 {
        24 * 3600 * 1000
    }

    /// The tenants whose events this webhook of `agent` receives: its own `tenants` within the agent's.
    pub fn tenant_scope(&self, agent: &AgentConfig) -> TenantScope {
        agent.tenant_scope().intersect(&scope_of(self.tenants.as_deref()))
    }

    /// The signing key, from `secret_env` read through `env`; `None` when no variable is named.
    pub fn resolve_secret(
        &self,
        key: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<crate::Secret>, crate::ConfigError> {
        match &self.secret_env {
            None => Ok(None),
            Some(variable) => crate::secret::from_env(key, variable, "the webhook's signing secret", env).map(Some),
        }
    }
}

/// `tenants = [...]` as a scope: absent is every tenant.
fn scope_of(tenants: Option<&[Tenant]>) -> TenantScope {
    tenants.map_or(TenantScope::All, |t| TenantScope::only(t.iter().cloned()))
}

/// An agent profile (`[agents.NAME]`).
///
/// ```
/// use turnstile_config::{Config, ToolId};
///
/// let config = Config::from_toml_str(
///     "[agents.careful]\ntools = [\"sleep\", \"client:deploy\"]\napproval = [\"client:*\"]\n",
/// )
/// .unwrap();
/// let careful = &config.agents["careful"];
/// assert_eq!(careful.model, "scripted");
/// assert!(careful.offers(ToolId::Client("deploy")));
/// assert!(careful.requires_approval(ToolId::Client("deploy")));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The table's name (`NAME` of `[agents.NAME]`); set by the parser, not written in the file.
    #[serde(skip)]
    pub name: String,
    /// What the agent is for, in a sentence: the description the agent protocols show (an MCP tool's, an
    /// A2A agent card's and skill's; SPEC §19). Default empty (they say which model it runs).
    pub description: String,
    /// The model it runs on (a `[models.NAME]`). Default `scripted`.
    pub model: String,
    /// The system prompt. Default empty (none sent).
    pub system: String,
    /// The tools it may call. Default none.
    pub tools: Vec<ToolRef>,
    /// Calls that wait for a `Decide` before they run. Default none.
    pub approval: Vec<ToolPattern>,
    /// How long such a call waits for a decision, in ms from its `tool/call`; then it is decided by
    /// `on_timeout` (SPEC §21). Default: it waits for a person for ever.
    pub approval_timeout_ms: Option<u64>,
    /// What a call that waited `approval_timeout_ms` gets: `"deny"` (the default) or `"approve"`.
    pub on_timeout: OnTimeout,
    /// History sent with each request, in whole turns before the current one. Default 100.
    pub history_turns: u32,
    /// Remote pre-step hooks, in order, after the built-in content guard. Default none.
    pub hooks: Vec<HookConfig>,
    /// Deadline of one tool call, in ms. Default `[tools] deadline_ms` (60,000).
    pub tool_deadline_ms: Option<u64>,
    /// The tools whose call, found running when its worker stopped, is run again by the new owner under
    /// the same idempotency key (SPEC §20); any other such call ends `interrupted` and never runs again.
    /// Default none: list only tools that refuse a key they have already seen.
    pub retry_after_repair: Vec<ToolPattern>,
    /// Model steps one turn may take: the proposal that would open one more ends the turn `blocked` (the
    /// built-in step-budget hook). Default unlimited.
    pub max_steps_per_turn: Option<u32>,
    /// Estimated request size, in tokens, above which the oldest turns are compacted (SPEC §13).
    /// Default: never compact.
    pub context_budget_tokens: Option<u64>,
    /// The model that writes compaction summaries (a `[models.NAME]`). Default the agent's model.
    pub compaction_model: Option<String>,
    /// Where the owner POSTs the sessions' durable events (SPEC §15). Default none.
    pub webhooks: Vec<WebhookConfig>,
    /// The tenants whose sessions may run this agent (decision 0091): another tenant's `ConfigureSession`
    /// (or `spawn_agent`) naming it is refused as for an agent that does not exist, and its webhooks never
    /// see another tenant's events. Default (absent): every tenant.
    pub tenants: Option<Vec<Tenant>>,
    /// Whether sessions keep the version they run when the agent changes (`pin`) or take the newest at
    /// their next turn (`latest`, the default).
    pub version_policy: VersionPolicy,
    /// The JSON Schema every final reply of its turns must match (SPEC §20), unless a turn gives its own.
    /// Default none.
    pub output: Option<crate::output::OutputConfig>,
    /// The namespaces of the tenant's memory its memory tools reach (SPEC §20): `memory = { namespaces =
    /// ["notes"] }`. Default none.
    pub memory: Option<crate::memory::AgentMemory>,
    /// What a session may override with `ConfigureSession` (SPEC §20): `[agents.NAME.overrides]`
    /// `system_prompt = true`, `models = ["large"]`, `tools = true`. Default: nothing.
    pub overrides: crate::overrides::OverridesConfig,
    /// The definition as written (its table, as canonical JSON: keys sorted, no defaults filled in); set by
    /// the parser. Its digest is the version's content hash (decision 0120).
    #[serde(skip)]
    pub definition: String,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            description: String::new(),
            model: SCRIPTED.to_owned(),
            system: String::new(),
            tools: Vec::new(),
            approval: Vec::new(),
            history_turns: 100,
            hooks: Vec::new(),
            tool_deadline_ms: None,
            retry_after_repair: Vec::new(),
            max_steps_per_turn: None,
            context_budget_tokens: None,
            compaction_model: None,
            webhooks: Vec::new(),
            tenants: None,
            approval_timeout_ms: None,
            on_timeout: OnTimeout::Deny,
            version_policy: VersionPolicy::Latest,
            output: None,
            memory: None,
            overrides: crate::overrides::OverridesConfig::default(),
            definition: String::new(),
        }
    }
}

/// `on_timeout` of an agent: the decision a call gets when its `approval_timeout_ms` passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    #[default]
    Deny,
    Approve,
}

impl AgentConfig {
    /// The built-in agent `scripted`: the scripted model with the tools `sleep`, `echo` and `clock`.
    pub fn scripted() -> Self {
        Self {
            name: SCRIPTED.to_owned(),
            tools: vec![
                ToolRef::Builtin(Builtin::Sleep),
                ToolRef::Builtin(Builtin::Echo),
                ToolRef::Builtin(Builtin::Clock),
            ],
            definition: r#"{"tools":["sleep","echo","clock"]}"#.to_owned(),
            ..Self::default()
        }
    }

    /// The tenants whose sessions may run this agent.
    pub fn tenant_scope(&self) -> TenantScope {
        scope_of(self.tenants.as_deref())
    }

    /// Whether the agent may call `tool`.
    pub fn offers(&self, tool: ToolId<'_>) -> bool {
        self.tools.iter().any(|t| t.matches(tool))
    }

    /// Whether a call of `tool` waits for a `Decide`.
    pub fn requires_approval(&self, tool: ToolId<'_>) -> bool {
        self.approval.iter().any(|p| p.matches(tool))
    }

    /// What its sessions may override (SPEC §20).
    pub fn override_policy(&self) -> turnstile_model::overrides::OverridePolicy {
        self.overrides.policy()
    }

    /// Its tools as it lists them (`clock`, `mcp:files/*`, `client:deploy`): what a session's tool subset
    /// names.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.iter().map(ToString::to_string).collect()
    }

    /// This agent as a session with `overrides` runs it (SPEC §20): `model` instead of its own, only the
    /// tools of the subset. The overrides were checked against the agent when they were set, and the
    /// driver passes on only those its version allows.
    pub fn overridden(&self, overrides: &turnstile_model::overrides::SessionOverrides) -> Self {
        let mut agent = self.clone();
        if let Some(model) = &overrides.model {
            agent.model.clone_from(model);
        }
        if let Some(subset) = &overrides.tools {
            agent.tools.retain(|t| subset.contains(&t.to_string()));
        }
        agent
    }

    /// The model compaction uses: `compaction_model`, else `model`.
    pub fn compaction_model(&self) -> &str {
        self.compaction_model.as_deref().unwrap_or(&self.model)
    }
}

/// An agent's table as canonical JSON: keys sorted (toml's tables are ordered maps), no spaces.
pub(crate) fn canonical(table: &toml::Table) -> String {
    serde_json::to_string(table).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use turnstile_model::TenantScope;

    use crate::Config;
    use crate::error::tests::load_error;

    #[test]
    fn agents_and_their_webhooks_can_be_confined_to_tenants() {
        let config = Config::from_toml_str(
            "[agents.shared]\nwebhooks = [{ url = \"http://127.0.0.1:1/h\", tenants = [\"a\"] }]\n\
             [agents.only-b]\ntenants = [\"b\"]\n",
        )
        .unwrap();
        let shared = &config.agents["shared"];
        assert_eq!(shared.tenant_scope(), TenantScope::All, "no list: every tenant, as before");
        let hook = shared.webhooks[0].tenant_scope(shared);
        assert!(hook.allows("a") && !hook.allows("b"));
        let only_b = config.agents["only-b"].tenant_scope();
        assert!(only_b.allows("b") && !only_b.allows("a"));
    }

    #[test]
    fn bad_tenant_lists_name_the_key() {
        assert!(load_error("[agents.x]\ntenants = []\n").contains("agents.x.tenants: is empty"));
        assert!(load_error("[agents.x]\ntenants = [\"a b\"]\n").contains("has the character ' '"));
        let e = load_error(
            "[agents.x]\ntenants = [\"a\"]\nwebhooks = [{ url = \"http://127.0.0.1:1/h\", tenants = [\"b\"] }]\n",
        );
        assert!(e.contains("agents.x.webhooks[0].tenants[0]: tenant \"b\" cannot run this agent"), "{e}");
        let e = load_error("default_agent = \"x\"\n[agents.x]\ntenants = [\"a\"]\n");
        assert!(e.contains("agents.x.tenants: \"x\" is the default_agent"), "{e}");
    }
}
