//! Tools a model step can call, the built-ins `sleep`, `echo`, `clock` and `spawn_agent` ([`spawn`]), the
//! tools of MCP servers ([`mcp`]) and client tools served over `ServeTools` ([`client`]).
//!
//! Each tool describes itself to the model ([`Tool::description`], [`Tool::input_schema`]); the registry
//! hands those out by name ([`ToolRegistry::spec`]) so an agent's model is offered exactly the tools the
//! agent lists. The registry is the worker's [`Tools`](turnstile_worker::agent::Tools), and its `call` is the
//! one place a call is checked against the agent's list, bounded by its deadline (`tool_timeout`), measured
//! and traced. The plain built-ins are [`Sleep`], [`Echo`] and [`Clock`].

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_model::message::SessionRef;
pub use turnstile_worker::agent::ToolReturn;

mod builtin;
pub mod client;
pub mod mcp;
pub mod memory;
mod metrics;
pub(crate) mod registry;
pub mod spawn;

pub use builtin::{Clock, Echo, Sleep, goal_complete_spec, rfc3339_utc};
pub use client::ClientBusSlot;
pub use memory::{MemoryOp, MemorySlot, MemoryTool};
pub use registry::ToolRegistry;
pub use spawn::{ChildSessions, ChildSessionsSlot, SPAWN_AGENT, SpawnAgent, SpawnLimits, SpawnRefused};

/// The error of a call that passed its deadline (SPEC §9).
pub const TOOL_TIMEOUT: &str = "tool_timeout";

/// The deadline of a call when no configuration says otherwise (`[tools] deadline_ms`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// Who calls a tool: the session (its tenant scopes client tools), the durable call id and its idempotency
/// key, the agent and the call's deadline (already applied by the registry's `Tools::call`; tools that talk
/// to others pass it on).
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub session: SessionRef,
    pub call_id: String,
    /// The call's idempotency key (SPEC §20, `<session>/<turn>/<step>/<call_id>`): the same when the call
    /// runs again after its worker stopped (`retry_after_repair`). A tool with a side effect outside
    /// Turnstile passes it on, or refuses a key it has already acted on.
    pub idempotency_key: String,
    pub agent: String,
    pub deadline: Duration,
    /// Cancelled, before `abort`, when this worker lets the call go without a cancel of the turn (a reload
    /// after a journal error, a shard handed over, a shutdown): its result will not be recorded here and
    /// the next owner repairs the call (SPEC §6). A tool whose abort has effects beyond the call (such as
    /// `spawn_agent` cancelling its child) skips them then.
    pub released: CancellationToken,
    /// The memory namespaces the agent's memory tools may reach (its profile's `memory.namespaces`).
    pub memory: Vec<String>,
}

impl Default for ToolContext {
    fn default() -> Self {
        Self {
            session: SessionRef { tenant: "default".to_owned(), id: "local".to_owned() },
            call_id: String::new(),
            idempotency_key: String::new(),
            agent: turnstile_config::SCRIPTED.to_owned(),
            deadline: DEFAULT_DEADLINE,
            released: CancellationToken::new(),
            memory: Vec::new(),
        }
    }
}

#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// What the tool does, for the model.
    fn description(&self) -> &str;

    /// The JSON Schema of the tool's arguments (an object), for the model.
    fn input_schema(&self) -> serde_json::Value;

    /// Runs one call. `arguments` is what the model sent: a JSON object for a real model, the text after
    /// the tool's name for a scripted `[[tool:NAME ARGS]]`. `abort` is signalled when the turn is
    /// cancelled, and when the call's deadline passed: a started call finishes (it may stop early, and should
    /// tell whatever runs it to stop) and its result is recorded.
    async fn call(&self, ctx: &ToolContext, arguments: &str, abort: &CancellationToken) -> ToolReturn;
}

/// Field `key` of `arguments` when they are a JSON object: `Some(None)` for an object without it,
/// `None` when the arguments are not a JSON object (scripted plain text).
fn json_field(arguments: &str, key: &str) -> Option<Option<serde_json::Value>> {
    let trimmed = arguments.trim_start();
    if !trimmed.starts_with('{') {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(trimmed) {
        Ok(serde_json::Value::Object(mut object)) => Some(object.remove(key)),
        _ => None,
    }
}
