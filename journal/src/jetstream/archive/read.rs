//! Whether a reader may read the archive before the log: the archive's end, proved to meet the log.

use async_nats::jetstream::stream::{LastRawMessageErrorKind, RawMessageErrorKind};

use super::{CHUNK_EVENTS, Chunk};
use crate::jetstream::group;
use crate::jetstream::log::{JetStreamLog, LastEvent};
use crate::jetstream::refusals::unavailable;
use crate::log::JournalError;
use turnstile_model::message::SessionRef;

/// The last chunk of the session's archive when a read of every event after `after_seq` should read the
/// archive first, given the log's end (`last`, just fetched): the log holds at least [`CHUNK_EVENTS`] events after `after_seq`, the archive reaches
/// past `after_seq`, its end meets the log ([`verify`]) and the log still starts at or before
/// `after_seq + 1`. `None` in every other case, failures to ask included: the reader reads the log.
pub(crate) async fn plan(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
    last: Option<LastEvent>,
) -> Option<Chunk> {
    let last = last?;
    if last.seq < after_seq.saturating_add(CHUNK_EVENTS) {
        return None;
    }
    let (archive, subject) = log.locate_archive(session);
    let end = match archive.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => Chunk::of(Some(&message.headers))?,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return None,
        Err(e) => {
            tracing::debug!(%session, error = %e, "archive not read; reading the log");
            return None;
        }
    };
    if end.last <= after_seq || end.last > last.seq {
        return None;
    }
    match (verify(log, session, &end).await, starts_by(log, session, after_seq.saturating_add(1)).await) {
        (Ok(true), Ok(true)) => Some(end),
        (Ok(_), Ok(_)) => None,
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!(%session, error = %e, "archive not verified; reading the log");
            None
        }
    }
}

/// Whether `chunk` ends where the session's log has it: the log message at `chunk.log_last` is on the
/// session's subject and ends at `chunk.last`. A deleted log (its messages purged; stream sequences are
/// never reused) or one written again since fails this.
pub(crate) async fn verify(log: &JetStreamLog, session: &SessionRef, chunk: &Chunk) -> Result<bool, JournalError> {
    let (stream, subject) = log.locate(session);
    match stream.raw_message_builder().sequence(chunk.log_last).send().await {
        Ok(message) if message.subject.as_str() == subject => {
            let (_, last) = group::header_range(session, Some(&message.headers), message.sequence)?;
            Ok(last == chunk.last)
        }
        Ok(_) => Ok(false),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(false),
        Err(e) => Err(unavailable(format!("verifying the archive of {session}"), e)),
    }
}

/// Whether the session's first stored message holds a seq at or below `seq`: a log whose oldest messages
/// expired (`max_age`) is read from the log alone, as it would be without an archive.
async fn starts_by(log: &JetStreamLog, session: &SessionRef, seq: u64) -> Result<bool, JournalError> {
    let (stream, subject) = log.locate(session);
    match stream.raw_message_builder().next_by_subject(subject).sequence(1).send().await {
        Ok(message) => {
            let (first, _) = group::header_range(session, Some(&message.headers), message.sequence)?;
            Ok(first <= seq)
        }
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(false),
        Err(e) => Err(unavailable(format!("reading the first event of {session}"), e)),
    }
}
