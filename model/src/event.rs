//! Durable and live events of SPEC §5.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::goal::GoalChange;
use crate::labels::Labeled;
use crate::message::{SessionRef, Target, UserMessage};
use crate::schedule::ScheduleChange;
use crate::transcript::TranscriptEntry;
// In `turn`, below the events, so that the transcript and the goal fold need not import this module.
pub use crate::turn::{CancelCause, ToolCallSpec, TurnEndReason};

/// Driver status. `Running` covers everything from the waking delivery through every drained turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    #[default]
    Idle,
    Running,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Marks why a splice removed messages. `None` on a removal is a claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpliceOutcome {
    #[default]
    None,
    Canceled,
    Restored,
}

/// `agent/inbox/spliced`: one normalized mutation of one pending list.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Splice {
    pub target: Target,
    pub start: u32,
    pub removed_count: u32,
    pub inserted: Vec<UserMessage>,
    pub outcome: SpliceOutcome,
    /// An insert made by a waking delivery.
    pub wake: bool,
    /// The target a waking delivery asked for when it was forced elsewhere (during an abort).
    pub requested_target: Option<Target>,
    /// A steer's deadline (SPEC §11): what happens to the inserted message if it is still pending then.
    #[serde(default)]
    pub deadline: Option<SteerDeadline>,
}

/// When a pending steer stops waiting, and what happens then (SPEC §11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SteerDeadline {
    /// Unix milliseconds: the steer's acceptance time plus its `deadline_ms`.
    pub at_ms: u64,
    pub on_deadline: OnDeadline,
}

/// What a steer deadline does to a steer still pending (SPEC §11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnDeadline {
    /// Cancel the running turn (cause `steer-deadline`, keeping the inbox) and move the steer to the head
    /// of next-turn, like `interrupt`.
    #[default]
    Interrupt,
    /// Remove the steer (canceled splice, live `discarded`).
    Drop,
}

impl fmt::Display for OnDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Interrupt => "interrupt",
            Self::Drop => "drop",
        })
    }
}

/// The token usage a model provider reported for one request (SPEC §8, §17), recorded on
/// `assistant/message`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (Anthropic: input plus cache reads and writes).
    pub input_tokens: u64,
    /// Tokens the model generated (reasoning included, where the provider counts it there).
    pub output_tokens: u64,
    /// Of `input_tokens`, those read from the provider's prompt cache (Anthropic
    /// `cache_read_input_tokens`, OpenAI `prompt_tokens_details.cached_tokens`).
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Of `input_tokens`, those written to the prompt cache (Anthropic `cache_creation_input_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Input and output tokens: what a tenant's `token_budget` counts (SPEC §17).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// The tokens a model request that did not finish used (SPEC §17, decision 0086), recorded on its step's
/// `step/end` and counted like an `assistant/message`'s usage: what the provider reported before the cut,
/// else (or beyond it, for output it had not reported yet) an estimate from the prompt and what streamed.
///
/// ```
/// use turnstile_model::{Spent, Usage};
/// let spent = Spent::estimate(4_000, 10, None);
/// assert_eq!(spent.usage, Usage { input_tokens: 1_000, output_tokens: 3, ..Usage::default() });
/// assert!(spent.estimated);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spent {
    pub usage: Usage,
    /// The model the request went to, when known.
    pub model: Option<ModelRef>,
    /// Some of `usage` is an estimate ([`Spent::estimate`]), not the provider's count.
    pub estimated: bool,
}

/// Bytes per token of the estimate: the usual figure for English text with BPE tokenizers (OpenAI's "a
/// token is about 4 characters").
pub const ESTIMATE_BYTES_PER_TOKEN: u64 = 4;

impl Spent {
    /// What a request cut before its end spent: the provider's `reported` usage so far, with the output
    /// raised to the estimate of `streamed_bytes` where the provider had not counted that far; without a
    /// report, the input estimated from `prompt_bytes` too.
    pub fn estimate(prompt_bytes: u64, streamed_bytes: u64, reported: Option<Usage>) -> Self {
        let tokens = |bytes: u64| bytes.div_ceil(ESTIMATE_BYTES_PER_TOKEN);
        let mut estimated = reported.is_none();
        let mut usage = reported.unwrap_or(Usage { input_tokens: tokens(prompt_bytes), ..Usage::default() });
        if tokens(streamed_bytes) > usage.output_tokens {
            usage.output_tokens = tokens(streamed_bytes);
            estimated = true;
        }
        Self { usage, model: None, estimated }
    }
}

