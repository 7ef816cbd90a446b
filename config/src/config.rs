//! [`Config`]: the whole file, its sections, loading and validation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::de::DeTable;

use crate::agent::AgentConfig;
use crate::error::ConfigError;
use crate::mcp::McpServerConfig;
use crate::model::ModelConfig;
use crate::names::{SCRIPTED, known};
use crate::path;
use crate::protocols::ProtocolsConfig;
use crate::tenant::TenantConfig;
use crate::tools::ToolId;

/// The environment variable that names the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "TURNSTILE_CONFIG";

/// The configuration of a node (docs/CONFIGURATION.md): every key optional, the same file on every node.
///
/// Parsing fills in defaults, adds the built-in model and agent `scripted` unless the file defines its own,
/// and validates; the fields are public so that command-line flags can override them afterwards (call
/// [`Config::validate`] again after changing them).
///
/// ```
/// use turnstile_config::Config;
///
/// let config = Config::from_toml_str("[limits]\nmax_pending = 50\n").unwrap();
/// assert_eq!(config.limits.max_pending, 50);
/// assert_eq!(config.limits.max_message_bytes, 1024 * 1024);
/// assert_eq!(config.default_agent, "scripted");
/// assert_eq!(config, Config::from_toml_str("").map(|mut c| { c.limits.max_pending = 50; c }).unwrap());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The agent a session runs until `ConfigureSession` names another. Default `scripted`.
    pub default_agent: String,
    /// Per-message and per-session limits (SPEC §2).
    pub limits: Limits,
    /// Shard layout and lease timings of a cluster (`dev --nats` uses only `partitions` and `replicas`).
    pub cluster: ClusterConfig,
    /// Snapshots, passivation and the dedup horizon.
    pub journal: JournalConfig,
    /// Defaults for tool calls.
    pub tools: ToolDefaults,
    /// Model endpoints by name; always has `scripted`.
    pub models: BTreeMap<String, ModelConfig>,
    /// MCP servers by name.
    pub mcp: BTreeMap<String, McpServerConfig>,
    /// Agent profiles by name; always has `scripted`.
    pub agents: BTreeMap<String, AgentConfig>,
    /// Per-tenant token budgets and quotas by tenant name (SPEC §17).
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The agent protocols served on the `--http` port (SPEC §19).
    pub protocols: ProtocolsConfig,
    /// The rules for webhooks registered at run time (SPEC §21).
    pub webhooks: crate::webhooks::WebhooksConfig,
    /// The per-tenant limits of memory (SPEC §20).
    pub memory: crate::memory::MemoryConfig,
}

/// `[limits]`: what one delivery may carry (SPEC §2).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// The bytes one message counts (its id, source and every field of every block, plus 64 per block;
    /// `turnstile_model::size`); larger ones are invalid-argument. Default 1 MiB.
    pub max_message_bytes: usize,
    /// Pending items across both lists of one session; more are resource-exhausted. Default 1,000.
    pub max_pending: usize,
    /// `WhenIdle` timeout when the caller gives none, in ms. Default 30,000.
    pub when_idle_timeout_ms: u64,
    /// The largest `max_rounds` a `SetGoal` may ask for; more are invalid-argument. Default 100.
    pub max_goal_rounds: u32,
    /// Commands waiting for one session's driver; one more is resource-exhausted at once. Default 1,024.
    pub max_queued_commands: usize,
    /// The bytes pending across both inbox lists of one session count (as `max_message_bytes` counts
    /// them); a delivery that would exceed it is resource-exhausted and writes nothing. At least
    /// `max_message_bytes`. Default 4 MiB less 64 KiB, so a whole inbox read (`GetInbox`, a Watch's
    /// `caught_up`) fits a client's default 4 MiB receive limit (decision 0085).
    pub max_pending_bytes: usize,
    /// Requests one tenant may make per minute on one gateway, sustained; more are resource-exhausted with
    /// a `retry-after-ms` hint. 0: no rate limit. Default 0.
    pub tenant_requests_per_minute: u32,
    /// Requests one tenant may make at once after being idle; 0: `tenant_requests_per_minute`. Default 0.
    pub tenant_request_burst: u32,
    /// Watch streams one tenant may hold open across every gateway of a cluster; one more is
    /// resource-exhausted. 0: no limit. Default 2,000.
    pub tenant_max_watches: usize,
    /// Bytes one Watch stream may hold for a client that does not keep up (the feed's items it has not
    /// taken and its send queue); one that would hold more is cut with UNAVAILABLE naming the seq to
    /// resume after (decision 0088). Default 4 MiB.
    pub watch_buffer_bytes: usize,
    /// Bytes all Watch streams of one gateway may hold together; past it, the streams holding any are cut
    /// the same way. At least `watch_buffer_bytes`. Default 256 MiB.
    pub watch_buffer_total_bytes: usize,
    /// Levels a `spawn_agent` child may sit below its root session (SPEC §13); a call that would go deeper
    /// is refused (`spawn_depth_exceeded`). Default 3.
    pub max_spawn_depth: u32,
    /// Child sessions one session's `spawn_agent` calls may create; one more is refused
    /// (`spawn_children_exceeded`). Default 16.
    pub max_children: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 1024 * 1024,
            max_pending: 1000,
            when_idle_timeout_ms: 30_000,
            max_goal_rounds: 100,
            max_queued_commands: 1024,
            max_pending_bytes: 4 * 1024 * 1024 - 64 * 1024,
            tenant_requests_per_minute: 0,
            tenant_request_burst: 0,
            tenant_max_watches: 2000,
            watch_buffer_bytes: 4 * 1024 * 1024,
            watch_buffer_total_bytes: 256 * 1024 * 1024,
            max_spawn_depth: 3,
            max_children: 16,
        }
    }
}

