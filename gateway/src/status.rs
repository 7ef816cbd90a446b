//! The one place where domain errors become gRPC statuses, so every RPC maps them the same way.

use tonic::{Code, Status};
use turnstile_journal::{CommandError, JournalError, ProjectionError};

use crate::convert::ConvertError;

/// A driver's answer to a command, as a gRPC status. The message is kept: it already says what was
/// wrong and what to do.
pub fn from_command(err: CommandError) -> Status {
    let code = command_code(&err);
    let message = match &err {
        // The gateway cannot re-route in `turnstile dev`; the client's retry with the same MessageId is safe.
        CommandError::NotOwner { .. } => format!("{err}; retry the request (the same MessageId is safe)"),
        _ => err.to_string(),
    };
    Status::new(code, message)
}

/// The gRPC code of a [`CommandError`].
pub fn command_code(err: &CommandError) -> Code {
    Code::from_i32(err.grpc_code())
}

/// A journal failure during a read. Unreachable stores are retryable; anything else is a bug or
/// corruption an operator must look at.
pub fn from_journal(err: JournalError) -> Status {
    let code = match &err {
        JournalError::Unavailable(_) | JournalError::Conflict { .. } => Code::Unavailable,
        JournalError::InvalidBatch { .. } | JournalError::Corrupt { .. } | JournalError::Storage(_) => Code::Internal,
    };
    let message = match code {
        Code::Unavailable => format!("{err}; retry shortly"),
        _ => err.to_string(),
    };
    Status::new(code, message)
}

/// A log that cannot be folded: the message names the seq (from [`ProjectionError`]'s display).
pub fn from_projection(session: &turnstile_journal::SessionRef, err: ProjectionError) -> Status {
    Status::internal(format!("the log of session {session} cannot be projected: {err}"))
}

/// A request that breaks the API's rules.
pub fn from_convert(err: ConvertError) -> Status {
    Status::invalid_argument(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_errors_keep_their_message_and_get_their_code() {
        let cases = [
            (CommandError::InvalidArgument("bad".into()), Code::InvalidArgument),
            (CommandError::NotFound("no such id".into()), Code::NotFound),
            (CommandError::AlreadyExists("dup".into()), Code::AlreadyExists),
            (CommandError::FailedPrecondition("turn 3 is running".into()), Code::FailedPrecondition),
            (CommandError::ResourceExhausted("full".into()), Code::ResourceExhausted),
            (CommandError::Unavailable("down".into()), Code::Unavailable),
            (CommandError::DeadlineExceeded("slow".into()), Code::DeadlineExceeded),
            (CommandError::Internal("bug".into()), Code::Internal),
        ];
        for (err, code) in cases {
            let text = err.to_string();
            let status = from_command(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), text);
        }
    }

    #[test]
    fn not_owner_is_unavailable_and_says_retry() {
        let status = from_command(CommandError::NotOwner { session: "acme/s1".into(), owner: Some("w2".into()) });
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("acme/s1"), "{}", status.message());
        assert!(status.message().contains("retry"), "{}", status.message());
    }

    #[test]
    fn journal_errors_split_into_retryable_and_internal() {
        assert_eq!(from_journal(JournalError::Unavailable("nats down".into())).code(), Code::Unavailable);
        assert_eq!(from_journal(JournalError::Storage("disk full".into())).code(), Code::Internal);
        let corrupt = JournalError::Corrupt {
            session: turnstile_journal::SessionRef { tenant: "a".into(), id: "b".into() },
            seq: 7,
            detail: "crc".into(),
        };
        let status = from_journal(corrupt);
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("seq 7"), "{}", status.message());
    }
}
