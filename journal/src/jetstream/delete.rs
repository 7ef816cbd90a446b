//! `DeleteSession` on JetStream (SPEC §12): the session's subject is purged from its partition's stream.
//!
//! A purge filtered on one subject removes that session's messages and nothing else; the stream's other
//! sessions keep their sequences. Afterwards the subject has no last message, so the next append expects
//! stream sequence 0 and starts a new log under the same name. Readers that recorded a position in the old
//! log (read snapshots) find another event there, or none, and fold from the start (`read_after`). The
//! session's archive subject is purged with it.

use super::log::{JetStreamLog, disk_full, unavailable};
use crate::log::JournalError;
use turnstile_model::message::SessionRef;

/// Purges `session`'s subject and returns the seq its log had (0 when it had no events). Its archive
/// (decision 0181) goes first, whether the log has events or not (a build without archives may have
/// deleted the log and left it): a delete cut short after it leaves a log without an archive, which
/// reads as before.
pub(super) async fn purge_session(log: &JetStreamLog, session: &SessionRef) -> Result<u64, JournalError> {
    super::archive::purge(log, session).await?;
    let last = log.fetch_last(session).await?.map_or(0, |l| l.seq);
    if last == 0 {
        return Ok(0);
    }
    let (stream, subject) = log.locate(session);
    let purged = stream.purge().filter(subject).await;
    // Whatever the outcome, this process no longer knows where the log ends.
    log.forget(session);
    let purged = purged.map_err(|e| purge_refused(session, e))?;
    tracing::info!(%session, last_seq = last, messages = purged.purged, "session log purged");
    Ok(last)
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

    use super::purge_refused;
    use crate::jetstream::log::reader_refused;
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
