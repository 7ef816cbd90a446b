//! Tools a model step can call, and the built-ins `sleep`, `echo` and `clock`.
//!
//! Each tool describes itself to the model ([`Tool::description`], [`Tool::input_schema`]); the registry
//! hands those out by name ([`ToolRegistry::spec`]) so an agent's model is offered exactly the tools the
//! agent lists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::model::chat::ToolSpec;

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReturn {
    pub output: String,
    /// Set when the call failed.
    pub error: Option<String>,
    /// The tool concluded the turn.
    pub concludes_turn: bool,
}

impl ToolReturn {
    pub fn ok(output: impl Into<String>) -> Self {
        Self { output: output.into(), error: None, concludes_turn: false }
    }

    pub fn failed(error: impl Into<String>) -> Self {
        Self { output: String::new(), error: Some(error.into()), concludes_turn: false }
    }
}

#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// What the tool does, for the model.
    fn description(&self) -> &str {
        ""
    }

    /// The JSON Schema of the tool's arguments, for the model. Default: an object with any properties.
    fn input_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }

    /// Runs one call. `abort` is signalled when the turn is cancelled: a started call finishes (it may
    /// stop early) and its result is recorded.
    async fn call(&self, arguments: &str, abort: &CancellationToken) -> ToolReturn;
}

/// `sleep MS`: waits and returns `slept MS`, or stops early on abort.
#[derive(Debug, Default)]
pub struct Sleep;

#[async_trait]
impl Tool for Sleep {
    async fn call(&self, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        let Ok(ms) = arguments.trim().parse::<u64>() else {
            return ToolReturn::failed(format!("sleep takes a number of milliseconds, got {arguments:?}"));
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

/// `echo TEXT`: returns TEXT.
#[derive(Debug, Default)]
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    async fn call(&self, arguments: &str, _abort: &CancellationToken) -> ToolReturn {
        ToolReturn::ok(arguments)
    }
}

/// `clock`: the current UTC time, as RFC 3339 and as Unix milliseconds; it takes no arguments.
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
    async fn call(&self, _arguments: &str, _abort: &CancellationToken) -> ToolReturn {
        let ms = (self.now_ms)();
        ToolReturn::ok(serde_json::json!({"utc": rfc3339_utc(ms), "unix_ms": ms}).to_string())
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
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// The built-ins `sleep`, `echo` and `clock`.
    pub fn builtin() -> Self {
        let mut r = Self::default();
        r.register("sleep", Arc::new(Sleep));
        r.register("echo", Arc::new(Echo));
        r.register("clock", Arc::new(Clock::default()));
        r
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

    /// Runs `name`; an unknown tool is a failed call that names the ones there are.
    pub async fn call(&self, name: &str, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        match self.tools.get(name) {
            Some(tool) => tool.call(arguments, abort).await,
            None => ToolReturn::failed(format!(
                "unknown tool {name:?}; available: {}",
                self.tools.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn sleep_returns_or_stops_on_abort() {
        let tools = ToolRegistry::builtin();
        let abort = CancellationToken::new();
        assert_eq!(tools.call("sleep", "20", &abort).await, ToolReturn::ok("slept 20"));
        abort.cancel();
        let r = tools.call("sleep", "100000", &abort).await;
        assert!(r.error.as_deref().is_some_and(|e| e.starts_with("aborted after")), "{r:?}");
    }

    #[tokio::test]
    async fn echo_and_unknown() {
        let tools = ToolRegistry::builtin();
        let abort = CancellationToken::new();
        assert_eq!(tools.call("echo", "hi there", &abort).await, ToolReturn::ok("hi there"));
        let r = tools.call("nope", "", &abort).await;
        assert_eq!(r.error.as_deref(), Some("unknown tool \"nope\"; available: clock, echo, sleep"));
        assert_eq!(
            tools.call("sleep", "soon", &abort).await.error.as_deref(),
            Some("sleep takes a number of milliseconds, got \"soon\"")
        );
    }
}
