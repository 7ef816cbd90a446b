//! Goals (SPEC §10): the typed `goal/change` event and the goal fold of a session log.
//!
//! A goal's lifecycle is written only by the goal system, as `goal/change`; its round R is not: R counts
//! the continuation messages of the current revision that became `user/message`, so a continuation a
//! pre-step decision rejected or dropped never advances it. Both facts are folded here, so any node that
//! reads the log knows the goal (`GetSession`) and a new owner continues where the old one stopped.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::message::MessageSource;
use crate::turn::TurnEndReason;

/// The longest goal id accepted, in bytes. Shorter than a MessageId so the continuation id
/// `goal-<goal_id>-<revision>-<round>` always fits the MessageId limit.
pub const MAX_GOAL_ID_LEN: usize = 64;

/// Where a goal stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GoalState {
    /// Rounds are delivered whenever the session goes idle after a completed turn.
    Active,
    /// Set by `UpdateGoal(pause)` or by a turn that ended blocked, error or aborted; `resume` continues
    /// from the same round.
    Paused,
    /// The model called `goal_complete`; terminal.
    Completed,
    /// `max_rounds` rounds were admitted without `goal_complete`; terminal (a revision starts again).
    BudgetLimited,
    /// `UpdateGoal(clear)`; terminal.
    Cleared,
}

impl GoalState {
    /// The API name (docs/API.md `GoalChange.state`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Completed => "completed",
            Self::BudgetLimited => "budget-limited",
            Self::Cleared => "cleared",
        }
    }

    /// The state named by its API name, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Active, Self::Paused, Self::Completed, Self::BudgetLimited, Self::Cleared]
            .into_iter()
            .find(|state| state.as_str() == name)
    }

    /// No change but a new `SetGoal` (a new goal) follows this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::BudgetLimited | Self::Cleared)
    }
}

impl fmt::Display for GoalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `goal/change`: one step of a goal's lifecycle, carrying the whole goal as it is after the change.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GoalChange {
    pub goal_id: String,
    /// From 1; a `SetGoal` while the goal is active or paused revises it (revision + 1, round 0).
    pub revision: u64,
    pub state: GoalState,
    pub objective: String,
    pub max_rounds: u32,
    /// Continuations of this revision admitted so far (R).
    pub round: u64,
    /// What `goal_complete` reported (state completed).
    pub summary: Option<String>,
    /// Why the goal paused (or who paused, cleared it).
    pub reason: Option<String>,
}

/// What `UpdateGoal` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GoalAction {
    Pause,
    Resume,
    Clear,
}

impl GoalAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Clear => "clear",
        }
    }
}

impl fmt::Display for GoalAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The session's current goal, as folded from the log: its last `goal/change` and where it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Goal {
    /// The goal as its last `goal/change` left it, except `round` (R), which counts every continuation of
    /// this revision that became `user/message` since. Flattened: a snapshot keeps the fields at the top.
    #[serde(flatten)]
    pub info: GoalChange,
    /// The seq of the last `goal/change`: tells a new owner whether the goal changed after the last turn.
    pub changed_seq: u64,
}

impl Goal {
    /// Every admitted round of the budget is used.
    pub fn budget_spent(&self) -> bool {
        self.info.round >= u64::from(self.info.max_rounds)
    }

    /// The text of the continuation for round `round` (SPEC §10).
    pub fn continuation_text(&self, round: u64) -> String {
        continuation_text(round, self.info.max_rounds, &self.info.objective)
    }

    /// The goal as it stands, in the shape of a `goal/change` (what `GoalInfo` reports).
    pub fn current(&self) -> GoalChange {
        self.info.clone()
    }

    /// The `goal/change` that moves this goal to `state`, keeping everything else.
    pub fn change(&self, state: GoalState, summary: Option<String>, reason: Option<String>) -> GoalChange {
        GoalChange { state, summary, reason, ..self.info.clone() }
    }
}

/// `Continue working toward the goal (round R of MAX): OBJECTIVE`.
pub fn continuation_text(round: u64, max_rounds: u32, objective: &str) -> String {
    format!("Continue working toward the goal (round {round} of {max_rounds}): {objective}")
}

/// How the last turn of the session ended, as far as the goal system cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastTurnEnd {
    pub seq: u64,
    pub turn: u64,
    pub reason: TurnEndReason,
    /// The turn ran at least one step (an empty first batch ends `completed` with none).
    pub stepped: bool,
}

impl LastTurnEnd {
    /// The turn ended in a way that pauses an active goal (SPEC §10: blocked, error or aborted).
    pub fn pauses_goal(&self) -> bool {
        matches!(self.reason, TurnEndReason::Blocked { .. } | TurnEndReason::Error { .. } | TurnEndReason::Aborted(_))
    }

    /// The turn ran a step and ended `completed`, or `interrupted` (a new owner repaired it; a crash is
    /// nobody's verdict on the goal): the session may go on with the next round.
    pub fn continues_goal(&self) -> bool {
        matches!(self.reason, TurnEndReason::Completed | TurnEndReason::Interrupted) && self.stepped
    }
}

