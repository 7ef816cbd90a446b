//! Commands that the gateway routes to a session's owning driver, and their replies.
//!
//! This is the seam between `gateway` (validation, routing) and `worker` (drivers): the gateway turns a
//! request into a [`Command`] and routes it (through `turnstile_cluster::CommandRouter`) to the driver
//! that owns the session, which answers with a [`CommandReply`] or a [`CommandError`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::{CancelCause, Envelope, Fork, InjectMode, OnDeadline, Status};
use crate::goal::{GoalAction, GoalChange};
use crate::labels::{Labeled, Labels};
use crate::message::{MessageId, SessionRef, Target, UserMessage};
use crate::overrides::SessionOverrides;
use crate::schedule::{Schedule, ScheduleSpec};

/// A client command for one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The delivery primitive (`followup`, `queue`, `steer`, `inject` are presets of it).
    Send {
        message: UserMessage,
        target: Target,
        wakeup: bool,
        expected_turn: Option<u64>,
        /// A steer's deadline, relative to its acceptance (SPEC §11).
        deadline: Option<DeadlineSpec>,
    },
    /// Cancel the active turn keeping the inbox, then followup at the head of next-turn.
    Interrupt {
        message: UserMessage,
    },
    Cancel {
        cause: CancelCause,
        keep_inbox: bool,
    },
    Replace {
        id: MessageId,
        message: UserMessage,
    },
    Remove {
        id: MessageId,
    },
    Splice {
        target: Target,
        start: u32,
        delete_count: u32,
        inserted: Vec<UserMessage>,
    },
    Clear,
    /// `ConfigureSession` (SPEC §8): the agent and inject mode from the next turn on; only while idle.
    Configure {
        agent: String,
        inject_mode: InjectMode,
        /// The version of `agent` to record (SPEC §20); `None`: none, the agent's newest at each turn.
        version: Option<u64>,
        /// The session's overrides from the next turn on, all of them (SPEC §20).
        #[serde(default)]
        overrides: SessionOverrides,
    },
    /// `MigrateSessions` (SPEC §20): a session running `agent` runs its version `version` from its next
    /// turn; written at once, allowed while a turn runs (that turn keeps its version).
    Migrate {
        agent: String,
        version: u64,
    },
    /// `Decide` (SPEC §9): answers the tool call awaiting approval.
    Decide {
        call_id: String,
        approve: bool,
        reason: String,
    },
    /// `CompleteToolCall` (SPEC §19): the result of the call of a client tool of the turn that waits for it.
    CompleteToolCall {
        call_id: String,
        output: String,
        error: Option<String>,
    },
    /// `SetGoal` (SPEC §10): starts goal `goal_id` (minted by the gateway) at revision 1, or, while a goal
    /// is active or paused, revises that goal (its id stays; revision + 1, round 0, active).
    SetGoal {
        goal_id: String,
        objective: String,
        max_rounds: u32,
    },
    /// `UpdateGoal` (SPEC §10): pause, resume or clear the session's goal `goal_id`.
    UpdateGoal {
        goal_id: String,
        action: GoalAction,
    },
    /// Resolves when the driver is idle and no latched wake is pending.
    WhenIdle,
    /// `Compact` (SPEC §13): summarize the whole turns not yet summarized, while idle.
    Compact,
    /// `ForkSession` (SPEC §13), routed to the *new* session's owner: writes `session/forked` as the
    /// session's first event (the gateway read the source and built `fork`).
    Fork(Box<Fork>),
    /// The built-in tool `spawn_agent` (SPEC §13), routed to the *child* session's owner: on a session
    /// with no events, `session/configured {agent, parent}` and the prompt as a followup, in one append
    /// group; on the same parent's child, the followup alone (a retry answers its first acceptance).
    Spawn(Box<Spawn>),
    /// `DeleteSession` (SPEC §12): cancel a running turn (cause `disposed`), then remove the session's log,
    /// snapshots and dedup state. The session host performs it around the driver, which never sees it.
    Delete,
    /// A read for a joining `Watch` (SPEC §14): the output so far of the step that is streaming, if one is.
    /// Writes nothing; the host answers it without loading a session that is not in memory (nothing of
    /// it can be streaming).
    StreamingStep,
    /// `CreateSchedule` (SPEC §15): durable `schedule/changed {created}`; the same id with the same spec
    /// answers the schedule as it is, with another spec ALREADY_EXISTS.
    CreateSchedule(Box<ScheduleSpec>),
    /// `DeleteSchedule` (SPEC §15); NOT_FOUND when the session has no such schedule.
    DeleteSchedule {
        schedule_id: String,
    },
    /// `SetLabels` (SPEC §16): durable `session/labeled`; a change that changes nothing writes nothing.
    SetLabels(Labeled),
    /// `ImportSessions` (SPEC §18): one group of an imported log, appended as it is (seqs, times, epochs
    /// and MessageIds kept); the group from seq 1 only to a session without events. The session host
    /// performs it around the driver, which never sees it; `complete` marks the log's last group.
    Import {
        events: Vec<Envelope>,
        complete: bool,
    },
}

