//! `tail`: an ordered consumer on the session's subject, checked for gaps and duplicates; far behind the
//! log's end, the session's archive first (decision 0181), then the log where the archive ends.

use std::collections::VecDeque;

use async_nats::jetstream;
use futures::StreamExt as _;
use futures::stream::BoxStream;

use super::archive::{self, Chunk};
use super::log::{JetStreamLog, LastEvent, Release, decode, decode_as_sent, ordered_reader};
use crate::log::{EventStream, JournalError, SentEventStream};
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;
use turnstile_proto::v1 as pb;

struct Cursor<T> {
    messages: async_nats::jetstream::consumer::pull::Ordered,
    /// Deletes the consumer on the server when the tail is dropped.
    _release: Release,
    session: SessionRef,
    /// The seq of the last event delivered (or `after_seq`).
    last: u64,
    /// Events of the last message read that are not delivered yet (a message holds an append group).
    ready: VecDeque<T>,
    done: bool,
    decode: Decode<T>,
    /// Set while `messages` reads the archive rather than the log.
    archive: Option<FromArchive>,
}

impl<T> Cursor<T> {
    /// A cursor that has delivered nothing after `after_seq` yet, over a reader of the log or, with
    /// `archive`, of the archive first.
    fn new(
        session: &SessionRef,
        after_seq: u64,
        (messages, release): (async_nats::jetstream::consumer::pull::Ordered, Release),
        decode: Decode<T>,
        archive: Option<FromArchive>,
    ) -> Self {
        Self {
            messages,
            _release: release,
            session: session.clone(),
            last: after_seq,
            ready: VecDeque::new(),
            done: false,
            decode,
            archive,
        }
    }
}

/// A tail reading the session's archive before its log.
struct FromArchive {
    /// The last seq of the archive's last chunk when the read began: the log is read after it.
    end: u64,
    /// The stream sequence the log is read from when the archive is left: just past the log message
    /// holding the last archived event passed on (or skipped), else where the log holds `after_seq + 1`.
    resume: u64,
    /// The log's stream and the session's subject in it.
    log: async_nats::jetstream::stream::Stream,
    subject: String,
    /// How long an archive message may take (`request_timeout`): an archive purged under the reader
    /// sends it to the log instead of leaving it waiting.
    wait: std::time::Duration,
    /// The archive is done with (its end reached, or a chunk that cannot be used): the log comes next.
    left: bool,
}

/// How a message becomes events of the form the tail yields, and each one's seq.
struct Decode<T> {
    message: fn(&SessionRef, &jetstream::Message) -> Result<Vec<T>, JournalError>,
    seq: fn(&T) -> u64,
}

/// Every event with seq > `after_seq`, then each new one. The consumer starts at the stream sequence of
/// the message holding event `after_seq + 1` (or just past the log's end, which every later append is
/// after), so nothing is missed between the catch-up and the follow. The ordered consumer recreates itself
/// after a hiccup and may then redeliver: events at or below the last delivered seq are dropped; a jump is
/// an error item, and the stream ends after any error (re-tail from the last seq seen).
pub(super) async fn follow(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
) -> Result<EventStream, JournalError> {
    let decode = Decode { message: decode, seq: |e: &Envelope| e.seq };
    Ok(stream(open(log, session, after_seq, decode).await?))
}

/// [`follow`] in the form readers send events on, without decoding them into domain values
/// (`codec::stored_as_sent`).
pub(super) async fn follow_as_sent(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
) -> Result<SentEventStream, JournalError> {
    let decode = Decode { message: decode_as_sent, seq: |e: &pb::SessionEvent| e.seq };
    Ok(stream(open(log, session, after_seq, decode).await?))
}

async fn open<T>(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
    decode: Decode<T>,
) -> Result<Cursor<T>, JournalError> {
    // Asked once: whether the archive is worth reading, and where the log read starts.
    let last = log.fetch_last(session).await?;
    if let Some(end) = archive::plan(log, session, after_seq, last).await {
        match open_archive(log, session, after_seq, end, last).await {
            Ok((messages, release, archive)) => {
                return Ok(Cursor::new(session, after_seq, (messages, release), decode, Some(archive)));
            }
            Err(e) => tracing::debug!(%session, error = %e, "archive not read; reading the log"),
        }
    }
    let start = log.start_of(session, after_seq.saturating_add(1), last).await?;
    let (messages, release) = log.consumer(session, start).await?;
    Ok(Cursor::new(session, after_seq, (messages, release), decode, None))
}

/// A reader of the session's archive from its first chunk, and where the log resumes if the archive is
/// left before its end.
async fn open_archive(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
    end: Chunk,
    last: Option<LastEvent>,
) -> Result<(async_nats::jetstream::consumer::pull::Ordered, Release, FromArchive), JournalError> {
    let resume = log.start_of(session, after_seq.saturating_add(1), last).await?;
    let (archive_stream, archive_subject) = log.locate_archive(session);
    let (messages, release) = ordered_reader(archive_stream, archive_subject, session, 1).await?;
    let (stream, subject) = log.locate(session);
    let wait = log.config().request_timeout;
    let archive = FromArchive { end: end.last, resume, log: stream.clone(), subject, wait, left: false };
    Ok((messages, release, archive))
}

