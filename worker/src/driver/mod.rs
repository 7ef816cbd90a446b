//! The session driver: SPEC §4 as a sans-IO state machine.
//!
//! Inputs are commands, the outcomes of the operations it asked for (pre-step decisions, model deltas
//! and results, tool results) and the current time; outputs are [`Effect`]s, polled in order. There is
//! no clock, socket or task inside, so every SPEC scenario runs against it in microseconds and the same
//! inputs always give the same effects. The async [`crate::runner`] performs the effects.
//!
//! Every durable event the driver writes goes through the same fold ([`SessionState::apply`]) that any
//! reader uses, so the owner's inbox is by construction the projection of its own log.

mod commands;
pub mod effect;
mod recovery;
mod turn;

use std::collections::VecDeque;

use turnstile_journal::{
    CancelCause, CommandError, CommandReply, Envelope, EventPayload, LiveEvent, LivePayload, ProjectionError,
    SessionState, SessionSummary, Status,
};

pub use effect::{
    CommandId, Effect, ModelOutcome, ModelOutput, ModelRequest, OpId, PreStepDecision, PreStepOutcome, PreStepRequest,
    ToolOutcome, ToolRequest,
};
use turn::ActiveTurn;

use crate::config::Limits;

/// The driver of one session: its single writer.
#[derive(Debug)]
pub struct Driver {
    state: SessionState,
    limits: Limits,
    epoch: u64,
    owner: String,
    turn: Option<ActiveTurn>,
    /// A waking delivery arrived while the active turn was aborting: start again once it has ended.
    latched_wake: bool,
    idle_waiters: Vec<CommandId>,
    next_op: OpId,
    effects: VecDeque<Effect>,
    /// Set when an event the driver produced does not fold: a bug. The runner must discard this input's
    /// effects and reload the session from its log.
    poisoned: Option<ProjectionError>,
    /// The time of the input being handled.
    now_ms: u64,
    /// Handing the session to another owner: finish what runs, claim nothing more.
    draining: bool,
}

impl Driver {
    /// A driver for a session whose log folds to `state`. Call [`Driver::recover`] before anything else
    /// so an open turn is repaired (SPEC §6).
    pub fn new(state: SessionState, limits: Limits, epoch: u64, owner: impl Into<String>) -> Self {
        Self {
            state,
            limits,
            epoch,
            owner: owner.into(),
            turn: None,
            latched_wake: false,
            idle_waiters: Vec::new(),
            next_op: 1,
            effects: VecDeque::new(),
            poisoned: None,
            now_ms: 0,
            draining: false,
        }
    }

    /// The fold of everything this driver has written (and what it loaded).
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// The next effect to perform, in order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// All pending effects, in order.
    pub fn drain_effects(&mut self) -> Vec<Effect> {
        self.effects.drain(..).collect()
    }

    /// An internal invariant broke while handling the last input (see the field's doc).
    pub fn poisoned(&self) -> Option<&ProjectionError> {
        self.poisoned.as_ref()
    }

    /// Starts handing the session off (rebalance or shutdown): the running step finishes, then the driver
    /// stops at the next boundary without claiming, leaving the turn for the next owner to repair and
    /// resume (SPEC §6). Commands must no longer be routed here.
    pub fn on_drain(&mut self) {
        self.draining = true;
        if let Some(t) = self.turn.as_mut()
            && matches!(t.phase, turn::Phase::PreStep { .. })
        {
            // A pending pre-step decision has claimed input that no step has entered: abandoning it here
            // leaves the claim undecided in the log, so the next owner restores it.
            t.phase = turn::Phase::Parked;
        }
    }

    /// Nothing is in flight: the session can be unloaded and handed over.
    pub fn is_parked(&self) -> bool {
        match &self.turn {
            None => true,
            Some(t) => matches!(t.phase, turn::Phase::Parked),
        }
    }

    /// The turn being run, if any.
    pub fn running_turn(&self) -> Option<u64> {
        self.turn.as_ref().map(|t| t.turn)
    }

