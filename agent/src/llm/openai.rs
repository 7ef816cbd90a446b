//! OpenAI Chat Completions, streaming: OpenAI itself and any compatible server (llama.cpp, vLLM,
//! DeepSeek, …). `POST {base_url}/chat/completions` with `stream: true`.
//!
//! Request: the system prompt as the first `system` message; user messages as a string, or as content
//! parts when they hold images (data URLs); assistant messages with their `tool_calls`; tool results as
//! `tool` messages (an error result's content starts with `error: `, the protocol has no flag for it);
//! `tools` as `function` tools with the JSON schema as `parameters`; `max_tokens`; `stream_options:
//! {include_usage: true}` so the last chunk reports usage. Reasoning is never sent back (DeepSeek rejects
//! `reasoning_content` in input messages).
//!
//! Stream: `choices[0].delta.content` is text, `delta.reasoning_content` (DeepSeek; `delta.reasoning` on
//! some servers) is reasoning, `delta.tool_calls` pieces are assembled by `index` (id and name come
//! first, the arguments in pieces); `finish_reason` `length` → [`Finish::Length`], `tool_calls` →
//! [`Finish::ToolCalls`]; `data: [DONE]` ends it. A chunk holding `error` breaks the stream with its
//! message.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio_util::sync::CancellationToken;
//! use turnstile_agent::llm::chat::{ChatMessage, ChatProvider, ChatRequest, DeltaSink, StreamDelta};
//! use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
//! use turnstile_agent::llm::openai::OpenAiProvider;
//!
//! let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "SmolLM2-135M-Instruct");
//! endpoint.base_url = "http://127.0.0.1:8080/v1".into();
//! let model = OpenAiProvider::new(endpoint)?;
//! let request = ChatRequest { messages: vec![ChatMessage::user_text("Hi!")], ..Default::default() };
//! let (tx, mut rx) = tokio::sync::mpsc::channel(64);
//! let print = async move {
//!     while let Some(delta) = rx.recv().await {
//!         if let StreamDelta::Text(t) = delta { print!("{t}") }
//!     }
//! };
//! // The sink drops with the request, which ends the printing.
//! let ask = async move { model.stream(&request, &DeltaSink::new(tx), &CancellationToken::new()).await };
//! let (reply, ()) = tokio::join!(ask, print);
//! let reply = reply?;
//! println!("\n{:?} {:?}", reply.finish, reply.usage);
//! # Ok(()) }
//! ```

use std::collections::HashMap;

use eventsource_stream::Event;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;
use serde_json::{Value, json};

use super::chat::{ChatContent, ChatMessage, ChatOutput, ChatRequest, Delivered, Finish, StreamDelta, Usage};
use super::endpoint::{EndpointError, ModelEndpoint};
use super::http::{ChatApi, Flow, HttpProvider, SseDecoder};

/// A model behind an OpenAI-compatible Chat Completions endpoint.
pub type OpenAiProvider = HttpProvider<OpenAi>;

/// The OpenAI Chat Completions API, as [`HttpProvider`] speaks it.
#[derive(Debug)]
pub struct OpenAi;

impl ChatApi for OpenAi {
    const PROVIDER: &'static str = "openai";
    const PATH: &'static str = "chat/completions";
    type Decoder = Decoder;

    fn headers(endpoint: &ModelEndpoint) -> Result<HeaderMap, EndpointError> {
        let mut headers = HeaderMap::new();
        if let Some(value) = endpoint.key_header("Bearer ")? {
            headers.insert(AUTHORIZATION, value);
        }
        Ok(headers)
    }

    fn body(endpoint: &ModelEndpoint, request: &ChatRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = &request.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        for message in &request.messages {
            messages.push(match message {
                ChatMessage::User { content } => json!({"role": "user", "content": user_content(content)}),
                ChatMessage::Assistant { text, reasoning: _, tool_calls } => {
                    let mut m = json!({"role": "assistant", "content": text});
                    if !tool_calls.is_empty() {
                        if text.is_empty() {
                            m["content"] = Value::Null;
                        }
                        m["tool_calls"] = tool_calls
                            .iter()
                            .map(|c| {
                                json!({"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments_json}})
                            })
                            .collect();
                    }
                    m
                }
                ChatMessage::ToolResult { call_id, output, is_error } => {
                    let content = if *is_error { format!("error: {output}") } else { output.clone() };
                    json!({"role": "tool", "tool_call_id": call_id, "content": content})
                }
            });
        }
        let mut body = json!({
            "model": endpoint.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(max) = request.max_tokens.or(endpoint.max_tokens) {
            body["max_tokens"] = max.into();
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function",
                           "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}})
                })
                .collect();
        }
        if let Some(output) = &request.output {
            // SPEC §20: the schema as the response format (OpenAI, llama.cpp, vLLM, … all read this form).
            body["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": output.name, "schema": output.schema, "strict": output.strict}});
        }
        body
    }
}

