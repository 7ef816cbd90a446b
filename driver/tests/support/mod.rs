//! A deterministic simulated runner for one session's [`Driver`].
//!
//! It performs the driver's effects in order against an in-memory log, a fake clock and the pure parts
//! of the worker (the scripted model's [`scripted::plan`], the content guard's [`scripted::judge`]),
//! and checks the driver's invariants after every input: the fold of the log equals the driver's state,
//! seqs are contiguous from 1, time and epoch never decrease, live events carry the seq they follow.
//!
//! Operations complete at once unless the test asked to hold them: a model reply with `[[delay:MS]]` is
//! held (progress it with [`Sim::stream_one_delta`] / [`Sim::finish_model`]), a `sleep` tool call is held
//! until [`Sim::finish_tools`] or [`Sim::advance`], pre-step decisions are held when
//! [`Sim::hold_presteps`] is set, abort acknowledgements when [`Sim::delay_aborts`] is set.
//!
//! Faults ([`Sim::arm`], [`Sim::crash`]) make the simulated worker die or the journal refuse an append
//! group; the runner then does what the real one does (decision 0002): a new owner with the next epoch,
//! or a reload under the same epoch, loads the durable log through `Driver::new` + `Driver::recover`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use turnstile_agent::scripted::{self, ScriptedPlan};
use turnstile_driver::HookVerdict;
use turnstile_driver::{AgentCatalog, Limits};
use turnstile_driver::{
    CommandId, Driver, Effect, ModelOutcome, ModelOutput, ModelRequest, OpId, PreStepDecision, PreStepOutcome,
    PreStepRequest, ToolOutcome, ToolRequest,
};
use turnstile_model::state::SessionState;
use turnstile_model::{
    CancelCause, Command, CommandError, CommandReply, DeadlineSpec, Envelope, EventPayload, GoalAction, Inbox,
    LiveEvent, LivePayload, MessageId, OnDeadline, ScheduleChange, SessionRef, SpliceOutcome, Target, TurnEndReason,
    UserMessage,
};

pub type Reply = Result<CommandReply, CommandError>;

/// One thing the runner saw, in order.
#[derive(Clone, Debug)]
pub enum Rec {
    D(Envelope),
    L(LiveEvent),
    R {
        id: CommandId,
        result: Reply,
    },
    /// A request for IO (pre-step, model, tool, abort), for debugging output.
    Op(String),
}

enum Ready {
    PreStep(OpId, PreStepOutcome),
    /// A text delta, or a reasoning delta when the flag is set.
    Delta(OpId, String, bool),
    ModelDone(OpId, ModelOutcome),
    ToolDone(OpId, ToolOutcome),
}

struct HeldModel {
    req: ModelRequest,
    reply: ModelReply,
    next: usize,
}

/// How the simulated model answers one request: deltas (`(reasoning, text)`) streamed in order, then the
/// output; held until the test streams it when `delay` is not zero. [`ModelReply::scripted`] is the
/// scripted model's plan; a test may queue its own ([`Sim::model_replies`]).
#[derive(Clone, Debug)]
pub struct ModelReply {
    pub deltas: Vec<(bool, String)>,
    pub output: ModelOutput,
    pub delay: std::time::Duration,
}

impl ModelReply {
    pub fn scripted(plan: ScriptedPlan) -> Self {
        Self { deltas: plan.deltas.into_iter().map(|d| (false, d)).collect(), output: plan.output, delay: plan.delay }
    }
}

struct HeldTool {
    req: ToolRequest,
    ms: u64,
    started: u64,
}

pub fn session() -> SessionRef {
    SessionRef::new("tenant", "session-1").unwrap()
}

pub fn msg(id: &str, text: &str) -> UserMessage {
    UserMessage::user_text(id, text)
}

/// The content guard as a pre-step outcome.
pub fn guard(req: &PreStepRequest) -> PreStepOutcome {
    match scripted::judge(req.messages.clone()) {
        Ok(HookVerdict::Pass(batch)) => PreStepOutcome::Decided(PreStepDecision::Enter(batch)),
        Ok(HookVerdict::Reject { reason }) => PreStepOutcome::Decided(PreStepDecision::Reject { reason }),
        Err(e) => PreStepOutcome::Failed { message: e.to_string() },
    }
}

/// What goes wrong at an append group (SPEC §6, decision 0002).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The group becomes durable, then the worker dies: nothing after it is performed (no reply, live
    /// event or operation), and a new owner takes over with the next epoch.
    Crash,
    /// The journal refuses the group (UNAVAILABLE): none of it is stored. The runner answers every
    /// waiting caller UNAVAILABLE, drops its operations and reloads the driver under the same epoch.
    Unavailable,
    /// The group's expected seq is stale: another writer won, none of it is stored. The runner stops
    /// serving the session (its callers answered UNAVAILABLE) and the new owner, with the next epoch,
    /// loads the log.
    Conflict,
}

/// A fault that happened.
#[derive(Clone, Debug)]
pub struct FaultRec {
    pub fault: Fault,
    /// The log length when it happened (after the group, for a crash).
    pub at: usize,
    /// The group it struck: durable but never followed up (a crash), or refused and not stored. Empty for a
    /// crash between inputs.
    pub group: Vec<Envelope>,
    /// The commands still waiting for their reply: lost with a crash, else answered UNAVAILABLE.
    pub unanswered: Vec<CommandId>,
}