    /// Idle with no latched wake: what `when_idle` waits for.
    pub fn is_quiescent(&self) -> bool {
        self.turn.is_none() && !self.latched_wake && self.state.status == Status::Idle
    }

    pub fn summary(&self) -> SessionSummary {
        SessionSummary {
            status: self.state.status,
            last_seq: self.state.last_seq,
            last_turn: self.state.last_turn,
            epoch: self.epoch,
            owner: self.owner.clone(),
        }
    }

    // ----- outcomes of operations ---------------------------------------------------------------

    /// The pre-step waterfall finished.
    pub fn on_pre_step(&mut self, op: OpId, outcome: PreStepOutcome, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_pre_step(op, outcome);
    }

    /// The model streamed a piece of its reply.
    pub fn on_model_delta(&mut self, op: OpId, text: &str, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_model_delta(op, text);
    }

    /// The model request ended.
    pub fn on_model_done(&mut self, op: OpId, outcome: ModelOutcome, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_model_done(op, outcome);
    }

    /// A tool call ended.
    pub fn on_tool_done(&mut self, op: OpId, outcome: ToolOutcome, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_tool_done(op, outcome);
    }

    // ----- shared plumbing ----------------------------------------------------------------------

    fn new_op(&mut self) -> OpId {
        let op = self.next_op;
        self.next_op += 1;
        op
    }

    /// Writes one durable event: stamps the envelope, folds it, and emits the append.
    fn write(&mut self, payload: EventPayload) -> u64 {
        let event = Envelope {
            session: self.state.session.clone(),
            seq: self.state.last_seq + 1,
            // Time never decreases, even if the clock of a new owner is behind.
            time_ms: self.now_ms.max(self.state.last_time_ms),
            epoch: self.epoch.max(self.state.epoch),
            payload,
        };
        match self.state.apply(&event) {
            Ok(()) => {
                let seq = event.seq;
                self.effects.push_back(Effect::Append(event));
                seq
            }
            Err(e) => {
                tracing::error!(session = %self.state.session, error = %e, "driver produced an event that does not fold");
                self.poisoned.get_or_insert(e);
                self.state.last_seq
            }
        }
    }

    fn publish(&mut self, payload: LivePayload) {
        self.effects.push_back(Effect::Publish(LiveEvent {
            session: self.state.session.clone(),
            after_seq: self.state.last_seq,
            payload,
        }));
    }

    fn reply(&mut self, id: CommandId, result: Result<CommandReply, CommandError>) {
        self.effects.push_back(Effect::Reply { id, result });
    }

    /// Durable and live status flip; never repeated.
    fn set_status(&mut self, status: Status) {
        if self.state.status != status {
            self.write(EventPayload::Status(status));
            self.publish(LivePayload::Status { status });
        }
    }

    /// Resolves `when_idle` waiters once nothing runs and no wake is latched.
    fn resolve_idle_waiters(&mut self) {
        if self.is_quiescent() && !self.idle_waiters.is_empty() {
            let summary = self.summary();
            for id in std::mem::take(&mut self.idle_waiters) {
                self.reply(id, Ok(CommandReply::Idle(summary.clone())));
            }
        }
    }

    fn aborting_cause(&self) -> Option<&CancelCause> {
        self.turn.as_ref().and_then(|t| t.cancel.as_ref())
    }
}

/// Splits a run of consecutive appends into the groups that must be written atomically: a `step/start`
/// with the `user/message`s that follow it is one group (recovery tells a claimed message a decision
/// dropped from one whose `user/message` was never written only because they land together); every
/// other event is a group of its own. Journals make single appends cheaper than atomic batches, and a
/// cut between any two groups is repaired by SPEC §6.
pub fn atomic_groups(events: &[Envelope]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let mut end = i + 1;
        if matches!(events[i].payload, EventPayload::StepStart { .. }) {
            while end < events.len() && matches!(events[end].payload, EventPayload::UserMessage { .. }) {
                end += 1;
            }
        }
        groups.push(i..end);
        i = end;
    }
    groups
}

#[cfg(test)]
mod tests;
