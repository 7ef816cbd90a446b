//! `tail`: an ordered consumer on the session's subject, checked for gaps and duplicates.

use std::collections::VecDeque;

use async_nats::jetstream;
use futures::StreamExt as _;
use futures::stream::BoxStream;

use super::log::{JetStreamLog, Release, decode, decode_as_sent};
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
    let start = log.start_of(session, after_seq.saturating_add(1)).await?;
    let (messages, release) = log.consumer(session, start).await?;
    Ok(Cursor {
        messages,
        _release: release,
        session: session.clone(),
        last: after_seq,
        ready: VecDeque::new(),
        done: false,
        decode,
    })
}

fn stream<T: Send + 'static>(cursor: Cursor<T>) -> BoxStream<'static, Result<T, JournalError>> {
    futures::stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        loop {
            let Some(event) = cursor.ready.pop_front() else {
                let next = match cursor.messages.next().await? {
                    Ok(message) => (cursor.decode.message)(&cursor.session, &message),
                    Err(e) => Err(JournalError::Unavailable(format!("the tail of {} broke: {e}", cursor.session))),
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
