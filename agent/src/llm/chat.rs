//! The provider-neutral chat request and streamed reply that every real model provider speaks
//! ([`super::openai`], [`super::anthropic`]).
//!
//! A [`ChatRequest`] is the whole context of one step (SPEC §8 "Model request of a step"): the system
//! prompt, the history in log order, the tools offered. A [`ChatProvider`] streams the reply: every piece
//! of text or reasoning goes to the caller's sink as a [`StreamDelta`] the moment it arrives, and the
//! finished reply comes back as a [`ChatOutput`]. Failures are [`ProviderError`]s whose
//! [`code`](ProviderError::code) is the `turn/end` error code of SPEC §8.
//!
//! ```
//! use turnstile_agent::llm::chat::{ChatMessage, ChatRequest, ChatToolCall, ToolSpec};
//!
//! let request = ChatRequest {
//!     system: Some("You are terse.".into()),
//!     messages: vec![
//!         ChatMessage::user_text("What time is it?"),
//!         ChatMessage::Assistant {
//!             text: String::new(),
//!             reasoning: None,
//!             tool_calls: vec![ChatToolCall { id: "c1".into(), name: "clock".into(), arguments_json: "{}".into() }],
//!         },
//!         ChatMessage::ToolResult { call_id: "c1".into(), output: "12:00".into(), is_error: false },
//!     ],
//!     tools: vec![ToolSpec {
//!         name: "clock".into(),
//!         description: "The current time".into(),
//!         input_schema: serde_json::json!({"type": "object", "properties": {}}),
//!     }],
//!     max_tokens: Some(256),
//!     output: None,
//!     history_len: 3,
//! };
//! assert_eq!(request.messages.len(), 3);
//! ```

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use tokio_util::sync::CancellationToken;
/// One streamed piece of the reply: the worker's, so a provider's pieces go to the runner unchanged. The
/// text deltas of a reply concatenate to [`ChatOutput::text`], the reasoning ones to [`ChatOutput::reasoning`].
pub use turnstile_worker::agent::{DeltaSink, StreamDelta};

/// One model request: system prompt, history in log order, tools, and an optional output limit (the
/// endpoint's `max_tokens` applies when this is `None`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatRequest {
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
    /// The JSON Schema the reply must match when it is final (SPEC §20): OpenAI-compatible providers send
    /// it as `response_format`, Anthropic as a forced tool named after it whose input is the reply.
    pub output: Option<turnstile_model::output::OutputSchema>,
    /// How many of the first `messages` repeat the session's history (the summary, the logged turns): the
    /// prefix the next request of the session starts with too, which a prompt cache can hold (SPEC §17).
    pub history_len: usize,
}

/// One message of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatMessage {
    /// What a user (or a hook, a tool's context message, …) entered.
    User { content: Vec<ChatContent> },
    /// A reply of the model, as delivered (an interrupted one holds the text streamed before the cut).
    /// `reasoning` is kept for the record; providers do not send it back (see each provider's docs).
    Assistant { text: String, reasoning: Option<String>, tool_calls: Vec<ChatToolCall> },
    /// The result of the tool call `call_id` of an earlier assistant message.
    ToolResult { call_id: String, output: String, is_error: bool },
}

impl ChatMessage {
    /// A user message with one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self::User { content: vec![ChatContent::Text(text.into())] }
    }

    /// An assistant message with text only.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Self::Assistant { text: text.into(), reasoning: None, tool_calls: Vec::new() }
    }
}

/// One block of a user message.
#[derive(Clone, PartialEq, Eq)]
pub enum ChatContent {
    Text(String),
    /// Bytes with a mime type: `image/*` goes to the model as an image, anything else as text naming its
    /// mime ([`ChatContent::data_as_text`]).
    Data {
        mime: String,
        bytes: Vec<u8>,
    },
}

impl fmt::Debug for ChatContent {
    // Data blocks can be megabytes: show their size, not their bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(text) => f.debug_tuple("Text").field(text).finish(),
            Self::Data { mime, bytes } => {
                f.debug_struct("Data").field("mime", mime).field("len", &bytes.len()).finish()
            }
        }
    }
}