/// A steer's `deadline_ms` and `on_deadline`, as the client gave them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadlineSpec {
    pub after_ms: u64,
    pub on_deadline: OnDeadline,
}

/// The longest steer deadline accepted: a week. Longer is almost certainly a unit mistake.
pub const MAX_STEER_DEADLINE_MS: u64 = 7 * 24 * 3600 * 1000;

impl Command {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Send { target: Target::NextTurn, wakeup: true, .. } => "followup",
            Self::Send { target: Target::NextTurn, wakeup: false, .. } => "queue",
            Self::Send { target: Target::NextStep, wakeup: true, .. } => "steer",
            Self::Send { target: Target::NextStep, wakeup: false, .. } => "inject",
            Self::Interrupt { .. } => "interrupt",
            Self::Cancel { .. } => "cancel",
            Self::Replace { .. } => "replace",
            Self::Remove { .. } => "remove",
            Self::Splice { .. } => "splice",
            Self::Clear => "clear",
            Self::Configure { .. } => "configure",
            Self::Migrate { .. } => "migrate",
            Self::Decide { .. } => "decide",
            Self::CompleteToolCall { .. } => "complete_tool_call",
            Self::SetGoal { .. } => "set_goal",
            Self::UpdateGoal { .. } => "update_goal",
            Self::WhenIdle => "when_idle",
            Self::Compact => "compact",
            Self::Fork(_) => "fork",
            Self::Spawn(_) => "spawn",
            Self::Delete => "delete",
            Self::StreamingStep => "streaming_step",
            Self::CreateSchedule(_) => "create_schedule",
            Self::DeleteSchedule { .. } => "delete_schedule",
            Self::SetLabels(_) => "set_labels",
            Self::Import { .. } => "import",
        }
    }
}

/// What `spawn_agent` asks of the child session's driver ([`Command::Spawn`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawn {
    /// The session whose tool call creates the child; same tenant as the child.
    pub parent: SessionRef,
    /// The agent profile the child runs.
    pub agent: String,
    /// The prompt, delivered as a followup; its id is derived from the parent's call, so a retry of the
    /// same call is deduplicated like any retried delivery.
    pub prompt: UserMessage,
}

/// Where a session stands, as its owner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    pub status: Status,
    pub last_seq: u64,
    pub last_turn: u64,
    pub epoch: u64,
    pub owner: String,
    /// The agent the session runs: the configured one, else the default agent.
    pub agent: String,
    pub inject_mode: InjectMode,
    /// The version of `agent` the session recorded (SPEC §20); `None`: it runs the newest.
    #[serde(default)]
    pub agent_version: Option<u64>,
    /// The session's latest goal in any state (`Goal::current`), if it ever had one.
    pub goal: Option<GoalChange>,
    /// The `time` of the last durable event (0 before the first): the session's last activity.
    pub last_time_ms: u64,
    /// The parent of a child session (SPEC §13).
    pub parent: Option<SessionRef>,
    /// The session's labels (SPEC §16).
    #[serde(default)]
    pub labels: Labels,
}

impl SessionSummary {
    /// What a reader of the log knows of `state`; `owner` and `agent` come from the cluster and the
    /// configuration, which the log does not hold.
    pub fn of(state: &crate::SessionState, owner: String, agent: String) -> Self {
        Self {
            status: state.status,
            last_seq: state.last_seq,
            last_turn: state.last_turn,
            epoch: state.epoch,
            owner,
            agent,
            inject_mode: state.inject_mode,
            agent_version: state.agent_version,
            goal: state.goals.current.as_ref().map(crate::goal::Goal::current),
            last_time_ms: state.last_time_ms,
            parent: state.parent.clone(),
            labels: state.labels.clone(),
        }
    }
}

