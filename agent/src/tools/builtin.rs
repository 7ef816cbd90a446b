//! The built-in tools `sleep`, `echo` and `clock`, and how the model is offered `goal_complete`.

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{Tool, ToolContext, ToolReturn, json_field};
use crate::llm::chat::ToolSpec;

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
pub fn goal_complete_spec(goal: &turnstile_driver::ActiveGoal) -> ToolSpec {
    ToolSpec {
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
pub use turnstile_model::time::rfc3339_utc;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::tools::ToolRegistry;

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
        assert_eq!(
            r.error.as_deref(),
            Some(
                "unknown tool \"nope\"; available: clock, echo, memory_get, memory_put, memory_search, sleep, spawn_agent"
            )
        );
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
