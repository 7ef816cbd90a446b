//! The values of Turnstile and the fold of a session's log: what a session *is*, independent of who
//! drives it, where it is stored and how it travels.
//!
//! Place in the architecture: the bottom of the one-way flow. The driver (`turnstile-driver`) writes
//! these events, the journal (`turnstile-journal`) stores and encodes them, the gateway folds them for
//! reads. This crate has no IO and no async runtime, so nothing built on it can reach a clock or a socket
//! through it.
//!
//! - [`message`]: SPEC §1 values (sessions, MessageIds, user messages, sources, targets).
//! - [`event`]: the durable and live events of §5 and their envelope.
//! - [`goal`]: the typed `goal/change` event and the goal fold (§10).
//! - [`turn`]: how a turn ends and the tool calls its steps make (used by events, transcript and goals).
//! - [`inbox`]: the two pending lists and the normalized splice of §3.
//! - [`state`]: [`SessionState`], the fold of a log into inbox, status and recovery facts (§3, §6).
//! - [`transcript_items`]: the conversation as items with their seqs, as `GetTranscript` answers it (§21).
//! - [`transcript`]: the bounded conversation history a model request is built from (§8).
//! - [`command`]: client commands, their replies and typed errors (the gateway → driver seam).
//! - [`output`]: the JSON Schema a turn's final reply must match, per agent or per turn (§20).
//! - [`overrides`]: what a session overrides of its agent, within what the agent allows (§20).
//! - [`child`]: the names a `spawn_agent` call gives its child session (§13).
//! - [`schedule`]: scheduled deliveries and their fold (§15).
//! - [`labels`]: session labels and label selectors (§16).
//! - [`tenant`]: valid tenant names and the sets of tenants an agent or webhook serves.
//! - [`shard`]: the stable session → virtual shard hash.
//! - [`secret`]: [`Secret`], a credential never printed (API keys, signing keys, push tokens).
//! - [`sync`]: poison-tolerant locking, shared by every crate that keeps maps under a mutex.
//! - [`size`]: what a delivery counts toward the size limits (§2).
//!
//! ```
//! use turnstile_model::{ContentBlock, MessageSource, SessionRef, SessionState, UserMessage};
//! let session = SessionRef::new("acme", "s1").unwrap();
//! let state = SessionState::new(session, 10_000);
//! assert_eq!(state.last_seq, 0);
//! let m = UserMessage { id: "m1".into(), content: vec![ContentBlock::text("hi")].into(), source: MessageSource::User };
//! assert_eq!(m.text(), "hi");
//! ```

pub mod child;
pub mod command;
pub mod dedup;
pub mod event;
pub mod goal;
pub mod inbox;
pub mod labels;
pub mod memory;
pub mod message;
pub mod output;
pub mod overrides;
pub mod rules;
pub mod schedule;
pub mod secret;
pub mod shard;
pub mod size;
pub mod state;
pub mod sync;
pub mod tenant;
pub mod time;
pub mod tool_key;
pub mod tool_names;
pub mod transcript;
pub mod transcript_items;
pub mod turn;
pub mod turn_tools;
pub mod usage;

pub use command::{
    Command, CommandError, CommandReply, DeadlineSpec, MAX_STEER_DEADLINE_MS, SessionSummary, Spawn, StreamingStep,
};
pub use event::{
    CancelCause, Compaction, Envelope, EventPayload, Fork, InjectMode, LiveEvent, LivePayload, ModelRef, OnDeadline,
    RepairAction, Spent, Splice, SpliceOutcome, Status, SteerDeadline, ToolCallSpec, TurnEndReason, Usage,
};
pub use goal::{Goal, GoalAction, GoalChange, GoalState};
pub use inbox::{Inbox, SpliceError};
pub use labels::{Labeled, Labels, Selector};
pub use message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};
pub use rules::ValueError;
pub use schedule::{Preset, Schedule, ScheduleChange, ScheduleSpec, Timing};
pub use secret::Secret;
pub use state::{ProjectionError, SessionState};
pub use tenant::{Tenant, TenantScope};
pub use transcript::{Transcript, TranscriptEntry};
pub use transcript_items::{ItemKind, TranscriptItem, TranscriptReader};