pub struct Sim {
    pub driver: Driver,
    pub session: SessionRef,
    pub limits: Limits,
    pub epoch: u64,
    pub now: u64,
    /// The whole durable log (for a recovered session: including what the previous owner wrote).
    pub log: Vec<Envelope>,
    pub live: Vec<LiveEvent>,
    /// What this runner saw, in order (not what a previous owner wrote).
    pub recs: Vec<Rec>,
    /// Replies by command id, with the log length when each was sent.
    pub replies: BTreeMap<CommandId, (Reply, usize)>,
    pub prestep_requests: Vec<PreStepRequest>,
    pub model_requests: Vec<ModelRequest>,
    pub tool_requests: Vec<ToolRequest>,
    /// The driver's inbox at every input boundary, with the seq it had then.
    pub inbox_at: Vec<(u64, Inbox)>,
    /// The log length after each append group (each one conditional append): the only places a crash
    /// can cut the log.
    pub batch_ends: Vec<usize>,
    /// Hold pre-step decisions until [`Sim::decide_pre_steps`].
    pub hold_presteps: bool,
    /// Hold abort signals until [`Sim::deliver_aborts`].
    pub delay_aborts: bool,
    /// How pre-steps are decided (default: the content guard).
    pub decide: fn(&PreStepRequest) -> PreStepOutcome,
    /// Replies for the next model requests, in order, instead of the scripted model's plan.
    pub model_replies: VecDeque<ModelReply>,
    /// The agents every driver of this session knows, a new owner's too.
    pub agents: AgentCatalog,
    /// `(pass, fault)`: `pass` more append groups are performed, the next one suffers `fault`.
    pub armed: Option<(usize, Fault)>,
    /// How long the session has no owner after a crash or a lost race (time passes for steer deadlines).
    pub takeover_gap_ms: u64,
    pub faults: Vec<FaultRec>,
    /// The log length each driver of this session was loaded at (the first one included).
    pub loads: Vec<usize>,
    /// Commands sent and not yet answered (`WhenIdle` waiters among them).
    outstanding: BTreeSet<CommandId>,
    next_cmd: CommandId,
    cursor: usize,
    shadow: SessionState,
    ready: VecDeque<Ready>,
    held_presteps: Vec<PreStepRequest>,
    held_models: Vec<HeldModel>,
    held_tools: Vec<HeldTool>,
    held_aborts: Vec<OpId>,
}

impl Sim {
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Self {
        Self::with_agents(limits, AgentCatalog::default())
    }

    /// A new session whose driver knows `agents`.
    pub fn with_agents(limits: Limits, agents: AgentCatalog) -> Self {
        let state = SessionState::new(session(), limits.dedup_horizon);
        let driver = Driver::new(state.clone(), limits.clone(), agents.clone(), 1, "node-1");
        let mut sim = Self::build(driver, limits, agents, 1, Vec::new(), state, 0);
        sim.driver.recover(0);
        sim.pump();
        assert!(sim.log.is_empty(), "a new session must write nothing on recover: {:?}", sim.render_all());
        sim
    }

    /// A new owner (epoch `epoch`) loads `log`, folds it and calls `recover(now)`.
    pub fn recover(log: Vec<Envelope>, limits: Limits, epoch: u64, now: u64) -> Self {
        Self::recover_with_agents(log, limits, AgentCatalog::default(), epoch, now)
    }

    /// [`Sim::recover`] by a driver that knows `agents`.
    pub fn recover_with_agents(log: Vec<Envelope>, limits: Limits, agents: AgentCatalog, epoch: u64, now: u64) -> Self {
        let state = SessionState::fold(session(), limits.dedup_horizon, &log).unwrap();
        let driver = Driver::new(state.clone(), limits.clone(), agents.clone(), epoch, "node-2");
        let mut sim = Self::build(driver, limits, agents, epoch, log, state, now);
        sim.driver.recover(now);
        sim.pump();
        sim
    }

    fn build(
        driver: Driver,
        limits: Limits,
        agents: AgentCatalog,
        epoch: u64,
        log: Vec<Envelope>,
        shadow: SessionState,
        now: u64,
    ) -> Self {
        let loads = vec![log.len()];
        Self {
            driver,
            session: session(),
            limits,
            epoch,
            now,
            log,
            live: Vec::new(),
            recs: Vec::new(),
            replies: BTreeMap::new(),
            prestep_requests: Vec::new(),
            model_requests: Vec::new(),
            tool_requests: Vec::new(),
            inbox_at: Vec::new(),
            batch_ends: Vec::new(),
            hold_presteps: false,
            delay_aborts: false,
            decide: guard,
            model_replies: VecDeque::new(),
            agents,
            armed: None,
            takeover_gap_ms: 0,
            faults: Vec::new(),
            loads,
            outstanding: BTreeSet::new(),
            next_cmd: 1,
            cursor: 0,
            shadow,
            ready: VecDeque::new(),
            held_presteps: Vec::new(),
            held_models: Vec::new(),
            held_tools: Vec::new(),
            held_aborts: Vec::new(),
        }
    }

    // ----- commands ----------------------------------------------------------------------------

    /// Sends `command`, runs until blocked and returns its id (the reply may still be pending for
    /// `WhenIdle`).
    pub fn submit(&mut self, command: Command) -> CommandId {
        let id = self.next_cmd;
        self.next_cmd += 1;
        // A `Compact` answers once its summary is back (after the pump below).
        let waits = matches!(command, Command::WhenIdle | Command::Compact);
        let now = self.now;
        let faults = self.faults.len();
        self.outstanding.insert(id);
        self.driver.on_command(id, command, now);
        self.perform_effects();
        // A fault during the command's own effects may leave it unanswered (a crash) or answered UNAVAILABLE.
        if !waits && self.faults.len() == faults {
            assert!(self.replies.contains_key(&id), "command {id} got no reply from its own input");
        }
        self.pump();
        id
    }

    /// Sends `command` and returns its reply, which every command except `WhenIdle` gets at once.
    pub fn command(&mut self, command: Command) -> Reply {
        self.try_command(command).expect("the worker died before it answered")
    }

