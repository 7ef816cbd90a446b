//! Domain ↔ protobuf mapping of events, live events and inbox snapshots.
//!
//! The gateway encodes what it reads from the log; clients (the CLI) decode what `Watch` streams back
//! into the journal's domain types, which derive `Serialize` for `--json` output.

use turnstile_journal::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};
use turnstile_journal::{
    CancelCause, Envelope, EventPayload, Inbox, LiveEvent, LivePayload, Splice, SpliceOutcome, Status, ToolCallSpec,
    TurnEndReason,
};
use turnstile_proto::v1 as pb;

/// A streamed item that a client cannot map to the domain model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct DecodeError {
    pub field: String,
    pub detail: String,
}

fn bad(field: &str, detail: impl Into<String>) -> DecodeError {
    DecodeError { field: field.to_owned(), detail: detail.into() }
}

pub fn encode_session(s: &SessionRef) -> pb::SessionRef {
    pb::SessionRef { tenant: s.tenant.clone(), id: s.id.clone() }
}

pub fn encode_message(m: &UserMessage) -> pb::UserMessage {
    use pb::message_source::Kind;
    let content = m
        .content
        .iter()
        .map(|b| pb::ContentBlock {
            block: Some(match b {
                ContentBlock::Text { text } => pb::content_block::Block::Text(pb::TextBlock { text: text.clone() }),
                ContentBlock::Data { mime, bytes } => {
                    pb::content_block::Block::Data(pb::DataBlock { mime: mime.clone(), bytes: bytes.clone() })
                }
            }),
        })
        .collect();
    let kind = match &m.source {
        MessageSource::User => Kind::User(pb::UserSource {}),
        MessageSource::Plugin { plugin, form } => {
            Kind::Plugin(pb::PluginSource { plugin: plugin.clone(), form: form.clone().unwrap_or_default() })
        }
        MessageSource::Goal { goal_id, revision, round } => {
            Kind::Goal(pb::GoalSource { goal_id: goal_id.clone(), revision: *revision, round: *round })
        }
        MessageSource::Tool { call_id } => Kind::Tool(pb::ToolSource { call_id: call_id.clone() }),
        MessageSource::Model { provider, model } => {
            Kind::Model(pb::ModelSource { provider: provider.clone(), model: model.clone() })
        }
    };
    pb::UserMessage { id: m.id.0.clone(), content, source: Some(pb::MessageSource { kind: Some(kind) }) }
}

pub fn encode_target(t: Target) -> pb::Target {
    match t {
        Target::NextTurn => pb::Target::NextTurn,
        Target::NextStep => pb::Target::NextStep,
    }
}

pub fn encode_status(s: Status) -> pb::SessionStatus {
    match s {
        Status::Idle => pb::SessionStatus::Idle,
        Status::Running => pb::SessionStatus::Running,
    }
}

pub fn encode_cause(c: &CancelCause) -> pb::CancelCause {
    use pb::cancel_cause::Cause;
    let cause = match c {
        CancelCause::User => Cause::User(pb::Empty {}),
        CancelCause::Parent => Cause::Parent(pb::Empty {}),
        CancelCause::Hook { reason } => Cause::Hook(pb::HookCause { reason: reason.clone() }),
        CancelCause::Disposed => Cause::Disposed(pb::Empty {}),
    };
    pb::CancelCause { cause: Some(cause) }
}

fn encode_reason(r: &TurnEndReason) -> pb::TurnEndReason {
    use pb::turn_end_reason::Reason;
    let reason = match r {
        TurnEndReason::Completed => Reason::Completed(pb::Empty {}),
        TurnEndReason::Blocked => Reason::Blocked(pb::Empty {}),
        TurnEndReason::MaxTokens => Reason::MaxTokens(pb::Empty {}),
        TurnEndReason::Aborted(c) => Reason::Aborted(encode_cause(c)),
        TurnEndReason::Error { message, code } => {
            Reason::Error(pb::TurnError { message: message.clone(), code: code.clone() })
        }
        TurnEndReason::Interrupted => Reason::Interrupted(pb::Empty {}),
    };
    pb::TurnEndReason { reason: Some(reason) }
}

