//! Client tools across the cluster (SPEC §9, docs/decisions/0013-client-tools.md): the subjects a worker
//! calls a client tool on and the gateways that hold executors answer, and the [`ToolBus`] seam between
//! them — NATS request/reply in a cluster ([`NatsToolBus`]), the gateway's own executor table in a
//! `turnstile dev` on the embedded journal.
//!
//! | subject | who listens | payload → reply |
//! |---|---|---|
//! | `turnstile.tools.<tenant>.<tool>` | queue group [`QUEUE_GROUP`] of the gateways holding an executor of the tool | `ToolCallTask` → `ToolCallResult` |
//! | `turnstile.toolspec.<tenant>.<tool>` | the same gateways, same group | empty → `ClientToolSpec` |
//! | `turnstile.toolcancel.<tenant>` | every gateway with a client-tool hub | `ToolCallTask` (session and call id) |
//!
//! The queue group makes exactly one gateway answer each call; NATS "no responders" is how a worker learns
//! at once that no executor is connected anywhere.

use std::time::Duration;

use async_trait::async_trait;
use prost::Message as _;
use turnstile_proto::v1 as pb;

/// Prefix of the call subjects: `turnstile.tools.<tenant>.<tool>`.
pub const CALL_PREFIX: &str = "turnstile.tools";
/// Prefix of the schema subjects: `turnstile.toolspec.<tenant>.<tool>`.
pub const SPEC_PREFIX: &str = "turnstile.toolspec";
/// Prefix of the cancel subjects: `turnstile.toolcancel.<tenant>`.
pub const CANCEL_PREFIX: &str = "turnstile.toolcancel";
/// The queue group of the gateways on call and schema subjects.
pub const QUEUE_GROUP: &str = "turnstile-gateways";

/// `turnstile.tools.<tenant>.<tool>`.
pub fn call_subject(tenant: &str, tool: &str) -> String {
    format!("{CALL_PREFIX}.{tenant}.{tool}")
}

/// `turnstile.toolspec.<tenant>.<tool>`.
pub fn spec_subject(tenant: &str, tool: &str) -> String {
    format!("{SPEC_PREFIX}.{tenant}.{tool}")
}

/// `turnstile.toolcancel.<tenant>`.
pub fn cancel_subject(tenant: &str) -> String {
    format!("{CANCEL_PREFIX}.{tenant}")
}

/// Why a client tool call or schema lookup got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolBusError {
    /// No executor of the tool is connected to any gateway.
    #[error("no executor for tool {0}")]
    NoExecutor(String),
    /// The bus failed (NATS down, a reply that does not decode, no answer in time).
    #[error("{0}")]
    Failed(String),
}

/// Reaches the executors of client tools.
#[async_trait]
pub trait ToolBus: Send + Sync + std::fmt::Debug + 'static {
    /// Runs `task` on an executor of the tool it names, of its session's tenant ([`addressee`]); gives up
    /// after `wait`.
    async fn call(&self, task: pb::ToolCallTask, wait: Duration) -> Result<pb::ToolCallResult, ToolBusError>;

    /// Tells the executor running `task` (its session and call id) to stop. Best effort.
    async fn cancel(&self, task: pb::ToolCallTask);

    /// The schema the executors of `tool` registered; `None` when none is connected.
    async fn spec(&self, tenant: &str, tool: &str) -> Result<Option<pb::ClientToolSpec>, ToolBusError>;
}

/// Whom `task` is for: its session's tenant and the tool it names. The task is the one place these are
/// said, so a bus cannot route a call under one name while the executor reads another.
pub fn addressee(task: &pb::ToolCallTask) -> Result<(&str, &str), ToolBusError> {
    match &task.session {
        Some(session) if !session.tenant.is_empty() && !task.name.is_empty() => Ok((&session.tenant, &task.name)),
        _ => Err(ToolBusError::Failed(format!("call {:?} names no session tenant or no tool", task.call_id))),
    }
}

/// How long a schema lookup may take: it runs before every model request of an agent with client tools.
pub const SPEC_TIMEOUT: Duration = Duration::from_secs(2);

/// The [`ToolBus`] of a cluster: NATS request/reply to the gateways.
#[derive(Clone, Debug)]
pub struct NatsToolBus {
    client: async_nats::Client,
}

impl NatsToolBus {
    pub fn new(client: async_nats::Client) -> Self {
        Self { client }
    }

    async fn request(
        &self,
        subject: String,
        payload: Vec<u8>,
        wait: Duration,
        tool: &str,
    ) -> Result<bytes::Bytes, ToolBusError> {
        let request = async_nats::Request::new().payload(payload.into()).timeout(Some(wait));
        match self.client.send_request(subject.clone(), request).await {
            Ok(message) => Ok(message.payload),
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                Err(ToolBusError::NoExecutor(tool.to_owned()))
            }
            Err(e) if e.kind() == async_nats::RequestErrorKind::TimedOut => {
                Err(ToolBusError::Failed(format!("no answer on {subject} within {} ms", wait.as_millis())))
            }
            Err(e) => Err(ToolBusError::Failed(format!("request on {subject} failed: {e}"))),
        }
    }
}

#[async_trait]
impl ToolBus for NatsToolBus {
    async fn call(&self, task: pb::ToolCallTask, wait: Duration) -> Result<pb::ToolCallResult, ToolBusError> {
        let (tenant, tool) = addressee(&task)?;
        let reply = self.request(call_subject(tenant, tool), task.encode_to_vec(), wait, tool).await?;
        pb::ToolCallResult::decode(reply)
            .map_err(|e| ToolBusError::Failed(format!("the gateway's reply to a call of {tool} does not decode: {e}")))
    }

    async fn cancel(&self, task: pb::ToolCallTask) {
        let Ok((tenant, _)) = addressee(&task) else { return };
        // Core NATS, fire and forget: a gateway that misses it still ends the call at its deadline.
        if let Err(e) = self.client.publish(cancel_subject(tenant), task.encode_to_vec().into()).await {
            tracing::warn!(error = %e, call_id = %task.call_id, "could not publish a client tool cancel");
        }
    }

    async fn spec(&self, tenant: &str, tool: &str) -> Result<Option<pb::ClientToolSpec>, ToolBusError> {
        match self.request(spec_subject(tenant, tool), Vec::new(), SPEC_TIMEOUT, tool).await {
            Ok(reply) => pb::ClientToolSpec::decode(reply)
                .map(Some)
                .map_err(|e| ToolBusError::Failed(format!("the schema of {tool} does not decode: {e}"))),
            Err(ToolBusError::NoExecutor(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tenant: Option<&str>, name: &str) -> pb::ToolCallTask {
        pb::ToolCallTask {
            session: tenant.map(|t| pb::SessionRef { tenant: t.into(), id: "s1".into() }),
            call_id: "c1".into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_is_addressed_by_its_session_tenant_and_tool_name() {
        assert_eq!(addressee(&task(Some("acme"), "lookup")), Ok(("acme", "lookup")));
        for unaddressed in [task(None, "lookup"), task(Some(""), "lookup"), task(Some("acme"), "")] {
            let Err(ToolBusError::Failed(why)) = addressee(&unaddressed) else {
                panic!("{unaddressed:?} is addressed")
            };
            assert!(why.contains("\"c1\""), "the error names the call: {why}");
        }
    }
}
