//! One JetStream message per append group (docs/decisions/0021-one-message-per-append-group.md): how a
//! group's events become one message's body and headers, and how a reader turns any stored message back
//! into events — a group message of this layout, or a single-event message of the layout before it.
//!
//! Body: protobuf `turnstile.v1.SessionEventGroup { repeated SessionEvent events = 1 }`, built by framing
//! each event's already-encoded bytes as field 1 (the same bytes prost would write for the message).
//! Headers: `Turnstile-Seq` and `Turnstile-Last-Seq` (the first and last seq it holds), `Turnstile-Type`
//! (the types in order, comma-separated), `Turnstile-Epoch`, `Turnstile-Format` ([`GROUP_FORMAT`]) and,
//! when given, `traceparent`. A message without `Turnstile-Last-Seq` is of the old layout: its body is one
//! bare `SessionEvent`.
//!
//! Versions (SPEC §18, decision 0072): the message layout is numbered by `Turnstile-Format`, each event by
//! its own `SessionEvent.format`. A reader refuses a message format newer than it knows, which no field
//! default can make safe; so a new layout ships in two releases: the first reads it, the next writes it.

use std::ops::Range;

use async_nats::HeaderMap;
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use super::{HEADER_EPOCH, HEADER_FORMAT, HEADER_LAST_SEQ, HEADER_SEQ, HEADER_TRACEPARENT, HEADER_TYPE};
use crate::log::JournalError;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;
use turnstile_proto::{codec, v1 as pb};

/// Separates the event types in a group's `Turnstile-Type` header.
pub const TYPE_SEPARATOR: char = ',';

/// The message format this build writes (`Turnstile-Format`) and the newest it reads: 1 is a
/// `SessionEventGroup` body with the headers above (decision 0021). The single-event layout before it
/// has no number (and no `Turnstile-Last-Seq`).
pub const GROUP_FORMAT: u32 = 1;

/// Bytes of a message's headers besides the type list (seqs, epoch, traceparent, expected sequence and,
/// for an oversized group, the batch headers), with room to spare.
const FIXED_HEADER_ALLOWANCE: usize = 1024;

/// The bytes one encoded event adds to a group body: field 1's key, the length and the event.
fn framed_len(body: &[u8]) -> usize {
    key_len(1) + encoded_len_varint(body.len() as u64) + body.len()
}

/// What one event adds to a message: its framed body and its type in the `Turnstile-Type` list.
fn event_cost(event: &Envelope, body: &[u8]) -> usize {
    framed_len(body) + event.event_type().len() + 1
}

/// The body of a group message holding `bodies` (each an encoded `SessionEvent`), in order.
pub fn encode_group<'a>(bodies: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for body in bodies {
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
    }
    out
}

/// The headers of a group message holding `events` (non-empty, contiguous).
pub fn group_headers(events: &[Envelope], traceparent: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let (Some(first), Some(last)) = (events.first(), events.last()) else { return headers };
    let types: Vec<&str> = events.iter().map(|e| e.event_type()).collect();
    headers.insert(HEADER_TYPE, types.join(&TYPE_SEPARATOR.to_string()).as_str());
    headers.insert(HEADER_SEQ, first.seq.to_string().as_str());
    headers.insert(HEADER_LAST_SEQ, last.seq.to_string().as_str());
    headers.insert(HEADER_EPOCH, last.epoch.to_string().as_str());
    headers.insert(HEADER_FORMAT, GROUP_FORMAT.to_string().as_str());
    if let Some(tp) = traceparent.filter(|tp| !tp.is_empty()) {
        headers.insert(HEADER_TRACEPARENT, tp);
    }
    headers
}

/// The largest encoded event a message of at most `max_payload` bytes holds on its own: what is left
/// after the headers and the event's framing and type name in them.
pub fn max_event_body(max_payload: usize) -> usize {
    max_payload.saturating_sub(FIXED_HEADER_ALLOWANCE + EVENT_FRAMING_ALLOWANCE)
}

/// Room for one event's key, length and `Turnstile-Type` entry beside its body (see [`event_cost`]).
const EVENT_FRAMING_ALLOWANCE: usize = 64;

/// Splits a group into the fewest runs of consecutive events whose messages fit `max_payload`: one run in
/// all but the rarest case (several large events in one group). Errs with the size of an event that fits
/// no message on its own.
pub fn split_to_fit(events: &[Envelope], bodies: &[Vec<u8>], max_payload: usize) -> Result<Vec<Range<usize>>, usize> {
    let room = max_payload.saturating_sub(FIXED_HEADER_ALLOWANCE);
    let mut runs = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, (event, body)) in events.iter().zip(bodies).enumerate() {
        let cost = event_cost(event, body);
        if cost > room {
            return Err(body.len());
        }
        if used + cost > room {
            runs.push(start..i);
            (start, used) = (i, 0);
        }
        used += cost;
    }
    if start < events.len() {
        runs.push(start..events.len());
    }
    Ok(runs)
}

