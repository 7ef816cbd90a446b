//! Durable events (SPEC §5): `Envelope` ↔ `SessionEvent`, and their parts.

use crate::v1 as pb;
use crate::v1::{cancel_cause::Cause, session_event::Payload, turn_end_reason::Reason};
use prost::Message as _;

use super::error::{CodecError, join};
use super::message::{
    encode_session_ref, encode_target, encode_user_message, messages_at, optional_target_at, required_message_at,
    required_session_at, session_ref_at, target_at,
};
use turnstile_model::event::{
    CancelCause, Compaction, DURABLE_TYPES, Envelope, EventPayload, Fork, IGNORABLE_TYPES, InjectMode, ModelRef,
    OnDeadline, Spent, Splice, SpliceOutcome, Status, SteerDeadline, ToolCallSpec, TurnEndReason, Usage,
};
use turnstile_model::goal::{GoalChange, GoalState, MAX_GOAL_ID_LEN};
use turnstile_model::memory::MemoryWritten;
use turnstile_model::schedule::Preset;
use turnstile_model::transcript::TranscriptEntry;
use turnstile_model::transcript_items::{ItemKind, TranscriptItem};

const STATUSES: &str = "use SESSION_STATUS_IDLE or SESSION_STATUS_RUNNING";
const CAUSES: &str = "set one of user, parent, hook or disposed";
const REASONS: &str = "set one of completed, blocked, max_tokens, aborted, error or interrupted";

pub fn encode_status(status: Status) -> pb::SessionStatus {
    match status {
        Status::Idle => pb::SessionStatus::Idle,
        Status::Running => pb::SessionStatus::Running,
    }
}

/// Decodes a status enum value (path `status`); `SESSION_STATUS_UNSPECIFIED` is refused.
pub fn decode_status(raw: i32) -> Result<Status, CodecError> {
    status_at(raw, "status")
}

pub fn status_at(raw: i32, path: &str) -> Result<Status, CodecError> {
    match pb::SessionStatus::try_from(raw) {
        Ok(pb::SessionStatus::Idle) => Ok(Status::Idle),
        Ok(pb::SessionStatus::Running) => Ok(Status::Running),
        Ok(pb::SessionStatus::Unspecified) => {
            Err(CodecError::invalid(path, format!("SESSION_STATUS_UNSPECIFIED is not a status; {STATUSES}")))
        }
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a known status; {STATUSES}"))),
    }
}

pub fn encode_cancel_cause(cause: &CancelCause) -> pb::CancelCause {
    let cause = match cause {
        CancelCause::User => Cause::User(pb::Empty {}),
        CancelCause::Parent => Cause::Parent(pb::Empty {}),
        CancelCause::Hook { reason } => Cause::Hook(pb::HookCause { reason: reason.clone() }),
        CancelCause::Disposed => Cause::Disposed(pb::Empty {}),
        CancelCause::SteerDeadline => Cause::SteerDeadline(pb::Empty {}),
    };
    pb::CancelCause { cause: Some(cause) }
}

/// Decodes a cancel cause (path `cause`).
pub fn decode_cancel_cause(cause: pb::CancelCause) -> Result<CancelCause, CodecError> {
    cancel_cause_at(cause, "cause")
}

fn cancel_cause_at(cause: pb::CancelCause, path: &str) -> Result<CancelCause, CodecError> {
    match cause.cause {
        Some(Cause::User(_)) => Ok(CancelCause::User),
        Some(Cause::Parent(_)) => Ok(CancelCause::Parent),
        Some(Cause::Hook(h)) => Ok(CancelCause::Hook { reason: h.reason }),
        Some(Cause::Disposed(_)) => Ok(CancelCause::Disposed),
        Some(Cause::SteerDeadline(_)) => Ok(CancelCause::SteerDeadline),
        None => Err(CodecError::invalid(path, format!("cancel cause has no kind; {CAUSES}"))),
    }
}

