//! What a turn is made of, below the events that record it: how a turn ends ([`TurnEndReason`], with the
//! [`CancelCause`] of an abort) and the tool calls its steps make ([`ToolCallSpec`]). The events, the
//! transcript and the goal fold all use these, so they live apart from [`crate::event`] and none of
//! those modules imports another.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a turn is cancelled. The first cause wins.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CancelCause {
    User,
    Parent,
    Hook {
        reason: String,
    },
    Disposed,
    /// A steer's deadline passed while it was pending, with `on_deadline = interrupt` (SPEC §11).
    SteerDeadline,
}

impl fmt::Display for CancelCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::User => f.write_str("user"),
            Self::Parent => f.write_str("parent"),
            Self::Hook { reason } => write!(f, "hook({reason})"),
            Self::Disposed => f.write_str("disposed"),
            Self::SteerDeadline => f.write_str("steer-deadline"),
        }
    }
}

/// How a turn ended (SPEC §4 step 3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TurnEndReason {
    Completed,
    /// A pre-step decision rejected the batch; the reason names the hook and says why, when it did.
    Blocked {
        reason: Option<String>,
    },
    MaxTokens,
    Aborted(CancelCause),
    Error {
        message: String,
        code: String,
    },
    Interrupted,
}

impl fmt::Display for TurnEndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completed => f.write_str("completed"),
            Self::Blocked { reason: None } => f.write_str("blocked"),
            Self::Blocked { reason: Some(reason) } => write!(f, "blocked{{{reason}}}"),
            Self::MaxTokens => f.write_str("max-tokens"),
            Self::Aborted(cause) => write!(f, "aborted{{{cause}}}"),
            Self::Error { message, code } => write!(f, "error{{{code}: {message}}}"),
            Self::Interrupted => f.write_str("interrupted"),
        }
    }
}

/// A tool call as the model produced it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolCallSpec {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}