/// The output so far of the model step a session's owner is streaming (SPEC §14): what a `Watch` that joins
/// mid-step sends before the live rest. Offsets of later deltas continue from these texts' byte lengths.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamingStep {
    pub turn: u64,
    pub step: u32,
    /// The seq of the durable event the latest delta followed: the output belongs after it in a stream.
    pub after_seq: u64,
    /// The reply text so far (UTF-8; its byte length is the next text delta's offset).
    pub text: String,
    /// The reasoning so far (its own offset space).
    pub reasoning: String,
}

/// The reply to a [`Command`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandReply {
    /// A delivery: the seq of its insert splice, and the turn it opened on an idle session.
    Sent { seq: u64, turn: Option<u64> },
    /// Cancel and edits: the seq of the last event written, or the session's last seq if none.
    Written { seq: u64 },
    /// `WhenIdle` resolved (boxed: a summary is many times the size of the other replies).
    Idle(Box<SessionSummary>),
    /// [`Command::StreamingStep`]: the step streaming now, if any.
    Streaming(Option<Box<StreamingStep>>),
    /// [`Command::CreateSchedule`] and [`Command::DeleteSchedule`]: the schedule after (before, for a
    /// delete) the command, and the seq of the session's last event.
    Schedule { seq: u64, schedule: Box<Schedule> },
    /// [`Command::SetGoal`] and [`Command::UpdateGoal`]: the goal as the command left it, and the seq of
    /// the session's last event then. The reply is built by the single writer, so it never shows a later
    /// round or state that the session reached before a reader could fold the log.
    Goal { seq: u64, goal: Box<crate::goal::GoalChange> },
}

/// Why a command failed. Each maps to one gRPC code; messages say what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Retryable: the owner or the journal could not be reached; nothing was applied, or the outcome is
    /// unknown and a retry with the same MessageId is safe.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    /// This node does not own the session; `owner` is its view of who does.
    #[error("this worker does not own session {session}; owner: {owner:?}")]
    NotOwner { session: String, owner: Option<String> },
    #[error("internal error: {0}")]
    Internal(String),
}

impl CommandError {
    /// The answer to a command or read that needs an existing session, on one with no events: the same
    /// words wherever it is decided (host, driver, gateway reads), so a caller sees one rule.
    pub fn session_not_found(session: impl fmt::Display) -> Self {
        Self::NotFound(format!("session {session} does not exist: it has no accepted writes yet"))
    }

    /// The answer to every command and read of a session whose log cannot be folded (`why`, naming the
    /// seq): it is quarantined until it is deleted (decision 0084). The same words wherever it is found.
    pub fn quarantined(session: impl fmt::Display, why: impl fmt::Display) -> Self {
        Self::FailedPrecondition(format!(
            "session {session} is quarantined: its log cannot be folded ({why}); read its events with \
             ExportSessions and remove it with DeleteSession (docs/OPERATIONS.md, Quarantined sessions)"
        ))
    }

    /// The kind of this error as a stable name (`invalid-argument`, `not-owner`, …): what the internal API
    /// carries beside the gRPC code, and what logs and tests compare.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "invalid-argument",
            Self::NotFound(_) => "not-found",
            Self::AlreadyExists(_) => "already-exists",
            Self::FailedPrecondition(_) => "failed-precondition",
            Self::ResourceExhausted(_) => "resource-exhausted",
            Self::Unavailable(_) => "unavailable",
            Self::DeadlineExceeded(_) => "deadline-exceeded",
            Self::NotOwner { .. } => "not-owner",
            Self::Internal(_) => "internal",
        }
    }

    /// The standard gRPC status code of this error (the numbers of `google.rpc.Code`), so the public
    /// gateway and the internal worker API map every kind the same way. Not-owner is UNAVAILABLE:
    /// retryable, and safe to retry with the same MessageId.
    pub fn grpc_code(&self) -> i32 {
        match self {
            Self::InvalidArgument(_) => 3,
            Self::DeadlineExceeded(_) => 4,
            Self::NotFound(_) => 5,
            Self::AlreadyExists(_) => 6,
            Self::ResourceExhausted(_) => 8,
            Self::FailedPrecondition(_) => 9,
            Self::Internal(_) => 13,
            Self::Unavailable(_) | Self::NotOwner { .. } => 14,
        }
    }
}
