//! Anthropic Messages, streaming: `POST {base_url}/messages` with `stream: true`, the key in `x-api-key`,
//! `anthropic-version: 2023-06-01`.
//!
//! Request: `system` at the top level; the history as alternating `user`/`assistant` messages —
//! consecutive messages of one role are merged, tool results become `tool_result` blocks (first in their
//! user message, as the API wants) paired by `tool_use_id`, assistant tool calls `tool_use` blocks whose
//! `input` is the call's JSON arguments (an argument text that is not a JSON object, only possible for a
//! truncated call, is sent as `{}`); images as base64 `image` blocks; `tools` as `{name, description,
//! input_schema}`; `max_tokens` is required: the request's, else the endpoint's, else
//! [`DEFAULT_ANTHROPIC_MAX_TOKENS`]. Thinking is not sent back (it would need its signature); empty text
//! blocks and messages left empty are dropped (the API refuses them). With the endpoint's `prompt_cache`
//! (SPEC §17) the system prompt goes as one text block, and it, the last tool and the last block of the
//! history prefix ([`ChatRequest::history_len`]) carry `cache_control: {type: "ephemeral"}`: three of the
//! four breakpoints the API allows.
//!
//! Stream: `message_start` (input tokens; `cache_read_input_tokens` and `cache_creation_input_tokens`
//! count in the input and are reported apart as cached and cache-write tokens), `content_block_start` (`text`, `thinking`, `tool_use` with id
//! and name), `content_block_delta` (`text_delta`, `thinking_delta`, `input_json_delta` pieces of the
//! tool input), `content_block_stop`, `message_delta` (`stop_reason`, output tokens), `message_stop` ends
//! it; `ping` is ignored, `error` breaks the stream with its message. `stop_reason` `max_tokens` →
//! [`Finish::Length`], `tool_use` → [`Finish::ToolCalls`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio_util::sync::CancellationToken;
//! use turnstile_agent::llm::anthropic::AnthropicProvider;
//! use turnstile_agent::llm::chat::{ChatMessage, ChatProvider, ChatRequest, DeltaSink};
//! use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
//! use turnstile_model::Secret;
//!
//! let mut endpoint = ModelEndpoint::new(ProviderKind::Anthropic, "claude-sonnet-4-5");
//! endpoint.api_key = Some(Secret::new(std::env::var("ANTHROPIC_API_KEY")?));
//! let model = AnthropicProvider::new(endpoint)?;
//! let request = ChatRequest { messages: vec![ChatMessage::user_text("Hi!")], ..Default::default() };
//! let reply = model.stream(&request, &DeltaSink::discard(), &CancellationToken::new()).await?;
//! println!("{}", reply.text);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;

use eventsource_stream::Event;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

use super::chat::{
    ChatContent, ChatMessage, ChatOutput, ChatRequest, ChatToolCall, Delivered, Finish, StreamDelta, Usage,
};
use super::endpoint::{DEFAULT_ANTHROPIC_MAX_TOKENS, EndpointError, ModelEndpoint};
use super::http::{ChatApi, Flow, HttpProvider, SseDecoder};

/// The Messages API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A model behind the Anthropic Messages API.
pub type AnthropicProvider = HttpProvider<Anthropic>;

/// The Anthropic Messages API, as [`HttpProvider`] speaks it.
#[derive(Debug)]
pub struct Anthropic;

impl ChatApi for Anthropic {
    const PROVIDER: &'static str = "anthropic";
    const PATH: &'static str = "messages";
    type Decoder = Decoder;

    fn headers(endpoint: &ModelEndpoint) -> Result<HeaderMap, EndpointError> {
        let mut headers = HeaderMap::new();
        headers.insert(HeaderName::from_static("anthropic-version"), HeaderValue::from_static(ANTHROPIC_VERSION));
        if let Some(value) = endpoint.key_header("")? {
            headers.insert(HeaderName::from_static("x-api-key"), value);
        }
        Ok(headers)
    }

