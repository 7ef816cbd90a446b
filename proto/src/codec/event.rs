//! Durable events (SPEC §5): `Envelope` ↔ `SessionEvent`, their payloads, forks and transcripts; the
//! values and smaller parts they carry are in [`super::values`] and [`super::parts`].

use crate::v1 as pb;
use crate::v1::session_event::Payload;
use prost::Message as _;

use super::error::{CodecError, join};
use super::message::{
    encode_session_ref, encode_user_message, required_message_at, required_session_at, session_ref_at,
};
use super::parts::{
    compaction_at, decode_model_ref, decode_usage, encode_compaction, encode_model_ref, encode_usage, goal_change,
};
use super::values::{
    REASONS, decode_tool_calls, encode_inject_mode, encode_repair_action, encode_splice, encode_status,
    encode_tool_call_spec, encode_turn_end_reason, inject_mode_at, repair_action_at, splice_at, status_at,
    turn_end_reason_at,
};
use turnstile_model::event::{DURABLE_TYPES, Envelope, EventPayload, Fork, IGNORABLE_TYPES, Spent, ToolCallSpec};
use turnstile_model::memory::MemoryWritten;
use turnstile_model::schedule::Preset;
use turnstile_model::tool_key::idempotency_key;
use turnstile_model::transcript::TranscriptEntry;
use turnstile_model::transcript_items::{ItemKind, TranscriptItem};

fn encode_payload(payload: &EventPayload) -> Option<Payload> {
    Some(match payload {
        EventPayload::InboxSpliced(splice) => Payload::InboxSpliced(encode_splice(splice)),
        EventPayload::Status(status) => Payload::Status(pb::StatusChanged { status: encode_status(*status).into() }),
        EventPayload::TurnStart { turn } => Payload::TurnStart(pb::TurnStart { turn: *turn }),
        EventPayload::TurnEnd { turn, reason } => {
            Payload::TurnEnd(pb::TurnEnd { turn: *turn, reason: Some(encode_turn_end_reason(reason)) })
        }
        EventPayload::StepStart { turn, step } => Payload::StepStart(pb::StepStart { turn: *turn, step: *step }),
        EventPayload::StepEnd { turn, step, spent } => Payload::StepEnd(pb::StepEnd {
            turn: *turn,
            step: *step,
            usage: spent.as_ref().map(|s| encode_usage(&s.usage)),
            model: spent.as_ref().and_then(|s| s.model.as_ref()).map(encode_model_ref),
            usage_estimated: spent.as_ref().is_some_and(|s| s.estimated),
        }),
        EventPayload::UserMessage { message, turn, step } => Payload::UserMessage(pb::UserMessageEvent {
            message: Some(encode_user_message(message)),
            turn: *turn,
            step: *step,
        }),
        EventPayload::AssistantMessage {
            turn,
            step,
            text,
            tool_calls,
            interrupted,
            max_tokens,
            reasoning,
            usage,
            model,
        } => Payload::AssistantMessage(pb::AssistantMessage {
            turn: *turn,
            step: *step,
            text: text.clone(),
            tool_calls: tool_calls.iter().map(encode_tool_call_spec).collect(),
            interrupted: *interrupted,
            max_tokens: *max_tokens,
            reasoning: reasoning.clone(),
            usage: usage.as_ref().map(encode_usage),
            model: model.as_ref().map(encode_model_ref),
        }),
        // Its idempotency key is set by `encode_session_event`, which knows the session.
        EventPayload::ToolCall { turn, step, call, awaiting_approval, awaiting_client } => {
            Payload::ToolCall(encode_tool_call((*turn, *step), call, *awaiting_approval, *awaiting_client))
        }
        EventPayload::ToolRepaired { turn, step, call_id, action } => Payload::ToolRepaired(pb::ToolRepaired {
            turn: *turn,
            step: *step,
            call_id: call_id.clone(),
            action: encode_repair_action(*action).into(),
        }),
        EventPayload::ToolDecision { turn, step, call_id, approved, reason, timed_out } => {
            Payload::ToolDecision(pb::ToolDecision {
                turn: *turn,
                step: *step,
                call_id: call_id.clone(),
                approved: *approved,
                reason: reason.clone(),
                timed_out: *timed_out,
            })
        }
        EventPayload::ToolResult { turn, step, call_id, output, error } => Payload::ToolResult(pb::ToolResult {
            turn: *turn,
            step: *step,
            call_id: call_id.clone(),
            output: output.clone(),
            error: error.clone(),
        }),
        EventPayload::GoalChange(change) => Payload::GoalChange(pb::GoalChange {
            goal_id: change.goal_id.clone(),
            revision: change.revision,
            state: change.state.as_str().to_owned(),
            objective: change.objective.clone(),
            max_rounds: change.max_rounds,
            round: change.round,
            summary: change.summary.clone(),
            reason: change.reason.clone(),
        }),
        EventPayload::SessionConfigured { agent, inject_mode, parent, version } => {
            Payload::SessionConfigured(pb::SessionConfigured {
                agent: agent.clone(),
                inject_mode: encode_inject_mode(*inject_mode).into(),
                parent: parent.as_ref().map(encode_session_ref),
                version: *version,
            })
        }
        EventPayload::ContextCompacted(c) => Payload::ContextCompacted(encode_compaction(c)),
        EventPayload::SessionForked(f) => Payload::SessionForked(encode_fork(f)),
        EventPayload::ScheduleChanged(c) => Payload::ScheduleChanged(super::schedule::encode_schedule_change(c)),
        EventPayload::SessionLabeled(l) => Payload::SessionLabeled(super::schedule::encode_labeled(l)),
        EventPayload::MemoryWritten(m) => Payload::MemoryWritten(pb::MemoryWritten {
            turn: m.turn,
            step: m.step,
            call_id: m.call_id.clone(),
            namespace: m.namespace.clone(),
            key: m.key.clone(),
            revision: m.revision,
            bytes: m.bytes,
        }),
        EventPayload::SessionOverridden(o) => Payload::SessionOverridden(super::parts::encode_overrides(o)),
        // An event this build does not understand has no payload it could write.
        EventPayload::Ignorable { .. } => return None,
    })
}