impl ChatContent {
    /// `Some((mime, base64))` when this block goes to the model as an image.
    pub fn as_image(&self) -> Option<(&str, String)> {
        match self {
            Self::Data { mime, bytes } if mime.starts_with("image/") => {
                Some((mime.as_str(), base64::engine::general_purpose::STANDARD.encode(bytes)))
            }
            _ => None,
        }
    }

    /// The block as text: text as is; data (images included, for providers that take no images) as a
    /// line naming its mime followed by the bytes as UTF-8, or base64 when they are not UTF-8.
    ///
    /// ```
    /// use turnstile_agent::llm::chat::ChatContent;
    /// let csv = ChatContent::Data { mime: "text/csv".into(), bytes: b"a,b\n1,2".to_vec() };
    /// assert_eq!(csv.data_as_text(), "[data text/csv]\na,b\n1,2");
    /// ```
    pub fn data_as_text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Data { mime, bytes } => match std::str::from_utf8(bytes) {
                Ok(text) => format!("[data {mime}]\n{text}"),
                Err(_) => {
                    format!("[data {mime}, base64]\n{}", base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            },
        }
    }
}

/// A tool the model may call: its name, what it does, and the JSON schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
}

/// A tool call the model made: the provider's call id, the tool's name, the arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatToolCall {
    pub id: String,
    pub name: String,
    pub arguments_json: String,
}

/// Why the model stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A natural stop (or a stop sequence).
    Stop,
    /// The output token limit (`length`, `max_tokens`): tool calls may be truncated and are never run.
    Length,
    /// The model called tools. A reply that carries tool calls but reports a plain stop (some
    /// OpenAI-compatible servers do) is reported as `ToolCalls` too.
    ToolCalls,
    /// Anything else, as the provider named it (`content_filter`, `refusal`, …).
    Other(String),
}

/// Token usage as the provider reported it: the model's own type, so it lands on `assistant/message`
/// unchanged (cache reads and writes included, SPEC §17).
pub use turnstile_model::Usage;

/// A finished reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatOutput {
    pub text: String,
    /// `None` when the model streamed no reasoning.
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ChatToolCall>,
    pub finish: Finish,
    pub usage: Option<Usage>,
}

/// What a request had streamed before it failed or was aborted (the deltas already sent to the sink).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partial {
    pub text: String,
    pub reasoning: String,
}

/// Which timeout ended a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutKind {
    /// No response byte within `first_byte_timeout`.
    FirstByte,
    /// The stream went quiet for `idle_timeout`.
    Idle,
    /// The whole request (retries included) passed `timeout`.
    Request,
}

impl fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FirstByte => "no first byte",
            Self::Idle => "stream idle",
            Self::Request => "whole request",
        })
    }
}

/// Why a model request failed. [`code`](Self::code) names the cause as SPEC §8 does.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Connection failures and 5xx answers, still failing after the endpoint's retries.
    #[error("model unavailable after {attempts} attempt(s): {message}")]
    Unavailable { message: String, attempts: u32 },
    /// 429 answers, still rate limited after the endpoint's retries.
    #[error("model rate limited after {attempts} attempt(s): {message}")]
    RateLimited { message: String, attempts: u32 },
    /// A timeout: first byte, idle stream or whole request. Never retried.
    #[error("model timed out ({kind} after {after:?})")]
    Timeout { kind: TimeoutKind, after: Duration, partial: Partial },
    /// The provider refused the request (a 4xx other than 429, e.g. a bad key or an unknown model), with
    /// the provider's own message. `status` is `None` when the request could not even be sent as built.
    #[error("model refused the request{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Refused { status: Option<u16>, message: String },
    /// The stream failed after its first byte: cut, malformed, or an error event from the provider.
    #[error("model stream broken: {message}")]
    StreamBroken { message: String, partial: Partial },
    /// The caller cancelled; the HTTP request was dropped at once.
    #[error("model request aborted")]
    Aborted { partial: Partial },
}

