//! The fold of a session log (SPEC §3 projection, §6 recovery facts).
//!
//! [`SessionState`] is what any node derives from a session's durable events: the inbox, the status, the
//! last turn, the open turn (for repair after a crash) and the index of accepted MessageIds (for
//! idempotent retries). The driver applies every event it writes through the same fold, so the owner's
//! inbox and any reader's projection are the same function of the same log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::{
    Compaction, Envelope, EventPayload, InjectMode, SpliceOutcome, Status, SteerDeadline, ToolCallSpec,
};
use crate::goal::{GoalFold, GoalFoldError};
use crate::inbox::{Inbox, SpliceError};
use crate::labels::Labels;
use crate::message::{MessageId, SessionRef, Target, UserMessage};
use crate::overrides::SessionOverrides;
use crate::schedule::Schedules;
use crate::transcript::{Transcript, TranscriptEntry};

pub use crate::dedup::{Acceptance, AcceptedIndex, DEFAULT_DEDUP_HORIZON, Fingerprint};

/// A turn that has a `turn/start` and no `turn/end` yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenTurn {
    pub turn: u64,
    /// The last step started in this turn (0 before the first).
    pub step: u32,
    /// A `step/start` without its `step/end`.
    pub step_open: bool,
    /// `tool/call`s of the open step without a `tool/result`.
    pub open_calls: Vec<ToolCallSpec>,
    /// Messages claimed since the last `step/start` (their pre-step decision has not entered a step).
    pub undecided_claims: Vec<(Target, UserMessage)>,
    /// Messages entered (as `user/message`) in this turn.
    pub admitted: Vec<UserMessage>,
    /// Messages entered in the last step that has not ended (the prompt a crash interrupted).
    pub open_step_messages: Vec<UserMessage>,
    /// A step of this turn ended at the model's token limit (sticky for the turn).
    pub max_tokens: bool,
    /// Tool results of the latest step (cleared at `step/start`): a turn cut after a tool step still owes
    /// the model's answer to them.
    pub last_step_results: Vec<ToolResultRecord>,
    /// The tool calls the open step's `assistant/message` asked for, in model order.
    #[serde(default)]
    pub step_calls: Vec<ToolCallSpec>,
    /// The open call that waits for a `tool/decision` (SPEC §9).
    #[serde(default)]
    pub awaiting: Option<ToolCallSpec>,
    /// The seq and time of the `tool/call` of [`OpenTurn::awaiting`]: since when it waits (SPEC §21).
    #[serde(default)]
    pub awaiting_since: Option<(u64, u64)>,
    /// The open call of a client tool of the turn that waits for `CompleteToolCall` (SPEC §19).
    #[serde(default)]
    pub awaiting_client: Option<ToolCallSpec>,
}

/// A `tool/result` with the name of its call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultRecord {
    pub call_id: String,
    pub name: String,
    pub output: String,
    pub error: Option<String>,
}

/// A log that cannot be folded: the reader refuses it and names the seq.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    #[error("event seq {got} does not follow {last} (seqs are contiguous from 1)")]
    Gap { last: u64, got: u64 },
    #[error("event {seq} belongs to session {got}, not {expected}")]
    WrongSession { seq: u64, expected: SessionRef, got: SessionRef },
    #[error("event {seq} has epoch {epoch}, below the previous {last}")]
    EpochDecreased { seq: u64, epoch: u64, last: u64 },
    #[error("event {seq} has time {time_ms}, before the previous {last}")]
    TimeDecreased { seq: u64, time_ms: u64, last: u64 },
    #[error("event {seq} is an invalid splice: {source}")]
    Splice { seq: u64, source: SpliceError },
    #[error("event {seq} is an invalid goal change: {source}")]
    Goal { seq: u64, source: GoalFoldError },
    #[error("event {seq} ({event_type}) does not fit the turn structure: {detail}")]
    Structure { seq: u64, event_type: &'static str, detail: String },
}

