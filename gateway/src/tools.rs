//! `ServeTools`: client tool executors (SPEC §9, docs/decisions/0013-client-tools.md).
//!
//! A client opens the stream, registers its tools, then receives `call`s and `cancel`s and sends
//! `result`s. The [`ToolHub`] keeps this gateway's executors by (tenant, tool), picks one round robin for
//! each call, and fails the calls in flight on an executor that leaves. With NATS it makes the executors
//! reachable from every worker: for each (tenant, tool) it serves it joins the gateways' queue group on
//! the tool's call and schema subjects (`turnstile_cluster::tools`), and leaves when its last executor of
//! that tool does. Without NATS (`turnstile dev` on the embedded journal) the in-process worker calls the
//! hub directly: it is a [`ToolBus`] itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use turnstile_model::sync::lock;

use async_trait::async_trait;
use futures::StreamExt;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use turnstile_cluster::tools::{QUEUE_GROUP, addressee, call_subject, spec_subject};
use turnstile_cluster::{ToolBus, ToolBusError};
use turnstile_model::tool_names::{BUILTIN_TOOL_NAMES, MAX_MODEL_TOOL_NAME, MCP_SEPARATOR, is_model_tool_name};
use turnstile_proto::v1 as pb;

/// The header naming an executor's tenant when auth is off (with auth, the token's tenant is used).
pub const TENANT_HEADER: &str = "turnstile-tenant";

/// Tasks buffered per executor stream before a call is refused as busy.
const STREAM_BUFFER: usize = 256;

/// How long a call may wait past its deadline for a result before the gateway gives up on it (the worker
/// has given up by then and sent a cancel, which normally ends it first).
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// How long a new stream may take to send its `register`: a client that opens and stays silent would hold
/// the handler (and itself, waiting for the response headers) forever.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a registration waits for another gateway's schema of a tool it registers.
const CONFLICT_CHECK: Duration = Duration::from_millis(500);

/// The error of a call whose executor's stream ended before its result.
pub fn disconnected(tool: &str) -> String {
    format!("executor of tool {tool} disconnected mid-call")
}

/// This gateway's client tool executors. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolHub {
    state: Arc<Mutex<State>>,
    nats: Option<async_nats::Client>,
    next_id: Arc<AtomicU64>,
}

impl std::fmt::Debug for ToolHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("ToolHub")
            .field("executors", &state.executors.len())
            .field("tools", &state.tools.len())
            .field("nats", &self.nats.is_some())
            .finish()
    }
}

#[derive(Default)]
struct State {
    executors: HashMap<u64, Executor>,
    /// (tenant, tool) → who serves it.
    tools: HashMap<(String, String), Served>,
}

struct Executor {
    tenant: String,
    tx: mpsc::Sender<Result<pb::ToolTask, Status>>,
    /// Calls sent down this stream and not answered yet, by call id.
    pending: HashMap<String, Pending>,
}

struct Pending {
    session: Option<pb::SessionRef>,
    tool: String,
    reply: oneshot::Sender<pb::ToolCallResult>,
}

struct Served {
    spec: pb::ClientToolSpec,
    /// The schema, parsed: two registrations agree when these are equal (key order and spacing aside).
    schema: serde_json::Value,
    executors: Vec<u64>,
    next: usize,
    /// The NATS subscriptions of this tool; aborted when the last executor leaves.
    subscription: Option<AbortHandle>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(task) = self.subscription.take() {
            task.abort();
        }
    }
}

/// A registration refused, with what to fix.
fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// Checks one tool of a registration; its parsed schema.
pub fn validate(spec: &pb::ClientToolSpec) -> Result<serde_json::Value, Status> {
    let name = &spec.name;
    if !is_model_tool_name(name) {
        return Err(invalid(format!(
            "tool name {name:?} is invalid: use 1 to {MAX_MODEL_TOOL_NAME} of letters, digits, '_' and '-'"
        )));
    }
    if name.contains(MCP_SEPARATOR) {
        return Err(invalid(format!(
            "tool name {name:?} contains \"__\", which is reserved for MCP tools (SERVER__TOOL); rename the tool"
        )));
    }
    if BUILTIN_TOOL_NAMES.contains(&name.as_str()) {
        return Err(invalid(format!(
            "tool name {name:?} is a built-in tool's name (built-ins: {}); rename the tool",
            BUILTIN_TOOL_NAMES.join(", ")
        )));
    }
    let schema: serde_json::Value = serde_json::from_str(&spec.input_schema_json).map_err(|e| {
        invalid(format!("tool {name:?}: input_schema_json is not JSON ({e}); send a JSON Schema object such as {{\"type\":\"object\",\"properties\":{{}}}}"))
    })?;
    match schema.get("type") {
        Some(serde_json::Value::String(t)) if t == "object" && schema.is_object() => Ok(schema),
        _ => Err(invalid(format!(
            "tool {name:?}: input_schema_json must be a JSON Schema of \"type\": \"object\" (the tool's arguments), got {}",
            truncate(&spec.input_schema_json)
        ))),
    }
}

