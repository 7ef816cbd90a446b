//! The history archive (decision 0181): a session's sealed history rewritten as few large messages, so
//! that a read of a long history (a Watch from 0, a load without a snapshot) pays per ~1,000 events what
//! it paid per stored message.
//!
//! Layout: stream `TURNSTILE_ARCHIVE_<p>` (subjects `turnstile.archive.<p>.>`, the event stream's
//! replicas and retention), one subject per session, `turnstile.archive.<p>.<tenant>.<id>`, outside
//! `turnstile.ev.>`: observers of the events never see it. Each message is a **chunk**: the events
//! `Turnstile-Seq..=Turnstile-Last-Seq` of whole log messages, in order, as one `SessionEventGroup` whose
//! bytes are the log messages' bodies end to end (each event's stored bytes unchanged), with headers
//! `Turnstile-Format` (1, the group layout), `Turnstile-Archive-Format` ([`ARCHIVE_FORMAT`]) and
//! `Turnstile-Log-First` / `Turnstile-Log-Last`, the stream sequences in the event stream of the log
//! messages holding the chunk's first and last event. Chunks follow each other without gap from seq 1.
//!
//! The log stays the source of truth: the archive is derived, written only by the session's owner after a
//! snapshot (`write`), each chunk one conditional publish (`Nats-Expected-Last-Subject-Sequence`), so a
//! crash leaves a shorter archive, never a torn one. A reader (`read`) uses it only once it has proved
//! that it meets the log: the log message named by the last chunk's `Turnstile-Log-Last` is still the
//! session's and ends at the chunk's last seq (a purged or rewritten log fails this: stream sequences
//! are never reused), and the log's first message starts at or before the first seq wanted. A chunk that
//! does not decode, does not follow the one before, or an archive of an unknown format sends the reader
//! back to the log where it stands.

mod read;
mod write;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use async_nats::HeaderMap;

use super::group::{self, GROUP_FORMAT};
use super::{HEADER_FORMAT, HEADER_LAST_SEQ, HEADER_SEQ};
use crate::log::JournalError;
use crate::sync::lock;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;

pub(super) use read::{plan, verify};
pub(super) use write::{archive_up_to, purge};

/// The archive format this build writes and the only one it reads (`Turnstile-Archive-Format`). The
/// archive is derived from the log, so a reader that meets another format reads the log instead: a new
/// format needs no release that only reads it.
pub const ARCHIVE_FORMAT: u32 = 1;
/// The archive format of a chunk.
pub const HEADER_ARCHIVE_FORMAT: &str = "Turnstile-Archive-Format";
/// The stream sequence (in the session's event stream) of the log message holding the chunk's first event.
pub const HEADER_LOG_FIRST: &str = "Turnstile-Log-First";
/// The stream sequence of the log message holding the chunk's last event.
pub const HEADER_LOG_LAST: &str = "Turnstile-Log-Last";

/// Events per chunk: a chunk is written once this many events of whole log messages are sealed (or its
/// bytes would pass the server's `max_payload`), so a chunk holds at least one log message and about
/// this many events.
pub const CHUNK_EVENTS: u64 = 1000;

/// One archive message as its headers describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The first and last seq it holds.
    pub first: u64,
    pub last: u64,
    /// The stream sequences of the log messages holding `first` and `last`.
    pub log_first: u64,
    pub log_last: u64,
}

impl Chunk {
    /// The headers of the chunk's message.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_SEQ, self.first.to_string().as_str());
        headers.insert(HEADER_LAST_SEQ, self.last.to_string().as_str());
        headers.insert(HEADER_FORMAT, GROUP_FORMAT.to_string().as_str());
        headers.insert(HEADER_ARCHIVE_FORMAT, ARCHIVE_FORMAT.to_string().as_str());
        headers.insert(HEADER_LOG_FIRST, self.log_first.to_string().as_str());
        headers.insert(HEADER_LOG_LAST, self.log_last.to_string().as_str());
        headers
    }

    /// The chunk a message's headers describe, or `None` when they are not a chunk of [`ARCHIVE_FORMAT`]
    /// with consistent numbers (such a message is not read: the log is).
    pub fn of(headers: Option<&HeaderMap>) -> Option<Self> {
        let number = |name: &str| headers?.get(name)?.as_str().parse::<u64>().ok();
        if number(HEADER_ARCHIVE_FORMAT)? != u64::from(ARCHIVE_FORMAT) {
            return None;
        }
        let chunk = Self {
            first: number(HEADER_SEQ)?,
            last: number(HEADER_LAST_SEQ)?,
            log_first: number(HEADER_LOG_FIRST)?,
            log_last: number(HEADER_LOG_LAST)?,
        };
        (chunk.first >= 1 && chunk.first <= chunk.last && chunk.log_first >= 1 && chunk.log_first <= chunk.log_last)
            .then_some(chunk)
    }
}