    /// Sends `command` and returns its reply; `None` when the worker died before answering it.
    pub fn try_command(&mut self, command: Command) -> Option<Reply> {
        let before = self.log.len();
        let faults = self.faults.len();
        let id = self.submit(command);
        let (reply, at) = self.replies.get(&id)?.clone();
        // A fault's UNAVAILABLE may follow durable groups of the same input (decision 0002).
        if reply.is_err() && self.faults.len() == faults {
            assert_eq!(at, before, "a refused command wrote durable events: {:?}", reply);
        }
        Some(reply)
    }

    pub fn send(&mut self, message: UserMessage, target: Target, wakeup: bool, expected_turn: Option<u64>) -> Reply {
        self.command(Command::Send { message, target, wakeup, expected_turn, deadline: None })
    }

    pub fn followup(&mut self, id: &str, text: &str) -> Reply {
        self.send(msg(id, text), Target::NextTurn, true, None)
    }

    pub fn queue(&mut self, id: &str, text: &str) -> Reply {
        self.send(msg(id, text), Target::NextTurn, false, None)
    }

    /// A steer whose deadline is `after_ms` after now.
    pub fn steer_with_deadline(&mut self, id: &str, text: &str, after_ms: u64, on_deadline: OnDeadline) -> Reply {
        self.command(Command::Send {
            message: msg(id, text),
            target: Target::NextStep,
            wakeup: true,
            expected_turn: None,
            deadline: Some(DeadlineSpec { after_ms, on_deadline }),
        })
    }

    pub fn steer(&mut self, id: &str, text: &str, expected_turn: Option<u64>) -> Reply {
        self.send(msg(id, text), Target::NextStep, true, expected_turn)
    }

    pub fn inject(&mut self, id: &str, text: &str) -> Reply {
        self.send(msg(id, text), Target::NextStep, false, None)
    }

    pub fn interrupt(&mut self, id: &str, text: &str) -> Reply {
        self.command(Command::Interrupt { message: msg(id, text) })
    }

    pub fn cancel(&mut self, cause: CancelCause, keep_inbox: bool) -> Reply {
        self.command(Command::Cancel { cause, keep_inbox })
    }

    pub fn replace(&mut self, id: &str, message: UserMessage) -> Reply {
        self.command(Command::Replace { id: MessageId::from(id), message })
    }

    pub fn remove(&mut self, id: &str) -> Reply {
        self.command(Command::Remove { id: MessageId::from(id) })
    }

    pub fn clear(&mut self) -> Reply {
        self.command(Command::Clear)
    }

    pub fn set_goal(&mut self, goal_id: &str, objective: &str, max_rounds: u32) -> Reply {
        self.command(Command::SetGoal { goal_id: goal_id.into(), objective: objective.into(), max_rounds })
    }

    pub fn update_goal(&mut self, goal_id: &str, action: GoalAction) -> Reply {
        self.command(Command::UpdateGoal { goal_id: goal_id.into(), action })
    }

    pub fn when_idle(&mut self) -> CommandId {
        self.submit(Command::WhenIdle)
    }

    pub fn reply(&self, id: CommandId) -> Option<&Reply> {
        self.replies.get(&id).map(|(r, _)| r)
    }

    // ----- progress of held operations ---------------------------------------------------------

    pub fn held_pre_steps(&self) -> usize {
        self.held_presteps.len()
    }

    pub fn held_models(&self) -> usize {
        self.held_models.len()
    }

    pub fn held_tools(&self) -> usize {
        self.held_tools.len()
    }

    /// The idempotency keys of the calls running now, in the order they started.
    pub fn held_tool_keys(&self) -> Vec<String> {
        self.held_tools.iter().map(|t| t.req.idempotency_key.clone()).collect()
    }

    pub fn held_aborts(&self) -> usize {
        self.held_aborts.len()
    }

    /// Nothing is held and nothing is ready: the driver waits only for commands.
    pub fn is_blocked_on_nothing(&self) -> bool {
        self.held_presteps.is_empty()
            && self.held_models.is_empty()
            && self.held_tools.is_empty()
            && self.held_aborts.is_empty()
    }

    /// Decides every held pre-step with [`Sim::decide`].
    pub fn decide_pre_steps(&mut self) {
        for req in std::mem::take(&mut self.held_presteps) {
            let outcome = (self.decide)(&req);
            self.ready.push_back(Ready::PreStep(req.op, outcome));
        }
        self.pump();
    }

    /// Decides the held pre-steps with `outcome`.
    pub fn decide_pre_steps_with(&mut self, outcome: PreStepOutcome) {
        for req in std::mem::take(&mut self.held_presteps) {
            self.ready.push_back(Ready::PreStep(req.op, outcome.clone()));
        }
        self.pump();
    }

    /// Streams the next delta of the held model reply; false when there is none left (or no model).
    pub fn stream_one_delta(&mut self) -> bool {
        let Some(m) = self.held_models.first_mut() else { return false };
        let Some((reasoning, delta)) = m.reply.deltas.get(m.next).cloned() else { return false };
        m.next += 1;
        let op = m.req.op;
        self.ready.push_back(Ready::Delta(op, delta, reasoning));
        self.pump();
        true
    }

    /// Streams the rest of every held model reply and finishes it.
    pub fn finish_model(&mut self) {
        for m in std::mem::take(&mut self.held_models) {
            self.now += m.reply.delay.as_millis() as u64;
            for (reasoning, delta) in &m.reply.deltas[m.next..] {
                self.ready.push_back(Ready::Delta(m.req.op, delta.clone(), *reasoning));
            }
            self.ready.push_back(Ready::ModelDone(m.req.op, ModelOutcome::Finished(m.reply.output.clone())));
        }
        self.pump();
    }

    /// Completes every held `sleep` call as if its time had passed.
    pub fn finish_tools(&mut self) {
        for t in std::mem::take(&mut self.held_tools) {
            self.now = self.now.max(t.started + t.ms);
            self.ready.push_back(Ready::ToolDone(t.req.op, tool_ok(&t.req, format!("slept {}", t.ms))));
        }
        self.pump();
    }

