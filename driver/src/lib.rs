//! The session driver: SPEC §4–§6 as a sans-IO state machine, the single writer of one session's log.
//!
//! Place in the architecture: the worker's async runner owns one [`Driver`] per loaded session. It
//! feeds the driver *inputs*, each with the current time read once for that input: commands
//! ([`Driver::on_command`]), the outcomes of operations the driver asked for ([`Driver::on_pre_step`],
//! [`Driver::on_model_delta`], [`Driver::on_model_done`], [`Driver::on_tool_done`]) and lifecycle
//! signals ([`Driver::recover`], [`Driver::on_drain`]). After each input it takes [`Driver::ready`]: the
//! [`Effect`]s to perform in order, raft-rs `Ready` style. An [`Effect::Append`] carries an
//! [`AppendGroup`] the journal must write atomically and durably before any later effect runs; the
//! runner never regroups, reorders or second-guesses them.
//!
//! This crate depends on `turnstile-model` (and `tracing`) only: there is no clock, socket or task
//! inside, so every SPEC scenario runs against it in microseconds and the same inputs always give the
//! same effects. Every durable event the driver writes goes through the same fold
//! ([`SessionState::apply`]) that any reader uses, so the owner's inbox is by construction the
//! projection of its own log.
//!
//! ```
//! use turnstile_driver::{AgentCatalog, Driver, Effect, Limits};
//! use turnstile_model::{Command, ContentBlock, MessageSource, SessionRef, SessionState, Target, UserMessage};
//!
//! let session = SessionRef::new("acme", "s1").unwrap();
//! let mut driver = Driver::new(SessionState::new(session, 10_000), Limits::default(), AgentCatalog::default(), 1, "doc");
//! driver.recover(0);
//! let hello = UserMessage { id: "m1".into(), content: vec![ContentBlock::text("hi")].into(), source: MessageSource::User };
//! driver.on_command(1, Command::Send { message: hello, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None }, 1_000);
//! let effects = driver.ready();
//! // The insert splice is durable before anything else happens; the turn's pre-step decision follows.
//! assert!(matches!(&effects[0], Effect::Append(group) if group.events()[0].seq == 1));
//! assert!(effects.iter().any(|e| matches!(e, Effect::PreStep(_))));
//! ```

pub mod agents;
mod commands;
pub mod compaction;
mod deadlines;
pub mod effect;
mod goals;
mod limits;
mod recovery;
mod schedules;
mod tool_calls;
mod turn;

use std::collections::VecDeque;

use turnstile_model::{
    CancelCause, CommandError, CommandReply, Envelope, EventPayload, LiveEvent, LivePayload, ProjectionError,
    SessionState, SessionSummary, Status,
};

pub use agents::{AgentCatalog, AgentOwner, AgentProfile, ApprovalRules, ApprovalTimeout, CatalogError, ToolRules};
pub use effect::{
    ActiveGoal, AppendGroup, CommandId, CompactionTask, Effect, GOAL_COMPLETE, HookError, HookVerdict, ModelOutcome,
    ModelOutput, ModelRequest, OpId, PreStepDecision, PreStepOutcome, PreStepRequest, SUMMARY_PREFIX,
    TENANT_BUDGET_EXHAUSTED, ToolOutcome, ToolRequest, compaction_instruction,
};
pub use limits::{DEFAULT_MAX_PENDING_BYTES, Limits};
use turn::ActiveTurn;
pub use turn::OUTPUT_PLUGIN;

/// The most events [`Driver::write`] puts in one append group before it opens another (a `user/message`
/// still joins its `step/start`'s group). An input writes a handful of events; the bound keeps a pathological
/// one (a cancel of many calls) well inside a journal's cap on one append (1,000 on JetStream).
pub const MAX_GROUP_EVENTS: usize = 256;