/// The events of one archive message, checked as a log message is (one session, the seqs its headers
/// name, contiguous); an archive message of another format is [`JournalError::Corrupt`].
pub fn decode_chunk(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    body: &[u8],
) -> Result<Vec<Envelope>, JournalError> {
    if Chunk::of(headers).is_none() {
        return Err(JournalError::Corrupt {
            session: session.clone(),
            seq: 0,
            detail: format!("an archive message that is not a chunk of archive format {ARCHIVE_FORMAT}"),
        });
    }
    group::decode_message(session, headers, body, 0)
}

/// Builds one chunk from consecutive stored log messages.
#[derive(Debug)]
pub struct ChunkBuilder {
    body: Vec<u8>,
    chunk: Option<Chunk>,
    /// The seq the next message must start at.
    next: u64,
}

impl ChunkBuilder {
    /// An empty chunk whose first message must start at `after_seq + 1`.
    pub fn after(after_seq: u64) -> Self {
        Self { body: Vec::new(), chunk: None, next: after_seq.saturating_add(1) }
    }

    /// The events held so far.
    pub fn events(&self) -> u64 {
        self.chunk.map_or(0, |c| c.last - c.first + 1)
    }

    /// The body's bytes so far.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunk.is_none()
    }

    /// The bytes a stored message would add to the body.
    pub fn cost(headers: Option<&HeaderMap>, body: &[u8]) -> usize {
        if grouped(headers) { body.len() } else { group::encode_group([body]).len() }
    }

    /// Adds the stored log message at `stream_seq` (its headers and body): it must start at the seq after
    /// the chunk's last and be of a message format this build reads.
    pub fn push(
        &mut self,
        session: &SessionRef,
        headers: Option<&HeaderMap>,
        body: &[u8],
        stream_seq: u64,
    ) -> Result<(), JournalError> {
        let (first, last) = group::header_range(session, headers, stream_seq)?;
        let corrupt = |detail: String| JournalError::Corrupt { session: session.clone(), seq: first, detail };
        if first != self.next {
            return Err(corrupt(format!(
                "stream message {stream_seq} starts at seq {first} where the archive needs {}",
                self.next
            )));
        }
        if let Some(format) = headers.and_then(|h| h.get(HEADER_FORMAT)) {
            match format.as_str().parse::<u32>() {
                Ok(n) if n <= GROUP_FORMAT => {}
                _ => {
                    return Err(corrupt(format!(
                        "stream message {stream_seq} is in a message format this build does not archive"
                    )));
                }
            }
        }
        if grouped(headers) {
            self.body.extend_from_slice(body);
        } else {
            // A message of the single-event layout: its bare event framed as the group's field 1.
            self.body.extend(group::encode_group([body]));
        }
        self.chunk = Some(match self.chunk {
            Some(c) => Chunk { last, log_last: stream_seq, ..c },
            None => Chunk { first, last, log_first: stream_seq, log_last: stream_seq },
        });
        self.next = last.saturating_add(1);
        Ok(())
    }

    /// The chunk and its body, `None` when nothing was pushed.
    pub fn finish(self) -> Option<(Chunk, Vec<u8>)> {
        Some((self.chunk?, self.body))
    }
}

/// Whether a stored log message is of the group layout (its body a `SessionEventGroup`).
fn grouped(headers: Option<&HeaderMap>) -> bool {
    headers.is_some_and(|h| h.get(HEADER_LAST_SEQ).is_some())
}

/// Where a session's archive ends: its last chunk and that message's sequence in the archive stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct End {
    pub chunk: Chunk,
    pub stream_seq: u64,
}

/// Entries in the archive-end cache before it is emptied (as the log's last-seq cache).
const CACHE_LIMIT: usize = 100_000;

/// What this process knows of archives: where each session's ends (`None`: it has none), and which
/// sessions are being archived now (one archiving per session at a time).
#[derive(Debug, Default)]
pub(super) struct Ends {
    ends: Mutex<HashMap<SessionRef, Option<End>>>,
    busy: Mutex<HashSet<SessionRef>>,
}