/// Bytes of a request's envelope allowed beside its content: message ids, sources, MIME types, targets,
/// tool-call ids and protobuf framing (decision 0033).
pub const REQUEST_ENVELOPE_BYTES: usize = 1024 * 1024;

impl Limits {
    /// The largest encoded request the public API decodes (tonic `max_decoding_message_size`; decision
    /// 0033): the content one valid request can carry — a `Splice` inserts at most `max_pending_bytes`,
    /// every other request at most one message or one tool result of `max_message_bytes` — plus
    /// [`REQUEST_ENVELOPE_BYTES`]. A larger request is refused before it is decoded.
    ///
    /// ```
    /// let limits = turnstile_config::Limits::default();
    /// assert_eq!(limits.max_request_bytes(), 5 * 1024 * 1024 - 64 * 1024);
    /// ```
    pub fn max_request_bytes(&self) -> usize {
        self.max_pending_bytes.max(self.max_message_bytes).saturating_add(REQUEST_ENVELOPE_BYTES)
    }

    /// `when_idle_timeout_ms` as a duration.
    pub fn when_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.when_idle_timeout_ms)
    }
}

/// `[cluster]`: how a NATS cluster's sessions are laid out and owned (docs/SUBJECTS.md, docs/decisions/0005-shard-leases-epochs-and-handoff.md).
/// `shards`, `partitions` and `replicas` are part of the layout: every node of a cluster must agree.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Virtual shards sessions are hashed to (V). Default 256.
    pub shards: u32,
    /// JetStream event streams sessions are spread over. Default 1.
    pub partitions: u32,
    /// Replicas of each stream and KV bucket: 1 for one NATS server, 3 for a cluster. Default 1.
    pub replicas: u32,
    /// How long a shard lease lasts without renewal: the failover time after a crash, in ms. Default 1,500.
    pub lease_ttl_ms: u64,
    /// How often leases are renewed and fair shares recomputed, in ms. Default 400.
    pub renew_ms: u64,
    /// How long a worker's heartbeat keeps it counted as live, in ms. Default 3,000.
    pub worker_ttl_ms: u64,
    /// How long running steps may take to finish when shards are handed over or at SIGTERM, in ms.
    /// Default 10,000.
    pub drain_timeout_ms: u64,
    /// How long a gateway command may wait for a shard owner while shards move, in ms. Default 10,000.
    pub route_deadline_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            shards: 256,
            partitions: 1,
            replicas: 1,
            lease_ttl_ms: 1500,
            renew_ms: 400,
            worker_ttl_ms: 3000,
            drain_timeout_ms: 10_000,
            route_deadline_ms: 10_000,
        }
    }
}

impl ClusterConfig {
    /// `lease_ttl_ms` as a duration.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// `renew_ms` as a duration.
    pub fn renew_every(&self) -> Duration {
        Duration::from_millis(self.renew_ms)
    }

    /// `worker_ttl_ms` as a duration.
    pub fn worker_ttl(&self) -> Duration {
        Duration::from_millis(self.worker_ttl_ms)
    }

