//! Goals (SPEC §10): `SetGoal`/`UpdateGoal`, continuation rounds, pausing, the budget and
//! `goal_complete` (docs/decisions/0018-goals.md).
//!
//! The goal system is the only writer of `goal/change`. Its state is the fold
//! ([`turnstile_model::goal::GoalFold`]): the goal itself, R (admitted continuations of the revision) and
//! how the last turn ended. The driver keeps nothing of its own, so a new owner decides exactly what the
//! old one would have decided next.

use turnstile_model::goal::MAX_GOAL_ID_LEN;
use turnstile_model::{
    CommandError, CommandReply, ContentBlock, EventPayload, Goal, GoalAction, GoalChange, GoalState, MessageId,
    MessageSource, Status, Target, ToolCallSpec, TurnEndReason, UserMessage,
};

use super::commands::Position;
use super::{ActiveGoal, Driver, ToolOutcome};

impl Driver {
    /// `SetGoal`: a new goal at revision 1, or a revision of the active or paused one. Everything is
    /// checked before the write, so a refused command writes nothing.
    pub(super) fn set_goal(
        &mut self,
        goal_id: String,
        objective: String,
        max_rounds: u32,
    ) -> Result<CommandReply, CommandError> {
        check_goal_id(&goal_id)?;
        if objective.trim().is_empty() {
            return Err(CommandError::InvalidArgument(
                "goal objective is empty; say what the session should work toward".into(),
            ));
        }
        if max_rounds == 0 {
            return Err(CommandError::InvalidArgument(
                "goal max_rounds is 0; allow at least one round (each round is one continuation turn)".into(),
            ));
        }
        if max_rounds > self.limits.max_goal_rounds {
            return Err(CommandError::InvalidArgument(format!(
                "goal max_rounds is {max_rounds}, above this cluster's cap of {} (config limits.max_goal_rounds); ask for fewer rounds",
                self.limits.max_goal_rounds
            )));
        }
        // The longest continuation (round MAX) must be a valid message, or no round could ever be sent.
        let longest = turnstile_model::goal::continuation_text(u64::from(max_rounds), max_rounds, &objective);
        if longest.len() > self.limits.max_message_bytes {
            return Err(CommandError::InvalidArgument(format!(
                "goal objective is {} bytes; its continuation message would be {} bytes, over the limit of {}; shorten it",
                objective.len(),
                longest.len(),
                self.limits.max_message_bytes
            )));
        }
        let (goal_id, revision) = match self.state.goals.current.as_ref().map(|g| &g.info) {
            Some(g) if !g.state.is_terminal() => {
                if g.state == GoalState::Active && g.objective == objective && g.max_rounds == max_rounds {
                    // The same goal again (a retry): nothing changes, so nothing is written.
                    return Ok(self.goal_reply());
                }
                // A revision keeps the goal's id: the id the caller minted names nothing new.
                (g.goal_id.clone(), g.revision + 1)
            }
            Some(g) if g.goal_id == goal_id => {
                return Err(CommandError::AlreadyExists(format!(
                    "goal {goal_id} of session {} already ended ({}); mint a new goal id for a new goal",
                    self.state.session, g.state
                )));
            }
            _ => (goal_id, 1),
        };
        // A new goal or revision starts active, at round 0.
        let change = GoalChange {
            goal_id,
            revision,
            state: GoalState::Active,
            objective,
            max_rounds,
            round: 0,
            summary: None,
            reason: None,
        };
        self.write(EventPayload::GoalChange(change));
        // Set on an idle session with nothing pending: the first round starts right away.
        self.goal_continue();
        Ok(self.goal_reply())
    }

