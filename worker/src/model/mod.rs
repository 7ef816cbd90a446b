//! Models: what runs a step's request. The scripted model is built in; others plug in through [`Model`].
//! Real providers ([`openai`], [`anthropic`]) stream a provider-neutral [`chat::ChatRequest`];
//! [`chat_model`] runs them as a [`Model`].

pub mod anthropic;
pub mod chat;
pub mod chat_model;
pub mod endpoint;
mod http;
pub mod openai;
pub mod retry;
pub mod scripted;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use turnstile_driver::{ModelOutput, ModelRequest};

use chat::StreamDelta;

pub use scripted::ScriptedModel;

/// Why a model request did not finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("{message}")]
    Failed { message: String, code: String },
    /// The request saw the abort signal and stopped.
    #[error("aborted")]
    Aborted,
}

/// Where a model streams the pieces of its reply: text, and reasoning kept apart from it.
#[derive(Clone, Debug)]
pub struct DeltaSink(mpsc::Sender<StreamDelta>);

impl DeltaSink {
    pub fn new(tx: mpsc::Sender<StreamDelta>) -> Self {
        Self(tx)
    }

    /// Streams one piece of the reply text. A closed sink (the step was abandoned) drops it silently.
    pub async fn send(&self, text: String) {
        self.send_delta(StreamDelta::Text(text)).await;
    }

    /// Streams one piece of reasoning.
    pub async fn send_reasoning(&self, text: String) {
        self.send_delta(StreamDelta::Reasoning(text)).await;
    }

    /// Streams one piece of either kind.
    pub async fn send_delta(&self, delta: StreamDelta) {
        let _ = self.0.send(delta).await;
    }
}

/// Who answers a model request, for metrics and spans: the provider (`openai`, `anthropic`, `scripted`)
/// and the model's name there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIdentity {
    pub provider: String,
    pub model: String,
}

impl ModelIdentity {
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        Self { provider: provider.into(), model: model.into() }
    }
}

/// A streaming model.
#[async_trait]
pub trait Model: Send + Sync + 'static {
    /// Who answers the requests of `agent` (the metrics' and spans' `provider` and `model`). Default:
    /// `custom` for both.
    fn identity(&self, agent: &str) -> ModelIdentity {
        let _ = agent;
        ModelIdentity::new("custom", "custom")
    }

    /// Answers one step. The text deltas sent to `deltas` must concatenate to the returned text, the
    /// reasoning deltas to the returned reasoning. On `abort`, return [`ModelError::Aborted`] promptly.
    async fn step(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
        abort: CancellationToken,
    ) -> Result<ModelOutput, ModelError>;
}