/// The events of one archive message, or `None` when the archive must be left for the log: the message
/// is not a chunk this build reads, does not follow the events passed on, or does not decode. Records how
/// far the archive has been passed, and leaves it once its end is reached.
fn read_chunk<T>(cursor: &mut Cursor<T>, message: &async_nats::jetstream::Message) -> Option<Vec<T>> {
    let archive = cursor.archive.as_mut()?;
    let pending = message.info().map_or(0, |i| i.pending);
    let Some(chunk) = Chunk::of(message.message.headers.as_ref()) else {
        archive.left = true;
        return None;
    };
    if chunk.first > cursor.last + 1 {
        archive.left = true;
        return None;
    }
    let events = if chunk.last <= cursor.last {
        Vec::new()
    } else {
        match (cursor.decode.message)(&cursor.session, message) {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!(session = %cursor.session, error = %e, "archive chunk not read; reading the log");
                archive.left = true;
                return None;
            }
        }
    };
    archive.resume = archive.resume.max(chunk.log_last + 1);
    // Its end, or nothing more to read though the end was not reached (purged under the reader).
    archive.left = chunk.last >= archive.end || pending == 0;
    Some(events)
}

/// The next message of the cursor's consumer: from the archive while it is read (bounded by its
/// `wait`; a message that does not come leaves the archive), else from the log.
async fn next_message<T>(cursor: &mut Cursor<T>) -> Option<Result<async_nats::jetstream::Message, JournalError>> {
    loop {
        let Some(archive) = cursor.archive.as_mut() else {
            return match cursor.messages.next().await? {
                Ok(message) => Some(Ok(message)),
                Err(e) => Some(Err(JournalError::Unavailable(format!("the tail of {} broke: {e}", cursor.session)))),
            };
        };
        if archive.left {
            let (messages, release) =
                match ordered_reader(&archive.log, archive.subject.clone(), &cursor.session, archive.resume).await {
                    Ok(reader) => reader,
                    Err(e) => return Some(Err(e)),
                };
            (cursor.messages, cursor._release, cursor.archive) = (messages, release, None);
            continue;
        }
        match tokio::time::timeout(archive.wait, cursor.messages.next()).await {
            Ok(Some(Ok(message))) => return Some(Ok(message)),
            // The archive's reader failed or went quiet: the log serves from where it stands.
            Ok(Some(Err(_)) | None) | Err(_) => archive.left = true,
        }
    }
}

fn stream<T: Send + 'static>(cursor: Cursor<T>) -> BoxStream<'static, Result<T, JournalError>> {
    futures::stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        loop {
            let Some(event) = cursor.ready.pop_front() else {
                let next = match next_message(&mut cursor).await? {
                    Ok(message) if cursor.archive.is_some() => {
                        Ok(read_chunk(&mut cursor, &message).unwrap_or_default())
                    }
                    Ok(message) => (cursor.decode.message)(&cursor.session, &message),
                    Err(e) => Err(e),
                };
                match next {
                    Ok(events) => cursor.ready.extend(events),
                    Err(e) => {
                        cursor.done = true;
                        return Some((Err(e), cursor));
                    }
                }
                continue;
            };
            let seq = (cursor.decode.seq)(&event);
            if seq <= cursor.last {
                continue;
            }
            let result = if seq == cursor.last + 1 {
                cursor.last = seq;
                Ok(event)
            } else {
                Err(JournalError::Unavailable(format!(
                    "the tail of {} jumped from seq {} to {seq}; tail again from {}",
                    cursor.session, cursor.last, cursor.last
                )))
            };
            cursor.done = result.is_err();
            return Some((result, cursor));
        }
    })
    .boxed()
}

/// Every event after `after_seq` through `last` (the log's end, just fetched) when the archive is
/// worth reading first ([`archive::plan`]); `None` when it is not, and the caller reads the log.
pub(super) async fn read_through(
    log: &JetStreamLog,
    session: &SessionRef,
    after_seq: u64,
    last: LastEvent,
) -> Result<Option<Vec<Envelope>>, JournalError> {
    let last_seq = last.seq;
    let Some(end) = archive::plan(log, session, after_seq, Some(last)).await else { return Ok(None) };
    let (messages, release, archive) = match open_archive(log, session, after_seq, end, Some(last)).await {
        Ok(opened) => opened,
        Err(e) => {
            tracing::debug!(%session, error = %e, "archive not read; reading the log");
            return Ok(None);
        }
    };
    let decode = Decode { message: decode, seq: |e: &Envelope| e.seq };
    let mut events = stream(Cursor::new(session, after_seq, (messages, release), decode, Some(archive)));
    let mut out = Vec::with_capacity(usize::try_from(last_seq - after_seq).unwrap_or(0));
    let wait = log.config().request_timeout;
    while out.last().map_or(after_seq, |e: &Envelope| e.seq) < last_seq {
        // Bounded as `read_from` is: every event through `last_seq` is stored, so waiting means a message
        // the consumer reported is not coming.
        let next = tokio::time::timeout(wait, events.next()).await.map_err(|_| {
            JournalError::Unavailable(format!(
                "reading {session}: no event within {} ms; read it again",
                wait.as_millis()
            ))
        })?;
        match next {
            Some(event) => out.push(event?),
            None => break,
        }
    }
    Ok(Some(out))
}