fn truncate(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}

/// Removes this executor when its stream ends, however it ends (client gone, gateway task aborted).
struct Leave {
    hub: ToolHub,
    id: u64,
}

impl Drop for Leave {
    fn drop(&mut self) {
        self.hub.leave(self.id);
    }
}

impl ToolHub {
    /// A hub reachable only in this process.
    pub fn new() -> Self {
        Self::default()
    }

    /// A hub that serves its tools to every worker on `client`'s NATS, and hears their cancels.
    pub async fn with_nats(client: async_nats::Client) -> Result<Self, async_nats::SubscribeError> {
        let hub = Self { nats: Some(client.clone()), ..Self::default() };
        let mut cancels = client.subscribe(format!("{}.>", turnstile_cluster::tools::CANCEL_PREFIX)).await?;
        let weak = Arc::downgrade(&hub.state);
        tokio::spawn(async move {
            while let Some(message) = cancels.next().await {
                let Some(state) = weak.upgrade() else { break };
                let Some(tenant) = message.subject.rsplit('.').next() else { continue };
                if let Ok(task) = pb::ToolCallTask::decode(message.payload) {
                    cancel_in(&state, tenant, task.session.as_ref(), &task.call_id);
                }
            }
        });
        Ok(hub)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Serves one `ServeTools` stream of `tenant`: the first message must register the tools.
    pub async fn serve(
        &self,
        tenant: String,
        mut inbound: impl futures::Stream<Item = Result<pb::ToolWorkerMessage, Status>> + Send + Unpin + 'static,
    ) -> Result<ReceiverStream<Result<pb::ToolTask, Status>>, Status> {
        let Ok(first) = tokio::time::timeout(REGISTER_TIMEOUT, inbound.next()).await else {
            return Err(Status::deadline_exceeded(format!(
                "no `register` within {} s of opening ServeTools; send `register {{tools: [...]}}` first",
                REGISTER_TIMEOUT.as_secs()
            )));
        };
        let register = match first {
            Some(Ok(pb::ToolWorkerMessage { message: Some(pb::tool_worker_message::Message::Register(r)) })) => r,
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(invalid(
                    "the first ServeTools message must be `register {tools: [...]}`; send the tools you serve first"
                        .into(),
                ));
            }
        };
        if register.tools.is_empty() {
            return Err(invalid("`register` lists no tools; list at least one tool you serve".into()));
        }
        let mut checked = Vec::with_capacity(register.tools.len());
        for spec in &register.tools {
            let schema = validate(spec)?;
            if checked.iter().any(|(s, _): &(pb::ClientToolSpec, _)| s.name == spec.name) {
                return Err(invalid(format!(
                    "tool {:?} is listed twice in one registration; list each tool once",
                    spec.name
                )));
            }
            checked.push((spec.clone(), schema));
        }
        self.check_other_gateways(&tenant, &checked).await?;

        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let new_tools = self.join(id, &tenant, tx.clone(), &checked)?;
        let leave = Leave { hub: self.clone(), id };
        for tool in new_tools {
            if let Err(e) = self.subscribe(&tenant, &tool).await {
                drop(leave);
                return Err(Status::unavailable(format!(
                    "could not offer tool {tool:?} to the cluster ({e}); retry the registration"
                )));
            }
        }
        let names = checked.iter().map(|(s, _)| s.name.clone()).collect::<Vec<_>>();
        tracing::info!(%tenant, tools = ?names, executor = id, "client tool executor registered");
        crate::ops::executors_changed(1);
        let registered =
            pb::ToolTask { task: Some(pb::tool_task::Task::Registered(pb::ToolsRegistered { tools: names })) };
        // The buffer is empty: this cannot fail for lack of room.
        let _ = tx.try_send(Ok(registered));
        let hub = self.clone();
        tokio::spawn(async move {
            let _leave = leave;
            loop {
                tokio::select! {
                    () = tx.closed() => break,
                    message = inbound.next() => match message {
                        Some(Ok(message)) => hub.received(id, message, &tx),
                        Some(Err(_)) | None => break,
                    },
                }
            }
            crate::ops::executors_changed(-1);
            tracing::info!(executor = id, "client tool executor left");
        });
        Ok(ReceiverStream::new(rx))
    }