/// The durable type a payload variant stands for.
/// A `tool/call` of step `(turn, step)`, without its idempotency key (the session's, set where it is known).
fn encode_tool_call((turn, step): (u64, u32), call: &ToolCallSpec, approval: bool, client: bool) -> pb::ToolCall {
    pb::ToolCall {
        turn,
        step,
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone(),
        awaiting_approval: approval,
        awaiting_client: client,
        idempotency_key: String::new(),
    }
}

fn payload_type(payload: &Payload) -> &'static str {
    match payload {
        Payload::InboxSpliced(_) => "agent/inbox/spliced",
        Payload::Status(_) => "agent/status",
        Payload::TurnStart(_) => "turn/start",
        Payload::TurnEnd(_) => "turn/end",
        Payload::StepStart(_) => "step/start",
        Payload::StepEnd(_) => "step/end",
        Payload::UserMessage(_) => "user/message",
        Payload::AssistantMessage(_) => "assistant/message",
        Payload::ToolCall(_) => "tool/call",
        Payload::ToolResult(_) => "tool/result",
        Payload::GoalChange(_) => "goal/change",
        Payload::SessionConfigured(_) => "session/configured",
        Payload::ToolDecision(_) => "tool/decision",
        Payload::ContextCompacted(_) => "context/compacted",
        Payload::SessionForked(_) => "session/forked",
        Payload::ScheduleChanged(_) => "schedule/changed",
        Payload::SessionLabeled(_) => "session/labeled",
        Payload::ToolRepaired(_) => "tool/repaired",
        Payload::MemoryWritten(_) => "memory/written",
        Payload::SessionOverridden(_) => "session/overridden",
    }
}

