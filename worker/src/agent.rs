//! The agent seam: what the runner calls to perform a driver's [`Effect::PreStep`], [`Effect::Model`] and
//! [`Effect::Tool`], and what `turnstile-agent` implements (decision 0050).
//!
//! The driver says *what* to ask (a [`PreStepRequest`], a [`ModelRequest`], a [`ToolRequest`]) and takes
//! the outcomes back as inputs; it cannot hold these traits itself, since answering them takes a task, a
//! cancellation signal and a channel, and the driver has no runtime. So they live here, with the host that
//! calls them: one [`PreStepHook`] (each agent's waterfall), one [`Model`] and one [`Tools`] serve every
//! agent of a worker, bundled with the agents' catalog as [`Agents`]. The LLM providers, the scripted model,
//! the tools (built-in, MCP, client, `spawn_agent`), the remote hooks and the configuration that picks them
//! are the `turnstile-agent` crate's; `turnstile-node` hands its [`Agents`] to the host. So this crate
//! carries no HTTP client and no MCP SDK.
//!
//! [`Effect::PreStep`]: turnstile_driver::Effect::PreStep
//! [`Effect::Model`]: turnstile_driver::Effect::Model
//! [`Effect::Tool`]: turnstile_driver::Effect::Tool

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use turnstile_driver::{AgentCatalog, ModelOutput, ModelRequest, PreStepRequest, ToolRequest};
pub use turnstile_driver::{HookError, HookVerdict};
use turnstile_model::{SessionRef, Usage, UserMessage};

/// Why a model request did not finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("{message}")]
    Failed { message: String, code: String },
    /// The request saw the abort signal and stopped.
    #[error("aborted")]
    Aborted,
}

/// One streamed piece of a model's reply, delivered as soon as it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamDelta {
    /// Reply text; the text deltas of a reply concatenate to [`ModelOutput::text`].
    Text(String),
    /// Reasoning text (DeepSeek `reasoning_content`, Anthropic thinking); they concatenate to
    /// [`ModelOutput::reasoning`].
    Reasoning(String),
    /// The token usage the provider has reported so far (Anthropic: the input at the start, the output at
    /// the end; OpenAI: all of it in the last chunk). Not part of the reply: the runner keeps the latest,
    /// so a request cut before it finishes is still counted (SPEC §17, decision 0086).
    Usage(Usage),
}

/// Where a model streams the pieces of its reply: text, and reasoning kept apart from it. Bounded: a
/// send waits while the runner has not taken the earlier pieces, so a slow consumer slows the model's
/// reading of its provider (the provider's own flow control does the rest).
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

    /// Reports the provider's token usage so far ([`StreamDelta::Usage`]).
    pub async fn report_usage(&self, usage: Usage) {
        self.send_delta(StreamDelta::Usage(usage)).await;
    }

    /// A sink whose pieces go nowhere (a caller that only wants the returned output).
    pub fn discard() -> Self {
        Self(mpsc::channel(1).0)
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

/// A streaming model: answers the driver's [`ModelRequest`]s.
#[async_trait]
pub trait Model: Send + Sync + 'static {
    /// Who answers the requests of `agent` (the metrics' and spans' `provider` and `model`). Default:
    /// `custom` for both.
    fn identity(&self, agent: &str) -> ModelIdentity {
        let _ = agent;
        ModelIdentity::new("custom", "custom")
    }

    /// Answers one step. The text deltas sent to [`ModelStep::deltas`] must concatenate to the returned
    /// text, the reasoning deltas to the returned reasoning. On [`ModelStep::abort`], return
    /// [`ModelError::Aborted`] promptly.
    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError>;
}

/// One step asked of a [`Model`]: the driver's request and what the runner adds to it, the sink its reply
/// streams to and the signal that aborts it. The three live as long as the step and travel together
/// through every model that wraps another (structured output, agent versions, the agents' router), which
/// reads the request and hands the step on whole.
#[derive(Debug)]
pub struct ModelStep {
    pub request: ModelRequest,
    pub deltas: DeltaSink,
    pub abort: CancellationToken,
}

impl ModelStep {
    pub fn new(request: ModelRequest, deltas: DeltaSink, abort: CancellationToken) -> Self {
        Self { request, deltas, abort }
    }
}

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReturn {
    pub output: String,
    /// Set when the call failed.
    pub error: Option<String>,
    /// The tool concluded the turn.
    pub concludes_turn: bool,
    /// Model-visible context messages to insert after the result (SPEC §9), as text.
    pub context: Vec<String>,
    /// Writes the call made to the tenant's memory (SPEC §20): each is recorded as `memory/written`.
    pub memory: Vec<turnstile_model::memory::MemoryWrite>,
}

impl ToolReturn {
    pub fn ok(output: impl Into<String>) -> Self {
        Self { output: output.into(), error: None, concludes_turn: false, context: Vec::new(), memory: Vec::new() }
    }