/// The fold of a session's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    pub session: SessionRef,
    pub last_seq: u64,
    pub last_time_ms: u64,
    pub epoch: u64,
    pub inbox: Inbox,
    pub status: Status,
    pub last_turn: u64,
    pub open_turn: Option<OpenTurn>,
    /// A waking insert follows the last `agent/status idle` (SPEC §6 resume rule).
    pub wake_since_idle: bool,
    pub accepted: AcceptedIndex,
    /// The agent the last `session/configured` named; `None` runs the configuration's default agent.
    pub agent: Option<String>,
    /// The version of `agent` the last `session/configured` recorded (SPEC §20); `None`: the newest.
    #[serde(default)]
    pub agent_version: Option<u64>,
    /// The inject mode the last `session/configured` set (SPEC §11).
    pub inject_mode: InjectMode,
    /// What the last `session/overridden` set (SPEC §20): applied to each turn as far as its agent version
    /// allows.
    #[serde(default)]
    pub overrides: SessionOverrides,
    /// The bounded conversation history model requests are built from (SPEC §8).
    pub transcript: Transcript,
    /// The deadlines of pending steers (SPEC §11), by message id: set by the steer's insert splice,
    /// gone once the message leaves the inbox (claimed, moved, removed).
    #[serde(default)]
    pub steer_deadlines: BTreeMap<MessageId, SteerDeadline>,
    /// The session's goal and how its last turn ended (SPEC §10).
    #[serde(default)]
    pub goals: GoalFold,
    /// The last `context/compacted` (SPEC §13): its summary stands for the turns through `upto_turn`,
    /// which the transcript no longer holds.
    #[serde(default)]
    pub compaction: Option<Compaction>,
    /// The session this one was forked from, and the turn (SPEC §13 `session/forked`).
    #[serde(default)]
    pub forked_from: Option<(SessionRef, u64)>,
    /// The parent of a child session (SPEC §13 `spawn_agent`), from its `session/configured`. Optional in
    /// the snapshot's shape, so snapshots written before it still load (no version bump).
    #[serde(default)]
    pub parent: Option<SessionRef>,
    /// The session's schedules (SPEC §15), from its `schedule/changed` events.
    #[serde(default)]
    pub schedules: Schedules,
    /// The session's labels (SPEC §16), from its `session/labeled` events.
    #[serde(default)]
    pub labels: Labels,
}

impl SessionState {
    pub fn new(session: SessionRef, dedup_horizon: usize) -> Self {
        Self {
            session,
            last_seq: 0,
            last_time_ms: 0,
            epoch: 0,
            inbox: Inbox::default(),
            status: Status::Idle,
            last_turn: 0,
            open_turn: None,
            wake_since_idle: false,
            accepted: AcceptedIndex::new(dedup_horizon),
            agent: None,
            inject_mode: InjectMode::Pending,
            agent_version: None,
            overrides: SessionOverrides::default(),
            transcript: Transcript::default(),
            steer_deadlines: BTreeMap::new(),
            goals: GoalFold::default(),
            compaction: None,
            forked_from: None,
            parent: None,
            schedules: Schedules::default(),
            labels: Labels::new(),
        }
    }