pub fn encode_turn_end_reason(reason: &TurnEndReason) -> pb::TurnEndReason {
    let reason = match reason {
        TurnEndReason::Completed => Reason::Completed(pb::Empty {}),
        TurnEndReason::Blocked { reason } => Reason::Blocked(pb::TurnBlocked { reason: reason.clone() }),
        TurnEndReason::MaxTokens => Reason::MaxTokens(pb::Empty {}),
        TurnEndReason::Aborted(cause) => Reason::Aborted(encode_cancel_cause(cause)),
        TurnEndReason::Error { message, code } => {
            Reason::Error(pb::TurnError { message: message.clone(), code: code.clone() })
        }
        TurnEndReason::Interrupted => Reason::Interrupted(pb::Empty {}),
    };
    pb::TurnEndReason { reason: Some(reason) }
}

/// Decodes a turn-end reason (path `reason`).
pub fn decode_turn_end_reason(reason: pb::TurnEndReason) -> Result<TurnEndReason, CodecError> {
    turn_end_reason_at(reason, "reason")
}

fn turn_end_reason_at(reason: pb::TurnEndReason, path: &str) -> Result<TurnEndReason, CodecError> {
    match reason.reason {
        Some(Reason::Completed(_)) => Ok(TurnEndReason::Completed),
        Some(Reason::Blocked(b)) => Ok(TurnEndReason::Blocked { reason: b.reason }),
        Some(Reason::MaxTokens(_)) => Ok(TurnEndReason::MaxTokens),
        Some(Reason::Aborted(cause)) => Ok(TurnEndReason::Aborted(cancel_cause_at(cause, &join(path, "aborted"))?)),
        Some(Reason::Error(e)) => Ok(TurnEndReason::Error { message: e.message, code: e.code }),
        Some(Reason::Interrupted(_)) => Ok(TurnEndReason::Interrupted),
        None => Err(CodecError::invalid(path, format!("turn-end reason has no kind; {REASONS}"))),
    }
}

const INJECT_MODES: &str = "use INJECT_MODE_PENDING or INJECT_MODE_OUT_OF_TURN";

pub fn encode_inject_mode(mode: InjectMode) -> pb::InjectMode {
    match mode {
        InjectMode::Pending => pb::InjectMode::Pending,
        InjectMode::OutOfTurn => pb::InjectMode::OutOfTurn,
    }
}

/// Decodes an inject mode at `path`. `unspecified` is what `INJECT_MODE_UNSPECIFIED` means there: a
/// request may leave the mode to its default, a stored event must name one (`None` refuses it).
pub fn inject_mode_at(raw: i32, path: &str, unspecified: Option<InjectMode>) -> Result<InjectMode, CodecError> {
    match pb::InjectMode::try_from(raw) {
        Ok(pb::InjectMode::Pending) => Ok(InjectMode::Pending),
        Ok(pb::InjectMode::OutOfTurn) => Ok(InjectMode::OutOfTurn),
        Ok(pb::InjectMode::Unspecified) => unspecified.ok_or_else(|| {
            CodecError::invalid(path, format!("INJECT_MODE_UNSPECIFIED is not an inject mode; {INJECT_MODES}"))
        }),
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a known inject mode; {INJECT_MODES}"))),
    }
}

fn encode_outcome(outcome: SpliceOutcome) -> pb::SpliceOutcome {
    match outcome {
        SpliceOutcome::None => pb::SpliceOutcome::None,
        SpliceOutcome::Canceled => pb::SpliceOutcome::Canceled,
        SpliceOutcome::Restored => pb::SpliceOutcome::Restored,
    }
}

fn outcome_at(raw: i32, path: &str) -> Result<SpliceOutcome, CodecError> {
    match pb::SpliceOutcome::try_from(raw) {
        Ok(pb::SpliceOutcome::None) => Ok(SpliceOutcome::None),
        Ok(pb::SpliceOutcome::Canceled) => Ok(SpliceOutcome::Canceled),
        Ok(pb::SpliceOutcome::Restored) => Ok(SpliceOutcome::Restored),
        Err(_) => Err(CodecError::invalid(
            path,
            format!("{raw} is not a known splice outcome; use SPLICE_OUTCOME_NONE, _CANCELED or _RESTORED"),
        )),
    }
}