    /// Moves the clock on and completes the `sleep` calls that are due.
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
        let now = self.now;
        let (due, rest): (Vec<HeldTool>, Vec<HeldTool>) =
            std::mem::take(&mut self.held_tools).into_iter().partition(|t| t.started + t.ms <= now);
        self.held_tools = rest;
        for t in due {
            self.ready.push_back(Ready::ToolDone(t.req.op, tool_ok(&t.req, format!("slept {}", t.ms))));
        }
        self.pump();
    }

    /// Moves the clock to `now` and fires the driver's timers (steer deadlines) that are due.
    pub fn fire_timers(&mut self, now: u64) {
        self.now = self.now.max(now);
        let now = self.now;
        self.driver.on_timer(now);
        self.perform_effects();
        self.pump();
    }

    /// Delivers the abort signals held by [`Sim::delay_aborts`].
    pub fn deliver_aborts(&mut self) {
        for op in std::mem::take(&mut self.held_aborts) {
            self.abort(op);
        }
        self.pump();
    }

    /// Finishes everything held, repeatedly, until nothing is.
    pub fn settle(&mut self) {
        for _ in 0..1000 {
            if self.is_blocked_on_nothing() {
                return;
            }
            self.deliver_aborts();
            self.decide_pre_steps();
            self.finish_model();
            self.finish_tools();
        }
        panic!("the session did not settle: {:#?}", self.render_all());
    }

    // ----- performing effects ------------------------------------------------------------------

    /// Feeds ready outcomes one at a time, performing the effects of each, until nothing is ready.
    fn pump(&mut self) {
        self.perform_effects();
        while let Some(ready) = self.ready.pop_front() {
            let now = self.now;
            match ready {
                Ready::PreStep(op, outcome) => self.driver.on_pre_step(op, outcome, now),
                Ready::Delta(op, text, reasoning) => self.driver.on_model_delta(op, &text, reasoning, now),
                Ready::ModelDone(op, outcome) => self.driver.on_model_done(op, outcome, now),
                Ready::ToolDone(op, outcome) => self.driver.on_tool_done(op, outcome, now),
            }
            self.perform_effects();
        }
    }

    /// Performs every effect of [`Driver::ready`] in order, then checks the invariants. Records where
    /// each append group ends: the only places a crash can cut the log.
    fn perform_effects(&mut self) {
        for effect in self.driver.ready() {
            let appended = matches!(effect, Effect::Append(_));
            if let Effect::Append(group) = &effect
                && let Some(fault) = self.fault_now()
            {
                let group = group.events().to_vec();
                if fault == Fault::Crash {
                    self.perform(effect);
                    self.batch_ends.push(self.log.len());
                }
                // The rest of this input's effects are never performed; the new driver checks itself.
                self.fault(fault, group);
                return;
            }
            self.perform(effect);
            if appended {
                self.batch_ends.push(self.log.len());
            }
        }
        self.check();
    }

    // ----- faults ------------------------------------------------------------------------------

    /// `pass` more append groups are performed, the next one suffers `fault` (replaces an armed fault).
    pub fn arm(&mut self, pass: usize, fault: Fault) {
        self.armed = Some((pass, fault));
    }

    /// The worker dies between inputs; a new owner takes over after [`Sim::takeover_gap_ms`].
    pub fn crash(&mut self) {
        self.fault(Fault::Crash, Vec::new());
    }

    /// Whether the append group about to be performed suffers the armed fault.
    fn fault_now(&mut self) -> Option<Fault> {
        let (pass, fault) = self.armed?;
        if pass == 0 {
            self.armed = None;
            Some(fault)
        } else {
            self.armed = Some((pass - 1, fault));
            None
        }
    }

    /// What the runner does about `fault` (decision 0002; `worker/src/runner.rs` `perform` and `reload`).
    fn fault(&mut self, fault: Fault, group: Vec<Envelope>) {
        let unanswered: Vec<CommandId> = std::mem::take(&mut self.outstanding).into_iter().collect();
        if fault != Fault::Crash {
            let message = format!("the journal refused an append ({fault:?}); retry with the same message id");
            for &id in &unanswered {
                self.record_reply(id, Err(CommandError::Unavailable(message.clone())));
            }
        }
        self.recs.push(Rec::Op(format!("X fault {fault:?} at {}", self.log.len())));
        self.faults.push(FaultRec { fault, at: self.log.len(), group, unanswered });
        let epoch = match fault {
            Fault::Unavailable => self.epoch,
            Fault::Crash | Fault::Conflict => {
                self.now += self.takeover_gap_ms;
                self.epoch + 1
            }
        };
        self.load(epoch);
    }

    /// Drops the driver and its operations (their outcomes must not reach the next driver) and loads the
    /// session from the durable log the way the worker does: fold, `Driver::new`, `Driver::recover`.
    fn load(&mut self, epoch: u64) {
        self.ready.clear();
        self.held_presteps.clear();
        self.held_models.clear();
        self.held_tools.clear();
        self.held_aborts.clear();
        let state = SessionState::fold(session(), self.limits.dedup_horizon, &self.log)
            .unwrap_or_else(|e| panic!("the durable log does not fold: {e}\n{:#?}", self.render_all()));
        assert_eq!(state, self.shadow, "the fold of the durable log differs from the projection kept while writing");
        self.epoch = epoch;
        self.driver = Driver::new(state, self.limits.clone(), self.agents.clone(), epoch, format!("node-{epoch}"));
        self.loads.push(self.log.len());
        let now = self.now;
        self.driver.recover(now);
        self.pump();
    }

    fn record_reply(&mut self, id: CommandId, result: Reply) {
        assert!(!self.replies.contains_key(&id), "command {id} replied twice");
        // A reply names only what is durable: the driver never answers ahead of its append group.
        let named = match &result {
            Ok(
                CommandReply::Sent { seq, .. }
                | CommandReply::Written { seq }
                | CommandReply::Goal { seq, .. }
                | CommandReply::Schedule { seq, .. },
            ) => *seq,
            Ok(CommandReply::Idle(summary)) => summary.last_seq,
            _ => 0,
        };
        assert!(named <= self.log.len() as u64, "reply {id} names seq {named}, the log ends at {}", self.log.len());
        self.outstanding.remove(&id);
        self.replies.insert(id, (result.clone(), self.log.len()));
        self.recs.push(Rec::R { id, result });
    }

    fn perform(&mut self, effect: Effect) {
        match effect {
            Effect::Append(group) => {
                for env in group.into_events() {
                    assert_eq!(env.seq, self.log.len() as u64 + 1, "seqs are contiguous from 1: {env:?}");
                    assert_eq!(env.session, self.session);
                    assert_eq!(env.epoch, self.epoch, "events carry the writer's epoch: {env:?}");
                    if let Some(last) = self.log.last() {
                        assert!(env.time_ms >= last.time_ms, "time decreased at seq {}", env.seq);
                    }
                    if let Err(e) = self.shadow.apply(&env) {
                        panic!("the log refuses the driver's event {}: {e}\n{:#?}", env.seq, self.render_all());
                    }
                    self.log.push(env.clone());
                    self.recs.push(Rec::D(env));
                }
            }
            Effect::Publish(ev) => {
                assert_eq!(ev.session, self.session);
                // Published once its durable event is: at the end of the append group holding it, which may
                // hold later events too (decision 0021). A reader places it by `after_seq`, and so does
                // the record: right after its durable event and the live events already placed there.
                assert!(ev.after_seq <= self.log.len() as u64, "a live event before its durable event: {ev:?}");
                if let Some(prev) = self.live.last() {
                    assert!(ev.after_seq >= prev.after_seq, "live events out of order: {prev:?} then {ev:?}");
                }
                self.live.push(ev.clone());
                if ev.after_seq == self.log.len() as u64 {
                    self.recs.push(Rec::L(ev));
                } else {
                    let after = self
                        .recs
                        .iter()
                        .position(|r| matches!(r, Rec::D(d) if d.seq == ev.after_seq))
                        .map_or(0, |i| i + 1);
                    let at = after + self.recs[after..].iter().take_while(|r| matches!(r, Rec::L(_))).count();
                    self.recs.insert(at, Rec::L(ev));
                }
            }
            Effect::Reply { id, result } => self.record_reply(id, result),
            Effect::PreStep(req) => {
                self.recs.push(Rec::Op(format!(
                    "X pre-step {}.{} k={} {}",
                    req.turn,
                    req.step,
                    req.proposal,
                    ids(&req.messages)
                )));
                self.prestep_requests.push(req.clone());
                if self.hold_presteps {
                    self.held_presteps.push(req);
                } else {
                    let outcome = (self.decide)(&req);
                    self.ready.push_back(Ready::PreStep(req.op, outcome));
                }
            }
            Effect::Model(req) => {
                match &req.compaction {
                    Some(task) => self.recs.push(Rec::Op(format!("X compact {}..{}", task.from_turn, task.upto_turn))),
                    None => {
                        self.recs.push(Rec::Op(format!("X model {}.{} {}", req.turn, req.step, ids(&req.messages))))
                    }
                }
                self.model_requests.push((*req).clone());
                let reply = match self.model_replies.pop_front() {
                    Some(reply) => reply,
                    None => {
                        let plan = scripted::plan(&req);
                        if let Some(message) = plan.fail {
                            let failed = ModelOutcome::Failed { message, code: "model_failed".into(), spent: None };
                            self.ready.push_back(Ready::ModelDone(req.op, failed));
                            return;
                        }
                        ModelReply::scripted(plan)
                    }
                };
                if reply.delay.is_zero() {
                    for (reasoning, delta) in &reply.deltas {
                        self.ready.push_back(Ready::Delta(req.op, delta.clone(), *reasoning));
                    }
                    self.ready.push_back(Ready::ModelDone(req.op, ModelOutcome::Finished(reply.output)));
                } else {
                    self.held_models.push(HeldModel { req: *req, reply, next: 0 });
                }
            }
            Effect::Tool(req) => {
                self.recs.push(Rec::Op(format!(
                    "X tool {}.{} {} {}",
                    req.turn, req.step, req.call.name, req.call.arguments
                )));
                self.tool_requests.push(req.clone());
                match req.call.name.as_str() {
                    "echo" => {
                        let out = tool_ok(&req, req.call.arguments.clone());
                        self.ready.push_back(Ready::ToolDone(req.op, out));
                    }
                    // `context A|B`: returns "ok" with the context messages "A" and "B" (SPEC §9).
                    "context" => {
                        let mut out = tool_ok(&req, "ok".into());
                        out.context = req
                            .call
                            .arguments
                            .split('|')
                            .enumerate()
                            .map(|(i, text)| msg(&format!("{}.ctx{i}", req.call.call_id), text.trim()))
                            .collect();
                        self.ready.push_back(Ready::ToolDone(req.op, out));
                    }
                    "sleep" => match req.call.arguments.trim().parse::<u64>() {
                        Ok(ms) => self.held_tools.push(HeldTool { req, ms, started: self.now }),
                        Err(_) => {
                            let e = format!("sleep takes a number of milliseconds, got {:?}", req.call.arguments);
                            let out = tool_err(&req, e);
                            self.ready.push_back(Ready::ToolDone(req.op, out));
                        }
                    },
                    other => {
                        let out = tool_err(&req, format!("unknown tool {other:?}; available: clock, echo, sleep"));
                        self.ready.push_back(Ready::ToolDone(req.op, out));
                    }
                }
            }
            Effect::Abort { op } => {
                self.recs.push(Rec::Op(format!("X abort {op}")));
                if self.delay_aborts {
                    self.held_aborts.push(op);
                } else {
                    self.abort(op);
                }
            }
            Effect::Reload { reason } => panic!("driver broke an invariant: {reason}\n{:#?}", self.render_all()),
        }
    }

    /// The operation `op` sees its abort signal.
    fn abort(&mut self, op: OpId) {
        if let Some(i) = self.held_presteps.iter().position(|r| r.op == op) {
            self.held_presteps.remove(i);
            self.ready.push_back(Ready::PreStep(op, PreStepOutcome::Aborted));
        } else if let Some(i) = self.held_models.iter().position(|m| m.req.op == op) {
            self.held_models.remove(i);
            self.ready.push_back(Ready::ModelDone(op, ModelOutcome::Aborted { spent: None }));
        } else if let Some(i) = self.held_tools.iter().position(|t| t.req.op == op) {
            let t = self.held_tools.remove(i);
            let e = format!("aborted after {} of {} ms", self.now - t.started, t.ms);
            self.ready.push_back(Ready::ToolDone(op, tool_err(&t.req, e)));
        }
        // Otherwise the operation already finished: the signal has nothing to stop.
    }

    /// The invariants that hold after every input.
    pub fn check(&mut self) {
        let state = self.driver.state();
        assert_eq!(&self.shadow, state, "the fold of the log differs from the driver's state");
        assert_eq!(state.last_seq, self.log.len() as u64);
        for (i, e) in self.log.iter().enumerate() {
            assert_eq!(e.seq, i as u64 + 1);
        }
        let at = (state.last_seq, state.inbox.clone());
        self.inbox_at.push(at);
    }

    /// Folds the whole log from scratch and compares it with the driver's state.
    pub fn check_full_fold(&self) {
        let folded = SessionState::fold(session(), self.limits.dedup_horizon, &self.log).unwrap();
        assert_eq!(&folded, self.driver.state());
        assert_eq!(folded.inbox, self.driver.state().inbox);
        assert_eq!(folded.status, self.driver.state().status);
        assert_eq!(folded.last_seq, self.driver.state().last_seq);
        assert_eq!(folded.last_turn, self.driver.state().last_turn);
    }

    // ----- rendering ---------------------------------------------------------------------------

    /// Durable and live events (no deltas, replies or IO requests) since the last `take`.
    pub fn take(&mut self) -> Vec<String> {
        let out = self.recs[self.cursor..].iter().filter_map(render_event).collect();
        self.cursor = self.recs.len();
        out
    }

    /// Asserts the events since the last `take`.
    #[track_caller]
    pub fn expect(&mut self, expected: &[&str]) {
        assert_sequence(&self.take(), expected);
    }

    /// Asserts that nothing durable or live happened since the last `take`.
    #[track_caller]
    pub fn expect_nothing(&mut self) {
        self.expect(&[]);
    }

    /// Everything, with deltas, replies and IO requests.
    pub fn render_all(&self) -> Vec<String> {
        self.recs.iter().map(render).collect()
    }

    /// Every recorded line, deltas and replies included, in order.
    pub fn lines(&self) -> Vec<String> {
        self.recs.iter().filter(|r| !matches!(r, Rec::Op(_))).map(render).collect()
    }

    /// The text deltas published for step `turn.step`, concatenated.
    pub fn delta_text(&self, turn: u64, step: u32) -> String {
        self.deltas_of(turn, step, false)
    }

    /// The reasoning deltas published for step `turn.step`, concatenated.
    pub fn delta_reasoning(&self, turn: u64, step: u32) -> String {
        self.deltas_of(turn, step, true)
    }

    /// The step's deltas of one kind, concatenated; each delta's offset must be the length of what came
    /// before it (SPEC §14), which every test that reads deltas thereby checks.
    fn deltas_of(&self, turn: u64, step: u32, of_reasoning: bool) -> String {
        let mut so_far = String::new();
        for e in &self.live {
            if let LivePayload::AssistantDelta { turn: t, step: s, text, reasoning, offset } = &e.payload
                && *t == turn
                && *s == step
                && *reasoning == of_reasoning
            {
                assert_eq!(*offset, so_far.len() as u64, "delta {text:?} of {turn}.{step} after {so_far:?}");
                so_far.push_str(text);
            }
        }
        so_far
    }

    /// Durable and live events, deltas included (no replies or IO requests), since the last `take`.
    pub fn take_with_deltas(&mut self) -> Vec<String> {
        let out = self.recs[self.cursor..].iter().filter(|r| matches!(r, Rec::D(_) | Rec::L(_))).map(render).collect();
        self.cursor = self.recs.len();
        out
    }

    /// Asserts the events since the last `take`, deltas included.
    #[track_caller]
    pub fn expect_with_deltas(&mut self, expected: &[&str]) {
        assert_sequence(&self.take_with_deltas(), expected);
    }

    /// The `assistant/message` of step `turn.step`.
    pub fn assistant_text(&self, turn: u64, step: u32) -> Option<String> {
        self.log.iter().find_map(|e| match &e.payload {
            EventPayload::AssistantMessage { turn: t, step: s, text, .. } if *t == turn && *s == step => {
                Some(text.clone())
            }
            _ => None,
        })
    }

    /// The `user/message` events: (id, turn, step, message).
    pub fn user_messages(&self) -> Vec<(String, u64, u32, UserMessage)> {
        self.log
            .iter()
            .filter_map(|e| match &e.payload {
                EventPayload::UserMessage { message, turn, step } => {
                    Some((message.id.0.clone(), *turn, *step, message.clone()))
                }
                _ => None,
            })
            .collect()
    }

    pub fn pending_ids(&self) -> (Vec<String>, Vec<String>) {
        let inbox = &self.driver.state().inbox;
        (
            inbox.next_turn.iter().map(|m| m.id.0.clone()).collect(),
            inbox.next_step.iter().map(|m| m.id.0.clone()).collect(),
        )
    }
}