    fn body(endpoint: &ModelEndpoint, request: &ChatRequest) -> Value {
        let cache = endpoint.prompt_cache;
        let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
        for (i, message) in request.messages.iter().enumerate() {
            let (role, blocks) = match message {
                ChatMessage::User { content } => ("user", content.iter().filter_map(user_block).collect()),
                ChatMessage::Assistant { text, reasoning: _, tool_calls } => {
                    let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
                    if !text.is_empty() {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    blocks.extend(tool_calls.iter().map(|c| {
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(&c.arguments_json)})
                    }));
                    ("assistant", blocks)
                }
                ChatMessage::ToolResult { call_id, output, is_error } => {
                    let mut block = json!({"type": "tool_result", "tool_use_id": call_id});
                    if !output.is_empty() {
                        block["content"] = output.as_str().into();
                    }
                    if *is_error {
                        block["is_error"] = true.into();
                    }
                    ("user", vec![block])
                }
            };
            if !blocks.is_empty() {
                match turns.last_mut() {
                    Some((last, merged)) if *last == role => merged.extend(blocks),
                    _ => turns.push((role, blocks)),
                }
            }
            if cache && i + 1 == request.history_len {
                // The end of the history prefix: the next request of the session repeats everything up to
                // here. The mark travels with its block through the tool-result sort below.
                if let Some(block) = turns.last_mut().and_then(|(_, blocks)| blocks.last_mut()) {
                    block["cache_control"] = ephemeral();
                }
            }
        }
        let messages: Vec<Value> = turns
            .into_iter()
            .map(|(role, mut content)| {
                // Tool results lead their user message (a stable sort keeps every other order).
                content.sort_by_key(|block| block["type"] != "tool_result");
                json!({"role": role, "content": content})
            })
            .collect();
        let mut body = json!({
            "model": endpoint.model,
            "max_tokens": request.max_tokens.or(endpoint.max_tokens).unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
            "stream": true,
            "messages": messages,
        });
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            body["system"] = if cache {
                json!([{"type": "text", "text": system, "cache_control": ephemeral()}])
            } else {
                system.into()
            };
        }
        let mut tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        if let Some(output) = &request.output {
            // SPEC §20: the answer is the input of a tool named after the schema, which the model must call;
            // with other tools offered it must call one of them or this one ("any"), so it can still use them.
            body["tool_choice"] =
                if tools.is_empty() { json!({"type": "tool", "name": output.name}) } else { json!({"type": "any"}) };
            tools.push(json!({"name": output.name, "input_schema": output.schema,
                "description": "Give your final answer by calling this tool: its input is the answer."}));
        }
        if !tools.is_empty() {
            if cache && let Some(last) = tools.last_mut() {
                // A mark on the last tool caches all of them (the prefix up to it).
                last["cache_control"] = ephemeral();
            }
            body["tools"] = tools.into();
        }
        body
    }
}

/// Anthropic's `cache_control` of a prompt-cache breakpoint (SPEC §17: `prompt_cache = true`).
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// A user content block; `None` for empty text (the API refuses empty text blocks).
fn user_block(content: &ChatContent) -> Option<Value> {
    if let Some((mime, data)) = content.as_image() {
        return Some(json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}));
    }
    let text = content.data_as_text();
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// A tool call's arguments as the object `tool_use.input` must be.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

