//! The parts of a Response that [`super::fold::ResponseFold`] builds: what it cannot read from the log
//! ([`Meta`]), how it ended ([`Outcome`]), its input messages, its output [`Item`]s as OpenAI's clients read
//! them ([`render_item`]), and one streaming [`Event`].

use serde_json::{Value, json};

/// What the fold cannot read from the turn's events: the session's agent and labels, how it was created.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub model: String,
    pub metadata: Value,
    pub background: bool,
}

/// How a response ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// `max_output_tokens` or `content_filter` (a pre-step hook blocked the turn).
    Incomplete(&'static str),
    Failed {
        code: String,
        message: String,
    },
    Cancelled {
        message: String,
    },
}

/// One input message the turn entered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub id: String,
    pub role: &'static str,
    pub text: String,
}

/// One item of the response's `output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Message {
        id: String,
        text: String,
        done: bool,
        interrupted: bool,
    },
    Tool {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        output: Option<String>,
        error: Option<String>,
    },
    /// A call awaiting approval (SPEC §9), as OpenAI's `mcp_approval_request`.
    Approval {
        id: String,
        name: String,
        arguments: String,
    },
    /// A call of a function tool the request declared (a client tool of the turn, SPEC §19): the client
    /// runs it and answers with a `function_call_output` naming `call_id`.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A streaming event: its number and its JSON (which carries the number and the type).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub number: u64,
    pub body: Value,
}

impl Event {
    pub fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap_or_default()
    }
}
/// An output item as OpenAI's clients read it: a message, or a tool the agent ran itself as an `mcp_call`
/// of the server `turnstile`.
pub fn render_item(item: &Item) -> Value {
    match item {
        Item::Message { id, text, done, interrupted, .. } => json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "status": match (done, interrupted) { (true, false) => "completed", (true, true) => "incomplete", _ => "in_progress" },
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }),
        Item::Tool { id, name, arguments, output, error, .. } => json!({
            "id": id,
            "type": "mcp_call",
            "server_label": "turnstile",
            "name": name,
            "arguments": arguments,
            "output": output,
            "error": error.as_ref().map(|e| json!({"type": "mcp_tool_execution_error", "content": e})),
            "status": match (output, error) { (None, _) => "calling", (_, Some(_)) => "failed", _ => "completed" },
        }),
        Item::Approval { id, name, arguments } => json!({
            "id": id,
            "type": "mcp_approval_request",
            "server_label": "turnstile",
            "name": name,
            "arguments": arguments,
        }),
        Item::FunctionCall { id, call_id, name, arguments } => json!({
            "id": id,
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }),
    }
}
