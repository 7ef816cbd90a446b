//! What the driver asks its runner to do, and what the runner reports back.

use turnstile_model::output::OutputSchema;
use turnstile_model::overrides::SessionOverrides;
use turnstile_model::{
    CommandError, CommandReply, ContentBlock, Envelope, EventPayload, LiveEvent, ModelRef, SessionRef, Spent,
    ToolCallSpec, TranscriptEntry, Usage, UserMessage,
};

/// Names one command for the runner, which pairs it with the caller waiting for the reply.
pub type CommandId = u64;

/// Names one asynchronous operation (pre-step decision, model request, tool call). Outcomes that name
/// an operation the driver no longer waits for are ignored, so a late answer can never act twice.
pub type OpId = u64;

/// An output of the driver, to be performed by the runner in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Append one group of durable events atomically, conditional on the log ending right before the
    /// group's first seq. The group must be durable before any later effect is performed; a failed append
    /// means the driver's state is ahead of the log: the runner drops the driver and reloads.
    Append(AppendGroup),
    /// Publish one live event (best effort).
    Publish(LiveEvent),
    /// Answer a command.
    Reply { id: CommandId, result: Result<CommandReply, CommandError> },
    /// Run the pre-step waterfall over a claimed batch.
    PreStep(PreStepRequest),
    /// Run one model request, streaming deltas (boxed: it is by far the largest effect).
    Model(Box<ModelRequest>),
    /// Run one tool call.
    Tool(ToolRequest),
    /// Signal an abort to a running operation. Pre-step and model operations must then report promptly
    /// (with [`PreStepOutcome::Aborted`] / [`ModelOutcome::Aborted`]); a tool finishes its call.
    Abort { op: OpId },
    /// The driver broke an invariant (see [`crate::Driver::ready`]): load the session again from its log.
    Reload { reason: String },
}

/// Durable events that must land together or not at all, in seq order (never empty).
#[derive(Clone, Debug, PartialEq)]
pub struct AppendGroup {
    events: Vec<Envelope>,
}

impl AppendGroup {
    pub(crate) fn new(first: Envelope) -> Self {
        Self { events: vec![first] }
    }

    pub(crate) fn push(&mut self, event: Envelope) {
        self.events.push(event);
    }

    /// How many events the group holds (at least one).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Never true: a group holds at least one event (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Ends with a `step/start` followed only by `user/message`s so far.
    pub(crate) fn opens_step(&self) -> bool {
        let mut rest = self.events.iter().rev().skip_while(|e| matches!(e.payload, EventPayload::UserMessage { .. }));
        matches!(rest.next().map(|e| &e.payload), Some(EventPayload::StepStart { .. }))
    }

    /// The events, in seq order.
    pub fn events(&self) -> &[Envelope] {
        &self.events
    }

    /// The seq the log must end at for this group to be appended (the first event's seq − 1).
    pub fn expected_last_seq(&self) -> u64 {
        self.events.first().map_or(0, |e| e.seq.saturating_sub(1))
    }

