//! The [`SessionLog`] on JetStream: each method of the trait as the store operations of [`JetStreamLog`].

use async_trait::async_trait;
use futures::StreamExt as _;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;

use super::log::{JetStreamLog, Refusal};
use super::refusals::{conflict, unavailable};
use super::subjects;
use crate::log::{EventStream, JournalError, SentEventStream, SessionLog};

#[async_trait]
impl SessionLog for JetStreamLog {
    /// The group is one message (decision 0021): one publish, one ack, one
    /// `Nats-Expected-Last-Subject-Sequence` check. Only a group too large for one message (several
    /// large events) is split into messages written as one atomic batch (decision 0004).
    async fn append(
        &self,
        session: &SessionRef,
        expected_last_seq: u64,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        let prepared = self.prepare(session, expected_last_seq, events)?;
        // As for a first append: a group published while disconnected would wait in the client's buffer and
        // could land after its caller, told UNAVAILABLE, re-read the log.
        if self.client().connection_state() != async_nats::connection::State::Connected {
            return Err(JournalError::Unavailable(format!(
                "appending to {session}: the connection to NATS is down (nothing was written)"
            )));
        }
        let expected_stream_seq = match self.cached(session) {
            Some(last) if last.seq == expected_last_seq => last.stream_seq,
            _ => {
                let last = self.fetch_last(session).await?;
                let actual = last.map_or(0, |l| l.seq);
                if actual != expected_last_seq {
                    return Err(conflict(session, expected_last_seq, actual));
                }
                last.map_or(0, |l| l.stream_seq)
            }
        };
        match self.publish(session, expected_last_seq, expected_stream_seq, events, prepared, traceparent).await {
            Ok(last) => Ok(last),
            Err(Refusal::WrongLastSequence) => {
                let actual = self.fetch_last(session).await?.map_or(0, |l| l.seq);
                Err(conflict(session, expected_last_seq, actual))
            }
            Err(Refusal::Failed(e)) => Err(e),
        }
    }

    /// One publish expecting no message on the session's subject, whatever the cache says, and no read
    /// after a refusal (the caller loads the session anyway).
    async fn append_first(
        &self,
        session: &SessionRef,
        events: &[Envelope],
        traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        let prepared = self.prepare(session, 0, events)?;
        // A publish made while disconnected waits in the client's buffer and may land after its ack timed
        // out: the caller, told UNAVAILABLE, loads the session and may read it before that late first group
        // lands. While the connection is down the first group is not published at all.
        if self.client().connection_state() != async_nats::connection::State::Connected {
            return Err(JournalError::Unavailable(format!(
                "appending to {session}: the connection to NATS is down (nothing was written)"
            )));
        }
        match self.publish(session, 0, 0, events, prepared, traceparent).await {
            Ok(last) => Ok(last),
            Err(Refusal::WrongLastSequence) => Err(JournalError::FirstRefused { session: session.clone() }),
            Err(Refusal::Failed(e)) => Err(e),
        }
    }

