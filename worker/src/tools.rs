//! Tools a model step can call, and the built-ins `sleep` and `echo`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

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
    /// `sleep` and `echo`.
    pub fn builtin() -> Self {
        let mut r = Self::default();
        r.register("sleep", Arc::new(Sleep));
        r.register("echo", Arc::new(Echo));
        r
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
        assert_eq!(r.error.as_deref(), Some("unknown tool \"nope\"; available: echo, sleep"));
        assert_eq!(
            tools.call("sleep", "soon", &abort).await.error.as_deref(),
            Some("sleep takes a number of milliseconds, got \"soon\"")
        );
    }
}