    /// `UpdateGoal`: pause, resume or clear. A change to the state the goal already has writes nothing.
    pub(super) fn update_goal(&mut self, goal_id: &str, action: GoalAction) -> Result<CommandReply, CommandError> {
        let session = &self.state.session;
        let goal = match self.state.goals.current.as_ref() {
            None => {
                return Err(CommandError::NotFound(format!("session {session} has no goal; set one with SetGoal")));
            }
            Some(g) if g.info.goal_id != goal_id => {
                return Err(CommandError::NotFound(format!(
                    "goal {goal_id} is not the goal of session {session} (its goal is {}); take the id from GetSession",
                    g.info.goal_id
                )));
            }
            Some(g) => g.clone(),
        };
        let change = match (action, goal.info.state) {
            (GoalAction::Pause, GoalState::Paused)
            | (GoalAction::Resume, GoalState::Active)
            | (GoalAction::Clear, GoalState::Cleared) => {
                return Ok(self.goal_reply());
            }
            (GoalAction::Pause, GoalState::Active) => {
                goal.change(GoalState::Paused, None, Some("paused by UpdateGoal".into()))
            }
            // Resume continues from the same round (R is kept).
            (GoalAction::Resume, GoalState::Paused) => goal.change(GoalState::Active, None, None),
            (GoalAction::Clear, _) => goal.change(GoalState::Cleared, None, Some("cleared by UpdateGoal".into())),
            (GoalAction::Pause | GoalAction::Resume, state) => {
                return Err(CommandError::FailedPrecondition(format!(
                    "goal {goal_id} of session {session} is {state}, so it cannot {action}; SetGoal starts a new goal"
                )));
            }
        };
        self.write(EventPayload::GoalChange(change));
        self.goal_continue();
        Ok(self.goal_reply())
    }

    /// The reply to a goal command: the goal as the command left it (after any round it started).
    fn goal_reply(&self) -> CommandReply {
        let seq = self.state.last_seq;
        match self.state.goals.current.as_ref() {
            Some(goal) => CommandReply::Goal { seq, goal: Box::new(goal.current()) },
            // Unreachable: both commands either refuse or leave a goal in the fold; a plain seq keeps
            // the reply honest if that ever changes.
            None => CommandReply::Written { seq },
        }
    }

    /// Right after `turn/end`: a turn that ended blocked, error or aborted pauses an active goal.
    pub(super) fn goal_after_turn(&mut self, turn: u64, reason: &TurnEndReason) {
        let pauses =
            matches!(reason, TurnEndReason::Blocked { .. } | TurnEndReason::Error { .. } | TurnEndReason::Aborted(_));
        if pauses && let Some(goal) = self.state.goals.active().cloned() {
            let why = format!("turn {turn} ended {reason}");
            self.write(EventPayload::GoalChange(goal.change(GoalState::Paused, None, Some(why))));
        }
    }

    /// The session is idle: if the goal is active and nothing is pending (human input always goes
    /// first), either the budget is spent (`budget-limited`) or the next round's continuation is
    /// delivered as a waking next-turn message, which opens a turn like any idle followup.
    pub(super) fn goal_continue(&mut self) {
        // A draining owner leaves it to the next one, which decides the same from the fold.
        let idle = self.turn.is_none() && self.state.status == Status::Idle && !self.latched_wake;
        if self.draining || !idle || !self.state.inbox.is_empty() {
            return;
        }
        let Some(goal) = self.state.goals.active().cloned() else { return };
        if goal.budget_spent() {
            let why = format!("{} rounds admitted without goal_complete", goal.info.max_rounds);
            self.write(EventPayload::GoalChange(goal.change(GoalState::BudgetLimited, None, Some(why))));
            return;
        }
        let round = goal.info.round + 1;
        let message = UserMessage {
            id: self.continuation_id(&goal, round),
            content: [ContentBlock::text(goal.continuation_text(round))].into(),
            source: MessageSource::Goal { goal_id: goal.info.goal_id.clone(), revision: goal.info.revision, round },
        };
        if let Err(e) = self.deliver(message, Target::NextTurn, true, None, None, Position::Tail) {
            // SetGoal checked the goal id and the size; nothing else can refuse an idle, empty session.
            tracing::error!(session = %self.state.session, error = %e, "goal continuation refused");
        }
    }