    /// The earliest time the session's owner must act on its own (SPEC §11 steer deadlines, §15
    /// schedules), in Unix ms.
    pub fn next_timer(&self) -> Option<u64> {
        let deadline = self.steer_deadlines.values().map(|d| d.at_ms).min();
        match (deadline, self.schedules.next_fire()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Folds a whole log from the start.
    pub fn fold<'a>(
        session: SessionRef,
        dedup_horizon: usize,
        events: impl IntoIterator<Item = &'a Envelope>,
    ) -> Result<Self, ProjectionError> {
        let mut state = Self::new(session, dedup_horizon);
        for e in events {
            state.apply(e)?;
        }
        Ok(state)
    }

    /// The session exists from its first accepted write.
    pub fn exists(&self) -> bool {
        self.last_seq > 0
    }

    /// Checks that `event` can follow this state without changing it.
    pub fn check(&self, event: &Envelope) -> Result<(), ProjectionError> {
        self.clone().apply(event).map(|_| ())
    }

    /// Applies one event. Every check runs before the first change, so on error the state is unchanged.
    pub fn apply(&mut self, event: &Envelope) -> Result<(), ProjectionError> {
        let seq = event.seq;
        if event.session != self.session {
            return Err(ProjectionError::WrongSession {
                seq,
                expected: self.session.clone(),
                got: event.session.clone(),
            });
        }
        if self.last_seq.checked_add(1) != Some(seq) {
            return Err(ProjectionError::Gap { last: self.last_seq, got: seq });
        }
        if event.epoch < self.epoch {
            return Err(ProjectionError::EpochDecreased { seq, epoch: event.epoch, last: self.epoch });
        }
        if event.time_ms < self.last_time_ms {
            return Err(ProjectionError::TimeDecreased { seq, time_ms: event.time_ms, last: self.last_time_ms });
        }
        let structure = |detail: String| ProjectionError::Structure { seq, event_type: event.event_type(), detail };
        match &event.payload {
            EventPayload::InboxSpliced(splice) => {
                let removed = self.inbox.apply(splice).map_err(|source| ProjectionError::Splice { seq, source })?;
                for m in &removed {
                    self.steer_deadlines.remove(&m.id);
                }
                if let Some(deadline) = splice.deadline {
                    for m in &splice.inserted {
                        self.steer_deadlines.insert(m.id.clone(), deadline);
                    }
                }
                let is_claim = splice.outcome == SpliceOutcome::None && !removed.is_empty();
                if is_claim && let Some(open) = self.open_turn.as_mut() {
                    open.undecided_claims.extend(removed.into_iter().map(|m| (splice.target, m)));
                }
                if splice.wake && !splice.inserted.is_empty() {
                    self.wake_since_idle = true;
                }
                for m in &splice.inserted {
                    if self.accepted.get(&m.id).is_some() {
                        continue;
                    }
                    let fingerprint = match splice.outcome {
                        // Inserts by deliveries carry no outcome; edits remove with `canceled`.
                        SpliceOutcome::None if splice.removed_count == 0 => {
                            let target = splice.requested_target.unwrap_or(splice.target);
                            Some(Fingerprint::of(m, target, splice.wake))
                        }
                        _ => None,
                    };
                    // Checked: a corrupt snapshot may carry a turn counter at its maximum.
                    let opened_turn = match (splice.wake && self.status == Status::Idle)
                        .then(|| self.last_turn.checked_add(1))
                    {
                        Some(None) => return Err(structure(format!("turn counter {} cannot grow", self.last_turn))),
                        other => other.flatten(),
                    };
                    self.accepted.insert(m.id.clone(), Acceptance { seq, fingerprint, opened_turn });
                }
            }
            EventPayload::Status(status) => {
                if *status == self.status && self.last_seq > 0 {
                    return Err(structure(format!("status is already {status}")));
                }
                self.status = *status;
                if *status == Status::Idle {
                    self.wake_since_idle = false;
                }
            }
            EventPayload::TurnStart { turn } => {
                if let Some(open) = &self.open_turn {
                    return Err(structure(format!("turn {} is still open", open.turn)));
                }
                if self.last_turn.checked_add(1) != Some(*turn) {
                    return Err(structure(format!("expected the turn after {}, got {turn}", self.last_turn)));
                }
                self.last_turn = *turn;
                self.open_turn = Some(OpenTurn { turn: *turn, ..OpenTurn::default() });
            }
            EventPayload::TurnEnd { turn, reason } => {
                let open = self.open_turn.as_ref().ok_or_else(|| structure("no turn is open".into()))?;
                if open.turn != *turn || open.step_open {
                    return Err(structure(format!("turn {} open (step open: {})", open.turn, open.step_open)));
                }
                let stepped = open.step > 0;
                self.goals.on_turn_end(seq, *turn, reason, stepped);
                self.open_turn = None;
            }
            EventPayload::StepStart { turn, step } => {
                let open = self.open_turn_mut(*turn).ok_or_else(|| structure("its turn is not open".into()))?;
                if open.step_open || open.step.checked_add(1) != Some(*step) {
                    return Err(structure(format!("step {} of turn {turn} cannot start now", step)));
                }
                open.step = *step;
                open.step_open = true;
                open.undecided_claims.clear();
                open.open_step_messages.clear();
                open.last_step_results.clear();
                open.step_calls.clear();
            }
            EventPayload::StepEnd { turn, step, .. } => {
                let open = self.open_turn_mut(*turn).ok_or_else(|| structure("its turn is not open".into()))?;
                if !open.step_open || *step != open.step || !open.open_calls.is_empty() {
                    return Err(structure(format!("step {step} of turn {turn} is not open or has open calls")));
                }
                open.step_open = false;
                open.open_step_messages.clear();
            }
            EventPayload::UserMessage { message, turn: 0, step: 0 } => {
                // An out-of-turn inject (SPEC §11): history between turns, accepted like a delivery.
                if let Some(open) = &self.open_turn {
                    return Err(structure(format!("a message between turns while turn {} is open", open.turn)));
                }
                if self.accepted.get(&message.id).is_some() {
                    return Err(structure(format!("message id {} was already accepted", message.id)));
                }
                let fingerprint = Some(Fingerprint::of(message, Target::NextStep, false));
                self.accepted.insert(message.id.clone(), Acceptance { seq, fingerprint, opened_turn: None });
                self.goals.on_user_message(&message.source);
                self.transcript.push(TranscriptEntry::User { turn: 0, step: 0, message: message.clone() });
            }
            EventPayload::UserMessage { message, turn, step } => {
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                open.admitted.push(message.clone());
                open.open_step_messages.push(message.clone());
                self.goals.on_user_message(&message.source);
                self.transcript.push(TranscriptEntry::User { turn: *turn, step: *step, message: message.clone() });
            }
            EventPayload::AssistantMessage { turn, step, max_tokens, text, tool_calls, interrupted, .. } => {
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                open.max_tokens |= *max_tokens;
                open.step_calls = tool_calls.clone();
                self.transcript.push(TranscriptEntry::Assistant {
                    turn: *turn,
                    step: *step,
                    text: text.clone(),
                    tool_calls: tool_calls.clone(),
                    interrupted: *interrupted,
                });
            }
            EventPayload::ToolCall { turn, step, call, awaiting_approval, awaiting_client } => {
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                if *awaiting_client {
                    if let Some(waiting) = &open.awaiting_client {
                        return Err(structure(format!("call {} already awaits its client", waiting.call_id)));
                    }
                    open.awaiting_client = Some(call.clone());
                }
                if *awaiting_approval {
                    if let Some(waiting) = &open.awaiting {
                        return Err(structure(format!("call {} already awaits approval", waiting.call_id)));
                    }
                    open.awaiting = Some(call.clone());
                    open.awaiting_since = Some((seq, event.time_ms));
                }
                open.open_calls.push(call.clone());
            }
            EventPayload::ToolDecision { turn, step, call_id, .. } => {
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                if open.awaiting.as_ref().is_none_or(|c| &c.call_id != call_id) {
                    return Err(structure(format!("call {call_id} does not await approval")));
                }
                open.awaiting = None;
                open.awaiting_since = None;
            }
            EventPayload::ToolRepaired { turn, step, call_id, .. } => {
                // The repair's record of a call it found running (SPEC §20): the call stays open until its
                // result, whichever owner writes it.
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                if !open.open_calls.iter().any(|c| &c.call_id == call_id) {
                    return Err(structure(format!("no open call {call_id}")));
                }
            }
            EventPayload::ToolResult { turn, step, call_id, output, error } => {
                let open = self.open_step(*turn, *step).ok_or_else(|| structure("its step is not open".into()))?;
                let i = open
                    .open_calls
                    .iter()
                    .position(|c| &c.call_id == call_id)
                    .ok_or_else(|| structure(format!("no open call {call_id}")))?;
                let call = open.open_calls.remove(i);
                if open.awaiting_client.as_ref().is_some_and(|c| c.call_id == call.call_id) {
                    open.awaiting_client = None;
                }
                if open.awaiting.as_ref().is_some_and(|c| c.call_id == call.call_id) {
                    // Denied, or ended unstarted by an abort.
                    open.awaiting = None;
                    open.awaiting_since = None;
                }
                open.last_step_results.push(ToolResultRecord {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    output: output.clone(),
                    error: error.clone(),
                });
                self.transcript.push(TranscriptEntry::ToolResult {
                    turn: *turn,
                    step: *step,
                    call_id: call.call_id,
                    name: call.name,
                    output: output.clone(),
                    error: error.clone(),
                });
            }
            EventPayload::SessionConfigured { agent, inject_mode, parent, version } => {
                self.agent = Some(agent.clone());
                self.agent_version = *version;
                self.inject_mode = *inject_mode;
                if parent.is_some() {
                    self.parent.clone_from(parent);
                }
            }
            EventPayload::GoalChange(change) => {
                self.goals.check(change).map_err(|source| ProjectionError::Goal { seq, source })?;
                self.goals.apply_change(seq, change);
            }
            EventPayload::ContextCompacted(c) => {
                let previous = self.compaction.as_ref().map_or(0, |p| p.upto_turn);
                let open = self.open_turn.as_ref().map(|o| o.turn);
                if c.upto_turn <= previous || c.upto_turn > self.last_turn || open == Some(c.upto_turn) {
                    return Err(structure(format!(
                        "compaction through turn {} does not follow the last one (turn {previous}) or is not a \
                         finished turn (last turn {}, open {open:?})",
                        c.upto_turn, self.last_turn
                    )));
                }
                self.transcript.compact(c.upto_turn);
                self.compaction = Some(c.clone());
            }
            EventPayload::SessionForked(fork) => {
                if seq != 1 {
                    return Err(structure("a fork's first event must be session/forked".into()));
                }
                if fork.compacted.as_ref().is_some_and(|c| c.upto_turn > fork.at_turn) {
                    return Err(structure("the fork's compaction covers turns after at_turn".into()));
                }
                self.agent.clone_from(&fork.agent);
                self.last_turn = fork.at_turn;
                self.compaction.clone_from(&fork.compacted);
                for entry in &fork.transcript {
                    self.transcript.push(entry.clone());
                }
                self.forked_from = Some((fork.from.clone(), fork.at_turn));
            }
            EventPayload::ScheduleChanged(change) => {
                self.schedules.check(change).map_err(|e| structure(e.to_string()))?;
                self.schedules.apply(change, event.time_ms);
            }
            EventPayload::SessionLabeled(change) => change.apply_to(&mut self.labels),
            EventPayload::SessionOverridden(overrides) => self.overrides.clone_from(overrides),
            EventPayload::MemoryWritten(_) | EventPayload::Ignorable { .. } => {}
        }
        self.last_seq = seq;
        self.last_time_ms = event.time_ms;
        self.epoch = event.epoch;
        Ok(())
    }

    fn open_turn_mut(&mut self, turn: u64) -> Option<&mut OpenTurn> {
        self.open_turn.as_mut().filter(|o| o.turn == turn)
    }

    fn open_step(&mut self, turn: u64, step: u32) -> Option<&mut OpenTurn> {
        self.open_turn_mut(turn).filter(|o| o.step_open && o.step == step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §20: the repair's record names a call that is open in the open step, and leaves it open for its
    /// result; one naming any other call does not fold.
    #[test]
    fn a_repair_record_names_an_open_call_and_leaves_it_open() {
        let session = SessionRef::new("t", "s").unwrap();
        let mut state = SessionState::new(session.clone(), 10);
        let call = ToolCallSpec { call_id: "c1".into(), name: "echo".into(), arguments: String::new() };
        let repaired = |call_id: &str| EventPayload::ToolRepaired {
            turn: 1,
            step: 1,
            call_id: call_id.into(),
            action: crate::RepairAction::Retried,
        };
        let payloads = [
            EventPayload::Status(Status::Running),
            EventPayload::TurnStart { turn: 1 },
            EventPayload::StepStart { turn: 1, step: 1 },
            EventPayload::ToolCall { turn: 1, step: 1, call, awaiting_approval: false, awaiting_client: false },
            repaired("c1"),
        ];
        for (i, payload) in payloads.into_iter().enumerate() {
            let event = Envelope { session: session.clone(), seq: i as u64 + 1, time_ms: 1, epoch: 1, payload };
            state.apply(&event).unwrap();
        }
        assert_eq!(state.open_turn.as_ref().map(|o| o.open_calls.len()), Some(1), "the call is still open");
        let other = Envelope { session, seq: 6, time_ms: 1, epoch: 1, payload: repaired("c2") };
        assert!(matches!(state.apply(&other), Err(ProjectionError::Structure { seq: 6, .. })));
    }
}
