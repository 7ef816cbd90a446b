//! Real providers behind today's [`Model`] trait, until the driver hands models whole histories.
//!
//! [`connect`] builds the provider an endpoint names; [`ChatModel`] runs it as a [`Model`]. The driver's
//! [`ModelRequest`] carries only what a step adds (its messages, the previous step's tool results, an
//! interrupted prompt), not the session's history, so this bridge is lossy on purpose: it sends the
//! agent's system prompt and this step's messages, and the previous step's tool results as one user
//! message of text (a `tool` message needs the assistant message with its call, which the request lacks).
//! Reasoning deltas and token usage have nowhere to go in [`ModelOutput`] yet and are dropped here.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use turnstile_worker::model::chat_model::{ChatModel, connect};
//! use turnstile_worker::model::endpoint::{ModelEndpoint, ProviderKind};
//!
//! let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "SmolLM2-135M-Instruct");
//! endpoint.base_url = "http://127.0.0.1:8080/v1".into();
//! let model = ChatModel::new(connect(endpoint)?).with_system("You are a helpful assistant.");
//! # let _ = model; Ok(()) }
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_model::{ContentBlock, ToolCallSpec, UserMessage};

use super::anthropic::AnthropicProvider;
use super::chat::{ChatContent, ChatMessage, ChatProvider, ChatRequest, Finish, ProviderError, StreamDelta, ToolSpec};
use super::endpoint::{EndpointError, ModelEndpoint, ProviderKind};
use super::openai::OpenAiProvider;
use super::{DeltaSink, Model, ModelError};
use turnstile_driver::{ModelOutput, ModelRequest};

/// The provider `endpoint.provider` names, ready to stream.
pub fn connect(endpoint: ModelEndpoint) -> Result<Arc<dyn ChatProvider>, EndpointError> {
    Ok(match endpoint.provider {
        ProviderKind::OpenAi => Arc::new(OpenAiProvider::new(endpoint)?),
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(endpoint)?),
    })
}

/// A [`ChatProvider`] as a [`Model`], with the agent's system prompt and tools.
#[derive(Clone)]
pub struct ChatModel {
    provider: Arc<dyn ChatProvider>,
    system: Option<String>,
    tools: Vec<ToolSpec>,
}

impl std::fmt::Debug for ChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatModel")
            .field("provider", &self.provider.provider())
            .field("model", &self.provider.model())
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl ChatModel {
    pub fn new(provider: Arc<dyn ChatProvider>) -> Self {
        Self { provider, system: None, tools: Vec::new() }
    }

    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    /// The chat request this bridge sends for `request` (see the module docs for what it leaves out).
    pub fn chat_request(&self, request: &ModelRequest) -> ChatRequest {
        let mut messages = Vec::new();
        if !request.tool_results.is_empty() {
            let lines: Vec<String> = request
                .tool_results
                .iter()
                .map(|r| match &r.error {
                    Some(error) => format!("- {} ({}) failed: {error}", r.name, r.call_id),
                    None => format!("- {} ({}): {}", r.name, r.call_id, r.output),
                })
                .collect();
            messages.push(ChatMessage::user_text(format!("Tool results:\n{}", lines.join("\n"))));
        }
        let prompt = request.interrupted_prompt.iter().chain(&request.messages);
        messages.extend(prompt.map(user_message));
        ChatRequest { system: self.system.clone(), messages, tools: self.tools.clone(), max_tokens: None }
    }
}

fn user_message(message: &UserMessage) -> ChatMessage {
    let content = message
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text } => ChatContent::Text(text.clone()),
            ContentBlock::Data { mime, bytes } => ChatContent::Data { mime: mime.clone(), bytes: bytes.clone() },
        })
        .collect();
    ChatMessage::User { content }
}

#[async_trait]
impl Model for ChatModel {
    async fn step(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
        abort: CancellationToken,
    ) -> Result<ModelOutput, ModelError> {
        let chat = self.chat_request(&request);
        // The provider's sink is synchronous; text goes through a channel to the async delta sink.
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let run = async move {
            let mut sink = move |delta: StreamDelta| {
                if let StreamDelta::Text(text) = delta {
                    let _ = tx.send(text);
                }
            };
            self.provider.stream(&chat, &mut sink, &abort).await
            // `sink` and its sender drop here, which ends the forwarding below.
        };
        let forward = async {
            while let Some(text) = rx.recv().await {
                deltas.send(text).await;
            }
        };
        let (result, ()) = tokio::join!(run, forward);
        match result {
            Ok(output) => Ok(ModelOutput {
                text: output.text,
                tool_calls: output
                    .tool_calls
                    .into_iter()
                    .map(|c| ToolCallSpec { call_id: c.id, name: c.name, arguments: c.arguments_json })
                    .collect(),
                max_tokens: output.finish == Finish::Length,
            }),
            Err(ProviderError::Aborted { .. }) => Err(ModelError::Aborted),
            Err(error) => Err(ModelError::Failed { message: error.to_string(), code: error.code().to_owned() }),
        }
    }
}