impl Default for Sim {
    fn default() -> Self {
        Self::new()
    }
}

fn tool_ok(req: &ToolRequest, output: String) -> ToolOutcome {
    ToolOutcome::new(&req.call.call_id, &req.call.name, output, None)
}

fn tool_err(req: &ToolRequest, error: String) -> ToolOutcome {
    ToolOutcome::new(&req.call.call_id, &req.call.name, String::new(), Some(error))
}

/// `got` is exactly `expected`, else a panic showing both, one line each.
#[track_caller]
fn assert_sequence(got: &[String], expected: &[&str]) {
    assert!(
        got == expected,
        "event sequence differs\n--- expected\n{}\n--- got\n{}\n",
        expected.join("\n"),
        got.join("\n")
    );
}

pub fn ids(messages: &[UserMessage]) -> String {
    format!("[{}]", messages.iter().map(|m| m.id.0.as_str()).collect::<Vec<_>>().join(","))
}

pub fn reason(r: &TurnEndReason) -> String {
    match r {
        TurnEndReason::Completed => "completed".into(),
        TurnEndReason::Blocked { reason: None } => "blocked".into(),
        TurnEndReason::Blocked { reason: Some(reason) } => format!("blocked{{{reason}}}"),
        TurnEndReason::MaxTokens => "max-tokens".into(),
        TurnEndReason::Aborted(cause) => format!("aborted{{{cause}}}"),
        TurnEndReason::Error { code, .. } => format!("error{{{code}}}"),
        TurnEndReason::Interrupted => "interrupted".into(),
    }
}