pub fn encode_splice(splice: &Splice) -> pb::InboxSpliced {
    pb::InboxSpliced {
        target: encode_target(splice.target).into(),
        start: splice.start,
        removed_count: splice.removed_count,
        inserted: splice.inserted.iter().map(encode_user_message).collect(),
        outcome: encode_outcome(splice.outcome).into(),
        wake: splice.wake,
        requested_target: splice.requested_target.map_or(pb::Target::Unspecified, encode_target).into(),
        deadline: splice
            .deadline
            .map(|d| pb::SteerDeadline { at_unix_ms: d.at_ms, on_deadline: encode_on_deadline(d.on_deadline).into() }),
    }
}

pub fn encode_on_deadline(on_deadline: OnDeadline) -> pb::OnDeadline {
    match on_deadline {
        OnDeadline::Interrupt => pb::OnDeadline::Interrupt,
        OnDeadline::Drop => pb::OnDeadline::Drop,
    }
}

/// `on_deadline` at `path`; UNSPECIFIED is `default` when one is given (a request), else an error (a
/// stored event always names it).
pub fn on_deadline_at(raw: i32, path: &str, default: Option<OnDeadline>) -> Result<OnDeadline, CodecError> {
    match pb::OnDeadline::try_from(raw) {
        Ok(pb::OnDeadline::Interrupt) => Ok(OnDeadline::Interrupt),
        Ok(pb::OnDeadline::Drop) => Ok(OnDeadline::Drop),
        Ok(pb::OnDeadline::Unspecified) => {
            default.ok_or_else(|| CodecError::invalid(path, "is unspecified; set INTERRUPT or DROP"))
        }
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not an OnDeadline; use INTERRUPT or DROP"))),
    }
}

/// Decodes a splice (path `inbox_spliced`). Whether it applies to an inbox is the fold's business.
pub fn decode_splice(splice: pb::InboxSpliced) -> Result<Splice, CodecError> {
    splice_at(splice, "inbox_spliced")
}

fn splice_at(splice: pb::InboxSpliced, path: &str) -> Result<Splice, CodecError> {
    // Field paths relative to the splice, rebased onto `path` only on an error: splices are the most
    // common event, and a path built up front is an allocation per field per event read.
    let under = |e: CodecError| e.under(path);
    Ok(Splice {
        target: target_at(splice.target, "target").map_err(under)?,
        start: splice.start,
        removed_count: splice.removed_count,
        inserted: messages_at(splice.inserted, "inserted").map_err(under)?,
        outcome: outcome_at(splice.outcome, "outcome").map_err(under)?,
        wake: splice.wake,
        requested_target: optional_target_at(splice.requested_target, "requested_target").map_err(under)?,
        deadline: match splice.deadline {
            None => None,
            Some(d) => Some(SteerDeadline {
                at_ms: d.at_unix_ms,
                on_deadline: on_deadline_at(d.on_deadline, "deadline.on_deadline", None).map_err(under)?,
            }),
        },
    })
}

fn decode_tool_calls(calls: Vec<pb::ToolCallSpec>) -> Vec<ToolCallSpec> {
    calls.into_iter().map(|c| ToolCallSpec { call_id: c.call_id, name: c.name, arguments: c.arguments }).collect()
}

fn encode_tool_call_spec(call: &ToolCallSpec) -> pb::ToolCallSpec {
    pb::ToolCallSpec { call_id: call.call_id.clone(), name: call.name.clone(), arguments: call.arguments.clone() }
}

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
        EventPayload::ToolCall { turn, step, call, awaiting_approval, awaiting_client } => {
            Payload::ToolCall(pb::ToolCall {
                turn: *turn,
                step: *step,
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                awaiting_approval: *awaiting_approval,
                awaiting_client: *awaiting_client,
            })
        }
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
        // An event this build does not understand has no payload it could write.
        EventPayload::Ignorable { .. } => return None,
    })
}