    pub fn into_events(self) -> Vec<Envelope> {
        self.events
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PreStepRequest {
    pub op: OpId,
    /// The agent running the turn: the runner picks its waterfall by this name.
    pub agent: String,
    /// The content hash of the agent version the turn runs (SPEC §20); empty without an agent store.
    pub agent_hash: String,
    pub turn: u64,
    /// The step this proposal would open.
    pub step: u32,
    /// The proposal number within the turn, from 1.
    pub proposal: u32,
    /// The claimed batch, next-step messages first.
    pub messages: Vec<UserMessage>,
}

/// The decision of the pre-step waterfall.
#[derive(Clone, Debug, PartialEq)]
pub enum PreStepDecision {
    /// End the turn `blocked`, with the reason the rejecting hook gave (recorded in `turn/end`).
    Reject { reason: Option<String> },
    /// The complete, ordered batch to enter.
    Enter(Vec<UserMessage>),
}

/// What one hook decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookVerdict {
    /// Pass this batch to the next hook (the last one is entered).
    Pass(Vec<UserMessage>),
    Reject {
        reason: Option<String>,
    },
}

/// A hook failed; the turn ends `error`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("hook {hook}: {message}")]
pub struct HookError {
    pub hook: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PreStepOutcome {
    Decided(PreStepDecision),
    /// A hook failed.
    Failed {
        message: String,
    },
    /// The operation stopped because of an abort.
    Aborted,
}

/// The result of one tool call, as recorded in `tool/result`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    pub call_id: String,
    pub name: String,
    pub output: String,
    pub error: Option<String>,
    /// The tool concluded the turn (the step result becomes `completed`).
    pub concludes_turn: bool,
    /// Model-visible context the tool returned with its result (SPEC §9): inserted at the end of
    /// next-step, right after the `tool/result`, with source `tool{call_id}` (the driver sets it).
    pub context: Vec<UserMessage>,
    /// Writes the call made to the tenant's memory (SPEC §20): recorded as `memory/written` before its
    /// `tool/result`.
    pub memory: Vec<turnstile_model::memory::MemoryWrite>,
}

impl ToolOutcome {
    /// A result with no context that does not conclude the turn.
    pub fn new(call_id: impl Into<String>, name: impl Into<String>, output: String, error: Option<String>) -> Self {
        Self {
            call_id: call_id.into(),
            name: name.into(),
            output,
            error,
            concludes_turn: false,
            context: Vec::new(),
            memory: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelRequest {
    pub op: OpId,
    /// The session the step belongs to: its tenant scopes the client tools offered to the model.
    pub session: SessionRef,
    pub turn: u64,
    pub step: u32,
    /// The agent running this turn (SPEC §8): the runner picks its model and tools by this name.
    pub agent: String,
    /// The content hash of the agent version the turn runs (SPEC §20); empty without an agent store.
    pub agent_hash: String,
    /// The agent's system prompt, sent before everything else (a session's extra prompt already after it).
    pub system: Option<String>,
    /// The session's overrides this turn applies (SPEC §20): the runner runs `model` instead of the agent's
    /// and offers only `tools` of its tools. Default on a compaction request.
    pub overrides: SessionOverrides,
    /// The session's history before this step, in log order: entered user messages, assistant messages
    /// (interrupted ones as delivered) and tool results, cut to the agent's `history_turns` by dropping
    /// the oldest whole turns before this one (the current turn is never cut). It includes what
    /// `tool_results` and `interrupted_prompt` repeat; those stay for models that only look at the step.
    pub history: Vec<std::sync::Arc<TranscriptEntry>>,
    /// Messages entered in this step.
    pub messages: Vec<UserMessage>,
    /// Results of the previous step's tool calls, in call order.
    pub tool_results: Vec<ToolOutcome>,
    /// The prompt of a turn a crash interrupted mid-step: this step must answer it (SPEC §6).
    pub interrupted_prompt: Vec<UserMessage>,
    /// The session's active goal (SPEC §10): while there is one the runner offers the model the built-in
    /// tool [`GOAL_COMPLETE`] `{summary}`. The driver itself runs that tool; it never reaches the runner.
    pub goal: Option<ActiveGoal>,
    /// The summary of the session's compacted turns (SPEC §13): sent right after the system prompt as
    /// one user-role message marked as a summary; `history` holds only the turns after it.
    pub summary: Option<String>,
    /// The JSON Schema the reply must match when it is the turn's final one (SPEC §20): the turn's own,
    /// else its agent's; `None` on a compaction request. The runner sends it to the provider and reports
    /// a final reply that does not match in [`ModelOutput::invalid_output`].
    pub output: Option<OutputSchema>,
    /// Set on a compaction request (SPEC §13): not a step, but the request that summarizes `history`
    /// (with `summary`, the earlier summary, before it). The runner uses the agent's
    /// `compaction_model`, offers no tools and publishes nothing; the reply text is the new summary.
    pub compaction: Option<CompactionTask>,
}

impl ModelRequest {
    /// The bytes of text and data the request sends the model (system prompt, summary, history, this
    /// step's messages and results): what [`Spent::estimate`] estimates a request's input from when the
    /// provider never reported its usage.
    pub fn prompt_bytes(&self) -> u64 {
        fn message(m: &UserMessage) -> usize {
            m.content
                .iter()
                .map(|b| match b {
                    ContentBlock::Text { text } => text.len(),
                    ContentBlock::Data { bytes, .. } => bytes.len(),
                })
                .sum()
        }
        let history = self.history.iter().map(|e| match e.as_ref() {
            TranscriptEntry::User { message: m, .. } => message(m),
            TranscriptEntry::Assistant { text, tool_calls, .. } => {
                text.len() + tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>()
            }
            TranscriptEntry::ToolResult { output, error, .. } => output.len() + error.as_ref().map_or(0, String::len),
        });
        let results = self.tool_results.iter().map(|r| r.output.len() + r.error.as_ref().map_or(0, String::len));
        let total: usize =
            [self.system.as_ref(), self.summary.as_ref()].into_iter().flatten().map(String::len).sum::<usize>()
                + history.sum::<usize>()
                + self.messages.iter().chain(&self.interrupted_prompt).map(message).sum::<usize>()
                + results.sum::<usize>();
        total as u64
    }
}

/// What a compaction request summarizes: turns `from_turn..=upto_turn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionTask {
    pub from_turn: u64,
    pub upto_turn: u64,
}

/// How a summary is marked when it goes to the model as a user-role message (SPEC §13).
pub const SUMMARY_PREFIX: &str = "[summary of the earlier conversation]\n";

/// The instruction a compaction request ends with.
pub fn compaction_instruction(task: &CompactionTask) -> String {
    format!(
        "Summarize turns {}..{} of the conversation above (and any earlier summary) for your own later use: \
         keep facts, decisions, open questions and tool results that matter; be brief. Reply with the summary only.",
        task.from_turn, task.upto_turn
    )
}

/// The name of the built-in tool that ends the active goal (SPEC §10).
pub const GOAL_COMPLETE: &str = "goal_complete";

/// What a model request says about the active goal, so the runner can describe `goal_complete`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveGoal {
    pub goal_id: String,
    pub revision: u64,
    pub objective: String,
    /// Continuations admitted so far in this revision.
    pub round: u64,
    pub max_rounds: u32,
}

/// What a finished model request produced.
///
/// ```
/// use turnstile_driver::ModelOutput;
/// use turnstile_model::Usage;
///
/// let output = ModelOutput {
///     usage: Some(Usage { input_tokens: 120, output_tokens: 8, ..Usage::default() }),
///     ..ModelOutput::text("It is noon.")
/// };
/// assert_eq!(output.reasoning, None);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelOutput {
    /// The whole reply; the streamed text deltas concatenate to it.
    pub text: String,
    pub tool_calls: Vec<ToolCallSpec>,
    /// The model stopped at its token limit; its tool calls are truncated and never run.
    pub max_tokens: bool,
    /// The model's reasoning, kept apart from the text; the streamed reasoning deltas concatenate to it.
    /// `None` when it streamed none.
    pub reasoning: Option<String>,
    /// The token usage the provider reported, if it did.
    pub usage: Option<Usage>,
    /// The model that answered (SPEC §17: a fallback when the agent's model failed before its first
    /// byte); `None` when the model does not say.
    pub model: Option<ModelRef>,
    /// Why a final reply (no tool calls, not cut at the token limit) does not match the request's
    /// [`ModelRequest::output`] schema, when it does not (SPEC §20): the driver asks once more, showing the
    /// model this, then ends the turn `error{invalid_output}`.
    pub invalid_output: Option<String>,
}

impl ModelOutput {
    /// A reply of `text` alone: no tool calls, reasoning or usage.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), ..Self::default() }
    }
}