/// The model that answered a request (SPEC §17): with fallbacks, not always the agent's first model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelRef {
    /// `openai`, `anthropic`, `scripted`.
    pub provider: String,
    /// The model's name at the provider.
    pub model: String,
}

impl ModelRef {
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        Self { provider: provider.into(), model: model.into() }
    }
}

/// What an `inject` to an idle session does (SPEC §11). Stored by `session/configured`; an inject to a
/// running session behaves as SPEC §4 in both modes (docs/decisions/0016-out-of-turn-inject.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InjectMode {
    /// The inject waits in next-step for the next step (SPEC §4).
    #[default]
    Pending,
    /// An inject to an idle session becomes a `user/message` between turns.
    OutOfTurn,
}

impl InjectMode {
    /// The name used by the CLI and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::OutOfTurn => "out-of-turn",
        }
    }
}

impl fmt::Display for InjectMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The payload of a durable event; one variant per durable type of SPEC §5.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventPayload {
    InboxSpliced(Splice),
    Status(Status),
    TurnStart {
        turn: u64,
    },
    TurnEnd {
        turn: u64,
        reason: TurnEndReason,
    },
    StepStart {
        turn: u64,
        step: u32,
    },
    StepEnd {
        turn: u64,
        step: u32,
        /// What the step's model request spent when it did not finish (cancelled, failed, timed out):
        /// `None` for a step whose reply finished (its usage is on its `assistant/message`) and for one
        /// that spent nothing the runner could see (SPEC §17, decision 0086).
        #[serde(default)]
        spent: Option<Spent>,
    },
    UserMessage {
        message: UserMessage,
        turn: u64,
        step: u32,
    },
    AssistantMessage {
        turn: u64,
        step: u32,
        /// The reply; the text deltas of the step concatenate to it.
        text: String,
        tool_calls: Vec<ToolCallSpec>,
        interrupted: bool,
        max_tokens: bool,
        /// Reasoning the model streamed apart from its text (DeepSeek `reasoning_content`, Anthropic
        /// thinking); the reasoning deltas concatenate to it. `None` when there was none.
        #[serde(default)]
        reasoning: Option<String>,
        /// The provider's token usage, when it reported one (never for an interrupted reply).
        #[serde(default)]
        usage: Option<Usage>,
        /// The model that answered (SPEC §17), when the runner knows it; absent on messages written
        /// before fallbacks existed and on interrupted replies.
        #[serde(default)]
        model: Option<ModelRef>,
    },
    ToolCall {
        turn: u64,
        step: u32,
        call: ToolCallSpec,
        /// The call waits for a `tool/decision` before it runs (SPEC §9).
        #[serde(default)]
        awaiting_approval: bool,
        /// A client tool of the turn ([`crate::turn_tools`]): it waits for `CompleteToolCall`.
        #[serde(default)]
        awaiting_client: bool,
    },
    /// `tool/decision` (SPEC §9): the answer to a call awaiting approval.
    ToolDecision {
        turn: u64,
        step: u32,
        call_id: String,
        approved: bool,
        reason: String,
        /// Decided by the agent's `approval_timeout_ms` passing (SPEC §21), not by a person.
        #[serde(default)]
        timed_out: bool,
    },
    ToolResult {
        turn: u64,
        step: u32,
        call_id: String,
        output: String,
        error: Option<String>,
    },
    /// `tool/repaired` (SPEC §20): what the repair of §6 did with a call that was running when its owner
    /// stopped. Written while the call is open: `interrupted` is followed by its error `tool/result`,
    /// `retried` by the call's result from the new owner, which ran it again under the same idempotency key.
    ToolRepaired {
        turn: u64,
        step: u32,
        call_id: String,
        action: RepairAction,
    },
    /// `goal/change` (SPEC §10): written only by the goal system.
    GoalChange(GoalChange),
    /// `session/configured` (SPEC §8): the agent profile and inject mode from the next turn on. Durable so
    /// every later owner runs the same profile.
    SessionConfigured {
        agent: String,
        inject_mode: InjectMode,
        /// Set on a child session's first event (SPEC §13 `spawn_agent`): the session whose tool call
        /// created it. A later `session/configured` without it keeps the link.
        #[serde(default)]
        parent: Option<SessionRef>,
        /// The version of `agent` the session runs from now on (SPEC §20); `None`: the agent's newest at
        /// each turn.
        #[serde(default)]
        version: Option<u64>,
    },
    /// `context/compacted` (SPEC §13): the whole turns through `upto_turn` are replaced in later model
    /// requests by `summary` (one user-role message marked as a summary). The log keeps every event.
    ContextCompacted(Compaction),
    /// `session/forked` (SPEC §13): the first event of a fork, with the source's transcript through the
    /// end of `at_turn` copied, so the fork never reads the source again.
    SessionForked(Fork),
    /// `schedule/changed` (SPEC §15): a schedule created, fired, skipped or deleted.
    ScheduleChanged(ScheduleChange),
    /// `session/labeled` (SPEC §16): labels set and removed.
    SessionLabeled(Labeled),
    /// `memory/written` (SPEC §20): a write an agent made to its tenant's memory (provenance). Written
    /// marked ignorable, so a reader that predates it skips it (SPEC §18).
    MemoryWritten(crate::memory::MemoryWritten),
    /// `session/overridden` (SPEC §20): the session's overrides from the next turn on, all of them (a field
    /// left out is no override). Written marked ignorable, so a reader that predates it runs the agent as
    /// it is.
    SessionOverridden(crate::overrides::SessionOverrides),
    /// An event of a type this build does not know, marked ignorable by its writer. Readers skip it;
    /// an unknown type that is not ignorable is refused by the codec instead.
    Ignorable {
        event_type: String,
    },
}

