//! What the JetStream server's refusals mean to a caller: which are conflicts, which are a full store and
//! which pass by themselves, each worded with what to do about it (decision 0078).

use async_nats::jetstream;
use turnstile_model::message::SessionRef;

use crate::log::JournalError;

pub(super) fn conflict(session: &SessionRef, expected: u64, actual: u64) -> JournalError {
    JournalError::Conflict { session: session.clone(), expected, actual }
}

/// Whether the server refused a publish for lack of room, by the JetStream error code it answered with:
/// its storage limit (`max_file_store`: insufficient resources, 10023), an account's (10002) or a memory
/// limit (10028), storage resources exceeded (10047), or a store failure (10077) whose description says the
/// stream's `max_bytes` (with discard new) or the disk is full. Nothing was written.
pub(super) fn out_of_space(e: &jetstream::context::PublishError) -> bool {
    use jetstream::ErrorCode;
    let Some(error) = std::error::Error::source(e).and_then(|s| s.downcast_ref::<jetstream::Error>()) else {
        return false;
    };
    match error.error_code() {
        ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::ACCOUNT_RESOURCES_EXCEEDED
        | ErrorCode::MEMORY_RESOURCES_EXCEEDED
        | ErrorCode::STORAGE_RESOURCES_EXCEEDED => true,
        // The server words why the store failed only in the description.
        ErrorCode::STREAM_STORE_FAILED => {
            let why = error.to_string().to_ascii_lowercase();
            why.contains("maximum bytes") || why.contains("no space left")
        }
        _ => false,
    }
}

/// Whether the server's answer says its disk is full (the filesystem refused a write, ENOSPC). Unlike its
/// storage limit (10023), which it checks before writing, this is a write that failed: nats-server 2.15
/// words it only in the description (e.g. a purge answered 10051 "write …: no space left on device").
pub(super) fn disk_full(api: &jetstream::Error) -> bool {
    api.to_string().to_ascii_lowercase().contains("no space left on device")
}

/// What a reader is told when its consumer could not be made (decision 0078). The server's consumer limit
/// (10026) gets a message of its own: readers end by deleting their consumer ([`Release`]), and one the
/// delete missed expires 30 s after its last use, so the refusal passes by itself; it is not a full disk
/// (ordered consumers are kept in memory, so a full store does not refuse them).
pub(super) fn reader_refused(session: &SessionRef, e: jetstream::stream::ConsumerError) -> JournalError {
    // async-nats keeps the server's answer in the error's kind, not as its source.
    if matches!(e.kind(), jetstream::stream::ConsumerErrorKind::JetStream(api)
        if api.error_code() == jetstream::ErrorCode::MAXIMUM_CONSUMERS_LIMIT)
    {
        return JournalError::Unavailable(format!(
            "opening a reader on {session}: the NATS server refuses new readers because its consumer limit is \
             reached ({e}); readers give theirs back when they end and leftovers expire within 30 s, so retry \
             shortly; if it lasts, fewer concurrent reads or Watch streams, or a higher consumer limit on the \
             stream, are needed"
        ));
    }
    unavailable(format!("opening a reader on {session}"), e)
}

/// Every failure to reach the store or get an answer in time is retryable: FIELD-NOTES, leader loss shows
/// up as "stream not found" (no responders) for a few seconds.
pub(super) fn unavailable(what: String, e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("{what}: {e}"))
}

/// What a delete is told when the purge failed; a full disk gets a message of its own (decision 0078).
pub(super) fn purge_refused(session: &SessionRef, e: async_nats::jetstream::stream::PurgeError) -> JournalError {
    use async_nats::jetstream::stream::PurgeErrorKind;
    // async-nats keeps the server's answer in the error's kind, not as its source.
    if matches!(e.kind(), PurgeErrorKind::JetStream(api) if disk_full(&api)) {
        // A delete frees room only once it is recorded, and the server could not write that record: room
        // must come from outside JetStream (decision 0078). Unavailable, not OutOfSpace, whose advice is to
        // delete sessions.
        JournalError::Unavailable(format!(
            "deleting {session}: the NATS server's disk is full and it cannot record the delete ({e}); free disk \
             space on that server (deleting sessions cannot), keep its max_file_store below the disk's free \
             space, then delete again; a stream that hit a full disk may refuse writes until its nats-server is \
             restarted"
        ))
    } else {
        unavailable(format!("deleting {session} (delete it again)"), e)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind, PurgeError, PurgeErrorKind};
    use turnstile_model::message::SessionRef;

    use super::{purge_refused, reader_refused};
    use crate::log::JournalError;

    /// An API error as the server answers it.
    fn api(code: usize, err_code: u64, description: &str) -> async_nats::jetstream::Error {
        let json = serde_json::json!({"code": code, "err_code": err_code, "description": description});
        serde_json::from_value(json).unwrap()
    }

    fn session() -> SessionRef {
        SessionRef::new("t", "s").unwrap()
    }

    #[test]
    fn a_purge_refused_by_a_full_disk_says_so() {
        let full = api(500, 10051, "write /data/jetstream/$G/streams/S/msgs/1.blk: no space left on device");
        let JournalError::Unavailable(m) = purge_refused(&session(), PurgeError::new(PurgeErrorKind::JetStream(full)))
        else {
            panic!("a full disk is retryable")
        };
        assert!(m.contains("the NATS server's disk is full"), "{m}");
        assert!(m.contains("deleting sessions cannot"), "{m}");
        // Any other refusal keeps the generic message.
        let other = api(503, 10008, "JetStream system temporarily unavailable");
        let JournalError::Unavailable(m) = purge_refused(&session(), PurgeError::new(PurgeErrorKind::JetStream(other)))
        else {
            panic!("retryable")
        };
        assert!(m.contains("delete it again") && !m.contains("disk is full"), "{m}");
    }

    #[test]
    fn a_reader_refused_for_the_consumer_limit_says_so() {
        let limit = api(400, 10026, "maximum consumers limit reached");
        let JournalError::Unavailable(m) =
            reader_refused(&session(), ConsumerError::new(ConsumerErrorKind::JetStream(limit)))
        else {
            panic!("retryable")
        };
        assert!(m.contains("consumer limit is reached"), "{m}");
        assert!(m.contains("retry shortly"), "{m}");
        let JournalError::Unavailable(m) = reader_refused(&session(), ConsumerError::new(ConsumerErrorKind::TimedOut))
        else {
            panic!("retryable")
        };
        assert!(!m.contains("consumer limit"), "{m}");
    }
}