fn header_u64(headers: Option<&HeaderMap>, name: &str) -> Option<u64> {
    headers?.get(name).and_then(|v| v.as_str().parse().ok())
}

/// The first and last seq a stored message holds, from its headers.
pub fn header_range(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    stream_seq: u64,
) -> Result<(u64, u64), JournalError> {
    let corrupt = |detail: String| JournalError::Corrupt { session: session.clone(), seq: 0, detail };
    let first = header_u64(headers, HEADER_SEQ)
        .ok_or_else(|| corrupt(format!("stream message {stream_seq} has no valid {HEADER_SEQ} header")))?;
    let has_last = headers.is_some_and(|h| h.get(HEADER_LAST_SEQ).is_some());
    let last = if has_last {
        header_u64(headers, HEADER_LAST_SEQ)
            .filter(|last| *last >= first)
            .ok_or_else(|| corrupt(format!("stream message {stream_seq} has an invalid {HEADER_LAST_SEQ} header")))?
    } else {
        first
    };
    Ok((first, last))
}

/// Decodes one stored message into its events and checks them against its headers and subject: one
/// session, the seqs the headers name, contiguous.
pub fn decode_message(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    body: &[u8],
    stream_seq: u64,
) -> Result<Vec<Envelope>, JournalError> {
    decode_each(session, headers, body, stream_seq, codec::decode_session_event)
}

/// [`decode_message`] in the form readers send events on (`codec::stored_as_sent`): a Watch's history
/// streams stored events without decoding them into domain values and encoding them again.
pub fn decode_message_as_sent(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    body: &[u8],
    stream_seq: u64,
) -> Result<Vec<pb::SessionEvent>, JournalError> {
    decode_each(session, headers, body, stream_seq, codec::stored_as_sent)
}

/// The checked events of one stored message, each through `decode`; its error names the event's seq.
fn decode_each<T>(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    body: &[u8],
    stream_seq: u64,
    decode: fn(pb::SessionEvent) -> Result<T, codec::CodecError>,
) -> Result<Vec<T>, JournalError> {
    decode_stored(session, headers, body, stream_seq)?
        .into_iter()
        .map(|e| {
            let seq = e.seq;
            decode(e).map_err(|err| JournalError::Corrupt { session: session.clone(), seq, detail: err.to_string() })
        })
        .collect()
}