/// The goal part of the fold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoalFold {
    /// The latest goal; a terminal one stays here (readers show it) until a new goal replaces it.
    pub current: Option<Goal>,
    pub last_turn_end: Option<LastTurnEnd>,
}

/// A `goal/change` that cannot follow the fold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoalFoldError {
    #[error("goal {goal_id} goes from revision {from} to {to}; a revision only grows by one")]
    Revision { goal_id: String, from: u64, to: u64 },
    #[error("a new goal {goal_id} starts at revision {revision}, not 1")]
    NewGoalRevision { goal_id: String, revision: u64 },
}

impl GoalFold {
    /// The goal, if it is active.
    pub fn active(&self) -> Option<&Goal> {
        self.current.as_ref().filter(|g| g.info.state == GoalState::Active)
    }

    /// Checks that `change` can follow without changing anything.
    pub fn check(&self, change: &GoalChange) -> Result<(), GoalFoldError> {
        match &self.current {
            Some(Goal { info: g, .. }) if g.goal_id == change.goal_id => {
                if change.revision != g.revision && change.revision != g.revision + 1 {
                    return Err(GoalFoldError::Revision {
                        goal_id: g.goal_id.clone(),
                        from: g.revision,
                        to: change.revision,
                    });
                }
                Ok(())
            }
            _ if change.revision != 1 => {
                Err(GoalFoldError::NewGoalRevision { goal_id: change.goal_id.clone(), revision: change.revision })
            }
            _ => Ok(()),
        }
    }

    /// Applies a checked `goal/change` written at `seq`.
    pub fn apply_change(&mut self, seq: u64, change: &GoalChange) {
        self.current = Some(Goal { info: change.clone(), changed_seq: seq });
    }

    /// A `user/message` was admitted: a continuation of the current revision advances R. One of an older
    /// revision (claimed before a revise) does not count for the new one.
    pub fn on_user_message(&mut self, source: &MessageSource) {
        if let MessageSource::Goal { goal_id, revision, .. } = source
            && let Some(Goal { info: goal, .. }) = self.current.as_mut()
            && goal.goal_id == *goal_id
            && goal.revision == *revision
        {
            goal.round += 1;
        }
    }

    pub fn on_turn_end(&mut self, seq: u64, turn: u64, reason: &TurnEndReason, stepped: bool) {
        self.last_turn_end = Some(LastTurnEnd { seq, turn, reason: reason.clone(), stepped });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(goal_id: &str, revision: u64) -> GoalChange {
        GoalChange {
            goal_id: goal_id.into(),
            revision,
            state: GoalState::Active,
            objective: "ship it".into(),
            max_rounds: 3,
            round: 0,
            summary: None,
            reason: None,
        }
    }

    fn source(goal_id: &str, revision: u64, round: u64) -> MessageSource {
        MessageSource::Goal { goal_id: goal_id.into(), revision, round }
    }

    #[test]
    fn rounds_count_admitted_continuations_of_the_current_revision() {
        let mut fold = GoalFold::default();
        fold.check(&set("g", 1)).unwrap_or_else(|e| panic!("{e}"));
        fold.apply_change(3, &set("g", 1));
        fold.on_user_message(&source("g", 1, 1));
        fold.on_user_message(&MessageSource::User);
        fold.on_user_message(&source("other", 1, 1));
        assert_eq!(fold.active().map(|g| g.info.round), Some(1));
        fold.apply_change(9, &set("g", 2));
        fold.on_user_message(&source("g", 1, 2));
        assert_eq!(fold.active().map(|g| (g.info.revision, g.info.round, g.changed_seq)), Some((2, 0, 9)));
    }

    #[test]
    fn revisions_only_grow_by_one_and_new_goals_start_at_one() {
        let mut fold = GoalFold::default();
        assert!(matches!(fold.check(&set("g", 2)), Err(GoalFoldError::NewGoalRevision { .. })));
        fold.apply_change(1, &set("g", 1));
        assert!(matches!(fold.check(&set("g", 3)), Err(GoalFoldError::Revision { .. })));
        assert_eq!(fold.check(&set("g", 2)), Ok(()));
        assert_eq!(fold.check(&set("h", 1)), Ok(()));
    }

    #[test]
    fn a_folded_goal_serializes_with_the_fields_of_its_change_at_the_top() {
        // The shape of snapshots and of the corpus states written before `Goal` embedded its change.
        let json = r#"{"goal_id":"g","revision":1,"state":"Active","objective":"ship it","max_rounds":3,"round":2,"summary":null,"reason":null,"changed_seq":7}"#;
        let goal: Goal = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(goal, Goal { info: GoalChange { round: 2, ..set("g", 1) }, changed_seq: 7 });
        assert_eq!(serde_json::to_string(&goal).unwrap_or_else(|e| panic!("{e}")), json);
    }

    #[test]
    fn continuation_text_names_round_budget_and_objective() {
        assert_eq!(continuation_text(2, 5, "fix it"), "Continue working toward the goal (round 2 of 5): fix it");
        assert_eq!(GoalState::BudgetLimited.to_string(), "budget-limited");
        assert_eq!(GoalState::parse("budget-limited"), Some(GoalState::BudgetLimited));
        assert_eq!(GoalState::parse("done"), None);
    }
}