/// A durable or live event (not a delta), rendered; `None` for everything else.
fn render_event(rec: &Rec) -> Option<String> {
    match rec {
        Rec::D(_) => Some(render(rec)),
        Rec::L(e) if !matches!(e.payload, LivePayload::AssistantDelta { .. }) => Some(render(rec)),
        _ => None,
    }
}

pub fn render_durable(e: &Envelope) -> String {
    match &e.payload {
        EventPayload::InboxSpliced(s) => {
            let mut out = format!("D spliced {} {} {} {}", s.target, s.start, s.removed_count, ids(&s.inserted));
            if s.wake {
                out.push_str(" wake");
            }
            match s.outcome {
                SpliceOutcome::None => {}
                SpliceOutcome::Canceled => out.push_str(" canceled"),
                SpliceOutcome::Restored => out.push_str(" restored"),
            }
            if let Some(t) = s.requested_target {
                out.push_str(&format!(" asked:{t}"));
            }
            out
        }
        EventPayload::Status(s) => format!("D status {s}"),
        EventPayload::TurnStart { turn } => format!("D turn/start {turn}"),
        EventPayload::TurnEnd { turn, reason: r } => format!("D turn/end {turn} {}", reason(r)),
        EventPayload::StepStart { turn, step } => format!("D step/start {turn}.{step}"),
        EventPayload::StepEnd { turn, step, .. } => format!("D step/end {turn}.{step}"),
        EventPayload::UserMessage { message, turn, step } => format!("D user/message {} {turn}.{step}", message.id),
        EventPayload::AssistantMessage {
            turn,
            step,
            text,
            tool_calls,
            interrupted,
            max_tokens,
            reasoning,
            usage,
            model: _,
        } => {
            let mut out = format!("D assistant/message {turn}.{step} {text:?}");
            if let Some(reasoning) = reasoning {
                out.push_str(&format!(" reasoning:{reasoning:?}"));
            }
            if let Some(u) = usage {
                out.push_str(&format!(" usage:{}/{}", u.input_tokens, u.output_tokens));
            }
            if !tool_calls.is_empty() {
                let names: Vec<&str> = tool_calls.iter().map(|c| c.name.as_str()).collect();
                out.push_str(&format!(" calls[{}]", names.join(",")));
            }
            if *interrupted {
                out.push_str(" interrupted");
            }
            if *max_tokens {
                out.push_str(" max-tokens");
            }
            out
        }
        EventPayload::ToolCall { turn, step, call, awaiting_approval: false, awaiting_client: false } => {
            format!("D tool/call {turn}.{step} {}", call.name)
        }
        EventPayload::ToolCall { turn, step, call, awaiting_approval: true, .. } => {
            format!("D tool/call {turn}.{step} {} awaiting-approval", call.name)
        }
        EventPayload::ToolCall { turn, step, call, awaiting_client: true, .. } => {
            format!("D tool/call {turn}.{step} {} awaiting-client", call.name)
        }
        EventPayload::ToolDecision { turn, step, call_id, approved, reason, timed_out } => {
            format!(
                "D tool/decision {turn}.{step} {call_id} {}{} {reason}",
                if *approved { "approved" } else { "denied" },
                if *timed_out { " timed-out" } else { "" }
            )
        }
        EventPayload::ToolResult { turn, step, call_id, error, .. } => {
            format!("D tool/result {turn}.{step} {call_id}{}", if error.is_some() { " error" } else { "" })
        }
        EventPayload::ToolRepaired { turn, step, call_id, action } => {
            format!("D tool/repaired {turn}.{step} {call_id} {}", action.as_str())
        }
        EventPayload::GoalChange(g) => {
            let mut out =
                format!("D goal/change {}.{} {} {}/{}", g.goal_id, g.revision, g.state, g.round, g.max_rounds);
            if let Some(summary) = &g.summary {
                out.push_str(&format!(" summary:{summary:?}"));
            }
            if let Some(reason) = &g.reason {
                out.push_str(&format!(" reason:{reason:?}"));
            }
            out
        }
        EventPayload::SessionConfigured { agent, inject_mode, parent, version } => {
            let mut out = format!("D session/configured {agent} {inject_mode}");
            if let Some(parent) = parent {
                out.push_str(&format!(" parent={parent}"));
            }
            if let Some(version) = version {
                out.push_str(&format!(" version={version}"));
            }
            out
        }
        EventPayload::ContextCompacted(c) => {
            format!("D context/compacted {} {:?} {}", c.upto_turn, c.summary, c.summarized_turns)
        }
        EventPayload::SessionForked(f) => {
            format!("D session/forked {} {} {} {}", f.from, f.at_turn, f.at_seq, f.transcript.len())
        }
        EventPayload::ScheduleChanged(change) => match change {
            ScheduleChange::Created(spec) => format!("D schedule/changed created {}", spec.schedule_id),
            ScheduleChange::Deleted { schedule_id } => format!("D schedule/changed deleted {schedule_id}"),
            ScheduleChange::Fired { schedule_id, fire_ms } => {
                format!("D schedule/changed fired {schedule_id}@{fire_ms}")
            }
            ScheduleChange::Skipped { schedule_id, upto_fire_ms, count } => {
                format!("D schedule/changed skipped {schedule_id} x{count} to {upto_fire_ms}")
            }
        },
        EventPayload::SessionLabeled(l) => {
            let set: Vec<String> = l.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("D session/labeled {} -{}", set.join(","), l.removed.join(","))
        }
        EventPayload::MemoryWritten(m) => format!("D memory/written {}/{}", m.namespace, m.key),
        EventPayload::SessionOverridden(o) => {
            format!("D session/overridden system={:?} model={:?} tools={:?}", o.system_prompt, o.model, o.tools)
        }
        EventPayload::Ignorable { event_type } => format!("D ignorable {event_type}"),
    }
}