impl EventPayload {
    /// An `assistant/message` of plain text: no tool calls, reasoning, usage or model, not cut short.
    pub fn reply(turn: u64, step: u32, text: impl Into<String>) -> Self {
        Self::AssistantMessage {
            turn,
            step,
            text: text.into(),
            tool_calls: Vec::new(),
            interrupted: false,
            max_tokens: false,
            reasoning: None,
            usage: None,
            model: None,
        }
    }

    /// The durable type name of SPEC §5.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::InboxSpliced(_) => "agent/inbox/spliced",
            Self::Status(_) => "agent/status",
            Self::TurnStart { .. } => "turn/start",
            Self::TurnEnd { .. } => "turn/end",
            Self::StepStart { .. } => "step/start",
            Self::StepEnd { .. } => "step/end",
            Self::UserMessage { .. } => "user/message",
            Self::AssistantMessage { .. } => "assistant/message",
            Self::ToolCall { .. } => "tool/call",
            Self::ToolResult { .. } => "tool/result",
            Self::ToolDecision { .. } => "tool/decision",
            Self::ToolRepaired { .. } => "tool/repaired",
            Self::GoalChange(_) => "goal/change",
            Self::SessionConfigured { .. } => "session/configured",
            Self::ContextCompacted(_) => "context/compacted",
            Self::SessionForked(_) => "session/forked",
            Self::ScheduleChanged(_) => "schedule/changed",
            Self::SessionLabeled(_) => "session/labeled",
            Self::MemoryWritten(_) => "memory/written",
            Self::SessionOverridden(_) => "session/overridden",
            Self::Ignorable { .. } => "ignorable",
        }
    }
}

/// Every durable type, in SPEC §5 order.
pub const DURABLE_TYPES: [&str; 20] = [
    "agent/inbox/spliced",
    "agent/status",
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "assistant/message",
    "tool/call",
    "tool/result",
    "goal/change",
    "session/configured",
    "tool/decision",
    "context/compacted",
    "session/forked",
    "schedule/changed",
    "session/labeled",
    "tool/repaired",
    "memory/written",
    "session/overridden",
];

/// The durable types written marked ignorable: added after a release, and not needed by the fold, so a
/// reader of an older build skips them during a rolling upgrade (SPEC §18).
pub const IGNORABLE_TYPES: [&str; 3] = ["tool/repaired", "memory/written", "session/overridden"];

/// What the repair of SPEC §6 did with a call that was running when its owner stopped (SPEC §20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairAction {
    /// Ended with an error result and never run again (the default).
    Interrupted,
    /// Run again by the new owner under the same idempotency key (`retry_after_repair`).
    Retried,
}

impl RepairAction {
    /// The name the API and the CLI show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interrupted => "interrupted",
            Self::Retried => "retried",
        }
    }
}

