//! Writing the archive: the owner seals whole log messages into chunks after a snapshot.

use async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::StreamExt as _;

use super::{CHUNK_EVENTS, Chunk, ChunkBuilder, End, verify};
use crate::jetstream::group;
use crate::jetstream::log::{JetStreamLog, ordered_reader};
use crate::jetstream::refusals::{purge_refused, unavailable};
use crate::log::JournalError;
use turnstile_model::message::SessionRef;

/// The most chunks one call writes: a call after a snapshot stays short (about 8,000 events read) even
/// on a long log archived for the first time; the next snapshots carry on.
const MAX_CHUNKS_PER_CALL: usize = 8;

/// Room left in a chunk's message for its headers (six short ones and the expected sequence).
const HEADER_ROOM: usize = 512;

/// Archives the session's log through at most `up_to` (a seq the caller's snapshot holds, so durable)
/// in chunks of about [`CHUNK_EVENTS`] events of whole log messages; returns the seq the archive
/// reaches. Nothing is written until a whole chunk is sealed, and a call that finds another archiving of
/// the session in this process returns at once.
pub(crate) async fn archive_up_to(log: &JetStreamLog, session: &SessionRef, up_to: u64) -> Result<u64, JournalError> {
    let archived = seal(log, session, up_to).await;
    if archived.is_err() {
        // What this process remembers of the archive may be what failed (another owner wrote on, or the
        // session was deleted and written again elsewhere): the next call asks the server.
        log.archived().forget(session);
    }
    archived
}

async fn seal(log: &JetStreamLog, session: &SessionRef, up_to: u64) -> Result<u64, JournalError> {
    let reached = |end: Option<End>| end.map_or(0, |e| e.chunk.last);
    // Most calls (a snapshot every 100 events) are far from a whole chunk: no request. So are all calls
    // on a session shorter than one chunk, whatever its archive holds.
    let known = log.archived().get(session);
    if up_to < CHUNK_EVENTS || known.is_some_and(|end| up_to < reached(end).saturating_add(CHUNK_EVENTS)) {
        return Ok(known.flatten().map_or(0, |e| e.chunk.last));
    }
    let Some(_busy) = log.archived().claim(session) else { return Ok(0) };
    let mut end = match log.archived().get(session) {
        Some(end) => end,
        None => match load_end(log, session).await? {
            Loaded::End(end) => end,
            // Another build's archive: left as it is (its readers use it, ours read the log).
            Loaded::Unknown => return Ok(0),
        },
    };
    log.archived().set(session, end);
    if up_to < reached(end).saturating_add(CHUNK_EVENTS) {
        return Ok(reached(end));
    }
    let (stream, subject) = log.locate(session);
    let start = end.map_or(1, |e| e.chunk.log_last + 1);
    let (mut messages, _release) = ordered_reader(stream, subject, session, start).await?;
    let budget = log.client().server_info().max_payload.saturating_sub(HEADER_ROOM);
    let wait = log.config().request_timeout;
    let mut builder = ChunkBuilder::after(reached(end));
    let mut written = 0;
    while written < MAX_CHUNKS_PER_CALL {
        // Bounded as `read_from` is: the consumer reported a message that is not coming.
        let next = tokio::time::timeout(wait, messages.next())
            .await
            .map_err(|_| unavailable(format!("archiving {session}"), "no log message in time"))?;
        let Some(message) = next else { break };
        let message = message.map_err(|e| unavailable(format!("archiving {session}"), e))?;
        let info = message.info().map_err(|e| unavailable(format!("archiving {session}"), e))?;
        let (stream_seq, pending) = (info.stream_sequence, info.pending);
        let (headers, body) = (message.message.headers.as_ref(), &message.message.payload);
        let (_, last) = group::header_range(session, headers, stream_seq)?;
        if last > up_to {
            break;
        }
        if !builder.is_empty() && builder.len() + ChunkBuilder::cost(headers, body) > budget {
            let sealed = std::mem::replace(&mut builder, ChunkBuilder::after(0));
            end = Some(publish(log, session, end, sealed).await?);
            builder = ChunkBuilder::after(reached(end));
            written += 1;
            if written == MAX_CHUNKS_PER_CALL {
                break;
            }
        }
        builder.push(session, headers, body, stream_seq)?;
        if builder.events() >= CHUNK_EVENTS {
            let sealed = std::mem::replace(&mut builder, ChunkBuilder::after(0));
            end = Some(publish(log, session, end, sealed).await?);
            builder = ChunkBuilder::after(reached(end));
            written += 1;
        }
        if pending == 0 {
            break;
        }
    }
    // A partly filled chunk is not written: it is sealed once whole.
    Ok(reached(end))
}

/// Publishes a sealed chunk after the archive's last message (none: `end` is `None`) and records the new end.
async fn publish(
    log: &JetStreamLog,
    session: &SessionRef,
    end: Option<End>,
    builder: ChunkBuilder,
) -> Result<End, JournalError> {
    let Some((chunk, body)) = builder.finish() else {
        // Callers publish only a builder they pushed to.
        return Err(JournalError::InvalidBatch { session: session.clone(), detail: "an empty archive chunk".into() });
    };
    let (_, subject) = log.locate_archive(session);
    let mut headers = chunk.headers();
    headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, end.map_or(0, |e| e.stream_seq).to_string().as_str());
    let ack = log.js().publish_with_headers(subject, headers, body.into()).await;
    let ack = match ack {
        Ok(ack) => ack.await,
        Err(e) => Err(e),
    };
    match ack {
        Ok(ack) => {
            let end = End { chunk, stream_seq: ack.sequence };
            log.archived().set(session, Some(end));
            tracing::debug!(%session, first = chunk.first, last = chunk.last, "archive chunk written");
            Ok(end)
        }
        Err(e) => {
            // Another writer's chunk, or an outcome unknown: ask the server next time.
            log.archived().forget(session);
            Err(unavailable(format!("archiving {session}"), e))
        }
    }
}

/// What the archive's last message says on a cold start.
enum Loaded {
    /// The archive's verified end, `None` when it has none (or had one that no longer meets the log: it
    /// was purged).
    End(Option<End>),
    /// A chunk of a format this build does not write.
    Unknown,
}

async fn load_end(log: &JetStreamLog, session: &SessionRef) -> Result<Loaded, JournalError> {
    let (archive, subject) = log.locate_archive(session);
    let message = match archive.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(Loaded::End(None)),
        Err(e) => return Err(unavailable(format!("reading the archive of {session}"), e)),
    };
    let Some(chunk) = Chunk::of(Some(&message.headers)) else { return Ok(Loaded::Unknown) };
    if verify(log, session, &chunk).await? {
        return Ok(Loaded::End(Some(End { chunk, stream_seq: message.sequence })));
    }
    // The log it was made of is gone (deleted, perhaps by a build that knew no archive): start over.
    tracing::info!(%session, archived_to = chunk.last, "the archive no longer meets the log; purging it");
    purge(log, session).await?;
    Ok(Loaded::End(None))
}

/// Purges the session's archive subject (a delete, or an archive that no longer meets the log).
pub(crate) async fn purge(log: &JetStreamLog, session: &SessionRef) -> Result<(), JournalError> {
    let (archive, subject) = log.locate_archive(session);
    let purged = archive.purge().filter(subject).await;
    log.archived().forget(session);
    purged.map_err(|e| purge_refused(session, e))?;
    Ok(())
}
