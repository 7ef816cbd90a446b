//! [`ToolRegistry`]: the tools of every agent of a worker, by name, and the worker's
//! [`Tools`]: the one place a call is checked against its agent's list, bounded by its deadline, measured
//! and traced.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::ToolBus;
use turnstile_config::{Config, ToolId};
use turnstile_worker::agent::{ToolRun, Tools};

use super::builtin::{Clock, Echo, Sleep};
use super::metrics::ToolCall;
use super::{
    ChildSessions, ChildSessionsSlot, ClientBusSlot, DEFAULT_DEADLINE, SPAWN_AGENT, SpawnAgent, SpawnLimits,
    TOOL_TIMEOUT, Tool, ToolContext, ToolReturn, client,
};
use crate::llm::chat::ToolSpec;

/// The refusal of a call of `name` that agent `agent` does not list among `tools`.
pub(crate) fn not_offered(name: &str, agent: &str, tools: &[impl ToString]) -> ToolReturn {
    let listed = listed(tools.iter().map(ToString::to_string));
    ToolReturn::failed(format!(
        "tool {name} is not available to agent {agent} (its tools: {listed}); call one of those"
    ))
}

/// `names` joined with commas for a refusal, `none` when there are none.
pub(crate) fn listed(names: impl Iterator<Item = String>) -> String {
    let names: Vec<String> = names.collect();
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

/// How long a tool may take to wind down (send its cancel) after its deadline passed, before the call
/// ends anyway.
const CANCEL_GRACE: Duration = Duration::from_millis(200);

/// The tools a worker offers, by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Which agent may call what, and each call's deadline; `None`: every tool, [`DEFAULT_DEADLINE`].
    policy: Option<Arc<Config>>,
    /// Reaches client tool executors once set (shared with the agents' models); empty: no client tools.
    client: ClientBusSlot,
    /// Reaches other sessions once set, for `spawn_agent`; empty: it answers that it cannot run here.
    children: ChildSessionsSlot,
    /// Reaches the tenants' memory once set, for the memory tools; empty: they answer that they cannot run.
    memory: super::MemorySlot,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// The built-ins `sleep`, `echo`, `clock` and `spawn_agent` (which runs once
    /// [`ToolRegistry::set_child_sessions`] gave it a route to other sessions).
    pub fn builtin() -> Self {
        let mut r = Self::default();
        r.register("sleep", Arc::new(Sleep));
        r.register("echo", Arc::new(Echo));
        r.register("clock", Arc::new(Clock::default()));
        r.offer_agents(Vec::new(), SpawnLimits::default());
        for (name, op) in [
            ("memory_get", super::MemoryOp::Get),
            ("memory_put", super::MemoryOp::Put),
            ("memory_search", super::MemoryOp::Search),
        ] {
            let tool = super::MemoryTool::new(op, r.memory.clone());
            r.register(name, Arc::new(tool));
        }
        r
    }

    /// The memory tools reach `store` from now on; the first one set stays.
    pub fn set_memory(&self, store: Arc<dyn turnstile_journal::MemoryStore>) {
        let _ = self.memory.set(store);
    }

    /// `spawn_agent` offers these agents to the model (the configuration's), within `limits`.
    pub fn offer_agents(&mut self, agents: Vec<String>, limits: SpawnLimits) {
        let tool = SpawnAgent::new(self.children.clone(), agents, limits);
        self.register(SPAWN_AGENT, Arc::new(tool));
    }

    /// `spawn_agent` reaches other sessions through `children` from now on; the first one set stays.
    pub fn set_child_sessions(&self, children: ChildSessions) {
        let _ = self.children.set(children);
    }

    /// Whether a tool named `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// What the model is told about tool `name`: its name, description and argument schema.
    pub fn spec(&self, name: &str) -> Option<ToolSpec> {
        self.tools.get(name).map(|tool| ToolSpec {
            name: name.to_owned(),
            description: tool.description().to_owned(),
            input_schema: tool.input_schema(),
        })
    }

    pub fn register(&mut self, name: impl Into<String>, tool: Arc<dyn Tool>) {
        self.tools.insert(name.into(), tool);
    }

    /// Calls are allowed and bounded as `config` says: an agent calls only the tools it lists, within
    /// [`Config::tool_deadline`].
    pub fn with_policy(mut self, config: Arc<Config>) -> Self {
        self.policy = Some(config);
        self
    }

    /// Client tools are called over `bus`.
    pub fn with_client_tools(self, bus: Arc<dyn ToolBus>) -> Self {
        self.set_client_tools(bus);
        self
    }

    /// Client tools are called over `bus` from now on, here and in every model sharing this registry's
    /// slot ([`ToolRegistry::client_slot`]); the first bus set stays.
    pub fn set_client_tools(&self, bus: Arc<dyn ToolBus>) {
        let _ = self.client.set(bus);
    }

    /// The slot the client tool bus is set in.
    pub fn client_slot(&self) -> ClientBusSlot {
        self.client.clone()
    }

    /// Runs `name` for the default agent with no policy applied (tests, tools used on their own); an
    /// unknown tool is a failed call that names the ones there are.
    pub async fn call(&self, name: &str, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        match self.tools.get(name) {
            Some(tool) => tool.call(&ToolContext::default(), arguments, abort).await,
            None => ToolReturn::failed(self.unknown(name)),
        }
    }

    fn unknown(&self, name: &str) -> String {
        format!("unknown tool {name:?}; available: {}", self.tools.keys().cloned().collect::<Vec<_>>().join(", "))
    }

    /// The memory namespaces of the file's agent `agent` (none without a policy or such an agent).
    fn memory_of(&self, agent: &str) -> Vec<String> {
        let profile = self.policy.as_ref().and_then(|c| c.agents.get(agent));
        profile.and_then(|p| p.memory.as_ref()).map(|m| m.namespaces.clone()).unwrap_or_default()
    }

    /// Runs the call of `run`, already allowed, bounded by `deadline`, its memory tools reaching `memory` (an
    /// agent version of the API checks its own list and names its own namespaces:
    /// `crate::versions::VersionedTools`).
    pub async fn run_within(&self, run: ToolRun<'_>, memory: Vec<String>, deadline: Duration) -> ToolReturn {
        let measure = ToolCall::start(ToolId::from_call_name(&run.request.call.name));
        self.call_within(run, memory, deadline, measure).await
    }

    async fn call_within(
        &self,
        ToolRun { session, request, abort, released }: ToolRun<'_>,
        memory: Vec<String>,
        deadline: Duration,
        mut measure: ToolCall,
    ) -> ToolReturn {
        let (name, arguments) = (request.call.name.as_str(), request.call.arguments.as_str());
        let id = ToolId::from_call_name(name);
        let tool: Arc<dyn Tool> = match (self.tools.get(name), id, self.client.get()) {
            (Some(tool), _, _) => tool.clone(),
            (None, ToolId::Client(tool), Some(bus)) => Arc::new(client::ClientTool::new(tool, bus.clone())),
            (None, _, _) => {
                measure.end("unavailable");
                return ToolReturn::failed(self.unknown(name));
            }
        };
        let ctx = ToolContext {
            session: session.clone(),
            call_id: request.call.call_id.clone(),
            idempotency_key: request.idempotency_key.clone(),
            agent: request.agent.clone(),
            deadline,
            released: released.clone(),
            memory,
        };
        let stop = abort.child_token();
        let call = tool.call(&ctx, arguments, &stop);
        tokio::pin!(call);
        let r = tokio::select! {
            r = &mut call => r,
            () = tokio::time::sleep(deadline) => {
                stop.cancel();
                // Let the tool send its cancel (MCP notification, client `cancel`); its own result is not
                // the outcome.
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut call).await;
                ToolReturn {
                    output: format!("{name} gave no result within {} ms; the call was cancelled", deadline.as_millis()),
                    ..ToolReturn::failed(TOOL_TIMEOUT)
                }
            }
        };
        let outcome = match r.error.as_deref() {
            None => "ok",
            Some(TOOL_TIMEOUT) => TOOL_TIMEOUT,
            Some(e) if e.starts_with(client::NO_EXECUTOR) => "no_executor",
            Some(_) if abort.is_cancelled() => "aborted",
            Some(_) => "error",
        };
        measure.end(outcome);
        r
    }
}