/// A user message's content: a plain string when it is all text, content parts when it holds an image.
fn user_content(content: &[ChatContent]) -> Value {
    if content.iter().all(|c| c.as_image().is_none()) {
        let texts: Vec<String> = content.iter().map(ChatContent::data_as_text).collect();
        return Value::String(texts.join("\n"));
    }
    content
        .iter()
        .map(|c| match c.as_image() {
            Some((mime, data)) => {
                json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{data}")}})
            }
            None => json!({"type": "text", "text": c.data_as_text()}),
        })
        .collect()
}

// The stream's chunks. Every field is optional: compatible servers differ in what they leave out or send
// as null.

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    /// OpenAI's prompt caching: `cached_tokens` of the prompt were read from the cache.
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles one streamed completion.
/// Reads the Chat Completions stream.
#[derive(Default)]
pub struct Decoder {
    delivered: Delivered,
    calls: Vec<PartialCall>,
    /// The stream's tool-call `index` → position in `calls`.
    by_index: HashMap<u32, usize>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

impl Decoder {
    /// Which call a tool-call piece belongs to. By `index` as the protocol says; a piece whose `index`
    /// is taken by a call with another id starts a new call (servers that number every call 0), and a
    /// piece without `index` belongs to the call with its id, else to the latest call.
    fn slot(&mut self, index: Option<u32>, id: Option<&str>) -> usize {
        let id = id.filter(|id| !id.is_empty());
        let found = match index {
            Some(index) => self.by_index.get(&index).copied().filter(|&slot| {
                let known = &self.calls[slot].id;
                id.is_none_or(|id| known.is_empty() || known == id)
            }),
            None => match id {
                Some(id) => self.calls.iter().position(|c| c.id == id),
                None => self.calls.len().checked_sub(1),
            },
        };
        found.unwrap_or_else(|| {
            self.calls.push(PartialCall::default());
            let slot = self.calls.len() - 1;
            if let Some(index) = index {
                self.by_index.insert(index, slot);
            }
            slot
        })
    }