    /// Refuses a tool another gateway's executors of this tenant serve with a different schema.
    async fn check_other_gateways(
        &self,
        tenant: &str,
        checked: &[(pb::ClientToolSpec, serde_json::Value)],
    ) -> Result<(), Status> {
        let Some(client) = &self.nats else { return Ok(()) };
        for (spec, schema) in checked {
            let request = async_nats::Request::new().timeout(Some(CONFLICT_CHECK));
            let Ok(reply) = client.send_request(spec_subject(tenant, &spec.name), request).await else {
                continue; // no responders (nobody serves it) or no answer: nothing to conflict with
            };
            let Ok(other) = pb::ClientToolSpec::decode(reply.payload) else { continue };
            let theirs: Option<serde_json::Value> = serde_json::from_str(&other.input_schema_json).ok();
            if theirs.as_ref() != Some(schema) {
                return Err(conflict(&spec.name));
            }
        }
        Ok(())
    }

    /// Adds executor `id`; the tools nobody here served before (to subscribe to).
    fn join(
        &self,
        id: u64,
        tenant: &str,
        tx: mpsc::Sender<Result<pb::ToolTask, Status>>,
        checked: &[(pb::ClientToolSpec, serde_json::Value)],
    ) -> Result<Vec<String>, Status> {
        let mut state = self.lock();
        for (spec, schema) in checked {
            if let Some(served) = state.tools.get(&(tenant.to_owned(), spec.name.clone()))
                && served.schema != *schema
            {
                return Err(conflict(&spec.name));
            }
        }
        let mut new_tools = Vec::new();
        for (spec, schema) in checked {
            let served = state.tools.entry((tenant.to_owned(), spec.name.clone())).or_insert_with(|| {
                new_tools.push(spec.name.clone());
                Served {
                    spec: spec.clone(),
                    schema: schema.clone(),
                    executors: Vec::new(),
                    next: 0,
                    subscription: None,
                }
            });
            served.executors.push(id);
        }
        state.executors.insert(id, Executor { tenant: tenant.to_owned(), tx, pending: HashMap::new() });
        Ok(new_tools)
    }

