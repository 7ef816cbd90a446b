//! Client tools (SPEC §9, docs/decisions/0013-client-tools.md): a call goes to an executor a client holds
//! on some gateway's `ServeTools` stream, over a [`ToolBus`] (NATS request/reply in a cluster).
//!
//! The call carries the durable call id, the session and the deadline; NATS "no responders" ends it at
//! once with `no executor for tool T`. An abort or the deadline (the registry fires `abort` then) sends a
//! `cancel` and ends the call at once: the executor's late result, if any, is refused by its gateway.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::{ToolBus, ToolBusError};
use turnstile_proto::v1 as pb;

use super::{Tool, ToolContext, ToolReturn};
use crate::llm::chat::ToolSpec;

/// Where the client tool bus is set once the node has it (after the agents are built).
pub type ClientBusSlot = Arc<std::sync::OnceLock<Arc<dyn turnstile_cluster::ToolBus>>>;

/// How the error of a call with no executor starts (`no executor for tool T`).
pub const NO_EXECUTOR: &str = "no executor for tool";

/// How long past its deadline the bus waits for a call's reply; the registry ends the call at the
/// deadline, this only bounds a request nobody answers.
const BUS_GRACE: Duration = Duration::from_secs(1);

/// One call of client tool `name`.
#[derive(Debug)]
pub struct ClientTool {
    name: String,
    bus: Arc<dyn ToolBus>,
}

impl ClientTool {
    pub fn new(name: impl Into<String>, bus: Arc<dyn ToolBus>) -> Self {
        Self { name: name.into(), bus }
    }
}

/// Sends a cancel for the call unless disarmed: however the call's future ends early (abort, deadline,
/// the runner dropped), the executor hears of it.
struct CancelOnDrop {
    bus: Arc<dyn ToolBus>,
    task: Option<pb::ToolCallTask>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.task.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let bus = self.bus.clone();
            runtime.spawn(async move { bus.cancel(task).await });
        }
    }
}

#[async_trait]
impl Tool for ClientTool {
    /// Client tools describe themselves at request time ([`offered`]); this registry entry is never listed.
    fn description(&self) -> &str {
        ""
    }

    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }

    async fn call(&self, ctx: &ToolContext, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        let deadline_unix_ms =
            turnstile_ops::clock::now_ms().saturating_add(u64::try_from(ctx.deadline.as_millis()).unwrap_or(u64::MAX));
        let task = pb::ToolCallTask {
            session: Some(pb::SessionRef { tenant: ctx.session.tenant.clone(), id: ctx.session.id.clone() }),
            call_id: ctx.call_id.clone(),
            name: self.name.clone(),
            // A scripted `[[tool:NAME ARGS]]` may pass plain text; executors get JSON either way.
            arguments_json: arguments_json(arguments),
            deadline_unix_ms,
            idempotency_key: ctx.idempotency_key.clone(),
        };
        let mut guard = CancelOnDrop { bus: self.bus.clone(), task: Some(task.clone()) };
        let started = tokio::time::Instant::now();
        let result = tokio::select! {
            r = self.bus.call(task, ctx.deadline + BUS_GRACE) => r,
            () = abort.cancelled() => {
                // The guard sends the cancel as this returns.
                return ToolReturn::failed(format!(
                    "aborted after {} ms; the executor of {} was sent a cancel",
                    started.elapsed().as_millis(),
                    self.name
                ));
            }
        };
        guard.task = None;
        match result {
            Ok(result) => ToolReturn {
                output: result.output,
                error: result.error,
                concludes_turn: false,
                context: result.context,
                memory: Vec::new(),
            },
            Err(ToolBusError::NoExecutor(tool)) => ToolReturn::failed(format!("{NO_EXECUTOR} {tool}")),
            Err(ToolBusError::Failed(message)) => {
                ToolReturn::failed(format!("client tool {} failed: {message}", self.name))
            }
        }
    }
}

/// `arguments` as JSON: as they are when they parse, else a JSON string of the text.
fn arguments_json(arguments: &str) -> String {
    let trimmed = arguments.trim();
    if trimmed.is_empty() {
        return "{}".to_owned();
    }
    match serde_json::from_str::<serde_json::Value>(trimmed) {
        Ok(_) => trimmed.to_owned(),
        Err(_) => serde_json::Value::String(arguments.to_owned()).to_string(),
    }
}