pub fn render_live(e: &LiveEvent) -> String {
    match &e.payload {
        LivePayload::Inserted { message } => format!("L inserted {}", message.id),
        LivePayload::Discarded { message } => format!("L discarded {}", message.id),
        LivePayload::Claimed { message, turn } => format!("L claimed {} {turn}", message.id),
        LivePayload::Status { status } => format!("L status {status}"),
        LivePayload::AssistantDelta { turn, step, text, reasoning: false, .. } => {
            format!("L delta {turn}.{step} {text}")
        }
        LivePayload::AssistantDelta { turn, step, text, reasoning: true, .. } => {
            format!("L reasoning {turn}.{step} {text}")
        }
        LivePayload::Error { turn, step, message } => format!("L error {turn}.{step} {message}"),
    }
}

pub fn render_reply(id: CommandId, result: &Reply) -> String {
    match result {
        Ok(CommandReply::Sent { seq, turn: Some(t) }) => format!("R {id} sent {seq} turn {t}"),
        Ok(CommandReply::Sent { seq, turn: None }) => format!("R {id} sent {seq}"),
        Ok(CommandReply::Written { seq }) => format!("R {id} written {seq}"),
        Ok(CommandReply::Idle(s)) => format!("R {id} idle {} {}", s.last_seq, s.status),
        Ok(CommandReply::Streaming(None)) => format!("R {id} streaming none"),
        Ok(CommandReply::Streaming(Some(s))) => format!("R {id} streaming {}.{} {:?}", s.turn, s.step, s.text),
        Ok(CommandReply::Schedule { seq, schedule }) => format!(
            "R {id} schedule {} {seq} next {:?} fired {} missed {}",
            schedule.spec.schedule_id, schedule.next_fire_ms, schedule.fired, schedule.missed
        ),
        Ok(CommandReply::Goal { seq, goal }) => format!(
            "R {id} goal {seq} {}.{} {} {}/{}",
            goal.goal_id, goal.revision, goal.state, goal.round, goal.max_rounds
        ),
        Err(e) => format!("R {id} err {}", error_kind(e)),
    }
}