fn encode_splice(s: &Splice) -> pb::InboxSpliced {
    pb::InboxSpliced {
        target: encode_target(s.target) as i32,
        start: s.start,
        removed_count: s.removed_count,
        inserted: s.inserted.iter().map(encode_message).collect(),
        outcome: match s.outcome {
            SpliceOutcome::None => pb::SpliceOutcome::None,
            SpliceOutcome::Canceled => pb::SpliceOutcome::Canceled,
            SpliceOutcome::Restored => pb::SpliceOutcome::Restored,
        } as i32,
        wake: s.wake,
        requested_target: s.requested_target.map_or(pb::Target::Unspecified, encode_target) as i32,
    }
}

/// A durable event as `Watch` streams it.
pub fn encode_event(e: &Envelope) -> pb::SessionEvent {
    use pb::session_event::Payload as P;
    let (event_type, ignorable, payload) = match &e.payload {
        EventPayload::Ignorable { event_type } => (event_type.clone(), true, None),
        other => (other.event_type().to_owned(), false, Some(encode_payload(other))),
    };
    fn encode_payload(p: &EventPayload) -> P {
        match p {
            EventPayload::InboxSpliced(s) => P::InboxSpliced(encode_splice(s)),
            EventPayload::Status(s) => P::Status(pb::StatusChanged { status: encode_status(*s) as i32 }),
            EventPayload::TurnStart { turn } => P::TurnStart(pb::TurnStart { turn: *turn }),
            EventPayload::TurnEnd { turn, reason } => {
                P::TurnEnd(pb::TurnEnd { turn: *turn, reason: Some(encode_reason(reason)) })
            }
            EventPayload::StepStart { turn, step } => P::StepStart(pb::StepStart { turn: *turn, step: *step }),
            EventPayload::StepEnd { turn, step } => P::StepEnd(pb::StepEnd { turn: *turn, step: *step }),
            EventPayload::UserMessage { message, turn, step } => P::UserMessage(pb::UserMessageEvent {
                message: Some(encode_message(message)),
                turn: *turn,
                step: *step,
            }),
            EventPayload::AssistantMessage { turn, step, text, tool_calls, interrupted, max_tokens } => {
                P::AssistantMessage(pb::AssistantMessage {
                    turn: *turn,
                    step: *step,
                    text: text.clone(),
                    tool_calls: tool_calls
                        .iter()
                        .map(|c| pb::ToolCallSpec {
                            call_id: c.call_id.clone(),
                            name: c.name.clone(),
                            arguments: c.arguments.clone(),
                        })
                        .collect(),
                    interrupted: *interrupted,
                    max_tokens: *max_tokens,
                })
            }
            EventPayload::ToolCall { turn, step, call } => P::ToolCall(pb::ToolCall {
                turn: *turn,
                step: *step,
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }),
            EventPayload::ToolResult { turn, step, call_id, output, error } => P::ToolResult(pb::ToolResult {
                turn: *turn,
                step: *step,
                call_id: call_id.clone(),
                output: output.clone(),
                error: error.clone(),
            }),
            EventPayload::GoalChange { goal_id, revision, state, detail } => P::GoalChange(pb::GoalChange {
                goal_id: goal_id.clone(),
                revision: *revision,
                state: state.clone(),
                detail: detail.clone(),
            }),
            // Handled by the caller: an ignorable event carries no payload.
            EventPayload::Ignorable { .. } => P::Status(pb::StatusChanged { status: 0 }),
        }
    }
    pb::SessionEvent {
        session: Some(encode_session(&e.session)),
        seq: e.seq,
        time_unix_ms: e.time_ms,
        epoch: e.epoch,
        r#type: event_type,
        ignorable,
        payload,
    }
}

/// A live event as `Watch` streams it.
pub fn encode_live(e: &LiveEvent) -> pb::LiveEvent {
    use pb::live_event::Payload as P;
    let payload = match &e.payload {
        LivePayload::Inserted { message } => P::Inserted(pb::Inserted { message: Some(encode_message(message)) }),
        LivePayload::Discarded { message } => P::Discarded(pb::Discarded { message: Some(encode_message(message)) }),
        LivePayload::Claimed { message, turn } => {
            P::Claimed(pb::Claimed { message: Some(encode_message(message)), turn: *turn })
        }
        LivePayload::Status { status } => P::Status(pb::StatusChanged { status: encode_status(*status) as i32 }),
        LivePayload::AssistantDelta { turn, step, text } => {
            P::AssistantDelta(pb::AssistantDelta { turn: *turn, step: *step, text: text.clone() })
        }
        LivePayload::Error { turn, step, message } => {
            P::Error(pb::AgentError { turn: *turn, step: *step, message: message.clone() })
        }
    };
    pb::LiveEvent {
        session: Some(encode_session(&e.session)),
        after_seq: e.after_seq,
        r#type: e.event_type().to_owned(),
        payload: Some(payload),
    }
}