impl ProviderError {
    /// The `turn/end` error code (SPEC §8); `aborted` for [`ProviderError::Aborted`], which ends a turn
    /// as a cancel, not as an error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "model_unavailable",
            Self::RateLimited { .. } => "model_rate_limited",
            Self::Timeout { .. } => "model_timeout",
            Self::Refused { .. } => "model_refused",
            Self::StreamBroken { .. } => "model_stream_broken",
            Self::Aborted { .. } => "aborted",
        }
    }

    /// The request failed before its first byte for a cause another model may not share: unavailable or
    /// rate limited after the retries, no first byte in time, or the whole request's time spent before
    /// anything was streamed. Such a request goes on to the model's `fallback` (SPEC §17); a refusal, a
    /// broken stream or an abort never does.
    pub fn falls_back(&self) -> bool {
        match self {
            Self::Unavailable { .. } | Self::RateLimited { .. } => true,
            Self::Timeout { kind: TimeoutKind::FirstByte, .. } => true,
            Self::Timeout { kind: TimeoutKind::Request, partial, .. } => partial == &Partial::default(),
            Self::Timeout { kind: TimeoutKind::Idle, .. }
            | Self::Refused { .. }
            | Self::StreamBroken { .. }
            | Self::Aborted { .. } => false,
        }
    }

    /// What was streamed before the failure, for errors that can happen mid-stream.
    pub fn partial(&self) -> Option<&Partial> {
        match self {
            Self::Timeout { partial, .. } | Self::StreamBroken { partial, .. } | Self::Aborted { partial } => {
                Some(partial)
            }
            Self::Unavailable { .. } | Self::RateLimited { .. } | Self::Refused { .. } => None,
        }
    }
}

/// A streaming chat model behind HTTP.
///
/// `stream` sends `request`, sends every delta to `sink` as it arrives (waiting while the sink is full, so
/// a slow consumer slows the reading of the response), and returns the whole reply. The token usage the
/// provider reports goes to the sink too, as soon as it is known ([`StreamDelta::Usage`]).
/// Retries (connection failures, 429, 5xx before the first byte) happen inside; on `cancel` the request
/// is dropped at once and [`ProviderError::Aborted`] returned with what was delivered so far.
#[async_trait]
pub trait ChatProvider: Send + Sync + 'static {
    /// `openai` or `anthropic` (the metrics and span label).
    fn provider(&self) -> &'static str;
    /// The model name sent to the provider.
    fn model(&self) -> &str;
    async fn stream(
        &self,
        request: &ChatRequest,
        sink: &DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ChatOutput, ProviderError>;
}

/// The text and reasoning streamed so far, shared by the providers' stream decoders: every piece goes to
/// the sink and is kept for the final [`ChatOutput`] (or the [`Partial`] of a failure).
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    pub(crate) text: String,
    pub(crate) reasoning: String,
}

impl Delivered {
    pub(crate) fn text(&mut self, piece: &str, sink: &mut (dyn FnMut(StreamDelta) + Send)) {
        if !piece.is_empty() {
            self.text.push_str(piece);
            sink(StreamDelta::Text(piece.to_owned()));
        }
    }

    pub(crate) fn reasoning(&mut self, piece: &str, sink: &mut (dyn FnMut(StreamDelta) + Send)) {
        if !piece.is_empty() {
            self.reasoning.push_str(piece);
            sink(StreamDelta::Reasoning(piece.to_owned()));
        }
    }

    pub(crate) fn partial(&self) -> Partial {
        Partial { text: self.text.clone(), reasoning: self.reasoning.clone() }
    }

    /// The reasoning for [`ChatOutput::reasoning`]: `None` when none was streamed (servers that send an
    /// empty `reasoning_content` with every chunk do not count).
    pub(crate) fn take_reasoning(&mut self) -> Option<String> {
        (!self.reasoning.is_empty()).then(|| std::mem::take(&mut self.reasoning))
    }
}