    fn tool_call(&mut self, piece: ToolCallDelta) {
        let slot = self.slot(piece.index, piece.id.as_deref());
        let call = &mut self.calls[slot];
        if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = piece.function {
            // Names come whole in one piece; a server that repeats it in every piece is not appended to.
            if let Some(name) = function.name.filter(|n| !n.is_empty() && *n != call.name) {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }
}

impl SseDecoder for Decoder {
    fn event(&mut self, event: &Event, sink: &mut (dyn FnMut(StreamDelta) + Send)) -> Result<Flow, String> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Flow::Done);
        }
        if data.is_empty() {
            return Ok(Flow::More);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| format!("malformed chunk ({e}): {data}"))?;
        if let Some(error) = chunk.error {
            let message = error["message"].as_str().map(str::to_owned).unwrap_or_else(|| error.to_string());
            return Err(format!("the provider reported an error mid-stream: {message}"));
        }
        if let Some(usage) = chunk.usage {
            let usage = Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                cached_input_tokens: usage.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0),
                cache_write_tokens: 0,
            };
            self.usage = Some(usage);
            sink(StreamDelta::Usage(usage));
        }
        // One completion is asked for (no `n`): only choice 0 counts.
        for choice in chunk.choices.unwrap_or_default().into_iter().filter(|c| c.index.unwrap_or(0) == 0) {
            if let Some(delta) = choice.delta {
                if let Some(reasoning) = delta.reasoning_content.or(delta.reasoning) {
                    self.delivered.reasoning(&reasoning, sink);
                }
                if let Some(text) = delta.content {
                    self.delivered.text(&text, sink);
                }
                for piece in delta.tool_calls.unwrap_or_default() {
                    self.tool_call(piece);
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        Ok(Flow::More)
    }

    fn complete_at_eof(&self) -> bool {
        self.finish_reason.is_some()
    }

    fn delivered(&self) -> &Delivered {
        &self.delivered
    }

    fn finish(&mut self) -> Result<ChatOutput, String> {
        let calls = std::mem::take(&mut self.calls);
        let mut finish = match self.finish_reason.as_deref() {
            Some("stop") => Finish::Stop,
            Some("length") => Finish::Length,
            Some("tool_calls" | "function_call") => Finish::ToolCalls,
            Some(other) => Finish::Other(other.to_owned()),
            // No reason given: judge by what came.
            None if calls.is_empty() => Finish::Stop,
            None => Finish::ToolCalls,
        };
        if finish == Finish::Stop && !calls.is_empty() {
            finish = Finish::ToolCalls;
        }
        let mut tool_calls = Vec::with_capacity(calls.len());
        for (i, call) in calls.into_iter().enumerate() {
            // A truncated reply's calls are never run; anything else needs a name to run.
            if call.name.is_empty() && finish != Finish::Length {
                return Err(format!("tool call {i} has no name"));
            }
            tool_calls.push(super::chat::ChatToolCall {
                id: if call.id.is_empty() { format!("call_{i}") } else { call.id },
                name: call.name,
                arguments_json: if call.arguments.trim().is_empty() { "{}".to_owned() } else { call.arguments },
            });
        }
        Ok(ChatOutput {
            text: std::mem::take(&mut self.delivered.text),
            reasoning: self.delivered.take_reasoning(),
            tool_calls,
            finish,
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(decoder: &mut Decoder, data: &str) -> Result<Flow, String> {
        let event = Event { event: "message".into(), data: data.into(), ..Default::default() };
        decoder.event(&event, &mut |_| {})
    }

    #[test]
    fn tool_calls_numbered_zero_with_distinct_ids_stay_apart() {
        let mut d = Decoder::default();
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"y","arguments":"{\"k\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            assert_eq!(feed(&mut d, data), Ok(Flow::More));
        }
        let out = d.finish().unwrap();
        let calls: Vec<_> = out.tool_calls.iter().map(|c| (&*c.id, &*c.name, &*c.arguments_json)).collect();
        assert_eq!(calls, [("a", "x", "{}"), ("b", "y", r#"{"k":1}"#)]);
    }

    #[test]
    fn calls_without_index_or_finish_reason() {
        let mut d = Decoder::default();
        feed(&mut d, r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"x"}}]}}]}"#).unwrap();
        feed(&mut d, r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\"q\":2}"}}]}}]}"#).unwrap();
        assert_eq!(feed(&mut d, "[DONE]"), Ok(Flow::Done));
        let out = d.finish().unwrap();
        assert_eq!(out.finish, Finish::ToolCalls);
        assert_eq!(out.tool_calls[0].arguments_json, r#"{"q":2}"#);
    }

    #[test]
    fn a_nameless_call_breaks_unless_truncated() {
        let mut d = Decoder::default();
        feed(&mut d, r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"finish_reason":"tool_calls"}]}"#).unwrap();
        assert!(d.finish().is_err());
        let mut d = Decoder::default();
        feed(&mut d, r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"finish_reason":"length"}]}"#).unwrap();
        assert_eq!(d.finish().unwrap().finish, Finish::Length);
    }

    #[test]
    fn empty_reasoning_pieces_are_no_reasoning() {
        let mut d = Decoder::default();
        let chunk = r#"{"choices":[{"delta":{"content":"hi","reasoning_content":""},"finish_reason":"stop"}]}"#;
        feed(&mut d, chunk).unwrap();
        let out = d.finish().unwrap();
        assert_eq!((out.text.as_str(), out.reasoning), ("hi", None));
    }

    #[test]
    fn error_chunks_and_garbage_break_the_stream() {
        let mut d = Decoder::default();
        let err = feed(&mut d, r#"{"error":{"message":"overloaded"}}"#).unwrap_err();
        assert!(err.contains("overloaded"), "{err}");
        assert!(feed(&mut d, "not json").is_err());
    }
}
