//! The session log: an async, fallible, conditional append-only log per session.
//!
//! Backends: the embedded one (memory, or files with `--data-dir`) and JetStream. Both are checked by
//! one contract test suite. The conditional append is the last line of defence of the single-writer rule
//! (SPEC §6): a writer that holds a stale last seq gets [`JournalError::Conflict`] and must stop.

use async_trait::async_trait;
use futures::stream::BoxStream;

use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;

/// A stream of durable events in seq order.
pub type EventStream = BoxStream<'static, Result<Envelope, JournalError>>;

/// A stream of durable events in seq order, in the form readers send them on (`codec::stored_as_sent`).
pub type SentEventStream = BoxStream<'static, Result<turnstile_proto::v1::SessionEvent, JournalError>>;

/// Errors of a session log or live bus.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Another writer appended first: the session's last seq is not the one the writer expected.
    #[error("append to {session} expected last seq {expected} but the log is at {actual}: another writer owns it")]
    Conflict { session: SessionRef, expected: u64, actual: u64 },
    /// [`SessionLog::append_first`] found events in the session's log: nothing was written, and the writer
    /// loads the session instead (decision 0040).
    #[error("session {session} already has events: its first append was not written")]
    FirstRefused { session: SessionRef },
    /// The writer's ownership of the session (at `epoch`) lapsed, so it appended nothing. Raised by the
    /// writer's own check before the store is asked (a worker checks its shard lease before every append),
    /// since a conditional append cannot tell a stale owner that nobody has overtaken yet.
    #[error("session {session}: this writer's ownership at epoch {epoch} lapsed, so it wrote nothing")]
    Fenced { session: SessionRef, epoch: u64 },
    /// The events handed to `append` are not contiguous from `expected_last_seq + 1` or name another session.
    #[error("append to {session} is malformed: {detail}")]
    InvalidBatch { session: SessionRef, detail: String },
    /// The store could not be reached or did not answer in time; the append did not happen, or its
    /// outcome is unknown (a reader must re-read the log).
    #[error("journal unavailable: {0}")]
    Unavailable(String),
    /// The store refuses writes for lack of room (its storage limit, or an account's or a stream's byte
    /// limit): nothing was written. Writes work again once space is freed.
    #[error("the journal is out of space and refuses writes ({0})")]
    OutOfSpace(String),
    /// A stored event could not be decoded or fails its checksum.
    #[error("session {session} has a corrupt event at seq {seq}: {detail}")]
    Corrupt { session: SessionRef, seq: u64, detail: String },
    /// A configuration or filesystem problem the operator must fix.
    #[error("journal storage error: {0}")]
    Storage(String),
}

impl JournalError {
    /// Worth retrying after the store comes back or has room again (the operation may have happened:
    /// re-read first).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::OutOfSpace(_))
    }

    /// The append was refused because someone else writes the session now ([`JournalError::Conflict`],
    /// [`JournalError::Fenced`]): the writer must stop serving it.
    pub fn is_lost_ownership(&self) -> bool {
        matches!(self, Self::Conflict { .. } | Self::Fenced { .. })
    }
}

