//! Tools a model step can call, the built-ins `sleep`, `echo`, `clock` and `spawn_agent` ([`spawn`]), the
//! tools of MCP servers ([`mcp`]) and client tools served over `ServeTools` ([`client`]).
//!
//! Each tool describes itself to the model ([`Tool::description`], [`Tool::input_schema`]); the registry
//! hands those out by name ([`ToolRegistry::spec`]) so an agent's model is offered exactly the tools the
//! agent lists. [`ToolRegistry::run`] is the one place a call is checked against the agent's list, bounded
//! by its deadline (`tool_timeout`), measured and traced.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_cluster::ToolBus;
use turnstile_config::{Config, ToolId};
use turnstile_model::message::SessionRef;

use crate::model::chat::ToolSpec;
pub use crate::model::chat_model::ClientBusSlot;

pub mod client;
pub mod mcp;
pub mod spawn;

pub use spawn::{ChildSessions, ChildSessionsSlot, SPAWN_AGENT, SpawnAgent};

/// The error of a call that passed its deadline (SPEC §9).
pub const TOOL_TIMEOUT: &str = "tool_timeout";

/// The deadline of a call when no configuration says otherwise (`[tools] deadline_ms`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// How long a tool may take to wind down (send its cancel) after its deadline passed, before the call
/// ends anyway.
const CANCEL_GRACE: Duration = Duration::from_millis(200);

/// Who calls a tool: the session (its tenant scopes client tools), the durable call id, the agent and the
/// call's deadline (already applied by [`ToolRegistry::run`]; tools that talk to others pass it on).
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub session: SessionRef,
    pub call_id: String,
    pub agent: String,
    pub deadline: Duration,
    /// Cancelled, before `abort`, when this worker lets the call go without a cancel of the turn (a reload
    /// after a journal error, a shard handed over, a shutdown): its result will not be recorded here and
    /// the next owner repairs the call (SPEC §6). A tool whose abort has effects beyond the call (such as
    /// `spawn_agent` cancelling its child) skips them then.
    pub released: CancellationToken,
}

impl Default for ToolContext {
    fn default() -> Self {
        Self {
            session: SessionRef { tenant: "default".to_owned(), id: "local".to_owned() },
            call_id: String::new(),
            agent: turnstile_config::SCRIPTED.to_owned(),
            deadline: DEFAULT_DEADLINE,
            released: CancellationToken::new(),
        }
    }
}

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReturn {
    pub output: String,
    /// Set when the call failed.
    pub error: Option<String>,
    /// The tool concluded the turn.
    pub concludes_turn: bool,
    /// Model-visible context messages to insert after the result (SPEC §9), as text.
    pub context: Vec<String>,
}

impl ToolReturn {
    pub fn ok(output: impl Into<String>) -> Self {
        Self { output: output.into(), error: None, concludes_turn: false, context: Vec::new() }
    }

    pub fn failed(error: impl Into<String>) -> Self {
        Self { output: String::new(), error: Some(error.into()), concludes_turn: false, context: Vec::new() }
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

/// `sleep`: waits `ms` milliseconds and returns `slept MS`, or stops early on abort.
///
/// Arguments: `{"ms": 500}`, or the plain number (`[[tool:sleep 500]]`).
#[derive(Debug, Default)]
pub struct Sleep;

#[async_trait]
impl Tool for Sleep {
    fn description(&self) -> &str {
        "Waits the given number of milliseconds, then returns \"slept MS\". Stops early if the turn is cancelled."
    }

    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"ms": {"type": "integer", "minimum": 0, "description": "How long to wait, in milliseconds."}},
            "required": ["ms"],
            "additionalProperties": false,
        })
    }

    async fn call(&self, _ctx: &ToolContext, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        let ms = match json_field(arguments, "ms") {
            Some(field) => field.as_ref().and_then(serde_json::Value::as_u64),
            None => arguments.trim().parse::<u64>().ok(),
        };
        let Some(ms) = ms else {
            return ToolReturn::failed(format!(
                "sleep takes {{\"ms\": MILLISECONDS}} or a number of milliseconds, got {arguments:?}"
            ));
        };
        let started = tokio::time::Instant::now();
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolReturn::ok(format!("slept {ms}")),
            () = abort.cancelled() => ToolReturn::failed(format!(
                "aborted after {} of {ms} ms", started.elapsed().as_millis()
            )),
        }
    }
}