    /// `drain_timeout_ms` as a duration.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    /// `route_deadline_ms` as a duration.
    pub fn route_deadline(&self) -> Duration {
        Duration::from_millis(self.route_deadline_ms)
    }
}

/// `[journal]`: how session state is kept (decision 0006).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// A snapshot is written after this many new events (and when a running session is unloaded by a
    /// drain or stop). Default 100.
    pub snapshot_every: u64,
    /// An idle session with nothing waiting is dropped from memory after this long, in ms (passivation;
    /// it keeps only its fold from 1 s after its last activity until then, decision 0037). Default 300,000.
    pub passivate_after_ms: u64,
    /// Accepted MessageIds remembered per session for idempotent retries; at least 10,000 (SPEC §2).
    /// Default 10,000.
    pub dedup_horizon: usize,
    /// JetStream retention: events older than this (ms) are removed from the event streams by the
    /// server; 0 keeps them until `DeleteSession` (decision 0027). Default 0.
    pub max_age_ms: u64,
    /// JetStream retention: bytes each event stream may hold; once full, appends are refused
    /// (UNAVAILABLE, nothing acknowledged is dropped) until sessions are deleted. 0: unlimited. Default 0.
    pub max_bytes: u64,
}

/// The smallest dedup horizon SPEC §2 allows.
pub const MIN_DEDUP_HORIZON: usize = 10_000;

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            snapshot_every: 100,
            passivate_after_ms: 300_000,
            dedup_horizon: MIN_DEDUP_HORIZON,
            max_age_ms: 0,
            max_bytes: 0,
        }
    }
}

impl JournalConfig {
    /// `passivate_after_ms` as a duration.
    pub fn passivate_after(&self) -> Duration {
        Duration::from_millis(self.passivate_after_ms)
    }

    /// `max_age_ms` as a duration; `None` for 0 (no age limit).
    pub fn max_age(&self) -> Option<Duration> {
        (self.max_age_ms > 0).then(|| Duration::from_millis(self.max_age_ms))
    }

    /// `max_bytes`; `None` for 0 (no size limit).
    pub fn max_bytes(&self) -> Option<u64> {
        (self.max_bytes > 0).then_some(self.max_bytes)
    }
}

/// `[tools]`: defaults for tool calls.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolDefaults {
    /// Deadline of one tool call when neither its MCP server nor its agent sets one, in ms. Default 60,000.
    pub deadline_ms: u64,
}

impl Default for ToolDefaults {
    fn default() -> Self {
        Self { deadline_ms: 60_000 }
    }
}

impl Default for Config {
    /// The configuration without a file: the agent `scripted` on the model `scripted`, with the tools
    /// `sleep`, `echo` and `clock`, and the default limits and timings.
    fn default() -> Self {
        Self {
            default_agent: SCRIPTED.to_owned(),
            limits: Limits::default(),
            cluster: ClusterConfig::default(),
            journal: JournalConfig::default(),
            tools: ToolDefaults::default(),
            models: BTreeMap::from([(SCRIPTED.to_owned(), ModelConfig::scripted())]),
            mcp: BTreeMap::new(),
            agents: BTreeMap::from([(SCRIPTED.to_owned(), AgentConfig::scripted())]),
            tenants: BTreeMap::new(),
            protocols: ProtocolsConfig::default(),
            webhooks: crate::webhooks::WebhooksConfig::default(),
            memory: crate::memory::MemoryConfig::default(),
        }
    }
}