/// A conditional, append-only log per session.
#[async_trait]
pub trait SessionLog: Send + Sync + 'static {
    /// Appends `events` iff the session's last seq is `expected_last_seq` (0 for a new session): all of
    /// them or none. `events` must be non-empty, of this session, with seqs contiguous from
    /// `expected_last_seq + 1`. Returns the new last seq. `traceparent` is the W3C trace context of the
    /// appending span, stored with the events where the backend keeps headers (JetStream); the others
    /// ignore it.
    async fn append(
        &self,
        session: &SessionRef,
        expected_last_seq: u64,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError>;

    /// Appends `events` as the first events of the session's log iff it has none, returning the new last
    /// seq; [`JournalError::FirstRefused`] when it has some (nothing was written). Unlike an append expecting
    /// 0 it reads nothing before or after the write: a worker serving the first command of a session it
    /// never served tries this before loading it, so a new session answers after one round trip (decision
    /// 0040).
    async fn append_first(
        &self,
        session: &SessionRef,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        match self.append(session, 0, events, traceparent).await {
            Err(JournalError::Conflict { .. }) => Err(JournalError::FirstRefused { session: session.clone() }),
            other => other,
        }
    }

    /// Up to `limit` events with `seq >= from_seq`, in order. An unknown session has no events.
    async fn read(&self, session: &SessionRef, from_seq: u64, limit: usize) -> Result<Vec<Envelope>, JournalError>;

    /// Every event with seq > `after_seq` up to the log's end, in order; `None` when the log ends before
    /// `after_seq` (it was reset: whatever described it is stale). `position` is the backend's position of
    /// event `after_seq` as a snapshot recorded it: a backend that can start there needs no search, and
    /// one that finds another event there answers `None`. A read from 0 is the whole log.
    async fn read_after(
        &self,
        session: &SessionRef,
        after_seq: u64,
        position: Option<u64>,
    ) -> Result<Option<Vec<Envelope>>, JournalError> {
        let _ = position;
        if self.last_seq(session).await? < after_seq {
            return Ok(None);
        }
        read_all(self, session, after_seq.saturating_add(1)).await.map(Some)
    }

    /// The seq of the session's last event, 0 when it has none.
    async fn last_seq(&self, session: &SessionRef) -> Result<u64, JournalError>;

    /// Every event with `seq > after_seq`, then each new one as it is appended: no gap, no duplicate.
    /// The stream ends only on error or when the log is dropped.
    async fn tail(&self, session: &SessionRef, after_seq: u64) -> Result<EventStream, JournalError>;

    /// [`SessionLog::tail`] in the form readers send events on: what `encode_session_event` makes of each
    /// event. A Watch's history is streamed from it. A log that stores that form (JetStream) passes it on
    /// without decoding each event into domain values and encoding it again; this default encodes.
    async fn tail_as_sent(&self, session: &SessionRef, after_seq: u64) -> Result<SentEventStream, JournalError> {
        use futures::StreamExt as _;
        let events = self.tail(session, after_seq).await?;
        Ok(events.map(|e| e.map(|e| turnstile_proto::codec::encode_session_event(&e))).boxed())
    }

    /// Rewrites the session's sealed history through at most `up_to` as its archive, where the backend
    /// keeps one (JetStream: few large messages that long reads take first, decision 0181), and returns
    /// the seq the archive reaches (0: none). The log stays the source of truth; readers use the archive
    /// only where it meets the log. Only the session's owner calls it, after a snapshot holding `up_to`,
    /// outside the driver. Default: no archive.
    async fn archive(&self, session: &SessionRef, up_to: u64) -> Result<u64, JournalError> {
        let _ = (session, up_to);
        Ok(0)
    }

    /// Removes every event of `session` (SPEC §12 `DeleteSession`), its archive with them, and returns the
    /// seq its log had (0: it had none, nothing was removed). Afterwards the session has no events: reads are empty, `last_seq`
    /// is 0, an append expecting 0 starts a new log under the same name, and tails of the old log end or
    /// never see it again. The caller makes sure no writer appends meanwhile (the owner stopped its runner).
    async fn delete(&self, session: &SessionRef) -> Result<u64, JournalError>;

    /// The owner dropped `session` from memory (passivation): forget what this log keeps about it between
    /// calls (JetStream: where its log ends), so a passivated session costs this process nothing. The next
    /// load asks the server again, as it does anyway.
    fn unloaded(&self, _session: &SessionRef) {}

    /// The largest event this log can store, in the bytes `turnstile_model::size` counts, if it has such a
    /// limit (JetStream: the NATS server's `max_payload` less the message headers). Writers refuse a
    /// delivery whose event could not fit before writing anything (decision 0085). Default: no limit.
    fn max_event_bytes(&self) -> Option<usize> {
        None
    }

    /// Sessions that have at least one event, ordered by (tenant, id), strictly after `after`, optionally of
    /// one tenant, at most `limit`.
    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, JournalError>;
}

/// Reads a whole log from `from_seq` in pages.
pub async fn read_all<L: SessionLog + ?Sized>(
    log: &L,
    session: &SessionRef,
    from_seq: u64,
) -> Result<Vec<Envelope>, JournalError> {
    const PAGE: usize = 1024;
    let mut out = Vec::new();
    let mut next = from_seq.max(1);
    loop {
        let page = log.read(session, next, PAGE).await?;
        let n = page.len();
        if let Some(last) = page.last() {
            next = last.seq + 1;
        }
        out.extend(page);
        if n < PAGE {
            return Ok(out);
        }
    }
}

/// One event of an append that passed [`check_batch`]: its stored bytes and the event as a reader will
/// decode them.
#[derive(Clone, Debug)]
pub(crate) struct CheckedEvent {
    pub body: Vec<u8>,
    pub stored: Envelope,
}

/// The checks every backend makes before an append (the `SessionLog::append` contract): a valid session
/// name, at most `max_events` events (at least one), all of this session, seqs contiguous from
/// `expected + 1`, and each event encodable into bytes that decode again (what is stored must read back:
/// refuse here what a reader would call corrupt).
pub(crate) fn check_batch(
    session: &SessionRef,
    expected: u64,
    events: &[Envelope],
    max_events: usize,
) -> Result<Vec<CheckedEvent>, JournalError> {
    let invalid = |detail: String| JournalError::InvalidBatch { session: session.clone(), detail };
    session.validate().map_err(|e| invalid(format!("the session name is invalid: {e}")))?;
    if events.is_empty() {
        return Err(invalid("no events; an append carries at least one".into()));
    }
    if events.len() > max_events {
        return Err(invalid(format!("{} events; one append carries at most {max_events}", events.len())));
    }
    let mut checked = Vec::with_capacity(events.len());
    for (i, event) in events.iter().enumerate() {
        if event.session != *session {
            return Err(invalid(format!("event {i} belongs to {}; append only this session's events", event.session)));
        }
        if expected.checked_add(i as u64 + 1) != Some(event.seq) {
            return Err(invalid(format!(
                "event {i} has seq {} but seqs must run contiguously from expected_last_seq + 1 = {}",
                event.seq,
                expected.saturating_add(1)
            )));
        }
        let body = turnstile_proto::codec::encode_event(event);
        let stored = turnstile_proto::codec::decode_event(&body)
            .map_err(|e| invalid(format!("event {i} (seq {}) cannot be stored: {e}", event.seq)))?;
        checked.push(CheckedEvent { body, stored });
    }
    Ok(checked)
}
