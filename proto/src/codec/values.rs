//! The small values events carry (SPEC §5): a session's status, why a turn was cancelled or how it ended,
//! how a message is injected, an inbox splice and its outcome, what a steer deadline does, tool calls.

use crate::v1 as pb;
use crate::v1::{cancel_cause::Cause, turn_end_reason::Reason};

use super::error::{CodecError, join};
use super::message::{encode_target, encode_user_message, messages_at, optional_target_at, target_at};
use turnstile_model::event::{
    CancelCause, InjectMode, OnDeadline, RepairAction, Splice, SpliceOutcome, Status, SteerDeadline, ToolCallSpec,
    TurnEndReason,
};

pub(crate) const STATUSES: &str = "use SESSION_STATUS_IDLE or SESSION_STATUS_RUNNING";
pub(crate) const CAUSES: &str = "set one of user, parent, hook or disposed";
pub(crate) const REASONS: &str = "set one of completed, blocked, max_tokens, aborted, error or interrupted";

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

pub(crate) fn cancel_cause_at(cause: pb::CancelCause, path: &str) -> Result<CancelCause, CodecError> {
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

const REPAIR_ACTIONS: &str = "use REPAIR_ACTION_INTERRUPTED or REPAIR_ACTION_RETRIED";

pub(crate) fn encode_repair_action(action: RepairAction) -> pb::RepairAction {
    match action {
        RepairAction::Interrupted => pb::RepairAction::Interrupted,
        RepairAction::Retried => pb::RepairAction::Retried,
    }
}

pub(crate) fn repair_action_at(raw: i32, path: &str) -> Result<RepairAction, CodecError> {
    match pb::RepairAction::try_from(raw) {
        Ok(pb::RepairAction::Interrupted) => Ok(RepairAction::Interrupted),
        Ok(pb::RepairAction::Retried) => Ok(RepairAction::Retried),
        Ok(pb::RepairAction::Unspecified) => {
            Err(CodecError::invalid(path, format!("REPAIR_ACTION_UNSPECIFIED is not an action; {REPAIR_ACTIONS}")))
        }
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a known repair action; {REPAIR_ACTIONS}"))),
    }
}

pub(crate) fn turn_end_reason_at(reason: pb::TurnEndReason, path: &str) -> Result<TurnEndReason, CodecError> {
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

pub(crate) const INJECT_MODES: &str = "use INJECT_MODE_PENDING or INJECT_MODE_OUT_OF_TURN";

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

pub(crate) fn encode_outcome(outcome: SpliceOutcome) -> pb::SpliceOutcome {
    match outcome {
        SpliceOutcome::None => pb::SpliceOutcome::None,
        SpliceOutcome::Canceled => pb::SpliceOutcome::Canceled,
        SpliceOutcome::Restored => pb::SpliceOutcome::Restored,
    }
}

pub(crate) fn outcome_at(raw: i32, path: &str) -> Result<SpliceOutcome, CodecError> {
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

pub(crate) fn splice_at(splice: pb::InboxSpliced, path: &str) -> Result<Splice, CodecError> {
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

pub(crate) fn decode_tool_calls(calls: Vec<pb::ToolCallSpec>) -> Vec<ToolCallSpec> {
    calls.into_iter().map(|c| ToolCallSpec { call_id: c.call_id, name: c.name, arguments: c.arguments }).collect()
}

pub(crate) fn encode_tool_call_spec(call: &ToolCallSpec) -> pb::ToolCallSpec {
    pb::ToolCallSpec { call_id: call.call_id.clone(), name: call.name.clone(), arguments: call.arguments.clone() }
}