#[async_trait]
impl Tools for ToolRegistry {
    /// Runs the call of `run`: refused when its agent does not list the tool (a model may name any tool), bounded
    /// by the agent's deadline for it (`tool_timeout`; the tool sees `abort` fire and gets a short grace to
    /// send its cancel), counted and timed (`turnstile_tool_calls_total`). `released` is
    /// [`ToolContext::released`]. (The inherent [`ToolRegistry::call`] runs a tool by name with no policy.)
    async fn call(&self, run: ToolRun<'_>) -> ToolReturn {
        let (agent, name) = (run.request.agent.as_str(), run.request.call.name.as_str());
        let id = ToolId::from_call_name(name);
        let mut measure = ToolCall::start(id);
        let memory = self.memory_of(agent);
        let deadline = match &self.policy {
            None => DEFAULT_DEADLINE,
            Some(config) => match config.agents.get(agent) {
                Some(profile) if profile.offers(id) => config.tool_deadline(profile, id),
                Some(profile) => {
                    measure.end("unavailable");
                    return not_offered(name, agent, &profile.tools);
                }
                // An agent the configuration does not name (a catalog built apart): no list to check.
                None => DEFAULT_DEADLINE,
            },
        };
        self.call_within(run, memory, deadline, measure).await
    }
}