/// `context/compacted` (SPEC §13, decision 0023).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Compaction {
    /// The last turn the summary covers; requests send the turns after it.
    pub upto_turn: u64,
    /// The first turn the summary covers (an earlier summary's first turn when it was folded in).
    pub from_turn: u64,
    /// What the model wrote.
    pub summary: String,
    /// How many turns this compaction summarized anew (an earlier summary it folded in not counted).
    pub summarized_turns: u32,
}

/// `session/forked` (SPEC §13, decision 0024).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fork {
    /// The source session (same tenant).
    pub from: SessionRef,
    /// The source's last turn copied; the fork's own turns are numbered from `at_turn + 1`.
    pub at_turn: u64,
    /// The seq of the source's `turn/end` of `at_turn`.
    pub at_seq: u64,
    /// The agent the source ran at that point (`None`: the default agent).
    pub agent: Option<String>,
    /// The source's compaction in force at `at_seq`, if any: its summary stands before `transcript`.
    pub compacted: Option<Compaction>,
    /// The source's transcript through the end of `at_turn` (after the compaction), in order.
    pub transcript: Vec<TranscriptEntry>,
}

/// A durable event with its envelope. `seq` is contiguous from 1 per session; `time_ms` and `epoch`
/// never decrease.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Envelope {
    pub session: SessionRef,
    pub seq: u64,
    pub time_ms: u64,
    pub epoch: u64,
    pub payload: EventPayload,
}

impl Envelope {
    pub fn event_type(&self) -> &'static str {
        self.payload.event_type()
    }
}

/// The payload of a live (not stored) event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LivePayload {
    Inserted {
        message: UserMessage,
    },
    Discarded {
        message: UserMessage,
    },
    Claimed {
        message: UserMessage,
        turn: u64,
    },
    Status {
        status: Status,
    },
    /// A piece of the reply (`reasoning = false`) or of the model's reasoning (`reasoning = true`).
    AssistantDelta {
        turn: u64,
        step: u32,
        text: String,
        #[serde(default)]
        reasoning: bool,
        /// The UTF-8 byte offset of `text` in the step's reply (or, for reasoning, in its reasoning): a
        /// delta's offset is the previous one's plus its length, so a gap shows a missed delta (SPEC §14).
        #[serde(default)]
        offset: u64,
    },
    Error {
        turn: u64,
        step: u32,
        message: String,
    },
}

impl LivePayload {
    /// The live type name of SPEC §5.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::Inserted { .. } => "agent/inbox/inserted",
            Self::Discarded { .. } => "agent/inbox/discarded",
            Self::Claimed { .. } => "agent/inbox/claimed",
            Self::Status { .. } => "agent/status",
            Self::AssistantDelta { .. } => "assistant/delta",
            Self::Error { .. } => "agent/error",
        }
    }
}

/// A live event: not stored, carries the seq of the durable event it follows.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LiveEvent {
    pub session: SessionRef,
    pub after_seq: u64,
    pub payload: LivePayload,
}

impl LiveEvent {
    pub fn event_type(&self) -> &'static str {
        self.payload.event_type()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn events_serialized_before_reasoning_and_usage_still_deserialize() {
        let old = r#"{"AssistantMessage":{"turn":1,"step":1,"text":"hi","tool_calls":[],"interrupted":false,"max_tokens":false}}"#;
        let payload: EventPayload = serde_json::from_str(old).unwrap();
        assert_eq!(payload, EventPayload::reply(1, 1, "hi"));
        let old_delta = r#"{"AssistantDelta":{"turn":1,"step":1,"text":"h"}}"#;
        let live: LivePayload = serde_json::from_str(old_delta).unwrap();
        assert_eq!(
            live,
            LivePayload::AssistantDelta { turn: 1, step: 1, text: "h".into(), reasoning: false, offset: 0 }
        );
    }

    #[test]
    fn reasoning_and_usage_round_trip_through_serde() {
        let payload = EventPayload::AssistantMessage {
            turn: 2,
            step: 1,
            text: "noon".into(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: Some("check the clock".into()),
            usage: Some(Usage { input_tokens: 7, output_tokens: 3, cached_input_tokens: 2, cache_write_tokens: 1 }),
            model: Some(ModelRef::new("anthropic", "claude")),
        };
        let json = serde_json::to_string(&payload).unwrap();
        assert_eq!(serde_json::from_str::<EventPayload>(&json).unwrap(), payload);
    }
}
