//! The async runner of one session: feeds its [`Driver`] and performs the driver's effects.
//!
//! The runner does IO only: it appends to the journal, publishes live events, answers callers and runs
//! pre-step hooks, model requests and tool calls as tasks whose outcomes come back as driver inputs.
//! Each append group the driver emits is written as one conditional append; it must be durable before any
//! later effect runs, so callers and observers never see what the log does not hold. The runner never
//! regroups the driver's output. Time is read once per input, after the input arrived.
//!
//! When an append fails, the in-memory driver may hold state the log does not: the runner treats that
//! like a crash of the driver. A conflict means another writer owns the session, so the runner stops for
//! good; any other failure drops the driver and reloads it from the log (SPEC §6 repair included).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use turnstile_journal::snapshot::{LoadError, Snapshot, SnapshotStore, load_state};
use turnstile_journal::{JournalError, LiveBus, SessionLog};
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, UserMessage};
use turnstile_model::{Command, CommandError, CommandReply, Envelope, SessionRef};
use turnstile_ops::clock::now_ms;

use crate::config::WorkerConfig;
use crate::hooks::{AgentHooks, run_waterfall};
use crate::host::Ownership;
use crate::metrics::ModelCall;
use crate::model::chat::StreamDelta;
use crate::model::{DeltaSink, Model, ModelError};
use crate::spans::{TurnSpans, command_span, model_span};
use crate::tools::ToolRegistry;
use turnstile_driver::{
    CommandId, Driver, Effect, ModelOutcome, ModelRequest, OpId, PreStepOutcome, PreStepRequest, ToolOutcome,
    ToolRequest,
};

/// Everything a runner needs besides its session.
pub struct RunnerDeps {
    pub log: Arc<dyn SessionLog>,
    pub bus: Arc<dyn LiveBus>,
    pub model: Arc<dyn Model>,
    pub tools: ToolRegistry,
    /// Each agent's pre-step waterfall, picked by the proposal's agent.
    pub hooks: AgentHooks,
    pub snapshots: Arc<dyn SnapshotStore>,
    /// Shard ownership in a cluster; `None` in `turnstile dev`, which owns everything at its epoch.
    pub ownership: Option<Arc<dyn Ownership>>,
    pub config: WorkerConfig,
}

/// Tells a runner to hand its session over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// Finish the running step, claim nothing more, then unload.
    Drain,
    /// Unload now, abandoning whatever runs (the lease is gone or the drain timed out).
    Stop,
    /// Unload now for `DeleteSession`: write no last snapshot and wait for snapshot writes in flight, so
    /// nothing of the session is stored after the runner is gone and the host removes it.
    Dispose,
}

pub(crate) type ReplyTx = oneshot::Sender<Result<CommandReply, CommandError>>;

/// A command for the runner, with where to send its reply.
pub(crate) struct CommandMsg {
    pub command: Command,
    pub reply: ReplyTx,
    /// The caller's W3C trace context: the command's span, its turns and their events join that trace.
    pub traceparent: Option<String>,
}

/// Outcomes of the runner's own operations, fed back into the driver.
enum OpMsg {
    PreStep { op: OpId, outcome: PreStepOutcome },
    ModelDelta { op: OpId, text: String, reasoning: bool },
    ModelDone { op: OpId, outcome: ModelOutcome },
    ToolDone { op: OpId, outcome: ToolOutcome },
}

/// Why a batch of effects could not be completed.
enum Stop {
    /// Reload the driver from the log, then continue.
    Reload,
    /// Another writer owns the session: stop serving it.
    Lost,
}

/// Loads a session (snapshot + tail) into a driver and repairs it (its effects are still to perform).
pub(crate) async fn load_driver(deps: &RunnerDeps, session: &SessionRef, epoch: u64) -> Result<Driver, CommandError> {
    let state = load_state(deps.log.as_ref(), deps.snapshots.as_ref(), session, deps.config.limits.dedup_horizon)
        .await
        .map_err(|e| match e {
            LoadError::Journal(e) => journal_to_command(e),
            LoadError::Projection { .. } => CommandError::Internal(e.to_string()),
        })?;
    let mut driver =
        Driver::new(state, deps.config.limits.clone(), deps.config.agents.clone(), epoch, deps.config.owner_id.clone());
    driver.recover(now_ms());
    Ok(driver)
}