impl Ends {
    pub(super) fn get(&self, session: &SessionRef) -> Option<Option<End>> {
        lock(&self.ends).get(session).copied()
    }

    pub(super) fn set(&self, session: &SessionRef, end: Option<End>) {
        let mut ends = lock(&self.ends);
        if ends.len() >= CACHE_LIMIT && !ends.contains_key(session) {
            ends.clear();
        }
        ends.insert(session.clone(), end);
    }

    pub(super) fn forget(&self, session: &SessionRef) {
        lock(&self.ends).remove(session);
    }

    /// Claims the session for one archiving; `None` while another holds it.
    fn claim<'a>(&'a self, session: &SessionRef) -> Option<Busy<'a>> {
        lock(&self.busy).insert(session.clone()).then(|| Busy { ends: self, session: session.clone() })
    }
}

/// Releases an archiving's claim when it ends, however it ends.
struct Busy<'a> {
    ends: &'a Ends,
    session: SessionRef,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.ends.busy).remove(&self.session);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jetstream::group::tests::{events, group_message};
    use prost::Message as _;
    use turnstile_proto::{codec, v1 as pb};

    #[test]
    fn a_chunk_of_both_layouts_holds_the_logs_event_bytes_in_order() {
        let events = events(5);
        let session = &events[0].session;
        let mut builder = ChunkBuilder::after(0);
        // Seqs 1..=2 as one group, 3 as a single-event message of the old layout, 4..=5 as a group.
        let (h, b) = group_message(&events[0..2]);
        builder.push(session, Some(&h), &b, 10).unwrap();
        let mut single = HeaderMap::new();
        single.insert(HEADER_SEQ, "3");
        builder.push(session, Some(&single), &codec::encode_event(&events[2]), 12).unwrap();
        let (h, b) = group_message(&events[3..5]);
        assert_eq!(ChunkBuilder::cost(Some(&h), &b), b.len());
        builder.push(session, Some(&h), &b, 20).unwrap();
        assert_eq!(builder.events(), 5);
        let (chunk, body) = builder.finish().unwrap();
        assert_eq!(chunk, Chunk { first: 1, last: 5, log_first: 10, log_last: 20 });
        let headers = chunk.headers();
        assert_eq!(Chunk::of(Some(&headers)), Some(chunk));
        assert_eq!(decode_chunk(session, Some(&headers), &body).unwrap(), events);
        // The body is the group prost writes for the events' stored bytes.
        let want = pb::SessionEventGroup { events: events.iter().map(codec::encode_session_event).collect() };
        assert_eq!(body, want.encode_to_vec());
    }

    #[test]
    fn a_message_that_does_not_follow_is_refused() {
        let events = events(4);
        let session = &events[0].session;
        let mut builder = ChunkBuilder::after(0);
        let (h, b) = group_message(&events[1..3]);
        assert!(matches!(builder.push(session, Some(&h), &b, 3), Err(JournalError::Corrupt { .. })));
        let (h, b) = group_message(&events[0..1]);
        builder.push(session, Some(&h), &b, 3).unwrap();
        let (h, b) = group_message(&events[2..4]);
        assert!(builder.push(session, Some(&h), &b, 4).is_err(), "seq 2 is missing");
        // A message format this build does not know is not archived.
        let (mut h, b) = group_message(&events[1..2]);
        h.insert(HEADER_FORMAT, (GROUP_FORMAT + 1).to_string().as_str());
        assert!(builder.push(session, Some(&h), &b, 5).is_err());
    }

    #[test]
    fn only_a_chunk_of_this_archive_format_is_read() {
        let chunk = Chunk { first: 1, last: 3, log_first: 2, log_last: 9 };
        let mut headers = chunk.headers();
        assert_eq!(Chunk::of(Some(&headers)), Some(chunk));
        headers.insert(HEADER_ARCHIVE_FORMAT, (ARCHIVE_FORMAT + 1).to_string().as_str());
        assert_eq!(Chunk::of(Some(&headers)), None, "a newer archive format is left to the log");
        let mut headers = chunk.headers();
        headers.insert(HEADER_LAST_SEQ, "0");
        assert_eq!(Chunk::of(Some(&headers)), None);
        assert_eq!(Chunk::of(None), None);
        let events = events(1);
        let (h, b) = group_message(&events);
        assert!(decode_chunk(&events[0].session, Some(&h), &b).is_err(), "a log message is not a chunk");
    }
}