fn decode_payload(payload: Payload) -> Result<EventPayload, CodecError> {
    Ok(match payload {
        Payload::InboxSpliced(s) => EventPayload::InboxSpliced(splice_at(s, "inbox_spliced")?),
        Payload::Status(s) => EventPayload::Status(status_at(s.status, "status.status")?),
        Payload::TurnStart(t) => EventPayload::TurnStart { turn: t.turn },
        Payload::TurnEnd(t) => {
            let reason = t.reason.ok_or_else(|| CodecError::missing("turn_end.reason", REASONS))?;
            EventPayload::TurnEnd { turn: t.turn, reason: turn_end_reason_at(reason, "turn_end.reason")? }
        }
        Payload::StepStart(s) => EventPayload::StepStart { turn: s.turn, step: s.step },
        Payload::StepEnd(s) => EventPayload::StepEnd {
            turn: s.turn,
            step: s.step,
            spent: s.usage.map(|usage| Spent {
                usage: decode_usage(usage),
                model: s.model.map(decode_model_ref),
                estimated: s.usage_estimated,
            }),
        },
        Payload::UserMessage(u) => EventPayload::UserMessage {
            message: required_message_at(u.message, "user_message.message")?,
            turn: u.turn,
            step: u.step,
        },
        Payload::AssistantMessage(a) => EventPayload::AssistantMessage {
            turn: a.turn,
            step: a.step,
            text: a.text,
            tool_calls: decode_tool_calls(a.tool_calls),
            interrupted: a.interrupted,
            max_tokens: a.max_tokens,
            reasoning: a.reasoning,
            usage: a.usage.map(decode_usage),
            model: a.model.map(decode_model_ref),
        },
        Payload::ToolCall(c) => EventPayload::ToolCall {
            turn: c.turn,
            step: c.step,
            call: ToolCallSpec { call_id: c.call_id, name: c.name, arguments: c.arguments },
            awaiting_approval: c.awaiting_approval,
            awaiting_client: c.awaiting_client,
        },
        Payload::ToolDecision(d) => EventPayload::ToolDecision {
            turn: d.turn,
            step: d.step,
            call_id: d.call_id,
            approved: d.approved,
            reason: d.reason,
            timed_out: d.timed_out,
        },
        Payload::ToolRepaired(r) => EventPayload::ToolRepaired {
            turn: r.turn,
            step: r.step,
            call_id: r.call_id,
            action: repair_action_at(r.action, "tool_repaired.action")?,
        },
        Payload::ToolResult(r) => EventPayload::ToolResult {
            turn: r.turn,
            step: r.step,
            call_id: r.call_id,
            output: r.output,
            error: r.error,
        },
        Payload::GoalChange(g) => EventPayload::GoalChange(goal_change(g)?),
        Payload::SessionConfigured(c) => {
            if c.agent.is_empty() {
                return Err(CodecError::invalid(
                    "session_configured.agent",
                    "is empty; name the agent the session runs",
                ));
            }
            EventPayload::SessionConfigured {
                agent: c.agent,
                inject_mode: inject_mode_at(c.inject_mode, "session_configured.inject_mode", None)?,
                parent: c.parent.map(|p| session_ref_at(p, "session_configured.parent")).transpose()?,
                version: c.version,
            }
        }
        Payload::ContextCompacted(c) => EventPayload::ContextCompacted(compaction_at(c, "context_compacted")?),
        Payload::SessionForked(f) => EventPayload::SessionForked(fork_at(f, "session_forked")?),
        Payload::ScheduleChanged(c) => {
            EventPayload::ScheduleChanged(super::schedule::schedule_change_at(c, "schedule_changed")?)
        }
        Payload::SessionLabeled(l) => EventPayload::SessionLabeled(super::schedule::labeled_at(l, "session_labeled")?),
        Payload::MemoryWritten(m) => EventPayload::MemoryWritten(memory_written_at(m)?),
        Payload::SessionOverridden(o) => {
            EventPayload::SessionOverridden(super::parts::overrides_at(o, "session_overridden")?)
        }
    })
}