/// First pause before loading a session again while the journal is unavailable; doubles up to the max.
const RELOAD_BACKOFF: Duration = Duration::from_millis(100);
const RELOAD_BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(crate) fn journal_to_command(e: JournalError) -> CommandError {
    match e {
        JournalError::Unavailable(m) if out_of_space(&m) => CommandError::Unavailable(format!(
            "the journal is out of space and refuses writes ({m}); the server stored none of it: free space on the NATS \
             servers (delete sessions, raise max_file_store or [journal] max_bytes) and retry with the same message id"
        )),
        JournalError::Unavailable(m) => {
            CommandError::Unavailable(format!("the journal is unavailable ({m}); retry with the same message id"))
        }
        JournalError::Conflict { .. } => CommandError::Unavailable(format!("{e}; retry to reach the new owner")),
        other => CommandError::Internal(other.to_string()),
    }
}

/// Whether a store error says JetStream has no room: the server's storage limit (`max_file_store`,
/// "insufficient resources", 10023), an account's or a stream's (`max_bytes` with discard new: "maximum
/// bytes exceeded", "storage resources exceeded", 10047). The server reports them only as text.
fn out_of_space(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["insufficient resources", "resources exceeded", "maximum bytes", "no space left"].iter().any(|s| m.contains(s))
}

/// Loads the session, retrying with backoff while the journal is unavailable and answering commands
/// meanwhile with UNAVAILABLE, so service resumes by itself when the journal returns. `None` when the
/// log cannot be folded (every waiting command gets that error) or the host went away.
async fn load_until_available(
    deps: &RunnerDeps,
    session: &SessionRef,
    epoch: u64,
    commands: &mut mpsc::Receiver<CommandMsg>,
) -> Option<Driver> {
    let mut backoff = RELOAD_BACKOFF;
    loop {
        let error = match load_driver(deps, session, epoch).await {
            Ok(driver) => return Some(driver),
            Err(e @ CommandError::Unavailable(_)) => e,
            Err(e) => {
                tracing::error!(%session, error = %e, "cannot load session");
                commands.close();
                while let Some(msg) = commands.recv().await {
                    let _ = msg.reply.send(Err(e.clone()));
                }
                return None;
            }
        };
        tracing::warn!(%session, error = %error, retry_in = ?backoff, "cannot load session; retrying");
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                msg = commands.recv() => match msg {
                    Some(msg) => { let _ = msg.reply.send(Err(error.clone())); }
                    None => return None,
                },
            }
        }
        backoff = (backoff * 2).min(RELOAD_BACKOFF_MAX);
    }
}

/// One session's runner task.
pub(crate) struct Runner {
    session: SessionRef,
    deps: Arc<RunnerDeps>,
    driver: Driver,
    waiting: HashMap<CommandId, ReplyTx>,
    next_command: CommandId,
    ops: HashMap<OpId, CancellationToken>,
    op_tx: mpsc::UnboundedSender<OpMsg>,
    op_rx: mpsc::UnboundedReceiver<OpMsg>,
    /// Cancelled when the runner stops, so no operation outlives it.
    stopped: CancellationToken,
    /// Cancelled (then replaced) just before the operations' tokens when the runner lets them go without a
    /// cancel of the turn (reload, shutdown): tools see it as `ToolContext::released`.
    released: CancellationToken,
    /// The seq of the last snapshot written (or loaded).
    snapshot_seq: u64,
    /// The owner epoch this runner writes under.
    epoch: u64,
    control: mpsc::UnboundedReceiver<Control>,
    draining: bool,
    /// Set by [`Control::Dispose`]: the session is being deleted.
    disposed: bool,
    /// Snapshot writes running in the background.
    saves: tokio::task::JoinSet<()>,
    clock: crate::metrics::SessionClock,
    spans: TurnSpans,
}

impl Runner {
    /// Loads the session and serves `commands` until the host drops the sender or ownership is lost.
    pub(crate) async fn run(
        session: SessionRef,
        deps: Arc<RunnerDeps>,
        epoch: u64,
        mut commands: mpsc::Receiver<CommandMsg>,
        control: mpsc::UnboundedReceiver<Control>,
    ) {
        let Some(driver) = load_until_available(&deps, &session, epoch, &mut commands).await else { return };
        let (op_tx, op_rx) = mpsc::unbounded_channel();
        let snapshot_seq = driver.state().last_seq;
        let mut runner = Runner {
            session,
            deps,
            driver,
            waiting: HashMap::new(),
            next_command: 1,
            ops: HashMap::new(),
            op_tx,
            op_rx,
            stopped: CancellationToken::new(),
            released: CancellationToken::new(),
            snapshot_seq,
            epoch,
            control,
            draining: false,
            disposed: false,
            saves: tokio::task::JoinSet::new(),
            clock: crate::metrics::SessionClock::default(),
            spans: TurnSpans::default(),
        };
        if runner.settle(&mut commands).await && runner.serve(&mut commands).await && !runner.disposed {
            // Unloading cleanly (the driver's state is exactly the log): keep a snapshot so the next load
            // reads only what follows it. After a failed append the state may hold events the log does
            // not, so nothing is written then.
            runner.snapshot(true).await;
        }
        // Before the queue closes: the host takes a closed queue to mean nothing more is written.
        while runner.saves.join_next().await.is_some() {}
        runner.shutdown(&mut commands, "the session's runner stopped; retry");
    }