// The stream's events, by their `type`. Unknown types and fields are ignored (the API adds them).

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: u64,
        content_block: BlockStart,
    },
    ContentBlockDelta {
        index: u64,
        delta: BlockDelta,
    },
    ContentBlockStop,
    MessageDelta {
        #[serde(default)]
        delta: Option<MessageDeltaBody>,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        #[serde(default)]
        error: Value,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct MessageStart {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct MessageDeltaBody {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    /// All prompt tokens: fresh input plus cache writes and reads.
    fn input(&self) -> Option<u64> {
        self.input_tokens.map(|fresh| {
            fresh + self.cache_creation_input_tokens.unwrap_or(0) + self.cache_read_input_tokens.unwrap_or(0)
        })
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockStart {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

enum Block {
    Text,
    Thinking,
    ToolUse { id: String, name: String, input: Value, json: String },
    Other,
}

/// Assembles one streamed message.
/// Reads the Messages API's event stream.
#[derive(Default)]
pub struct Decoder {
    delivered: Delivered,
    /// Content blocks by their stream `index` (ordered: tool calls come out in block order).
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
}

impl Decoder {
    /// Takes what `usage` reports; a field it leaves out keeps its earlier value (`message_delta` repeats
    /// only some of `message_start`'s).
    /// Reports the usage so far to `sink` as well, so a stream cut before `message_stop` is still counted.
    fn usage(&mut self, usage: &WireUsage, sink: &mut (dyn FnMut(StreamDelta) + Send)) {
        self.input_tokens = usage.input().or(self.input_tokens);
        self.output_tokens = usage.output_tokens.or(self.output_tokens);
        self.cache_read_tokens = usage.cache_read_input_tokens.or(self.cache_read_tokens);
        self.cache_write_tokens = usage.cache_creation_input_tokens.or(self.cache_write_tokens);
        if let Some(usage) = self.reported() {
            sink(StreamDelta::Usage(usage));
        }
    }

    /// The usage reported so far, if the provider reported any.
    fn reported(&self) -> Option<Usage> {
        (self.input_tokens.is_some() || self.output_tokens.is_some()).then(|| Usage {
            input_tokens: self.input_tokens.unwrap_or(0),
            output_tokens: self.output_tokens.unwrap_or(0),
            cached_input_tokens: self.cache_read_tokens.unwrap_or(0),
            cache_write_tokens: self.cache_write_tokens.unwrap_or(0),
        })
    }
}

impl SseDecoder for Decoder {
    fn event(&mut self, event: &Event, sink: &mut (dyn FnMut(StreamDelta) + Send)) -> Result<Flow, String> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Flow::More);
        }
        let wire: WireEvent =
            serde_json::from_str(data).map_err(|e| format!("malformed {} event ({e}): {data}", event.event))?;
        match wire {
            WireEvent::MessageStart { message } => self.usage(&message.usage.unwrap_or_default(), sink),
            WireEvent::ContentBlockStart { index, content_block } => {
                let block = match content_block {
                    BlockStart::Text { text } => {
                        self.delivered.text(&text, sink);
                        Block::Text
                    }
                    BlockStart::Thinking { thinking } => {
                        self.delivered.reasoning(&thinking, sink);
                        Block::Thinking
                    }
                    BlockStart::ToolUse { id, name, input } => Block::ToolUse { id, name, input, json: String::new() },
                    BlockStart::Other => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            WireEvent::ContentBlockDelta { index, delta } => match (self.blocks.get_mut(&index), delta) {
                (Some(Block::Text), BlockDelta::TextDelta { text }) => self.delivered.text(&text, sink),
                (Some(Block::Thinking), BlockDelta::ThinkingDelta { thinking }) => {
                    self.delivered.reasoning(&thinking, sink)
                }
                (Some(Block::ToolUse { json, .. }), BlockDelta::InputJsonDelta { partial_json }) => {
                    json.push_str(&partial_json)
                }
                (None, _) => return Err(format!("a delta for content block {index}, which never started")),
                // Signatures, citations and deltas of block types this client does not know.
                _ => {}
            },
            WireEvent::ContentBlockStop | WireEvent::Ping | WireEvent::Unknown => {}
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    self.usage(&usage, sink);
                }
            }
            WireEvent::MessageStop => return Ok(Flow::Done),
            WireEvent::Error { error } => {
                let message = match (error["type"].as_str(), error["message"].as_str()) {
                    (Some(kind), Some(message)) => format!("{kind}: {message}"),
                    (None, Some(message)) => message.to_owned(),
                    _ => error.to_string(),
                };
                return Err(format!("the provider reported an error mid-stream: {message}"));
            }
        }
        Ok(Flow::More)
    }

    fn complete_at_eof(&self) -> bool {
        self.stop_reason.is_some()
    }

    fn delivered(&self) -> &Delivered {
        &self.delivered
    }

    fn finish(&mut self) -> Result<ChatOutput, String> {
        let tool_calls: Vec<ChatToolCall> = std::mem::take(&mut self.blocks)
            .into_values()
            .filter_map(|block| match block {
                Block::ToolUse { id, name, input, json } => {
                    let arguments_json = if !json.trim().is_empty() {
                        json
                    } else if input.as_object().is_some_and(|o| !o.is_empty()) {
                        input.to_string()
                    } else {
                        "{}".to_owned()
                    };
                    Some(ChatToolCall { id, name, arguments_json })
                }
                Block::Text | Block::Thinking | Block::Other => None,
            })
            .collect();
        let mut finish = match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") => Finish::Stop,
            Some("max_tokens") => Finish::Length,
            Some("tool_use") => Finish::ToolCalls,
            Some(other) => Finish::Other(other.to_owned()),
            None if tool_calls.is_empty() => Finish::Stop,
            None => Finish::ToolCalls,
        };
        if finish == Finish::Stop && !tool_calls.is_empty() {
            finish = Finish::ToolCalls;
        }
        let usage = self.reported();
        Ok(ChatOutput {
            text: std::mem::take(&mut self.delivered.text),
            reasoning: self.delivered.take_reasoning(),
            tool_calls,
            finish,
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(decoder: &mut Decoder, data: &str) -> Result<Flow, String> {
        let event = Event { event: "x".into(), data: data.into(), ..Default::default() };
        decoder.event(&event, &mut |_| {})
    }

    #[test]
    fn unknown_events_and_blocks_are_ignored_cache_tokens_count_as_input() {
        let mut d = Decoder::default();
        feed(&mut d, r#"{"type":"message_start","message":{"usage":{"input_tokens":3,"cache_read_input_tokens":10,"output_tokens":1}}}"#).unwrap();
        feed(&mut d, r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"s"}}"#)
            .unwrap();
        feed(&mut d, r#"{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta"}}"#).unwrap();
        feed(&mut d, r#"{"type":"content_block_stop","index":0}"#).unwrap();
        feed(&mut d, r#"{"type":"something_new","x":1}"#).unwrap();
        feed(&mut d, r#"{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":7}}"#)
            .unwrap();
        assert_eq!(feed(&mut d, r#"{"type":"message_stop"}"#), Ok(Flow::Done));
        let out = d.finish().unwrap();
        assert_eq!(out.finish, Finish::Other("refusal".into()));
        let cached = Usage { input_tokens: 13, output_tokens: 7, cached_input_tokens: 10, cache_write_tokens: 0 };
        assert_eq!(out.usage, Some(cached));
        assert!(out.tool_calls.is_empty());
    }

    #[test]
    fn a_delta_for_an_unknown_block_breaks_the_stream() {
        let mut d = Decoder::default();
        let err = feed(&mut d, r#"{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"x"}}"#)
            .unwrap_err();
        assert!(err.contains("block 4"), "{err}");
    }

    #[test]
    fn tool_input_must_be_an_object() {
        assert_eq!(tool_input(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(tool_input(r#"{"a":"#), json!({}));
        assert_eq!(tool_input("[1]"), json!({}));
    }
}
