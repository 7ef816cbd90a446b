//! `DeleteSession` on JetStream (SPEC §12): the session's subject is purged from its partition's stream.
//!
//! A purge filtered on one subject removes that session's messages and nothing else; the stream's other
//! sessions keep their sequences. Afterwards the subject has no last message, so the next append expects
//! stream sequence 0 and starts a new log under the same name. Readers that recorded a position in the old
//! log (read snapshots) find another event there, or none, and fold from the start (`read_after`). The
//! session's archive subject is purged with it.

use super::log::JetStreamLog;
use super::refusals::purge_refused;
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