/// The driver of one session: its single writer.
#[derive(Debug)]
pub struct Driver {
    state: SessionState,
    limits: Limits,
    /// The agents a session may run (SPEC §8): names for `ConfigureSession`, profiles for model requests.
    agents: AgentCatalog,
    epoch: u64,
    owner: String,
    turn: Option<ActiveTurn>,
    /// A waking delivery arrived while the active turn was aborting: start again once it has ended.
    latched_wake: bool,
    /// Inside a cancel-then-wake that is one step (an interrupt): the idle instant between the aborted
    /// turn's end and the wake is not one `when_idle` may report.
    holding_idle_waiters: bool,
    /// Inside [`Driver::recover`] before its repair: a wake opens no turn yet, recovery decides what resumes.
    recovering: bool,
    idle_waiters: Vec<CommandId>,
    next_op: OpId,
    effects: VecDeque<Effect>,
    /// Set when an event the driver produced does not fold: a bug. [`Driver::ready`] then withdraws this
    /// input's effects and asks for a reload.
    poisoned: Option<ProjectionError>,
    /// The time of the input being handled.
    now_ms: u64,
    /// Handing the session to another owner: finish what runs, claim nothing more.
    draining: bool,
    /// An idle `Compact` waiting for its summary (SPEC §13).
    idle_compaction: Option<compaction::IdleCompaction>,
}

impl Driver {
    /// A driver for a session whose log folds to `state`. Call [`Driver::recover`] before anything else
    /// so an open turn is repaired (SPEC §6).
    ///
    /// The transcript's bound is raised to the catalog's largest history budget, so every agent gets the
    /// history it asks for; it is never lowered here, so the owner's fold stays the readers' fold.
    pub fn new(
        mut state: SessionState,
        limits: Limits,
        agents: AgentCatalog,
        epoch: u64,
        owner: impl Into<String>,
    ) -> Self {
        if agents.max_history_turns() > state.transcript.keep_turns() {
            state.transcript.set_keep_turns(agents.max_history_turns());
        }
        Self {
            state,
            limits,
            agents,
            epoch,
            owner: owner.into(),
            turn: None,
            latched_wake: false,
            holding_idle_waiters: false,
            recovering: false,
            idle_waiters: Vec::new(),
            next_op: 1,
            effects: VecDeque::new(),
            poisoned: None,
            now_ms: 0,
            draining: false,
            idle_compaction: None,
        }
    }

    /// The agents from now on (SPEC §20): an input, given when the worker's agents change (a version put,
    /// an agent deleted). A running turn keeps the version it started with; the next turn resolves anew.
    pub fn set_agents(&mut self, agents: AgentCatalog) {
        if agents.max_history_turns() > self.state.transcript.keep_turns() {
            self.state.transcript.set_keep_turns(agents.max_history_turns());
        }
        self.agents = agents;
    }

    /// The agents this driver resolves turns against.
    pub fn agents(&self) -> &AgentCatalog {
        &self.agents
    }

    /// The fold of everything this driver has written (and what it loaded).
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// The fold, giving up the driver: for keeping an idle session in memory with nothing else. Take it only
    /// from a quiescent driver ([`Driver::is_quiescent`], no command waiting and no timer): a
    /// [`Driver::new`] of the same state, without [`Driver::recover`], then behaves as this one would.
    pub fn into_state(self) -> SessionState {
        self.state
    }

    /// Everything the runner must do after the last input, in order. Each [`Effect::Append`] group must be
    /// durable before any later effect is performed.
    ///
    /// If the last input made the driver produce an event that does not fold (a bug), none of that
    /// input's effects may happen: they are withdrawn, every reply among them becomes UNAVAILABLE (the
    /// caller may retry with the same MessageId), and the last effect is [`Effect::Reload`]. This driver is
    /// then spent; the runner loads the session again from its log.
    pub fn ready(&mut self) -> Vec<Effect> {
        let effects: Vec<Effect> = self.effects.drain(..).collect();
        let Some(error) = self.poisoned.take() else { return effects };
        let message = format!("session {} hit an internal error ({error}); retry", self.state.session);
        let mut withdrawn: Vec<Effect> = effects
            .into_iter()
            .filter_map(|effect| match effect {
                Effect::Reply { id, .. } => {
                    Some(Effect::Reply { id, result: Err(CommandError::Unavailable(message.clone())) })
                }
                _ => None,
            })
            .collect();
        withdrawn.push(Effect::Reload { reason: error.to_string() });
        withdrawn
    }