/// The durable type a payload variant stands for.
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
        Payload::MemoryWritten(_) => "memory/written",
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

fn encode_compaction(c: &Compaction) -> pb::ContextCompacted {
    pb::ContextCompacted {
        upto_turn: c.upto_turn,
        summary: c.summary.clone(),
        summarized_turns: c.summarized_turns,
        from_turn: c.from_turn,
    }
}

fn compaction_at(c: pb::ContextCompacted, path: &str) -> Result<Compaction, CodecError> {
    if c.upto_turn == 0 {
        return Err(CodecError::invalid(join(path, "upto_turn"), "is 0; a compaction covers at least turn 1"));
    }
    if c.from_turn > c.upto_turn {
        return Err(CodecError::invalid(join(path, "from_turn"), "is after upto_turn"));
    }
    Ok(Compaction {
        upto_turn: c.upto_turn,
        from_turn: c.from_turn,
        summary: c.summary,
        summarized_turns: c.summarized_turns,
    })
}

fn encode_model_ref(m: &ModelRef) -> pb::ModelRef {
    pb::ModelRef { provider: m.provider.clone(), model: m.model.clone() }
}

fn decode_model_ref(m: pb::ModelRef) -> ModelRef {
    ModelRef { provider: m.provider, model: m.model }
}

/// A model request's token usage on the wire.
pub fn encode_usage(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_input_tokens: u.cached_input_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
}

/// [`encode_usage`]'s inverse; fields a writer before SPEC §17 did not set read as 0.
pub fn decode_usage(u: pb::Usage) -> Usage {
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_input_tokens: u.cached_input_tokens,
        cache_write_tokens: u.cache_write_tokens,
    }
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
        ItemKind::ToolCall { call, awaiting_approval, awaiting_client } => Some(Item::ToolCall(pb::ToolCall {
            turn: item.turn,
            step: item.step,
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            awaiting_approval: *awaiting_approval,
            awaiting_client: *awaiting_client,
        })),
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
        other => (other.event_type().to_owned(), IGNORABLE_TYPES.contains(&other.event_type())),
    };
    pb::SessionEvent {
        session: Some(encode_session_ref(&event.session)),
        seq: event.seq,
        time_unix_ms: event.time_ms,
        epoch: event.epoch,
        r#type: ty,
        ignorable,
        format: EVENT_FORMAT,
        payload: encode_payload(&event.payload),
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
        && event.payload.as_ref().is_some_and(|p| payload_type(p) == event.r#type);
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

fn goal_change(g: pb::GoalChange) -> Result<GoalChange, CodecError> {
    if g.goal_id.is_empty() || g.goal_id.len() > MAX_GOAL_ID_LEN {
        return Err(CodecError::invalid(
            "goal_change.goal_id",
            format!("must be 1–{MAX_GOAL_ID_LEN} bytes (got {})", g.goal_id.len()),
        ));
    }
    if g.revision == 0 {
        return Err(CodecError::invalid("goal_change.revision", "is 0; revisions start at 1"));
    }
    if g.max_rounds == 0 {
        return Err(CodecError::invalid("goal_change.max_rounds", "is 0; a goal runs at least one round"));
    }
    let Some(state) = GoalState::parse(&g.state) else {
        return Err(CodecError::invalid(
            "goal_change.state",
            format!("`{}` is not a goal state (active, paused, completed, budget-limited, cleared)", g.state),
        ));
    };
    Ok(GoalChange {
        goal_id: g.goal_id,
        revision: g.revision,
        state,
        objective: g.objective,
        max_rounds: g.max_rounds,
        round: g.round,
        summary: g.summary,
        reason: g.reason,
    })
}