    /// True when the host closed the queue, false when the session can no longer be served.
    async fn serve(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        let passivate_after = self.deps.config.passivate_after;
        loop {
            let idle_for = tokio::time::sleep(passivate_after);
            // A steer deadline (SPEC §11): the driver keeps them; the runner only sleeps until the next.
            let timer = self.driver.next_timer();
            let timer_due =
                tokio::time::sleep(Duration::from_millis(timer.map_or(0, |at| at.saturating_sub(now_ms()))));
            // The span of what this iteration does: the command's, else the open step's or turn's.
            let mut span = None;
            tokio::select! {
                () = idle_for, if self.is_unloadable() => {
                    // Passivation: an idle session costs nothing until its next command.
                    tracing::debug!(session = %self.session, "passivating idle session");
                    return true;
                }
                () = timer_due, if timer.is_some() => self.driver.on_timer(now_ms()),
                Some(control) = self.control.recv() => match control {
                    Control::Drain => {
                        self.draining = true;
                        self.driver.on_drain();
                    }
                    Control::Stop => return true,
                    Control::Dispose => {
                        self.disposed = true;
                        return true;
                    }
                },
                Some(msg) = self.op_rx.recv() => {
                    let now = now_ms();
                    match msg {
                    OpMsg::PreStep { op, outcome } => {
                        self.ops.remove(&op);
                        self.driver.on_pre_step(op, outcome, now);
                    }
                    OpMsg::ModelDelta { op, text, reasoning } => {
                        self.driver.on_model_delta(op, &text, reasoning, now);
                    }
                    OpMsg::ModelDone { op, outcome } => {
                        self.ops.remove(&op);
                        self.driver.on_model_done(op, outcome, now);
                    }
                    OpMsg::ToolDone { op, outcome } => {
                        self.ops.remove(&op);
                        self.driver.on_tool_done(op, outcome, now);
                    }
                    }
                },
                msg = commands.recv() => {
                    let Some(CommandMsg { command, reply, traceparent }) = msg else { return true };
                    span = Some(command_span(&self.session, command.name(), traceparent.as_deref()));
                    let id = self.next_command;
                    self.next_command += 1;
                    self.waiting.insert(id, reply);
                    self.driver.on_command(id, command, now_ms());
                }
            }
            let span = span.unwrap_or_else(|| self.spans.active());
            if !self.settle(commands).instrument(span).await {
                return false;
            }
            self.snapshot(false).await;
            if self.draining && self.driver.is_parked() {
                return true;
            }
        }
    }

    /// Nothing runs, nothing waits: the session may be unloaded.
    fn is_unloadable(&self) -> bool {
        // A pending steer deadline must fire on time, so its session stays loaded.
        self.driver.is_quiescent()
            && self.waiting.is_empty()
            && self.ops.is_empty()
            && self.driver.next_timer().is_none()
    }

    /// Writes a snapshot every `snapshot_every` events (or always when `final_`), in the background so
    /// the session is not held up; a failed snapshot only costs a longer fold later.
    async fn snapshot(&mut self, final_: bool) {
        let state = self.driver.state();
        let due = state.last_seq > self.snapshot_seq
            && (final_ || state.last_seq - self.snapshot_seq >= self.deps.config.snapshot_every);
        if !due {
            return;
        }
        self.snapshot_seq = state.last_seq;
        let (snapshot, store, session) = (Snapshot::of(state), self.deps.snapshots.clone(), self.session.clone());
        let save = async move {
            if let Err(e) = store.save(&snapshot).await {
                tracing::warn!(%session, error = %e, "snapshot not written");
            }
        };
        if final_ {
            save.await;
        } else {
            // Reap finished writes so the set stays as small as the writes in flight.
            while self.saves.try_join_next().is_some() {}
            self.saves.spawn(save);
        }
    }