    /// After repair, before the driver goes idle: the pause the old owner owed the last turn, if a cut
    /// lost it (written where the old owner would have, before `status idle`).
    pub(super) fn goal_recover_pause(&mut self) {
        let Some(changed_seq) = self.state.goals.active().map(|g| g.changed_seq) else { return };
        if let Some(last) = self.state.goals.last_turn_end.clone()
            && last.seq > changed_seq
            && last.pauses_goal()
        {
            self.goal_after_turn(last.turn, &last.reason);
        }
    }

    /// After repair, on a session that does not resume: the round (or budget verdict) the old owner owed
    /// the session, if a cut lost it.
    pub(super) fn goal_recover_continue(&mut self) {
        let Some(changed_seq) = self.state.goals.active().map(|g| g.changed_seq) else { return };
        let owed = match &self.state.goals.last_turn_end {
            // No turn since the goal changed (set, revised or resumed on an idle session): a round is owed.
            None => true,
            Some(last) => last.seq < changed_seq || last.continues_goal(),
        };
        if owed {
            self.goal_continue();
        }
    }

    /// `goal-<goal_id>-<revision>-<round>`; a round delivered again (its first continuation was rejected
    /// or dropped) gets `.2`, `.3`, … because an accepted MessageId is never reused. Derived from the fold
    /// alone, so every owner mints the same id.
    fn continuation_id(&self, goal: &Goal, round: u64) -> MessageId {
        let base = format!("goal-{}-{}-{round}", goal.info.goal_id, goal.info.revision);
        let used = |id: &MessageId| self.state.accepted.get(id).is_some() || self.state.inbox.contains(id);
        let first = MessageId(base.clone());
        if !used(&first) {
            return first;
        }
        (2u64..).map(|n| MessageId(format!("{base}.{n}"))).find(|id| !used(id)).unwrap_or(first)
    }

    /// The active goal as a model request describes it (the runner offers `goal_complete` then).
    pub(super) fn active_goal(&self) -> Option<ActiveGoal> {
        self.state.goals.active().map(|Goal { info: g, .. }| ActiveGoal {
            goal_id: g.goal_id.clone(),
            revision: g.revision,
            objective: g.objective.clone(),
            round: g.round,
            max_rounds: g.max_rounds,
        })
    }

    /// The model called `goal_complete`: the driver runs it itself. `tool/call`, `tool/result`, then
    /// `goal/change {completed, summary}`; the call concludes the turn, so no step answers it and no
    /// round follows. Without an active goal (paused meanwhile, or never offered) it is an error result.
    pub(super) fn goal_complete_call(&mut self, turn: u64, step: u32, call: ToolCallSpec) {
        self.write_call(turn, step, call.clone());
        let goal = self.state.goals.active().cloned();
        let mut outcome = match &goal {
            Some(g) => ToolOutcome::new(&call.call_id, &call.name, format!("goal {} completed", g.info.goal_id), None),
            None => ToolOutcome::new(
                &call.call_id,
                &call.name,
                String::new(),
                Some("the session has no active goal to complete".into()),
            ),
        };
        outcome.concludes_turn = goal.is_some();
        self.record_tool_result(turn, step, outcome);
        if let Some(goal) = goal {
            let summary = summary_of(&call.arguments);
            self.write(EventPayload::GoalChange(goal.change(GoalState::Completed, Some(summary), None)));
        }
    }
}

/// The `summary` of `goal_complete`'s JSON arguments; anything else is taken as the summary itself, so a
/// model that answers in plain text still completes the goal.
fn summary_of(arguments: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(map)) => match map.get("summary") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        },
        _ => arguments.trim().to_owned(),
    }
}

/// A goal id: 1 to [`MAX_GOAL_ID_LEN`] letters, digits, `-` or `_` (a UUID fits), so the continuation
/// MessageIds built from it are valid.
fn check_goal_id(goal_id: &str) -> Result<(), CommandError> {
    let ok = (1..=MAX_GOAL_ID_LEN).contains(&goal_id.len())
        && goal_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(CommandError::InvalidArgument(format!(
            "goal id {goal_id:?} must be 1 to {MAX_GOAL_ID_LEN} letters, digits, '-' or '_'; mint a UUID"
        )))
    }
}