/// The error's stable kind name (`CommandError::kind`).
pub fn error_kind(e: &CommandError) -> &'static str {
    e.kind()
}

pub fn render(rec: &Rec) -> String {
    match rec {
        Rec::D(e) => render_durable(e),
        Rec::L(e) => render_live(e),
        Rec::R { id, result } => render_reply(*id, result),
        Rec::Op(s) => s.clone(),
    }
}

/// An event through a wire format and back, as another node would read it.
///
/// The event after the proto codec: what a reader of the journal gets back.
pub fn wire_round_trip(e: &Envelope) -> Envelope {
    turnstile_proto::codec::decode_event(&turnstile_proto::codec::encode_event(e)).unwrap()
}

/// `Sent { seq, turn }`, or a panic naming the error.
#[track_caller]
pub fn sent(reply: Reply) -> (u64, Option<u64>) {
    match reply {
        Ok(CommandReply::Sent { seq, turn }) => (seq, turn),
        other => panic!("expected a delivery reply, got {other:?}"),
    }
}

/// `Written { seq }`, or a panic naming the error.
#[track_caller]
pub fn written(reply: Reply) -> u64 {
    match reply {
        Ok(CommandReply::Written { seq }) => seq,
        other => panic!("expected an edit/cancel reply, got {other:?}"),
    }
}

/// `Goal { seq, goal }` (SetGoal and UpdateGoal), or a panic naming the error.
#[track_caller]
pub fn goal(reply: Reply) -> (u64, turnstile_model::goal::GoalChange) {
    match reply {
        Ok(CommandReply::Goal { seq, goal }) => (seq, *goal),
        other => panic!("expected a goal reply, got {other:?}"),
    }
}

/// The error of a refused command: its kind and message.
#[track_caller]
pub fn refused(reply: Reply) -> (&'static str, String) {
    match reply {
        Err(e) => (error_kind(&e), e.to_string()),
        Ok(r) => panic!("expected the command to be refused, got {r:?}"),
    }
}