    /// Performs the driver's effects, reloading from the log after a failed append. Returns false when
    /// the session must no longer be served.
    async fn settle(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        loop {
            let effects = self.driver.ready();
            match self.perform(effects).await {
                Ok(()) => return true,
                Err(Stop::Lost) => return false,
                Err(Stop::Reload) => {
                    if !self.reload(commands).await {
                        return false;
                    }
                }
            }
        }
    }

    async fn perform(&mut self, effects: Vec<Effect>) -> Result<(), Stop> {
        let mut rest = effects.into_iter();
        while let Some(effect) = rest.next() {
            match effect {
                Effect::Append(group) => {
                    if let Err(e) = self.append(group.events()).await {
                        let remaining: Vec<Effect> = rest.collect();
                        let lost = matches!(e, JournalError::Conflict { .. });
                        let message = journal_to_command(e.clone()).to_string();
                        tracing::warn!(session = %self.session, error = %e, "append failed");
                        self.fail_replies(&remaining, &message);
                        return Err(if lost { Stop::Lost } else { Stop::Reload });
                    }
                }
                Effect::Publish(event) => {
                    if let Err(e) = self.deps.bus.publish(&event).await {
                        tracing::debug!(session = %self.session, error = %e, "live event not published");
                    }
                }
                Effect::Reply { id, result } => {
                    if let Some(tx) = self.waiting.remove(&id) {
                        let _ = tx.send(result);
                    }
                }
                Effect::PreStep(request) => self.spawn_pre_step(request),
                Effect::Model(request) => self.spawn_model(request),
                Effect::Tool(request) => self.spawn_tool(request),
                Effect::Abort { op } => {
                    if let Some(token) = self.ops.get(&op) {
                        token.cancel();
                    }
                }
                Effect::Reload { reason } => {
                    // The driver already withdrew this input's effects and failed its replies.
                    tracing::error!(session = %self.session, error = %reason, "driver invariant broken; reloading");
                    return Err(Stop::Reload);
                }
            }
        }
        Ok(())
    }

    async fn append(&mut self, batch: &[Envelope]) -> Result<u64, JournalError> {
        let expected = batch.first().map_or(0, |e| e.seq.saturating_sub(1));
        // A worker whose lease lapsed (or was taken) must not write again under the old epoch, even
        // where the conditional append would still let it through (nobody else has written yet).
        if let Some(ownership) = &self.deps.ownership
            && !ownership.may_write(&self.session, self.epoch)
        {
            return Err(JournalError::Conflict { session: self.session.clone(), expected, actual: expected });
        }
        let started = std::time::Instant::now();
        let span = self.spans.begin_append(&self.session, batch);
        let traceparent = turnstile_ops::trace::traceparent_of(&span);
        let result =
            self.deps.log.append_traced(&self.session, expected, batch, traceparent.as_deref()).instrument(span).await;
        self.spans.end_append(batch);
        self.clock.appended(batch, started.elapsed(), &result);
        result
    }

    /// Answers every reply among `effects` with UNAVAILABLE: their writes did not all become durable.
    fn fail_replies(&mut self, effects: &[Effect], message: &str) {
        for effect in effects {
            if let Effect::Reply { id, .. } = effect
                && let Some(tx) = self.waiting.remove(id)
            {
                let _ = tx.send(Err(CommandError::Unavailable(message.to_owned())));
            }
        }
    }

    /// Drops the driver and its operations and loads the session again from the log, waiting out a
    /// journal outage. False when the session cannot be served any more.
    async fn reload(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        std::mem::take(&mut self.released).cancel();
        for (_, token) in self.ops.drain() {
            token.cancel();
        }
        // Outcomes of the dropped operations must not reach the new driver.
        let (op_tx, op_rx) = mpsc::unbounded_channel();
        self.op_tx = op_tx;
        self.op_rx = op_rx;
        // Callers waiting on the old driver (when_idle) learn that it is gone; they may ask again.
        for (_, tx) in self.waiting.drain() {
            let _ = tx.send(Err(CommandError::Unavailable(format!(
                "session {} is reloading after a journal error; retry",
                self.session
            ))));
        }
        match load_until_available(&self.deps, &self.session, self.epoch, commands).await {
            Some(driver) => {
                self.driver = driver;
                true
            }
            None => false,
        }
    }

    fn shutdown(&mut self, commands: &mut mpsc::Receiver<CommandMsg>, message: &str) {
        self.released.cancel();
        self.stopped.cancel();
        for (_, token) in self.ops.drain() {
            token.cancel();
        }
        for (_, tx) in self.waiting.drain() {
            let _ = tx.send(Err(CommandError::Unavailable(message.to_owned())));
        }
        commands.close();
        while let Ok(msg) = commands.try_recv() {
            let _ = msg.reply.send(Err(CommandError::Unavailable(message.to_owned())));
        }
    }

