//! The one place where domain errors become gRPC statuses, so every RPC maps them the same way.

use tonic::{Code, Status};
use turnstile_journal::JournalError;
use turnstile_model::{CommandError, ProjectionError};

use turnstile_proto::codec::CodecError;

/// A driver's answer to a command, as a gRPC status (the one mapping, `turnstile_cluster::status`).
pub fn from_command(err: CommandError) -> Status {
    turnstile_cluster::status::command_status(&err)
}

/// A journal failure during a read. Unreachable stores are retryable; anything else is a bug or
/// corruption an operator must look at.
pub fn from_journal(err: JournalError) -> Status {
    let code = match &err {
        JournalError::Unavailable(_)
        | JournalError::OutOfSpace(_)
        | JournalError::Conflict { .. }
        | JournalError::FirstRefused { .. }
        | JournalError::Fenced { .. } => Code::Unavailable,
        JournalError::InvalidBatch { .. } | JournalError::Corrupt { .. } | JournalError::Storage(_) => Code::Internal,
    };
    let message = match code {
        Code::Unavailable => format!("{err}; retry shortly"),
        _ => err.to_string(),
    };
    Status::new(code, message)
}

/// A log that cannot be folded: the session is quarantined, as its owner answers commands (decision 0084);
/// the message names the seq (from [`ProjectionError`]'s display).
pub fn from_projection(session: &turnstile_model::SessionRef, err: ProjectionError) -> Status {
    from_command(CommandError::quarantined(session, err))
}

/// A request that breaks the API's rules.
pub fn from_convert(err: CodecError) -> Status {
    Status::invalid_argument(err.to_string())
}

/// A count or duration field where 0 (unset) means `default`: its value, or INVALID_ARGUMENT naming `field`,
/// the value and the limit when it is over `max`. The one rule of every such field of the API.
pub(crate) fn bounded<T: Copy + PartialOrd + std::fmt::Display + Default>(
    field: &str,
    raw: T,
    default: T,
    max: T,
) -> Result<T, Status> {
    if raw == T::default() {
        Ok(default)
    } else if raw > max {
        Err(Status::invalid_argument(format!("{field}: {raw} is over the limit of {max}; ask for at most {max}")))
    } else {
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_errors_split_into_retryable_and_internal() {
        assert_eq!(from_journal(JournalError::Unavailable("nats down".into())).code(), Code::Unavailable);
        assert_eq!(from_journal(JournalError::Storage("disk full".into())).code(), Code::Internal);
        let corrupt = JournalError::Corrupt {
            session: turnstile_model::SessionRef { tenant: "a".into(), id: "b".into() },
            seq: 7,
            detail: "crc".into(),
        };
        let status = from_journal(corrupt);
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("seq 7"), "{}", status.message());
    }
}