/// The protobuf events of one stored message, checked against its headers and subject (one session,
/// the seqs the headers name, contiguous) but not decoded further.
fn decode_stored(
    session: &SessionRef,
    headers: Option<&HeaderMap>,
    body: &[u8],
    stream_seq: u64,
) -> Result<Vec<pb::SessionEvent>, JournalError> {
    let (first, last) = header_range(session, headers, stream_seq)?;
    let corrupt = |detail: String| JournalError::Corrupt { session: session.clone(), seq: first, detail };
    if let Some(format) = headers.and_then(|h| h.get(HEADER_FORMAT)) {
        match format.as_str().parse::<u32>() {
            Ok(n) if n <= GROUP_FORMAT => {}
            Ok(n) => {
                return Err(corrupt(format!(
                    "stream message {stream_seq} is in message format {n}, newer than this build reads \
                     ({GROUP_FORMAT}): a newer Turnstile wrote it; upgrade this process"
                )));
            }
            Err(_) => {
                return Err(corrupt(format!(
                    "stream message {stream_seq} has an invalid {HEADER_FORMAT} header {:?}",
                    format.as_str()
                )));
            }
        }
    }
    let grouped = headers.is_some_and(|h| h.get(HEADER_LAST_SEQ).is_some());
    let events = if grouped {
        pb::SessionEventGroup::decode(body).map_err(|e| corrupt(format!("SessionEventGroup: {e}")))?.events
    } else {
        vec![pb::SessionEvent::decode(body).map_err(|e| {
            corrupt(codec::CodecError::Malformed { what: "SessionEvent", detail: e.to_string() }.to_string())
        })?]
    };
    // `last >= first` (header_range), but `last - first + 1` overflows for a message claiming every seq.
    if (last - first).checked_add(1) != Some(events.len() as u64) {
        return Err(corrupt(format!(
            "stream message {stream_seq} holds {} events but its headers name seqs {first}..={last}",
            events.len()
        )));
    }
    // An inclusive range: `first..` would overflow past a last seq of u64::MAX.
    for (event, want) in events.iter().zip(first..=last) {
        let names_session = event.session.as_ref().is_some_and(|s| s.tenant == session.tenant && s.id == session.id);
        if !names_session {
            let named = event.session.as_ref().map_or_else(|| "none".to_owned(), |s| format!("{}/{}", s.tenant, s.id));
            return Err(corrupt(format!("the stored event names session {named}")));
        }
        if event.seq != want {
            return Err(corrupt(format!(
                "stream message {stream_seq} holds seq {} where its headers say {want}",
                event.seq
            )));
        }
    }
    Ok(events)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use turnstile_model::{EventPayload, Status};

    /// Seqs 1..=`n` of one session, of status events.
    pub(crate) fn events(n: u64) -> Vec<Envelope> {
        let session = SessionRef::new("acme", "g").unwrap();
        (1..=n)
            .map(|seq| Envelope {
                session: session.clone(),
                seq,
                time_ms: seq,
                epoch: 2,
                payload: EventPayload::Status(if seq % 2 == 0 { Status::Idle } else { Status::Running }),
            })
            .collect()
    }

    /// A group message of `events` as the log stores it.
    pub(crate) fn group_message(events: &[Envelope]) -> (HeaderMap, Vec<u8>) {
        let bodies: Vec<Vec<u8>> = events.iter().map(codec::encode_event).collect();
        (group_headers(events, None), encode_group(bodies.iter().map(Vec::as_slice)))
    }

    #[test]
    fn a_group_body_is_a_session_event_group_and_decodes_back() {
        let events = events(3);
        let (headers, body) = group_message(&events);
        let want = pb::SessionEventGroup { events: events.iter().map(codec::encode_session_event).collect() };
        assert_eq!(body, want.encode_to_vec(), "the same bytes prost writes for the message");
        assert_eq!(headers.get(HEADER_TYPE).unwrap().as_str(), "agent/status,agent/status,agent/status");
        assert_eq!(header_range(&events[0].session, Some(&headers), 7).unwrap(), (1, 3));
        assert_eq!(decode_message(&events[0].session, Some(&headers), &body, 7).unwrap(), events);
    }

    #[test]
    fn a_message_of_the_old_layout_is_one_event() {
        let events = events(1);
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_SEQ, "1");
        let body = codec::encode_event(&events[0]);
        assert_eq!(decode_message(&events[0].session, Some(&headers), &body, 1).unwrap(), events);
    }

    #[test]
    fn a_newer_message_format_is_refused_naming_the_upgrade() {
        let events = events(1);
        let body = encode_group([codec::encode_event(&events[0]).as_slice()]);
        let mut headers = group_headers(&events, None);
        assert_eq!(headers.get(HEADER_FORMAT).unwrap().as_str(), GROUP_FORMAT.to_string());
        headers.insert(HEADER_FORMAT, (GROUP_FORMAT + 1).to_string().as_str());
        let err = decode_message(&events[0].session, Some(&headers), &body, 4).unwrap_err();
        assert!(err.to_string().contains("upgrade this process"), "{err}");
        headers.insert(HEADER_FORMAT, "x");
        assert!(decode_message(&events[0].session, Some(&headers), &body, 4).is_err());
        // Written before the header existed: format 1 all the same.
        let mut old = HeaderMap::new();
        for name in [HEADER_SEQ, HEADER_LAST_SEQ] {
            old.insert(name, "1");
        }
        old.insert(HEADER_TYPE, "agent/status");
        assert_eq!(decode_message(&events[0].session, Some(&old), &body, 4).unwrap(), events);
    }

    #[test]
    fn headers_that_disagree_with_the_body_are_corrupt() {
        let events = events(2);
        let (mut headers, body) = group_message(&events);
        headers.insert(HEADER_LAST_SEQ, "3");
        let err = decode_message(&events[0].session, Some(&headers), &body, 1).unwrap_err();
        assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
        headers.insert(HEADER_LAST_SEQ, "0");
        assert!(header_range(&events[0].session, Some(&headers), 1).is_err());
    }

    #[test]
    fn an_oversized_group_splits_into_runs_that_fit() {
        let events = events(4);
        let bodies: Vec<Vec<u8>> = events.iter().map(codec::encode_event).collect();
        let each = event_cost(&events[0], &bodies[0]);
        assert_eq!(split_to_fit(&events, &bodies, 1 << 20).unwrap(), vec![0..4]);
        let two = FIXED_HEADER_ALLOWANCE + 2 * each;
        assert_eq!(split_to_fit(&events, &bodies, two).unwrap(), vec![0..2, 2..4]);
        assert_eq!(split_to_fit(&events, &bodies, FIXED_HEADER_ALLOWANCE + each - 1), Err(bodies[0].len()));
    }
}
