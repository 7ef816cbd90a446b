//! The tool call metrics (`turnstile_tool_calls_total`, `turnstile_tool_call_duration_seconds`; names in
//! [`turnstile_ops::names`], docs/OPERATIONS.md lists them).

use std::time::Instant;

use metrics::{counter, histogram};
use tracing::Span;
use turnstile_config::ToolId;
use turnstile_ops::names;

/// One tool call being measured: counted and timed by kind, server, tool and outcome when it ends, and its
/// outcome recorded on the current span (`tool.call`).
pub(crate) struct ToolCall {
    kind: &'static str,
    server: String,
    tool: String,
    started: Instant,
}

impl ToolCall {
    pub(crate) fn start(id: ToolId<'_>) -> Self {
        let (kind, server, tool) = match id {
            ToolId::Builtin(b) => ("builtin", String::new(), b.as_str().to_owned()),
            ToolId::Mcp { server, tool } => ("mcp", server.to_owned(), tool.to_owned()),
            ToolId::Client(tool) => ("client", String::new(), tool.to_owned()),
        };
        Self { kind, server, tool, started: Instant::now() }
    }

    pub(crate) fn end(&mut self, outcome: &'static str) {
        let took = self.started.elapsed();
        let labels = [
            ("kind", self.kind.to_owned()),
            ("server", std::mem::take(&mut self.server)),
            ("tool", std::mem::take(&mut self.tool)),
            ("outcome", outcome.to_owned()),
        ];
        counter!(names::TOOL_CALLS, &labels).increment(1);
        histogram!(names::TOOL_CALL_SECONDS, &labels).record(took.as_secs_f64());
        Span::current().record("outcome", outcome);
    }
}
