//! What a reader learns about a session (`SessionInfo`, `GoalInfo`): one mapping for the gateway's reads,
//! `WhenIdle` and the gateway → worker hop.

use crate::v1 as pb;
use turnstile_model::event::InjectMode;
use turnstile_model::goal::{GoalChange, GoalState, MAX_GOAL_ID_LEN};
use turnstile_model::message::SessionRef;
use turnstile_model::{GoalAction, SessionSummary};

use super::error::{CodecError, join};
use super::message::{encode_session_ref, session_ref_at};
use super::values::{encode_inject_mode, encode_status, inject_mode_at, status_at};

const GOAL_ACTIONS: &str = "use GOAL_ACTION_PAUSE, GOAL_ACTION_RESUME or GOAL_ACTION_CLEAR";

pub fn encode_goal_info(goal: &GoalChange) -> pb::GoalInfo {
    pb::GoalInfo {
        goal_id: goal.goal_id.clone(),
        revision: goal.revision,
        state: goal.state.as_str().to_owned(),
        objective: goal.objective.clone(),
        round: goal.round,
        max_rounds: goal.max_rounds,
        summary: goal.summary.clone(),
        reason: goal.reason.clone(),
    }
}

/// Decodes a `GoalInfo` at `path`, refusing a state that is not a goal state.
pub fn goal_info_at(info: pb::GoalInfo, path: &str) -> Result<GoalChange, CodecError> {
    if info.goal_id.is_empty() || info.goal_id.len() > MAX_GOAL_ID_LEN {
        return Err(CodecError::invalid(
            join(path, "goal_id"),
            format!("must be 1–{MAX_GOAL_ID_LEN} bytes (got {})", info.goal_id.len()),
        ));
    }
    let Some(state) = GoalState::parse(&info.state) else {
        return Err(CodecError::invalid(
            join(path, "state"),
            format!("`{}` is not a goal state (active, paused, completed, budget-limited, cleared)", info.state),
        ));
    };
    Ok(GoalChange {
        goal_id: info.goal_id,
        revision: info.revision,
        state,
        objective: info.objective,
        max_rounds: info.max_rounds,
        round: info.round,
        summary: info.summary,
        reason: info.reason,
    })
}

pub fn encode_session_info(session: &SessionRef, summary: &SessionSummary) -> pb::SessionInfo {
    pb::SessionInfo {
        session: Some(encode_session_ref(session)),
        status: encode_status(summary.status) as i32,
        last_seq: summary.last_seq,
        last_turn: summary.last_turn,
        epoch: summary.epoch,
        owner: summary.owner.clone(),
        agent: summary.agent.clone(),
        inject_mode: encode_inject_mode(summary.inject_mode) as i32,
        goal: summary.goal.as_ref().map(encode_goal_info),
        last_event_unix_ms: summary.last_time_ms,
        parent: summary.parent.as_ref().map(encode_session_ref),
        labels: summary.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        // Not in a summary: the gateway's reads of the log add them.
        awaiting_approval: None,
        awaiting_client: None,
        overrides: None,
        agent_version: summary.agent_version.unwrap_or(0),
    }
}

/// The inverse of [`encode_session_info`] (the session itself is the caller's), at `path`.
pub fn session_info_at(info: pb::SessionInfo, path: &str) -> Result<SessionSummary, CodecError> {
    Ok(SessionSummary {
        status: status_at(info.status, &join(path, "status"))?,
        last_seq: info.last_seq,
        last_turn: info.last_turn,
        epoch: info.epoch,
        owner: info.owner,
        agent: info.agent,
        // A node of an older build sends no mode: its sessions can only be pending.
        inject_mode: inject_mode_at(info.inject_mode, &join(path, "inject_mode"), Some(InjectMode::Pending))?,
        goal: info.goal.map(|g| goal_info_at(g, &join(path, "goal"))).transpose()?,
        last_time_ms: info.last_event_unix_ms,
        parent: info.parent.map(|p| session_ref_at(p, &join(path, "parent"))).transpose()?,
        labels: info.labels.into_iter().collect(),
        agent_version: (info.agent_version > 0).then_some(info.agent_version),
    })
}

pub fn encode_goal_action(action: GoalAction) -> pb::GoalAction {
    match action {
        GoalAction::Pause => pb::GoalAction::Pause,
        GoalAction::Resume => pb::GoalAction::Resume,
        GoalAction::Clear => pb::GoalAction::Clear,
    }
}

/// Decodes a `GoalAction` enum value at `path`; UNSPECIFIED is refused.
pub fn goal_action_at(raw: i32, path: &str) -> Result<GoalAction, CodecError> {
    match pb::GoalAction::try_from(raw) {
        Ok(pb::GoalAction::Pause) => Ok(GoalAction::Pause),
        Ok(pb::GoalAction::Resume) => Ok(GoalAction::Resume),
        Ok(pb::GoalAction::Clear) => Ok(GoalAction::Clear),
        Ok(pb::GoalAction::Unspecified) => Err(CodecError::invalid(path, format!("is unspecified; {GOAL_ACTIONS}"))),
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a goal action; {GOAL_ACTIONS}"))),
    }
}
