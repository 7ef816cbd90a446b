//! What the host sends a session's runner — a command with the channel its reply goes back on
//! ([`CommandMsg`]), or a [`Control`] to hand the session over — and how a journal failure is answered
//! ([`journal_error`]).

use tokio::sync::oneshot;
use turnstile_journal::JournalError;
use turnstile_model::{Command, CommandError, CommandReply};

/// Tells a runner to hand its session over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// Finish the running step, claim nothing more, then unload.
    Drain,
    /// Unload now, abandoning whatever runs (the lease is gone or the drain timed out).
    Stop,
    /// Unload now for `DeleteSession`: write no last snapshot and wait for snapshot writes in flight, so
    /// nothing of the session is stored after the runner is gone and the host removes it.
    Dispose,
}

pub(crate) type ReplyTx = oneshot::Sender<Result<CommandReply, CommandError>>;

/// A command for the runner, with where to send its reply.
pub(crate) struct CommandMsg {
    pub command: Command,
    pub reply: ReplyTx,
    /// The caller's W3C trace context: the command's span, its turns and their events join that trace.
    pub traceparent: Option<String>,
}

/// What a caller is told when the journal failed its command: UNAVAILABLE (retry with the same message id)
/// while the store is away, full or owned by another writer; INTERNAL for what a retry cannot fix.
pub(crate) fn journal_error(e: JournalError) -> CommandError {
    match e {
        JournalError::OutOfSpace(_) => CommandError::Unavailable(format!(
            "{e}; the server stored none of it: free space on the NATS servers (delete sessions, raise \
             max_file_store or [journal] max_bytes) and retry with the same message id"
        )),
        JournalError::Unavailable(m) => {
            CommandError::Unavailable(format!("the journal is unavailable ({m}); retry with the same message id"))
        }
        JournalError::Conflict { .. } | JournalError::Fenced { .. } => {
            CommandError::Unavailable(format!("{e}; retry to reach the new owner"))
        }
        JournalError::FirstRefused { .. } => CommandError::Unavailable(format!("{e}; retry with the same message id")),
        other => CommandError::Internal(other.to_string()),
    }
}