    fn op_token(&mut self, op: OpId) -> CancellationToken {
        let token = self.stopped.child_token();
        self.ops.insert(op, token.clone());
        token
    }

    fn spawn_pre_step(&mut self, request: PreStepRequest) {
        let token = self.op_token(request.op);
        let (tx, session) = (self.op_tx.clone(), self.session.clone());
        let waterfall = self.deps.hooks.for_agent(&request.agent);
        let task = async move {
            let outcome = tokio::select! {
                // Checked first: a hook that sees the abort returns an error, which must not be mistaken
                // for a hook failure.
                biased;
                () = token.cancelled() => PreStepOutcome::Aborted,
                r = run_waterfall(&waterfall, &session, &request, &token) => match r {
                    Ok(decision) => PreStepOutcome::Decided(decision),
                    Err(e) => PreStepOutcome::Failed { message: e.to_string() },
                },
            };
            let _ = tx.send(OpMsg::PreStep { op: request.op, outcome });
        };
        // The hooks' spans (`pre_step.hook`) belong to the open turn.
        tokio::spawn(task.instrument(self.spans.active()));
    }

    fn spawn_model(&mut self, request: ModelRequest) {
        let token = self.op_token(request.op);
        let (tx, deps, op) = (self.op_tx.clone(), self.deps.clone(), request.op);
        let identity = deps.model.identity(&request.agent);
        // The step's span is open: `step/start` was appended before the driver asked for the model.
        let span = model_span(&self.spans.active(), &self.session, &request.agent, &identity);
        let mut call = ModelCall::start(&self.session, &request.agent, identity, span.clone());
        let task = async move {
            let (delta_tx, mut delta_rx) = mpsc::channel::<StreamDelta>(64);
            let forward = {
                let tx = tx.clone();
                let call = &mut call;
                async move {
                    while let Some(delta) = delta_rx.recv().await {
                        call.streamed();
                        let (text, reasoning) = match delta {
                            StreamDelta::Text(text) => (text, false),
                            StreamDelta::Reasoning(text) => (text, true),
                        };
                        let _ = tx.send(OpMsg::ModelDelta { op, text, reasoning });
                    }
                }
            };
            let step = deps.model.step(request, DeltaSink::new(delta_tx), token.clone());
            // The forwarder ends when the model drops its sink, so every delta precedes the outcome.
            let (result, ()) = tokio::join!(
                async {
                    tokio::select! {
                        () = token.cancelled() => Err(ModelError::Aborted),
                        r = step => r,
                    }
                },
                forward
            );
            let outcome = match result {
                Ok(output) => ModelOutcome::Finished(output),
                Err(ModelError::Failed { message, code }) => ModelOutcome::Failed { message, code },
                Err(ModelError::Aborted) => ModelOutcome::Aborted,
            };
            call.finish(&outcome);
            let _ = tx.send(OpMsg::ModelDone { op, outcome });
        };
        tokio::spawn(task.instrument(span));
    }

    fn spawn_tool(&mut self, request: ToolRequest) {
        let token = self.op_token(request.op);
        let released = self.released.clone();
        let (tx, deps, session) = (self.op_tx.clone(), self.deps.clone(), self.session.clone());
        let span = tracing::info_span!(
            parent: &self.spans.active(),
            "tool.call",
            %session,
            agent = %request.agent,
            tool = %request.call.name,
            call_id = %request.call.call_id,
            outcome = tracing::field::Empty,
        );
        tokio::spawn(
            async move {
                // A started call finishes even on abort: the tool sees the signal and may stop early.
                let call = &request.call;
                let r = deps
                    .tools
                    .run(&session, &call.call_id, &request.agent, &call.name, &call.arguments, &token, &released)
                    .await;
                // Context messages get ids derived from the call id (unique in the session like it).
                let context = r
                    .context
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| UserMessage {
                        id: MessageId(format!("{}.ctx{i}", call.call_id)),
                        content: vec![ContentBlock::text(text)],
                        source: MessageSource::Tool { call_id: call.call_id.clone() },
                    })
                    .collect();
                let outcome = ToolOutcome {
                    concludes_turn: r.concludes_turn,
                    context,
                    ..ToolOutcome::new(call.call_id.clone(), call.name.clone(), r.output, r.error)
                };
                let _ = tx.send(OpMsg::ToolDone { op: request.op, outcome });
            }
            .instrument(span),
        );
    }
}