/// `echo`: returns its text.
///
/// Arguments: `{"text": "hi"}`, or the plain text (`[[tool:echo hi]]`); a JSON object without `text` is
/// returned as it came.
#[derive(Debug, Default)]
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn description(&self) -> &str {
        "Returns the given text unchanged."
    }

    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string", "description": "The text to return."}},
            "required": ["text"],
            "additionalProperties": false,
        })
    }

    async fn call(&self, _ctx: &ToolContext, arguments: &str, _abort: &CancellationToken) -> ToolReturn {
        match json_field(arguments, "text") {
            Some(Some(serde_json::Value::String(text))) => ToolReturn::ok(text),
            _ => ToolReturn::ok(arguments),
        }
    }
}

/// `clock`: the current UTC time, as RFC 3339 and as Unix milliseconds; it takes no arguments (any are
/// ignored). No time zones: the model converts if it must.
///
/// The output is one JSON object, e.g. `{"utc":"2025-06-01T12:00:00.250Z","unix_ms":1748779200250}`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    now_ms: fn() -> u64,
}

impl Default for Clock {
    fn default() -> Self {
        Self { now_ms: turnstile_ops::clock::now_ms }
    }
}

impl Clock {
    /// A clock reading `now_ms` (tests pin the time).
    pub fn with_time_source(now_ms: fn() -> u64) -> Self {
        Self { now_ms }
    }
}

#[async_trait]
impl Tool for Clock {
    fn description(&self) -> &str {
        "Returns the current time in UTC: {\"utc\": RFC 3339 timestamp with milliseconds, \"unix_ms\": milliseconds since the Unix epoch}."
    }

    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    /// Any arguments are ignored.
    async fn call(&self, _ctx: &ToolContext, _arguments: &str, _abort: &CancellationToken) -> ToolReturn {
        let ms = (self.now_ms)();
        // Written by hand so the keys keep this order (the timestamp needs no escaping).
        ToolReturn::ok(format!(r#"{{"utc":"{}","unix_ms":{ms}}}"#, rfc3339_utc(ms)))
    }
}

/// How the model is offered `goal_complete` while the session has an active goal (SPEC §10). The driver
/// runs the call itself (it writes the goal's end), so no [`Tool`] stands behind this description.
pub fn goal_complete_spec(goal: &turnstile_driver::ActiveGoal) -> crate::model::chat::ToolSpec {
    crate::model::chat::ToolSpec {
        name: turnstile_driver::GOAL_COMPLETE.to_owned(),
        description: format!(
            "Call this once the goal is achieved, with a short summary of the outcome; it ends the goal and no \
             further rounds run. The goal (round {} of at most {}): {}",
            goal.round, goal.max_rounds, goal.objective
        ),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "What was achieved."}},
            "required": ["summary"],
            "additionalProperties": false,
        }),
    }
}