/// What the model is told about client tools `names` of `tenant` now: the schema their executors
/// registered; a tool with no executor connected (or whose lookup failed) is not offered.
pub async fn offered(bus: &dyn ToolBus, tenant: &str, names: &[String]) -> Vec<ToolSpec> {
    let lookups = names.iter().map(|name| async move { (name, bus.spec(tenant, name).await) });
    let mut specs = Vec::new();
    for (name, found) in futures::future::join_all(lookups).await {
        match found {
            Ok(Some(spec)) => match serde_json::from_str(&spec.input_schema_json) {
                Ok(input_schema) => {
                    specs.push(ToolSpec { name: name.clone(), description: spec.description, input_schema });
                }
                Err(e) => tracing::warn!(tool = %name, error = %e, "a client tool's registered schema is not JSON"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(tool = %name, error = %e, "could not look up a client tool's schema"),
        }
    }
    specs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use super::*;
    use turnstile_worker::agent::{ToolRun, Tools};

    #[test]
    fn arguments_become_json() {
        assert_eq!(arguments_json(r#"{"q":"x"}"#), r#"{"q":"x"}"#);
        assert_eq!(arguments_json(""), "{}");
        assert_eq!(arguments_json("hello there"), r#""hello there""#);
    }

    /// A bus whose executor answers after `delay`, recording cancels.
    #[derive(Debug, Default)]
    struct Slow {
        delay: Duration,
        cancels: Mutex<Vec<String>>,
        none: bool,
    }

    #[async_trait]
    impl ToolBus for Slow {
        async fn call(&self, task: pb::ToolCallTask, _wait: Duration) -> Result<pb::ToolCallResult, ToolBusError> {
            if self.none {
                return Err(ToolBusError::NoExecutor(task.name));
            }
            tokio::time::sleep(self.delay).await;
            Ok(pb::ToolCallResult {
                call_id: task.call_id,
                output: format!("got {}", task.arguments_json),
                error: None,
                context: vec!["note".into()],
            })
        }

        async fn cancel(&self, task: pb::ToolCallTask) {
            self.cancels.lock().unwrap().push(task.call_id);
        }

        async fn spec(&self, _tenant: &str, tool: &str) -> Result<Option<pb::ClientToolSpec>, ToolBusError> {
            Ok((tool == "lookup").then(|| pb::ClientToolSpec {
                name: tool.into(),
                description: "finds".into(),
                input_schema_json: r#"{"type":"object"}"#.into(),
            }))
        }
    }

    fn ctx(deadline_ms: u64) -> ToolContext {
        ToolContext { call_id: "c1".into(), deadline: Duration::from_millis(deadline_ms), ..ToolContext::default() }
    }

    #[tokio::test]
    async fn results_no_executor_abort_and_schemas() {
        let bus = Arc::new(Slow { delay: Duration::from_millis(10), ..Slow::default() });
        let tool = ClientTool::new("lookup", bus.clone());
        let r = tool.call(&ctx(1000), r#"{"q":"x"}"#, &CancellationToken::new()).await;
        assert_eq!(r.output, r#"got {"q":"x"}"#);
        assert_eq!(r.context, vec!["note".to_owned()]);
        assert!(bus.cancels.lock().unwrap().is_empty());

        let none = ClientTool::new("lookup", Arc::new(Slow { none: true, ..Slow::default() }));
        let r = none.call(&ctx(1000), "{}", &CancellationToken::new()).await;
        assert_eq!(r.error.as_deref(), Some("no executor for tool lookup"));

        let slow = Arc::new(Slow { delay: Duration::from_secs(30), ..Slow::default() });
        let tool = ClientTool::new("lookup", slow.clone());
        let abort = CancellationToken::new();
        let stop = abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            stop.cancel();
        });
        let r = tool.call(&ctx(60_000), "{}", &abort).await;
        assert!(r.error.unwrap().starts_with("aborted after"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*slow.cancels.lock().unwrap(), vec!["c1".to_owned()]);

        let specs = offered(slow.as_ref(), "t", &["lookup".into(), "gone".into()]).await;
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].name, "lookup");
        assert_eq!(specs[0].description, "finds");
    }

    #[tokio::test]
    async fn the_registry_refuses_unlisted_tools_and_times_out_with_a_cancel() {
        let mut config = turnstile_config::Config::default();
        let agent = config.agents.get_mut(turnstile_config::SCRIPTED).unwrap();
        agent.tools.push("client:lookup".parse().unwrap());
        agent.tool_deadline_ms = Some(50);
        let slow = Arc::new(Slow { delay: Duration::from_secs(30), ..Slow::default() });
        let tools = super::super::ToolRegistry::builtin().with_policy(Arc::new(config)).with_client_tools(slow.clone());
        let session = turnstile_model::message::SessionRef::new("t", "s").unwrap();
        let abort = CancellationToken::new();
        let request = |call_id: &str, name: &str, arguments: &str| turnstile_driver::ToolRequest {
            op: 1,
            agent: "scripted".into(),
            agent_hash: String::new(),
            turn: 1,
            step: 1,
            call: turnstile_model::ToolCallSpec {
                call_id: call_id.into(),
                name: name.into(),
                arguments: arguments.into(),
            },
            tools: None,
            idempotency_key: format!("t/s/1/1/{call_id}"),
        };
        let released = CancellationToken::new();
        let call = |request: turnstile_driver::ToolRequest| {
            let (tools, session, abort, released) = (&tools, &session, &abort, &released);
            async move { Tools::call(tools, ToolRun { session, request: &request, abort, released }).await }
        };
        let r = call(request("c9", "other", "{}")).await;
        assert_eq!(
            r.error.as_deref(),
            Some(
                "tool other is not available to agent scripted (its tools: sleep, echo, clock, client:lookup); call one of those"
            )
        );
        let r = call(request("c9", "lookup", "{}")).await;
        assert_eq!(r.error.as_deref(), Some(super::super::TOOL_TIMEOUT));
        // The cancel is sent from a task of its own.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(*slow.cancels.lock().unwrap(), vec!["c9".to_owned()]);
        let r = call(request("c10", "echo", "hi")).await;
        assert_eq!(r.output, "hi");
    }
}