    pub fn failed(error: impl Into<String>) -> Self {
        Self {
            output: String::new(),
            error: Some(error.into()),
            concludes_turn: false,
            context: Vec::new(),
            memory: Vec::new(),
        }
    }
}

/// The tools of every agent: runs the driver's [`ToolRequest`]s.
#[async_trait]
pub trait Tools: Send + Sync + 'static {
    /// Runs the call of `run` for its agent, bounded by whatever deadline the agent sets.
    async fn call(&self, run: ToolRun<'_>) -> ToolReturn;
}

/// One tool call the runner hands to [`Tools`]: the driver's request, the session it is made in and the
/// runner's two signals. They travel together through every [`Tools`] that wraps another (agent
/// versions), and the signals, of one type, are told apart by name rather than by position.
#[derive(Clone, Copy, Debug)]
pub struct ToolRun<'a> {
    pub session: &'a SessionRef,
    pub request: &'a ToolRequest,
    /// Signalled when the turn is cancelled: a started call finishes (it may stop early) and its result is
    /// recorded.
    pub abort: &'a CancellationToken,
    /// Cancelled, before `abort`, when this worker lets the call go without a cancel of the turn (a reload
    /// after a journal error, a shard handed over, a shutdown): its result will not be recorded here and the
    /// next owner repairs the call (SPEC §6).
    pub released: &'a CancellationToken,
}

/// A pre-step hook (SPEC §4, §9): decides over a claimed batch. A waterfall of hooks is itself a hook, so
/// the runner calls one per worker and it picks the agent's waterfall.
#[async_trait]
pub trait PreStepHook: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// Decides over `batch` for `proposal`. On [`Proposal::abort`], return promptly.
    async fn decide(&self, proposal: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError>;
}

/// What a proposal puts to the pre-step hooks besides its batch: the session, the driver's request and the
/// turn's abort signal. They stay the same down a waterfall, while the batch is the one the hook before left,
/// so it goes apart.
#[derive(Clone, Copy, Debug)]
pub struct Proposal<'a> {
    pub session: &'a SessionRef,
    pub request: &'a PreStepRequest,
    pub abort: &'a CancellationToken,
}

impl<'a> Proposal<'a> {
    pub fn new(session: &'a SessionRef, request: &'a PreStepRequest, abort: &'a CancellationToken) -> Self {
        Self { session, request, abort }
    }
}

/// Fetches the agents anew from where they are kept (SPEC §20), for a command that names a version the
/// worker's catalog does not hold yet (put a moment ago through another gateway).
#[async_trait]
pub trait CatalogRefresh: Send + Sync + 'static {
    /// Returns once the catalog [`Catalogs::current`] gives holds every version stored now.
    async fn refresh(&self);
}

/// The agents' catalog as it changes (SPEC §20): agents put, changed or deleted at run time reach every
/// runner, which hands its driver the new catalog before its next input.
#[derive(Clone)]
pub struct Catalogs {
    current: watch::Receiver<AgentCatalog>,
    refresh: Option<Arc<dyn CatalogRefresh>>,
}

impl Catalogs {
    /// A catalog that never changes (a worker without an agent store, tests).
    pub fn fixed(catalog: AgentCatalog) -> Self {
        Self { current: watch::channel(catalog).1, refresh: None }
    }

    /// The catalogs `current` receives, fetched anew through `refresh` when a command needs it.
    pub fn new(current: watch::Receiver<AgentCatalog>, refresh: Arc<dyn CatalogRefresh>) -> Self {
        Self { current, refresh: Some(refresh) }
    }

    /// The catalog now (a shared clone).
    pub fn current(&self) -> AgentCatalog {
        self.current.borrow().clone()
    }

    /// Waits until the catalog holds version `version` of `agent` for `tenant`, fetching it once if it does
    /// not (the driver then answers as it would for any version: it exists now, or it does not).
    pub async fn ensure(&self, agent: &str, tenant: &str, version: u64) {
        if self.current().version_for(agent, tenant, version).is_some() {
            return;
        }
        if let Some(refresh) = &self.refresh {
            refresh.refresh().await;
        }
    }
}

impl std::fmt::Debug for Catalogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalogs").field("current", &*self.current.borrow()).finish_non_exhaustive()
    }
}

/// What a worker's sessions run: the agents' catalog (for the driver) and what answers their steps.
#[derive(Clone)]
pub struct Agents {
    /// Names, system prompts and history budgets of the agents and their versions, and the default one.
    pub catalog: Catalogs,
    /// Serves every agent's model requests.
    pub model: Arc<dyn Model>,
    /// Runs every agent's tool calls.
    pub tools: Arc<dyn Tools>,
    /// Decides every agent's proposals (each agent's waterfall).
    pub hooks: Arc<dyn PreStepHook>,
    /// Sends every agent's webhooks (SPEC §15).
    pub webhooks: Arc<dyn crate::webhooks::WebhookSender>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents").field("catalog", &self.catalog).finish_non_exhaustive()
    }
}