/// `ms` since the Unix epoch as an RFC 3339 UTC timestamp with milliseconds (`1970-01-01T00:00:00.000Z`).
pub fn rfc3339_utc(ms: u64) -> String {
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar (H. Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

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
        r.offer_agents(Vec::new());
        r
    }

    /// `spawn_agent` offers these agents to the model (the configuration's).
    pub fn offer_agents(&mut self, agents: Vec<String>) {
        let tool = SpawnAgent::new(self.children.clone(), agents);
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

    /// Runs call `call_id` of tool `name` by `agent` in `session`: refused when the agent does not list
    /// the tool (a model may name any tool), bounded by the agent's deadline for it (`tool_timeout`; the
    /// tool sees `abort` fire and gets [`CANCEL_GRACE`] to send its cancel), counted and timed
    /// ([`crate::metrics::ToolCall`]). `released` is [`ToolContext::released`].
    #[allow(clippy::too_many_arguments)] // The call's identity, its arguments and its two signals.
    pub async fn run(
        &self,
        session: &SessionRef,
        call_id: &str,
        agent: &str,
        name: &str,
        arguments: &str,
        abort: &CancellationToken,
        released: &CancellationToken,
    ) -> ToolReturn {
        let id = ToolId::from_call_name(name);
        let mut measure = crate::metrics::ToolCall::start(id);
        let deadline = match &self.policy {
            None => DEFAULT_DEADLINE,
            Some(config) => match config.agents.get(agent) {
                Some(profile) if profile.offers(id) => config.tool_deadline(profile, id),
                Some(profile) => {
                    let listed: Vec<String> = profile.tools.iter().map(ToString::to_string).collect();
                    let listed = if listed.is_empty() { "none".to_owned() } else { listed.join(", ") };
                    measure.end("unavailable");
                    return ToolReturn::failed(format!(
                        "tool {name} is not available to agent {agent} (its tools: {listed}); call one of those"
                    ));
                }
                // An agent the configuration does not name (a catalog built apart): no list to check.
                None => DEFAULT_DEADLINE,
            },
        };
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
            call_id: call_id.to_owned(),
            agent: agent.to_owned(),
            deadline,
            released: released.clone(),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sleep_returns_or_stops_on_abort() {
        let tools = ToolRegistry::builtin();
        let abort = CancellationToken::new();
        assert_eq!(tools.call("sleep", "20", &abort).await, ToolReturn::ok("slept 20"));
        assert_eq!(tools.call("sleep", r#"{"ms": 30}"#, &abort).await, ToolReturn::ok("slept 30"));
        abort.cancel();
        let r = tools.call("sleep", "100000", &abort).await;
        assert!(r.error.as_deref().is_some_and(|e| e.starts_with("aborted after")), "{r:?}");
    }

    #[tokio::test]
    async fn echo_sleep_arguments_and_unknown_tools() {
        let tools = ToolRegistry::builtin();
        let abort = CancellationToken::new();
        assert_eq!(tools.call("echo", "hi there", &abort).await, ToolReturn::ok("hi there"));
        assert_eq!(tools.call("echo", r#"{"text": "from a model"}"#, &abort).await, ToolReturn::ok("from a model"));
        assert_eq!(tools.call("echo", r#"{"other": 1}"#, &abort).await, ToolReturn::ok(r#"{"other": 1}"#));
        let r = tools.call("nope", "", &abort).await;
        assert_eq!(r.error.as_deref(), Some("unknown tool \"nope\"; available: clock, echo, sleep, spawn_agent"));
        for bad in ["soon", r#"{"ms": -1}"#, r#"{"ms": "5"}"#, "{}"] {
            assert_eq!(
                tools.call("sleep", bad, &abort).await.error,
                Some(format!("sleep takes {{\"ms\": MILLISECONDS}} or a number of milliseconds, got {bad:?}"))
            );
        }
    }

    #[tokio::test]
    async fn clock_returns_utc_rfc3339_and_unix_ms() {
        let clock = Clock::with_time_source(|| 1_748_779_200_250);
        let ctx = ToolContext::default();
        let r = clock.call(&ctx, "", &CancellationToken::new()).await;
        assert_eq!(r, ToolReturn::ok(r#"{"utc":"2025-06-01T12:00:00.250Z","unix_ms":1748779200250}"#));
        // Arguments are ignored.
        assert_eq!(clock.call(&ctx, r#"{"tz": "+02:00"}"#, &CancellationToken::new()).await, r);
        // The real clock: now, give or take.
        let before = turnstile_ops::clock::now_ms();
        let r = ToolRegistry::builtin().call("clock", "{}", &CancellationToken::new()).await;
        let out: serde_json::Value = serde_json::from_str(&r.output).unwrap();
        let ms = out["unix_ms"].as_u64().unwrap();
        assert!(ms >= before && ms < before + 60_000, "{out}");
        assert_eq!(out["utc"].as_str().unwrap(), rfc3339_utc(ms));
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_utc(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(rfc3339_utc(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_utc(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339_utc(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
    }

    #[test]
    fn every_builtin_describes_itself_with_an_object_schema() {
        let tools = ToolRegistry::builtin();
        for name in ["sleep", "echo", "clock"] {
            let spec = tools.spec(name).unwrap();
            assert_eq!(spec.name, name);
            assert!(!spec.description.is_empty(), "{name}");
            assert_eq!(spec.input_schema["type"], "object", "{name}");
            assert_eq!(spec.input_schema["additionalProperties"], false, "{name}");
        }
        assert_eq!(tools.spec("sleep").unwrap().input_schema["required"], serde_json::json!(["ms"]));
        assert_eq!(tools.spec("echo").unwrap().input_schema["required"], serde_json::json!(["text"]));
        assert!(tools.spec("nope").is_none());
    }
}