/// A `memory/written`: its namespace and key by the rules of memory (`turnstile_model::memory`).
fn memory_written_at(m: pb::MemoryWritten) -> Result<MemoryWritten, CodecError> {
    use turnstile_model::memory::{validate_key, validate_namespace};
    validate_namespace(&m.namespace).map_err(|e| CodecError::invalid("memory_written.namespace", e.to_string()))?;
    validate_key(&m.key).map_err(|e| CodecError::invalid("memory_written.key", e.to_string()))?;
    Ok(MemoryWritten {
        turn: m.turn,
        step: m.step,
        call_id: m.call_id,
        namespace: m.namespace,
        key: m.key,
        revision: m.revision,
        bytes: m.bytes,
    })
}

/// The event format this build writes in `SessionEvent.format` (SPEC §18, decision 0072). 0 is every event
/// written before formats were numbered; their bytes mean what format 1's do, so both decode alike. A
/// change to what stored bytes *mean* (not a new field, which older readers skip and newer ones default)
/// takes the next number, and [`decode_session_event`] keeps decoding each older one by its own rules:
/// the corpus in `tests/corpus/` holds logs of every format, and its test folds them all.
pub const EVENT_FORMAT: u32 = 1;

/// The protobuf form of a durable event. `type` is the payload's durable type; an
/// [`EventPayload::Ignorable`] keeps the type it was read with, is marked ignorable and has no payload.
pub fn encode_session_event(event: &Envelope) -> pb::SessionEvent {
    let (ty, ignorable) = match &event.payload {
        EventPayload::Ignorable { event_type } => (event_type.clone(), true),
        // A reader from before SPEC §20 skips these (`IGNORABLE_TYPES`): the repair's record (the call's
        // `tool/result` still follows), an agent's memory write and a session's overrides.
        other => (other.event_type().to_owned(), IGNORABLE_TYPES.contains(&other.event_type())),
    };
    let mut payload = encode_payload(&event.payload);
    if let Some(Payload::ToolCall(call)) = &mut payload {
        call.idempotency_key = idempotency_key(&event.session, call.turn, call.step, &call.call_id);
    }
    pb::SessionEvent {
        session: Some(encode_session_ref(&event.session)),
        seq: event.seq,
        time_unix_ms: event.time_ms,
        epoch: event.epoch,
        r#type: ty,
        ignorable,
        format: EVENT_FORMAT,
        payload,
    }
}

/// Decodes and validates a durable event. An unknown `type`, or a missing payload, is refused unless the
/// event is marked ignorable, in which case it becomes [`EventPayload::Ignorable`]. A `type` that names a
/// different variant than the payload is always refused. Every `format` decodes: those up to
/// [`EVENT_FORMAT`] by their rules (0 and 1 share them), a newer one (a newer writer in the same cluster,
/// during a rolling upgrade) by the protobuf rules, its unknown fields skipped. The decoded event is
/// format-free: encoding it again writes [`EVENT_FORMAT`].
pub fn decode_session_event(event: pb::SessionEvent) -> Result<Envelope, CodecError> {
    let session = required_session_at(event.session, "session")?;
    if event.seq == 0 {
        return Err(CodecError::invalid("seq", "must be at least 1; seqs are contiguous from 1 per session"));
    }
    let ty = event.r#type;
    let known = DURABLE_TYPES.contains(&ty.as_str());
    let payload = match event.payload {
        Some(payload) if known => {
            let actual = payload_type(&payload);
            if actual != ty {
                return Err(CodecError::invalid(
                    "type",
                    format!("is {ty:?} but the payload is {actual:?}; write the type of the payload variant"),
                ));
            }
            decode_payload(payload)?
        }
        _ if event.ignorable => EventPayload::Ignorable { event_type: ty },
        None if known => {
            return Err(CodecError::missing(
                "payload",
                &format!("set the payload of {ty:?}, or mark the event ignorable"),
            ));
        }
        _ => {
            return Err(CodecError::invalid(
                "type",
                format!(
                    "{ty:?} is not a durable type this build knows and the event is not marked ignorable; \
                     upgrade the reader, or mark the event ignorable if readers may skip it"
                ),
            ));
        }
    };
    Ok(Envelope { session, seq: event.seq, time_ms: event.time_unix_ms, epoch: event.epoch, payload })
}

