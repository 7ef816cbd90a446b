//! `DeleteSession` on JetStream (SPEC §12): the session's subject is purged from its partition's stream.
//!
//! A purge filtered on one subject removes that session's messages and nothing else; the stream's other
//! sessions keep their sequences. Afterwards the subject has no last message, so the next append expects
//! stream sequence 0 and starts a new log under the same name. Readers that recorded a position in the old
//! log (read snapshots) find another event there, or none, and fold from the start (`read_after`).

use super::log::{JetStreamLog, disk_full, unavailable};
use crate::log::JournalError;
use turnstile_model::message::SessionRef;

/// Purges `session`'s subject and returns the seq its log had (0 when it had no events).
pub(super) async fn purge_session(log: &JetStreamLog, session: &SessionRef) -> Result<u64, JournalError> {
    let last = log.fetch_last(session).await?.map_or(0, |l| l.seq);
    if last == 0 {
        return Ok(0);
    }
    let (stream, subject) = log.locate(session);
    let purged = stream.purge().filter(subject).await;
    // Whatever the outcome, this process no longer knows where the log ends.
    log.forget(session);
    let purged = purged.map_err(|e| {
        if disk_full(&e) {
            // A delete frees room only once it is recorded, and the server could not write that record:
            // room must come from outside JetStream (decision 0078). Unavailable, not OutOfSpace, whose
            // advice is to delete sessions.
            JournalError::Unavailable(format!(
                "deleting {session}: the NATS server's disk is full and it cannot record the delete ({e}); free \
                 disk space on that server (deleting sessions cannot), keep its max_file_store below the disk's \
                 free space, then delete again; a stream that hit a full disk may refuse writes until its \
                 nats-server is restarted"
            ))
        } else {
            unavailable(format!("deleting {session} (delete it again)"), e)
        }
    })?;
    tracing::info!(%session, last_seq = last, messages = purged.purged, "session log purged");
    Ok(last)
}