    /// Starts handing the session off (rebalance or shutdown): the running step finishes, then the driver
    /// stops at the next boundary without claiming, leaving the turn for the next owner to repair and
    /// resume (SPEC §6). Commands must no longer be routed here.
    pub fn on_drain(&mut self) {
        self.draining = true;
        if let Some(t) = self.turn.as_mut()
            && matches!(t.phase, turn::Phase::PreStep { .. } | turn::Phase::Compacting { .. })
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
            // A call waiting for approval (or for its client) runs nothing: the next owner waits instead.
            Some(t) => {
                matches!(t.phase, turn::Phase::Parked | turn::Phase::Tools { running: None, awaiting: Some(_), .. })
            }
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
        let agent = self.agents.resolve(self.state.agent.as_deref(), &self.state.session.tenant).0.to_owned();
        // The driver's own epoch: the log's last event may predate this ownership.
        SessionSummary { epoch: self.epoch, ..SessionSummary::of(&self.state, self.owner.clone(), agent) }
    }

    // ----- outcomes of operations ---------------------------------------------------------------

    /// The pre-step waterfall finished.
    pub fn on_pre_step(&mut self, op: OpId, outcome: PreStepOutcome, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_pre_step(op, outcome);
    }

    /// The model streamed a piece of its reply text, or of its reasoning when `reasoning` is set. Each
    /// becomes a live `assistant/delta` (marked reasoning or not); an abort keeps what was delivered.
    pub fn on_model_delta(&mut self, op: OpId, text: &str, reasoning: bool, now_ms: u64) {
        self.now_ms = now_ms;
        self.turn_model_delta(op, text, reasoning);
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

    /// Writes one durable event: stamps the envelope, folds it, and emits it in an append group. The
    /// events one input writes are one group, up to [`MAX_GROUP_EVENTS`]: an event joins the last group
    /// unless an effect that must see that group durable *and act on it* came after it (a pre-step,
    /// model or tool request, an abort, a reload). Live events and replies wait for the group anyway, so
    /// they do not split it. An idle followup's splice, status, `turn/start` and claim are thus one group,
    /// answered after one journal round trip (SPEC §2), and a step's end, `turn/end` and status another
    /// (decision 0021). A `user/message` always shares the group of the `step/start` it follows (recovery
    /// tells a claimed message a decision dropped from one whose `user/message` was never written only
    /// because they land together). A cut between two groups is repaired by SPEC §6; fewer groups are
    /// fewer places to cut.
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
                let joins_step = matches!(event.payload, EventPayload::UserMessage { .. });
                match self.open_group() {
                    Some(group) if group.len() < MAX_GROUP_EVENTS || (joins_step && group.opens_step()) => {
                        group.push(event);
                    }
                    _ => self.effects.push_back(Effect::Append(AppendGroup::new(event))),
                }
                seq
            }
            Err(e) => {
                tracing::error!(session = %self.state.session, error = %e, "driver produced an event that does not fold");
                self.poisoned.get_or_insert(e);
                self.state.last_seq
            }
        }
    }

    /// The last append group, if only live events and replies follow it (see [`Driver::write`]).
    fn open_group(&mut self) -> Option<&mut AppendGroup> {
        for effect in self.effects.iter_mut().rev() {
            match effect {
                Effect::Append(group) => return Some(group),
                Effect::Publish(_) | Effect::Reply { .. } => {}
                _ => return None,
            }
        }
        None
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
        if self.is_quiescent() && !self.holding_idle_waiters && !self.idle_waiters.is_empty() {
            let summary = self.summary();
            for id in std::mem::take(&mut self.idle_waiters) {
                self.reply(id, Ok(CommandReply::Idle(Box::new(summary.clone()))));
            }
        }
    }

    /// Runs `step` (an abort and the wake that follows it) with `when_idle` held: an aborted turn that ends
    /// at once (it only waited for an approval) goes idle for an instant that no caller may observe. The
    /// waiters resolve afterwards if the session is really idle.
    fn holding_idle_waiters<T>(&mut self, step: impl FnOnce(&mut Self) -> T) -> T {
        let held = std::mem::replace(&mut self.holding_idle_waiters, true);
        let result = step(self);
        self.holding_idle_waiters = held;
        self.resolve_idle_waiters();
        result
    }

    fn aborting_cause(&self) -> Option<&CancelCause> {
        self.turn.as_ref().and_then(|t| t.cancel.as_ref())
    }
}

#[cfg(test)]
mod tests;
