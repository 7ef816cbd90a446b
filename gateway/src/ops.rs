//! The gateway's metrics: one count per routed command.

use metrics::{counter, gauge};
use turnstile_model::{CommandError, CommandReply};
use turnstile_ops::names;

/// Counts a command the gateway routed, by preset (`Command::name()`) and outcome (`accepted` or the
/// error kind). `when_idle` is a wait, not a delivery, and is not counted.
pub(crate) fn delivered(preset: &'static str, reply: &Result<CommandReply, CommandError>) {
    if preset == "when_idle" {
        return;
    }
    counter!(names::DELIVERIES, "preset" => preset, "outcome" => outcome(reply)).increment(1);
}

fn outcome(reply: &Result<CommandReply, CommandError>) -> &'static str {
    match reply {
        Ok(_) => "accepted",
        Err(CommandError::InvalidArgument(_)) => "invalid_argument",
        Err(CommandError::NotFound(_)) => "not_found",
        Err(CommandError::AlreadyExists(_)) => "already_exists",
        Err(CommandError::FailedPrecondition(_)) => "failed_precondition",
        Err(CommandError::ResourceExhausted(_)) => "resource_exhausted",
        Err(CommandError::Unavailable(_)) => "unavailable",
        Err(CommandError::DeadlineExceeded(_)) => "deadline_exceeded",
        Err(CommandError::NotOwner { .. }) => "not_owner",
        Err(CommandError::Internal(_)) => "internal",
    }
}

/// A client tool executor registered (+1) or left (-1).
pub(crate) fn executors_changed(by: i8) {
    gauge!(names::TOOL_EXECUTORS).increment(f64::from(by));
}

/// An executor sent a result for a call nobody waits for.
pub(crate) fn result_rejected() {
    counter!(names::TOOL_RESULTS_REJECTED).increment(1);
}