    /// Joins the gateways' queue group on `tool`'s call and schema subjects, until the tool's last
    /// executor here leaves.
    async fn subscribe(&self, tenant: &str, tool: &str) -> Result<(), String> {
        let Some(client) = &self.nats else { return Ok(()) };
        let mut calls =
            client.queue_subscribe(call_subject(tenant, tool), QUEUE_GROUP.into()).await.map_err(|e| e.to_string())?;
        let mut specs =
            client.queue_subscribe(spec_subject(tenant, tool), QUEUE_GROUP.into()).await.map_err(|e| e.to_string())?;
        // The registration is acknowledged only once NATS routes calls here.
        client.flush().await.map_err(|e| e.to_string())?;
        let (hub, client, tenant_owned, tool_owned) =
            (self.clone(), client.clone(), tenant.to_owned(), tool.to_owned());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    Some(message) = calls.next() => {
                        let (hub, client) = (hub.clone(), client.clone());
                        let (tenant, tool) = (tenant_owned.clone(), tool_owned.clone());
                        tokio::spawn(async move {
                            let Some(reply_to) = message.reply else { return };
                            let result = match pb::ToolCallTask::decode(message.payload) {
                                // The subject routed it here: a task naming another tool or tenant is refused.
                                Ok(task) if addressee(&task) != Ok((&tenant, &tool)) => error_result(
                                    &task.call_id,
                                    format!("the call came for {tool} of tenant {tenant} but its task names another"),
                                ),
                                Ok(task) => {
                                    let wait = wait_for(task.deadline_unix_ms);
                                    match hub.call(task.clone(), wait).await {
                                        Ok(result) => result,
                                        Err(e) => error_result(&task.call_id, e.to_string()),
                                    }
                                }
                                Err(e) => error_result("", format!("the call of {tool} does not decode: {e}")),
                            };
                            let _ = client.publish(reply_to, result.encode_to_vec().into()).await;
                        });
                    }
                    Some(message) = specs.next() => {
                        let Some(reply_to) = message.reply else { continue };
                        let spec = hub.lock().tools.get(&(tenant_owned.clone(), tool_owned.clone())).map(|s| s.spec.clone());
                        if let Some(spec) = spec {
                            let _ = client.publish(reply_to, spec.encode_to_vec().into()).await;
                        }
                    }
                    else => break,
                }
            }
        });
        let mut state = self.lock();
        match state.tools.get_mut(&(tenant.to_owned(), tool.to_owned())) {
            Some(served) => served.subscription = Some(task.abort_handle()),
            // Every executor of it left while subscribing.
            None => task.abort(),
        }
        Ok(())
    }

    /// One message of executor `id` after its registration.
    fn received(&self, id: u64, message: pb::ToolWorkerMessage, tx: &mpsc::Sender<Result<pb::ToolTask, Status>>) {
        let reject = |call_id: String, reason: String| {
            let task = pb::ToolTask { task: Some(pb::tool_task::Task::Rejected(pb::ToolRejected { call_id, reason })) };
            let _ = tx.try_send(Ok(task));
        };
        match message.message {
            Some(pb::tool_worker_message::Message::Result(result)) => {
                let pending = self.lock().executors.get_mut(&id).and_then(|e| e.pending.remove(&result.call_id));
                match pending {
                    Some(pending) => {
                        let _ = pending.reply.send(result);
                    }
                    None => {
                        crate::ops::result_rejected();
                        reject(
                            result.call_id.clone(),
                            format!(
                                "no call {:?} is waiting for a result from this stream (unknown, already answered, cancelled or past its deadline); send results only for calls you received",
                                result.call_id
                            ),
                        );
                    }
                }
            }
            Some(pb::tool_worker_message::Message::Register(_)) => reject(
                String::new(),
                "this stream already registered its tools; open another ServeTools stream to serve other tools".into(),
            ),
            None => reject(String::new(), "empty ToolWorkerMessage; send `result`".into()),
        }
    }

    /// Executor `id` is gone: its calls in flight end with an error at once.
    fn leave(&self, id: u64) {
        let mut state = self.lock();
        let Some(executor) = state.executors.remove(&id) else { return };
        for (call_id, pending) in executor.pending {
            let _ = pending.reply.send(error_result(&call_id, disconnected(&pending.tool)));
        }
        let tenant = executor.tenant;
        state.tools.retain(|(t, _), served| {
            if *t == tenant {
                served.executors.retain(|e| *e != id);
            }
            !served.executors.is_empty()
        });
    }

    /// Tells the executor running call `call_id` of `session` to stop; the call ends now with an error.
    pub fn cancel(&self, tenant: &str, session: Option<&pb::SessionRef>, call_id: &str) {
        cancel_in(&self.state, tenant, session, call_id);
    }

    /// The schema this gateway's executors registered for (`tenant`, `tool`).
    pub fn spec_of(&self, tenant: &str, tool: &str) -> Option<pb::ClientToolSpec> {
        self.lock().tools.get(&(tenant.to_owned(), tool.to_owned())).map(|s| s.spec.clone())
    }
}

fn cancel_in(state: &Mutex<State>, tenant: &str, session: Option<&pb::SessionRef>, call_id: &str) {
    let mut state = lock(state);
    for executor in state.executors.values_mut().filter(|e| e.tenant == tenant) {
        let found = executor.pending.get(call_id).is_some_and(|p| session.is_none() || p.session.as_ref() == session);
        if !found {
            continue;
        }
        if let Some(pending) = executor.pending.remove(call_id) {
            let task = pb::ToolTask {
                task: Some(pb::tool_task::Task::Cancel(pb::ToolCancelTask { call_id: call_id.to_owned() })),
            };
            let _ = executor.tx.try_send(Ok(task));
            let _ =
                pending.reply.send(error_result(call_id, format!("call {call_id} of {} was cancelled", pending.tool)));
        }
        return;
    }
}

fn conflict(tool: &str) -> Status {
    Status::failed_precondition(format!(
        "tool {tool:?} is already served for this tenant with a different input schema; register it with the same schema, or under another name"
    ))
}

/// A failed call's result.
pub fn error_result(call_id: &str, error: String) -> pb::ToolCallResult {
    pb::ToolCallResult { call_id: call_id.to_owned(), output: String::new(), error: Some(error), context: Vec::new() }
}

/// How long to wait for a call whose deadline is `deadline_unix_ms` (0: none given).
fn wait_for(deadline_unix_ms: u64) -> Duration {
    let now = turnstile_ops::clock::now_ms();
    let left = if deadline_unix_ms == 0 { 60_000 } else { deadline_unix_ms.saturating_sub(now) };
    Duration::from_millis(left) + DEADLINE_GRACE
}