impl Config {
    /// Parses and validates a configuration text. Errors name the key and its line and column.
    ///
    /// ```
    /// use turnstile_config::Config;
    ///
    /// let err = Config::from_toml_str("[models.local]\nprovider = \"foo\"\n").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     r#"line 2, column 12: models.local.provider: unknown provider "foo" (allowed: openai, anthropic, scripted)"#
    /// );
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let root = DeTable::parse(text).map_err(|e| path::syntax_error(text, &e))?;
        let root = root.get_ref();
        let mut config: Self = toml::from_str(text).map_err(|e| path::deserialize_error(text, root, &e))?;
        config.normalize();
        config.keep_definitions(text);
        config.check().map_err(|e| e.into_error(Some((text, root))))?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`; errors start with the file's name.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        Self::from_toml_str(&text).map_err(|e| e.in_file(PathBuf::from(path)))
    }

    /// [`Config::load`] when a file is named (by `--config` or [`CONFIG_ENV`]), else the default.
    pub fn load_or_default(path: Option<&Path>) -> Result<Self, ConfigError> {
        path.map_or_else(|| Ok(Self::default()), Self::load)
    }

    /// Adds the built-in model and agent `scripted` where the maps lack them and sets every entry's `name`
    /// to its key. The parser does this; call it on a configuration built in code before
    /// [`Config::validate`].
    pub fn normalize(&mut self) {
        self.models.entry(SCRIPTED.to_owned()).or_insert_with(ModelConfig::scripted);
        self.agents.entry(SCRIPTED.to_owned()).or_insert_with(AgentConfig::scripted);
        for (name, model) in &mut self.models {
            model.name.clone_from(name);
        }
        for (name, server) in &mut self.mcp {
            server.name.clone_from(name);
        }
        for (name, agent) in &mut self.agents {
            agent.name.clone_from(name);
        }
        for (name, tenant) in &mut self.tenants {
            tenant.name.clone_from(name);
        }
    }

    /// Sets each file agent's `definition` to its table as written (a text that parsed as a whole parses
    /// as a plain table too).
    fn keep_definitions(&mut self, text: &str) {
        let Ok(raw) = toml::from_str::<toml::Table>(text) else { return };
        let Some(toml::Value::Table(agents)) = raw.get("agents") else { return };
        for (name, table) in agents {
            if let (Some(agent), toml::Value::Table(table)) = (self.agents.get_mut(name), table) {
                agent.definition = crate::agent::canonical(table);
            }
        }
    }

    /// Checks the whole configuration (after flags changed it, say); the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(|e| e.into_error(None))
    }

    /// The agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.get(name)
    }

    /// The `default_agent`'s profile (present in a validated configuration).
    pub fn default_agent(&self) -> Option<&AgentConfig> {
        self.agents.get(&self.default_agent)
    }

    /// The model `agent` runs on (present in a validated configuration).
    pub fn model_of(&self, agent: &AgentConfig) -> Option<&ModelConfig> {
        self.models.get(&agent.model)
    }

    /// The agents that run on model `model` or compact with it (`compaction_model`), sorted: the models a
    /// worker sets up, and the ones whose API key it needs, are exactly those with an agent here
    /// (docs/decisions/0045-only-used-models-need-keys.md).
    ///
    /// ```
    /// use turnstile_config::Config;
    ///
    /// let config = Config::from_toml_str(
    ///     "[models.gpt]\nmodel = \"gpt-4o-mini\"\napi_key_env = \"OPENAI_API_KEY\"\n\
    ///      [models.claude]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\n\
    ///      [agents.writer]\nmodel = \"gpt\"\n[agents.editor]\nmodel = \"gpt\"\n",
    /// )
    /// .unwrap();
    /// assert_eq!(config.agents_using_model("gpt"), ["editor", "writer"]);
    /// assert!(config.agents_using_model("claude").is_empty());
    /// ```
    pub fn agents_using_model(&self, model: &str) -> Vec<&str> {
        // A model an agent's model falls back to is used by that agent too (SPEC §17).
        let uses =
            |name: &str| name == model || self.models.get(name).is_some_and(|m| m.fallback.iter().any(|f| f == model));
        self.agents
            .values()
            .filter(|a| uses(&a.model) || a.compaction_model.as_deref().is_some_and(uses))
            .map(|a| a.name.as_str())
            .collect()
    }

    /// The agents' names, sorted and comma-separated, for messages such as an unknown agent in
    /// `ConfigureSession`.
    pub fn agent_names(&self) -> String {
        known(self.agents.keys())
    }

    /// The deadline of a call of `tool` by `agent`: the MCP server's `tool_deadline_ms`, else the agent's,
    /// else `[tools] deadline_ms`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_config::{Builtin, Config, ToolId};
    ///
    /// let config = Config::default();
    /// let agent = config.default_agent().unwrap();
    /// assert_eq!(config.tool_deadline(agent, ToolId::Builtin(Builtin::Sleep)), Duration::from_secs(60));
    /// ```
    pub fn tool_deadline(&self, agent: &AgentConfig, tool: ToolId<'_>) -> Duration {
        let server = match tool {
            ToolId::Mcp { server, .. } => self.mcp.get(server).and_then(|s| s.tool_deadline_ms),
            ToolId::Builtin(_) | ToolId::Client(_) => None,
        };
        Duration::from_millis(server.or(agent.tool_deadline_ms).unwrap_or(self.tools.deadline_ms))
    }
}