    async fn read(&self, session: &SessionRef, from_seq: u64, limit: usize) -> Result<Vec<Envelope>, JournalError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let from_seq = from_seq.max(1);
        let Some(start) = self.stream_seq_of(session, from_seq).await? else { return Ok(Vec::new()) };
        self.read_from(session, start, from_seq, limit).await
    }

    /// One last-event get, then one ordered consumer from the recorded position (no search): a snapshot's
    /// tail costs the same on a log of 100 events as on one of 100,000. Without a position the start is
    /// found by `JetStreamLog::stream_seq_of`'s binary search (O(log n) gets).
    async fn read_after(
        &self,
        session: &SessionRef,
        after_seq: u64,
        position: Option<u64>,
    ) -> Result<Option<Vec<Envelope>>, JournalError> {
        let Some(last) = self.fetch_last(session).await? else {
            return Ok((after_seq == 0).then(Vec::new));
        };
        if last.seq < after_seq {
            return Ok(None);
        }
        if last.seq == after_seq {
            // The recorded event is the last one: it must still be where it was recorded.
            return Ok(position.is_none_or(|p| p == last.stream_seq).then(Vec::new));
        }
        // A long way behind (a load without a snapshot): the archive first, when it meets the log.
        if let Some(events) = super::tail::read_through(self, session, after_seq, last).await? {
            return Ok(Some(events));
        }
        let start = match position {
            // Event `after_seq` precedes the last one, so its message is below the last's; a position at
            // or past it is not this log's. A recorded position is the message whose *last* event is
            // `after_seq` (`Positions` only holds message ends), so event `after_seq + 1` opens the
            // subject's next message: reading from p + 1 starts at it.
            Some(p) if p < last.stream_seq => p + 1,
            Some(_) => return Ok(None),
            None if after_seq == 0 => 1,
            None => match self.stream_seq_before(session, after_seq + 1, last).await? {
                Some(start) => start,
                None => return Ok(None),
            },
        };
        // A message of the subject lies at or after `start` (the last one), so the read cannot wait.
        let events = self.read_from(session, start, after_seq + 1, usize::MAX).await?;
        // From a position that is not event `after_seq`'s (a log reset and written again), the first event
        // read is not the next one: the caller folds from the start.
        if events.first().is_none_or(|e| e.seq != after_seq + 1) {
            return Ok(None);
        }
        Ok(Some(events))
    }

    async fn last_seq(&self, session: &SessionRef) -> Result<u64, JournalError> {
        Ok(self.fetch_last(session).await?.map_or(0, |l| l.seq))
    }

    fn unloaded(&self, session: &SessionRef) {
        self.forget(session);
        self.archived().forget(session);
    }

    /// Chunks of about 1,000 events of whole log messages in the session's archive stream (decision 0181).
    async fn archive(&self, session: &SessionRef, up_to: u64) -> Result<u64, JournalError> {
        super::archive::archive_up_to(self, session, up_to).await
    }

    /// One event must fit one message on its own (a batch splits only between events).
    fn max_event_bytes(&self) -> Option<usize> {
        Some(super::group::max_event_body(self.client().server_info().max_payload))
    }

    async fn tail(&self, session: &SessionRef, after_seq: u64) -> Result<EventStream, JournalError> {
        super::tail::follow(self, session, after_seq).await
    }

    async fn tail_as_sent(&self, session: &SessionRef, after_seq: u64) -> Result<SentEventStream, JournalError> {
        super::tail::follow_as_sent(self, session, after_seq).await
    }

    async fn delete(&self, session: &SessionRef) -> Result<u64, JournalError> {
        super::delete::purge_session(self, session).await
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, JournalError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Subjects with messages, from each partition's stream info: O(sessions) per call, which is fine for
        // listing pages at current scale; a sessions index (KV) replaces it if it is not.
        let mut sessions = Vec::new();
        for (p, stream) in (0u32..).zip(self.streams()) {
            let filter = tenant.map_or_else(|| subjects::stream_subjects(p), |t| subjects::tenant_filter(p, t));
            let mut info = stream
                .info_with_subjects(filter)
                .await
                .map_err(|e| unavailable(format!("listing the sessions of partition {p}"), e))?;
            while let Some(entry) = info.next().await {
                let (subject, _count) = entry.map_err(|e| unavailable(format!("listing partition {p}"), e))?;
                match subjects::parse_event_subject(&subject) {
                    Some(s) if tenant.is_none_or(|t| s.tenant == t) && after.is_none_or(|a| &s > a) => {
                        sessions.push(s);
                    }
                    Some(_) => {}
                    None => tracing::warn!(%subject, "ignoring a subject in an event stream that names no session"),
                }
            }
        }
        sessions.sort();
        sessions.dedup();
        sessions.truncate(limit);
        Ok(sessions)
    }
}
