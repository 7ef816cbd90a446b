//! Live events (SPEC §5 live types): `LiveEvent` ↔ `pb::LiveEvent`.

use crate::v1 as pb;
use crate::v1::live_event::Payload;
use prost::Message as _;

use super::error::CodecError;
use super::message::{encode_session_ref, encode_user_message, required_message_at, required_session_at};
use super::values::{encode_status, status_at};
use turnstile_model::event::{LiveEvent, LivePayload};

fn encode_payload(payload: &LivePayload) -> Payload {
    match payload {
        LivePayload::Inserted { message } => {
            Payload::Inserted(pb::Inserted { message: Some(encode_user_message(message)) })
        }
        LivePayload::Discarded { message } => {
            Payload::Discarded(pb::Discarded { message: Some(encode_user_message(message)) })
        }
        LivePayload::Claimed { message, turn } => {
            Payload::Claimed(pb::Claimed { message: Some(encode_user_message(message)), turn: *turn })
        }
        LivePayload::Status { status } => Payload::Status(pb::StatusChanged { status: encode_status(*status).into() }),
        LivePayload::AssistantDelta { turn, step, text, reasoning, offset } => {
            Payload::AssistantDelta(pb::AssistantDelta {
                turn: *turn,
                step: *step,
                text: text.clone(),
                reasoning: *reasoning,
                offset: *offset,
            })
        }
        LivePayload::Error { turn, step, message } => {
            Payload::Error(pb::AgentError { turn: *turn, step: *step, message: message.clone() })
        }
    }
}

fn payload_type(payload: &Payload) -> &'static str {
    match payload {
        Payload::Inserted(_) => "agent/inbox/inserted",
        Payload::Discarded(_) => "agent/inbox/discarded",
        Payload::Claimed(_) => "agent/inbox/claimed",
        Payload::Status(_) => "agent/status",
        Payload::AssistantDelta(_) => "assistant/delta",
        Payload::Error(_) => "agent/error",
    }
}

fn decode_payload(payload: Payload) -> Result<LivePayload, CodecError> {
    Ok(match payload {
        Payload::Inserted(p) => LivePayload::Inserted { message: required_message_at(p.message, "inserted.message")? },
        Payload::Discarded(p) => {
            LivePayload::Discarded { message: required_message_at(p.message, "discarded.message")? }
        }
        Payload::Claimed(p) => {
            LivePayload::Claimed { message: required_message_at(p.message, "claimed.message")?, turn: p.turn }
        }
        Payload::Status(p) => LivePayload::Status { status: status_at(p.status, "status.status")? },
        Payload::AssistantDelta(p) => LivePayload::AssistantDelta {
            turn: p.turn,
            step: p.step,
            text: p.text,
            reasoning: p.reasoning,
            offset: p.offset,
        },
        Payload::Error(p) => LivePayload::Error { turn: p.turn, step: p.step, message: p.message },
    })
}

pub fn encode_live_event(event: &LiveEvent) -> pb::LiveEvent {
    pb::LiveEvent {
        session: Some(encode_session_ref(&event.session)),
        after_seq: event.after_seq,
        r#type: event.event_type().to_owned(),
        payload: Some(encode_payload(&event.payload)),
    }
}

/// Decodes and validates a live event; its `type` must be the type of its payload.
pub fn decode_live_event(event: pb::LiveEvent) -> Result<LiveEvent, CodecError> {
    let session = required_session_at(event.session, "session")?;
    let payload = event
        .payload
        .ok_or_else(|| CodecError::missing("payload", &format!("set the payload of live type {:?}", event.r#type)))?;
    let actual = payload_type(&payload);
    if actual != event.r#type {
        return Err(CodecError::invalid(
            "type",
            format!("is {:?} but the payload is {actual:?}; write the type of the payload variant", event.r#type),
        ));
    }
    Ok(LiveEvent { session, after_seq: event.after_seq, payload: decode_payload(payload)? })
}

/// The bytes of a live event on the bus (prost encoding of `LiveEvent`).
pub fn encode_live(event: &LiveEvent) -> Vec<u8> {
    encode_live_event(event).encode_to_vec()
}

/// The inverse of [`encode_live`].
pub fn decode_live(bytes: &[u8]) -> Result<LiveEvent, CodecError> {
    let event =
        pb::LiveEvent::decode(bytes).map_err(|e| CodecError::Malformed { what: "LiveEvent", detail: e.to_string() })?;
    decode_live_event(event)
}