/// The `turn/end` error code of a step whose model request was not sent because the session's tenant used
/// its daily `token_budget` (SPEC §17). The runner answers the model effect with it; the driver ends the
/// turn with the runner's message as it is (it names the budget and when it resets).
pub const TENANT_BUDGET_EXHAUSTED: &str = "tenant_budget_exhausted";

/// How a model request ended. A request that did not finish carries what it spent, as the runner saw it
/// ([`Spent`]); the driver records that on the step's `step/end` (decision 0086).
#[derive(Clone, Debug, PartialEq)]
pub enum ModelOutcome {
    Finished(ModelOutput),
    Failed { message: String, code: String, spent: Option<Spent> },
    Aborted { spent: Option<Spent> },
}

impl ModelOutcome {
    /// What the request spent, for a step that will not record its reply: a finished reply's reported
    /// usage (a cancel that lands as the reply finishes), else what the runner saw of an unfinished one.
    pub fn spent(&self) -> Option<Spent> {
        match self {
            Self::Finished(output) => {
                output.usage.map(|usage| Spent { usage, model: output.model.clone(), estimated: false })
            }
            Self::Failed { spent, .. } | Self::Aborted { spent } => spent.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub op: OpId,
    /// The agent running the turn: its tool list and deadlines apply to the call.
    pub agent: String,
    /// The content hash of the agent version the turn runs (SPEC §20); empty without an agent store.
    pub agent_hash: String,
    pub turn: u64,
    pub step: u32,
    pub call: ToolCallSpec,
    /// The tools the turn offers when a session narrowed them (SPEC §20): a call of any other is refused.
    pub tools: Option<Vec<String>>,
    /// The call's idempotency key (SPEC §20, [`turnstile_model::tool_key`]): whoever runs the call hands
    /// it on, and a call run again after a repair has the same one.
    pub idempotency_key: String,
}