/// A stored event in the form readers send it on (a Watch's history): exactly what
/// `encode_session_event(&decode_session_event(event)?)` makes of it, without the round trip when that is
/// the event itself. An event of [`EVENT_FORMAT`] whose `type` this build knows and whose payload is that
/// type's was encoded by this codec from a decoded event, so it goes out as it is; anything else (an older
/// or newer format, an ignorable or unknown type) takes the round trip, whose rules it needs. Values are
/// not checked again on the first path: the journal checked them before it stored the event (the append's
/// decode check), and the fold checks them on every read that folds.
pub fn stored_as_sent(event: pb::SessionEvent) -> Result<pb::SessionEvent, CodecError> {
    let as_stored = event.format == EVENT_FORMAT
        && !event.ignorable
        && event.seq != 0
        && event.session.is_some()
        && event.payload.as_ref().is_some_and(|p| payload_type(p) == event.r#type)
        // A `tool/call` stored before idempotency keys existed gets its key from the round trip.
        && !matches!(&event.payload, Some(Payload::ToolCall(c)) if c.idempotency_key.is_empty());
    if as_stored { Ok(event) } else { Ok(encode_session_event(&decode_session_event(event)?)) }
}

/// The bytes the journal stores for a durable event (prost encoding of `SessionEvent`).
pub fn encode_event(event: &Envelope) -> Vec<u8> {
    encode_session_event(event).encode_to_vec()
}

/// The inverse of [`encode_event`].
pub fn decode_event(bytes: &[u8]) -> Result<Envelope, CodecError> {
    let event = pb::SessionEvent::decode(bytes)
        .map_err(|e| CodecError::Malformed { what: "SessionEvent", detail: e.to_string() })?;
    decode_session_event(event)
}

/// A transcript item of `GetTranscript` (SPEC §21): its event's own message where it has one.
pub fn encode_transcript_item(item: &TranscriptItem) -> pb::TranscriptItem {
    use pb::transcript_item::Item;
    let body = match &item.kind {
        ItemKind::User { message, delivery } => Some(Item::User(pb::TranscriptUserMessage {
            message: Some(encode_user_message(message)),
            delivery: delivery.map_or(pb::DeliveryKind::Unspecified, encode_delivery).into(),
        })),
        ItemKind::Assistant(payload) => match encode_payload(payload) {
            Some(Payload::AssistantMessage(m)) => Some(Item::Assistant(m)),
            _ => None,
        },
        // A transcript item names no session; its `tool/call` event carries the key.
        ItemKind::ToolCall { call, awaiting_approval, awaiting_client } => {
            Some(Item::ToolCall(encode_tool_call((item.turn, item.step), call, *awaiting_approval, *awaiting_client)))
        }
        ItemKind::ToolDecision { call_id, approved, reason, timed_out } => Some(Item::ToolDecision(pb::ToolDecision {
            turn: item.turn,
            step: item.step,
            call_id: call_id.clone(),
            approved: *approved,
            reason: reason.clone(),
            timed_out: *timed_out,
        })),
        ItemKind::ToolResult { call_id, name, output, error } => Some(Item::ToolResult(pb::TranscriptToolResult {
            turn: item.turn,
            step: item.step,
            call_id: call_id.clone(),
            name: name.clone(),
            output: output.clone(),
            error: error.clone(),
        })),
        ItemKind::TurnEnd { reason, usage } => Some(Item::TurnEnd(pb::TranscriptTurnEnd {
            reason: Some(encode_turn_end_reason(reason)),
            usage: Some(encode_usage(usage)),
        })),
    };
    pb::TranscriptItem { seq: item.seq, time_unix_ms: item.time_ms, turn: item.turn, step: item.step, item: body }
}

fn encode_delivery(preset: Preset) -> pb::DeliveryKind {
    match preset {
        Preset::Followup => pb::DeliveryKind::Followup,
        Preset::Queue => pb::DeliveryKind::Queue,
        Preset::Steer => pb::DeliveryKind::Steer,
        Preset::Inject => pb::DeliveryKind::Inject,
    }
}

fn encode_transcript_entry(entry: &TranscriptEntry) -> pb::TranscriptEntry {
    use pb::transcript_entry::Entry;
    let entry = match entry {
        TranscriptEntry::User { turn, step, message } => {
            Entry::User(pb::UserMessageEvent { message: Some(encode_user_message(message)), turn: *turn, step: *step })
        }
        TranscriptEntry::Assistant { turn, step, text, tool_calls, interrupted } => {
            Entry::Assistant(pb::AssistantMessage {
                turn: *turn,
                step: *step,
                text: text.clone(),
                tool_calls: tool_calls.iter().map(encode_tool_call_spec).collect(),
                interrupted: *interrupted,
                ..pb::AssistantMessage::default()
            })
        }
        TranscriptEntry::ToolResult { turn, step, call_id, name, output, error } => {
            Entry::ToolResult(pb::TranscriptToolResult {
                turn: *turn,
                step: *step,
                call_id: call_id.clone(),
                name: name.clone(),
                output: output.clone(),
                error: error.clone(),
            })
        }
    };
    pb::TranscriptEntry { entry: Some(entry) }
}

fn transcript_entry_at(entry: pb::TranscriptEntry, path: &str) -> Result<TranscriptEntry, CodecError> {
    use pb::transcript_entry::Entry;
    Ok(match entry.entry.ok_or_else(|| CodecError::missing(path, "user, assistant or tool_result"))? {
        Entry::User(u) => TranscriptEntry::User {
            turn: u.turn,
            step: u.step,
            message: required_message_at(u.message, "user.message").map_err(|e| e.under(path))?,
        },
        Entry::Assistant(a) => TranscriptEntry::Assistant {
            turn: a.turn,
            step: a.step,
            text: a.text,
            tool_calls: decode_tool_calls(a.tool_calls),
            interrupted: a.interrupted,
        },
        Entry::ToolResult(r) => TranscriptEntry::ToolResult {
            turn: r.turn,
            step: r.step,
            call_id: r.call_id,
            name: r.name,
            output: r.output,
            error: r.error,
        },
    })
}

/// The protobuf form of a `session/forked` payload (also what `ForkCommand` carries between nodes).
pub fn encode_fork(f: &Fork) -> pb::SessionForked {
    pb::SessionForked {
        from: Some(encode_session_ref(&f.from)),
        at_turn: f.at_turn,
        at_seq: f.at_seq,
        agent: f.agent.clone(),
        compacted: f.compacted.as_ref().map(encode_compaction),
        transcript: f.transcript.iter().map(encode_transcript_entry).collect(),
    }
}

/// The inverse of [`encode_fork`]; `path` names the message in errors.
pub fn fork_at(f: pb::SessionForked, path: &str) -> Result<Fork, CodecError> {
    let transcript = f
        .transcript
        .into_iter()
        .enumerate()
        .map(|(i, e)| transcript_entry_at(e, &format!("{path}.transcript[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    if f.at_turn == 0 {
        return Err(CodecError::invalid(join(path, "at_turn"), "is 0; a fork copies at least turn 1"));
    }
    Ok(Fork {
        from: required_session_at(f.from, &join(path, "from"))?,
        at_turn: f.at_turn,
        at_seq: f.at_seq,
        agent: f.agent,
        compacted: f.compacted.map(|c| compaction_at(c, &join(path, "compacted"))).transpose()?,
        transcript,
    })
}