/// The inbox projection at `seq`.
pub fn encode_inbox(inbox: &Inbox, seq: u64) -> pb::InboxSnapshot {
    pb::InboxSnapshot {
        seq,
        next_turn: inbox.next_turn.iter().map(encode_message).collect(),
        next_step: inbox.next_step.iter().map(encode_message).collect(),
    }
}

// ---- decoding, for clients ----

pub fn decode_session(field: &str, s: Option<pb::SessionRef>) -> Result<SessionRef, DecodeError> {
    let s = s.ok_or_else(|| bad(field, "missing"))?;
    Ok(SessionRef { tenant: s.tenant, id: s.id })
}

/// A message as the server sent it. Unlike request decoding, nothing is validated: the server's
/// values are shown as they are.
pub fn decode_message(field: &str, m: Option<pb::UserMessage>) -> Result<UserMessage, DecodeError> {
    use pb::message_source::Kind;
    let m = m.ok_or_else(|| bad(field, "missing"))?;
    let content = m
        .content
        .into_iter()
        .enumerate()
        .map(|(i, b)| match b.block {
            Some(pb::content_block::Block::Text(t)) => Ok(ContentBlock::Text { text: t.text }),
            Some(pb::content_block::Block::Data(d)) => Ok(ContentBlock::Data { mime: d.mime, bytes: d.bytes }),
            None => Err(bad(&format!("{field}.content[{i}]"), "empty block")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let source = match m.source.and_then(|s| s.kind) {
        None => return Err(bad(&format!("{field}.source"), "missing")),
        Some(Kind::User(_)) => MessageSource::User,
        Some(Kind::Plugin(p)) => {
            MessageSource::Plugin { plugin: p.plugin, form: (!p.form.is_empty()).then_some(p.form) }
        }
        Some(Kind::Goal(g)) => MessageSource::Goal { goal_id: g.goal_id, revision: g.revision, round: g.round },
        Some(Kind::Tool(t)) => MessageSource::Tool { call_id: t.call_id },
        Some(Kind::Model(m)) => MessageSource::Model { provider: m.provider, model: m.model },
    };
    Ok(UserMessage { id: MessageId(m.id), content, source })
}

fn decode_target(field: &str, raw: i32) -> Result<Target, DecodeError> {
    match pb::Target::try_from(raw) {
        Ok(pb::Target::NextTurn) => Ok(Target::NextTurn),
        Ok(pb::Target::NextStep) => Ok(Target::NextStep),
        _ => Err(bad(field, format!("unknown target {raw}"))),
    }
}

pub fn decode_status(field: &str, raw: i32) -> Result<Status, DecodeError> {
    match pb::SessionStatus::try_from(raw) {
        Ok(pb::SessionStatus::Idle) => Ok(Status::Idle),
        Ok(pb::SessionStatus::Running) => Ok(Status::Running),
        _ => Err(bad(field, format!("unknown status {raw}"))),
    }
}

fn decode_cause(field: &str, c: Option<pb::CancelCause>) -> Result<CancelCause, DecodeError> {
    use pb::cancel_cause::Cause;
    match c.and_then(|c| c.cause) {
        Some(Cause::User(_)) => Ok(CancelCause::User),
        Some(Cause::Parent(_)) => Ok(CancelCause::Parent),
        Some(Cause::Hook(h)) => Ok(CancelCause::Hook { reason: h.reason }),
        Some(Cause::Disposed(_)) => Ok(CancelCause::Disposed),
        None => Err(bad(field, "missing cause")),
    }
}

fn decode_reason(r: Option<pb::TurnEndReason>) -> Result<TurnEndReason, DecodeError> {
    use pb::turn_end_reason::Reason;
    match r.and_then(|r| r.reason) {
        Some(Reason::Completed(_)) => Ok(TurnEndReason::Completed),
        Some(Reason::Blocked(_)) => Ok(TurnEndReason::Blocked),
        Some(Reason::MaxTokens(_)) => Ok(TurnEndReason::MaxTokens),
        Some(Reason::Aborted(c)) => Ok(TurnEndReason::Aborted(decode_cause("turn_end.reason.aborted", Some(c))?)),
        Some(Reason::Error(e)) => Ok(TurnEndReason::Error { message: e.message, code: e.code }),
        Some(Reason::Interrupted(_)) => Ok(TurnEndReason::Interrupted),
        None => Err(bad("turn_end.reason", "missing")),
    }
}

/// A durable event from `Watch`.
pub fn decode_event(e: pb::SessionEvent) -> Result<Envelope, DecodeError> {
    use pb::session_event::Payload as P;
    let session = decode_session("event.session", e.session)?;
    let payload = match e.payload {
        None if e.ignorable => EventPayload::Ignorable { event_type: e.r#type },
        None => return Err(bad("event.payload", format!("event {} of type {:?} has no payload", e.seq, e.r#type))),
        Some(P::InboxSpliced(s)) => EventPayload::InboxSpliced(Splice {
            target: decode_target("inbox_spliced.target", s.target)?,
            start: s.start,
            removed_count: s.removed_count,
            inserted: s
                .inserted
                .into_iter()
                .enumerate()
                .map(|(i, m)| decode_message(&format!("inbox_spliced.inserted[{i}]"), Some(m)))
                .collect::<Result<_, _>>()?,
            outcome: match pb::SpliceOutcome::try_from(s.outcome) {
                Ok(pb::SpliceOutcome::Canceled) => SpliceOutcome::Canceled,
                Ok(pb::SpliceOutcome::Restored) => SpliceOutcome::Restored,
                _ => SpliceOutcome::None,
            },
            wake: s.wake,
            requested_target: decode_target("inbox_spliced.requested_target", s.requested_target).ok(),
        }),
        Some(P::Status(s)) => EventPayload::Status(decode_status("status.status", s.status)?),
        Some(P::TurnStart(t)) => EventPayload::TurnStart { turn: t.turn },
        Some(P::TurnEnd(t)) => EventPayload::TurnEnd { turn: t.turn, reason: decode_reason(t.reason)? },
        Some(P::StepStart(s)) => EventPayload::StepStart { turn: s.turn, step: s.step },
        Some(P::StepEnd(s)) => EventPayload::StepEnd { turn: s.turn, step: s.step },
        Some(P::UserMessage(u)) => EventPayload::UserMessage {
            message: decode_message("user_message.message", u.message)?,
            turn: u.turn,
            step: u.step,
        },
        Some(P::AssistantMessage(a)) => EventPayload::AssistantMessage {
            turn: a.turn,
            step: a.step,
            text: a.text,
            tool_calls: a
                .tool_calls
                .into_iter()
                .map(|c| ToolCallSpec { call_id: c.call_id, name: c.name, arguments: c.arguments })
                .collect(),
            interrupted: a.interrupted,
            max_tokens: a.max_tokens,
        },
        Some(P::ToolCall(c)) => EventPayload::ToolCall {
            turn: c.turn,
            step: c.step,
            call: ToolCallSpec { call_id: c.call_id, name: c.name, arguments: c.arguments },
        },
        Some(P::ToolResult(r)) => EventPayload::ToolResult {
            turn: r.turn,
            step: r.step,
            call_id: r.call_id,
            output: r.output,
            error: r.error,
        },
        Some(P::GoalChange(g)) => {
            EventPayload::GoalChange { goal_id: g.goal_id, revision: g.revision, state: g.state, detail: g.detail }
        }
    };
    Ok(Envelope { session, seq: e.seq, time_ms: e.time_unix_ms, epoch: e.epoch, payload })
}

/// A live event from `Watch`.
pub fn decode_live(e: pb::LiveEvent) -> Result<LiveEvent, DecodeError> {
    use pb::live_event::Payload as P;
    let session = decode_session("live.session", e.session)?;
    let payload = match e.payload {
        None => return Err(bad("live.payload", format!("live event of type {:?} has no payload", e.r#type))),
        Some(P::Inserted(i)) => LivePayload::Inserted { message: decode_message("inserted.message", i.message)? },
        Some(P::Discarded(d)) => LivePayload::Discarded { message: decode_message("discarded.message", d.message)? },
        Some(P::Claimed(c)) => {
            LivePayload::Claimed { message: decode_message("claimed.message", c.message)?, turn: c.turn }
        }
        Some(P::Status(s)) => LivePayload::Status { status: decode_status("status.status", s.status)? },
        Some(P::AssistantDelta(d)) => LivePayload::AssistantDelta { turn: d.turn, step: d.step, text: d.text },
        Some(P::Error(x)) => LivePayload::Error { turn: x.turn, step: x.step, message: x.message },
    };
    Ok(LiveEvent { session, after_seq: e.after_seq, payload })
}

/// An inbox snapshot from `GetInbox` or `caught_up`.
pub fn decode_inbox(s: pb::InboxSnapshot) -> Result<(u64, Inbox), DecodeError> {
    let list = |name: &str, ms: Vec<pb::UserMessage>| {
        ms.into_iter()
            .enumerate()
            .map(|(i, m)| decode_message(&format!("inbox.{name}[{i}]"), Some(m)))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok((s.seq, Inbox { next_turn: list("next_turn", s.next_turn)?, next_step: list("next_step", s.next_step)? }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn session() -> SessionRef {
        SessionRef { tenant: "acme".into(), id: "s1".into() }
    }

    fn envelope(seq: u64, payload: EventPayload) -> Envelope {
        Envelope { session: session(), seq, time_ms: 1000 + seq, epoch: 1, payload }
    }

    #[test]
    fn durable_events_survive_a_round_trip() {
        let m = UserMessage {
            id: MessageId("m1".into()),
            content: vec![ContentBlock::text("hi"), ContentBlock::Data { mime: "image/png".into(), bytes: vec![1, 2] }],
            source: MessageSource::Plugin { plugin: "mem".into(), form: Some("recall".into()) },
        };
        let events = [
            envelope(
                1,
                EventPayload::InboxSpliced(Splice {
                    target: Target::NextStep,
                    start: 0,
                    removed_count: 0,
                    inserted: vec![m.clone()],
                    outcome: SpliceOutcome::None,
                    wake: true,
                    requested_target: Some(Target::NextStep),
                }),
            ),
            envelope(2, EventPayload::Status(Status::Running)),
            envelope(
                3,
                EventPayload::TurnEnd {
                    turn: 1,
                    reason: TurnEndReason::Aborted(CancelCause::Hook { reason: "x".into() }),
                },
            ),
            envelope(4, EventPayload::UserMessage { message: m, turn: 1, step: 2 }),
            envelope(
                5,
                EventPayload::ToolResult {
                    turn: 1,
                    step: 1,
                    call_id: "c".into(),
                    output: String::new(),
                    error: Some("boom".into()),
                },
            ),
            envelope(6, EventPayload::Ignorable { event_type: "future/thing".into() }),
        ];
        for e in events {
            let wire = encode_event(&e);
            assert_eq!(wire.r#type, e.event_type().replace("ignorable", "future/thing"));
            assert_eq!(decode_event(wire).unwrap(), e);
        }
    }

    #[test]
    fn live_events_and_inboxes_survive_a_round_trip() {
        let live = LiveEvent {
            session: session(),
            after_seq: 9,
            payload: LivePayload::AssistantDelta { turn: 2, step: 1, text: "ec".into() },
        };
        assert_eq!(encode_live(&live).r#type, "assistant/delta");
        assert_eq!(decode_live(encode_live(&live)).unwrap(), live);
        let inbox = Inbox { next_turn: vec![UserMessage::user_text("a", "A")], next_step: vec![] };
        assert_eq!(decode_inbox(encode_inbox(&inbox, 4)).unwrap(), (4, inbox));
    }

    #[test]
    fn an_event_without_payload_is_refused_unless_ignorable() {
        let mut wire = encode_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
        wire.payload = None;
        let err = decode_event(wire).unwrap_err();
        assert!(err.to_string().contains("turn/start"), "{err}");
    }
}