/// A call sent down one of this gateway's executors of (`tenant`, `tool`), waiting up to `wait` for its
/// result: the bus of `turnstile dev`, and what the NATS subjects of a cluster deliver to.
#[async_trait]
impl ToolBus for ToolHub {
    async fn call(&self, task: pb::ToolCallTask, wait: Duration) -> Result<pb::ToolCallResult, ToolBusError> {
        let (tenant, tool) = addressee(&task)?;
        let call_id = task.call_id.clone();
        let (reply_tx, reply_rx) = oneshot::channel();
        let sent = {
            let mut state = self.lock();
            let State { executors, tools } = &mut *state;
            let Some(served) = tools.get_mut(&(tenant.to_owned(), tool.to_owned())) else {
                return Err(ToolBusError::NoExecutor(tool.to_owned()));
            };
            // Round robin, skipping an executor already running a call of this id (call ids are unique
            // per session only).
            let n = served.executors.len();
            let chosen = (0..n)
                .map(|i| served.executors[(served.next + i) % n])
                .find(|id| executors.get(id).is_some_and(|e| !e.pending.contains_key(&call_id)));
            served.next = served.next.wrapping_add(1);
            let Some(id) = chosen else {
                return Err(ToolBusError::Failed(format!(
                    "every executor of tool {tool} is already running a call with id {call_id}"
                )));
            };
            let Some(executor) = executors.get_mut(&id) else {
                return Err(ToolBusError::NoExecutor(tool.to_owned()));
            };
            let message = pb::ToolTask { task: Some(pb::tool_task::Task::Call(task.clone())) };
            match executor.tx.try_send(Ok(message)) {
                Ok(()) => {
                    executor.pending.insert(
                        call_id.clone(),
                        Pending { session: task.session.clone(), tool: tool.to_owned(), reply: reply_tx },
                    );
                    Ok(id)
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Err(format!("the executor of tool {tool} is not reading its stream ({STREAM_BUFFER} tasks queued)"))
                }
                Err(mpsc::error::TrySendError::Closed(_)) => Err(disconnected(tool)),
            }
        };
        let id = sent.map_err(ToolBusError::Failed)?;
        match tokio::time::timeout(wait, reply_rx).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Ok(error_result(&call_id, disconnected(tool))),
            Err(_) => {
                // The worker gave up long ago; forget the call so a late result is refused.
                if let Some(executor) = self.lock().executors.get_mut(&id) {
                    executor.pending.remove(&call_id);
                }
                Err(ToolBusError::Failed(format!("no result for call {call_id} of {tool} in time")))
            }
        }
    }

    async fn cancel(&self, task: pb::ToolCallTask) {
        if let Ok((tenant, _)) = addressee(&task) {
            ToolHub::cancel(self, tenant, task.session.as_ref(), &task.call_id);
        }
    }

    async fn spec(&self, tenant: &str, tool: &str) -> Result<Option<pb::ClientToolSpec>, ToolBusError> {
        Ok(self.spec_of(tenant, tool))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(name: &str, schema: &str) -> pb::ClientToolSpec {
        pb::ClientToolSpec { name: name.into(), description: String::new(), input_schema_json: schema.into() }
    }

    #[test]
    fn names_and_schemas_are_checked() {
        let ok = r#"{"type":"object","properties":{"q":{"type":"string"}}}"#;
        assert!(validate(&spec("lookup", ok)).is_ok());
        assert!(validate(&spec("a-b_9", ok)).is_ok());
        for (name, needle) in [
            ("", "1 to 64"),
            ("a.b", "1 to 64"),
            (&"x".repeat(65), "1 to 64"),
            ("a__b", "reserved for MCP"),
            ("echo", "built-in"),
            ("spawn_agent", "built-in"),
        ] {
            let e = validate(&spec(name, ok)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(needle), "{name}: {}", e.message());
        }
        for bad in ["{", "[]", r#"{"type":"string"}"#, "{}"] {
            let e = validate(&spec("t", bad)).unwrap_err();
            assert!(e.message().contains("input_schema_json"), "{bad}: {}", e.message());
        }
    }

    #[test]
    fn deadlines_bound_the_wait() {
        assert!(wait_for(0) >= Duration::from_secs(60));
        assert_eq!(wait_for(1), DEADLINE_GRACE);
    }
}
