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
use turnstile_journal::snapshot::{LoadError, Snapshot, SnapshotStore, empty_state, load_state};
use turnstile_journal::{JournalError, LiveBus, SessionLog};
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, UserMessage};
use turnstile_model::{Command, CommandError, CommandReply, Envelope, SessionRef, SessionState};
use turnstile_ops::clock::now_ms;

use crate::agent::{Agents, DeltaSink, HookVerdict, ModelError, StreamDelta};
use crate::config::WorkerConfig;
use crate::host::Ownership;
use crate::metrics::ModelCall;
use crate::spans::{TurnSpans, command_span, model_span};
use turnstile_driver::{
    CommandId, Driver, Effect, ModelOutcome, ModelRequest, OpId, PreStepDecision, PreStepOutcome, PreStepRequest,
    ToolOutcome, ToolRequest,
};
use turnstile_ops::GaugeGuard;

/// Everything a runner needs besides its session.
pub struct RunnerDeps {
    pub log: Arc<dyn SessionLog>,
    pub bus: Arc<dyn LiveBus>,
    /// The agents' catalog, and what answers their pre-step, model and tool effects.
    pub agents: Agents,
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
    let mut driver = Driver::new(
        state,
        deps.config.limits.clone(),
        deps.agents.catalog.clone(),
        epoch,
        deps.config.owner_id.clone(),
    );
    driver.recover(now_ms());
    Ok(driver)
}

/// A driver taking up a parked session's fold: no repair, since the driver it came from was quiescent.
fn resume_driver(deps: &RunnerDeps, state: SessionState, epoch: u64) -> Driver {
    Driver::new(state, deps.config.limits.clone(), deps.agents.catalog.clone(), epoch, deps.config.owner_id.clone())
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

/// A loaded session whose runner ended because it was idle (decision 0037): its driver alone, with no
/// task, channel, timer or span. The host keeps it until the next command resumes it or passivation
/// drops it; both happen without reading or writing anything.
pub(crate) struct Parked {
    /// The quiescent driver's fold: a driver is rebuilt from it, without repair, when a command comes.
    state: SessionState,
    epoch: u64,
    /// The seq of the last snapshot written (or loaded), so a resumed runner keeps the snapshot cadence.
    snapshot_seq: u64,
    /// When passivation may drop it.
    pub(crate) until: tokio::time::Instant,
    /// Counts it in `turnstile_sessions_loaded` while it is held.
    _loaded: GaugeGuard,
}

impl Parked {
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").field("epoch", &self.epoch).field("last_seq", &self.state.last_seq).finish()
    }
}

/// What a runner starts from.
pub(crate) enum Start {
    /// Load the session from its snapshot and log.
    Load,
    /// Take up a parked driver where it stopped.
    Resume(Box<Parked>),
    /// Serve this command of a session the host has not seen: written as a new session's first events
    /// before any read (decision 0040), else on the driver loaded after that.
    Fresh(CommandMsg),
}

/// Where a runner may park its driver when idle: the host's slot of its session, named by the runner's id.
pub(crate) trait Home: Send + Sync + 'static {
    /// Replaces runner `id`'s entry with `parked` when it is still the session's runner and `commands` and
    /// `control` are empty, closing `commands` so the next command finds the parked driver. Gives `parked`
    /// back when the runner must go on serving.
    fn park(
        &self,
        session: &SessionRef,
        id: u64,
        parked: Box<Parked>,
        commands: &mut mpsc::Receiver<CommandMsg>,
        control: &mpsc::UnboundedReceiver<Control>,
    ) -> Result<(), Box<Parked>>;
}

/// How [`Runner::serve`] ended.
enum Served {
    /// Unload (the host closed the queue, a stop, a drain that parked every step, a dispose).
    Unload,
    /// Nothing ran for `park_after`: hand the driver to the host.
    Park,
    /// The session can no longer be served.
    Lost,
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

/// What a runner needs to park: the host's map and its own id there.
pub(crate) struct Parking {
    pub home: std::sync::Weak<dyn Home>,
    pub id: u64,
}

impl Runner {
    /// Loads the session (or resumes a parked driver) and serves `commands` until the host drops the
    /// sender, ownership is lost, or the session parks.
    pub(crate) async fn run(
        session: SessionRef,
        deps: Arc<RunnerDeps>,
        epoch: u64,
        start: Start,
        mut commands: mpsc::Receiver<CommandMsg>,
        control: mpsc::UnboundedReceiver<Control>,
        parking: Parking,
    ) {
        let mut first = None;
        let (driver, snapshot_seq, loaded) = match start {
            Start::Load => {
                let loaded = crate::metrics::loaded();
                let Some(driver) = load_until_available(&deps, &session, epoch, &mut commands).await else { return };
                let snapshot_seq = driver.state().last_seq;
                (driver, snapshot_seq, loaded)
            }
            Start::Resume(parked) => {
                let Parked { state, snapshot_seq, _loaded, .. } = *parked;
                (resume_driver(&deps, state, epoch), snapshot_seq, _loaded)
            }
            Start::Fresh(msg) => {
                let loaded = crate::metrics::loaded();
                let empty = match empty_state(&session, deps.config.limits.dedup_horizon) {
                    Ok(state) => state,
                    Err(e) => {
                        let _ = msg.reply.send(Err(CommandError::Internal(e.to_string())));
                        return;
                    }
                };
                first = Some(msg);
                (resume_driver(&deps, empty, epoch), 0, loaded)
            }
        };
        let mut runner = Runner::new(session, deps, driver, snapshot_seq, epoch, control);
        let served = match first {
            Some(msg) => runner.serve_first(msg, &mut commands).await,
            None => runner.settle(&mut commands).await,
        };
        if !served {
            return runner.end(&mut commands, false).await;
        }
        let mut loaded = Some(loaded);
        loop {
            match runner.serve(&mut commands).await {
                Served::Unload => return runner.end(&mut commands, true).await,
                Served::Lost => return runner.end(&mut commands, false).await,
                Served::Park => {
                    // Snapshot writes in flight finish first: dropping the runner would abort them.
                    while runner.saves.join_next().await.is_some() {}
                    let (Some(home), Some(guard)) = (parking.home.upgrade(), loaded.take()) else {
                        return runner.end(&mut commands, true).await;
                    };
                    let config = &runner.deps.config;
                    let until = tokio::time::Instant::now() + config.passivate_after.saturating_sub(config.park_after);
                    // Parking needs nothing of the runner but the driver: nothing runs or waits.
                    let Runner { session, deps, driver, snapshot_seq, epoch, control, .. } = runner;
                    let parked =
                        Box::new(Parked { state: driver.into_state(), epoch, snapshot_seq, until, _loaded: guard });
                    match home.park(&session, parking.id, parked, &mut commands, &control) {
                        Ok(()) => {
                            tracing::debug!(%session, "parked idle session");
                            return;
                        }
                        // A command or control message came in meanwhile: serve it.
                        Err(parked) => {
                            let Parked { state, _loaded, .. } = *parked;
                            loaded = Some(_loaded);
                            let driver = resume_driver(&deps, state, epoch);
                            runner = Runner::new(session, deps, driver, snapshot_seq, epoch, control);
                        }
                    }
                }
            }
        }
    }

    fn new(
        session: SessionRef,
        deps: Arc<RunnerDeps>,
        driver: Driver,
        snapshot_seq: u64,
        epoch: u64,
        control: mpsc::UnboundedReceiver<Control>,
    ) -> Self {
        let (op_tx, op_rx) = mpsc::unbounded_channel();
        Runner {
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
        }
    }

    /// Unloads: a last snapshot when `clean` (the driver's state is exactly the log) and the session is not
    /// being deleted, then every waiting caller is answered.
    async fn end(mut self, commands: &mut mpsc::Receiver<CommandMsg>, clean: bool) {
        if clean && !self.disposed {
            // Keep a snapshot so the next load reads only what follows it. After a failed append the state
            // may hold events the log does not, so nothing is written then.
            self.snapshot(true).await;
        }
        // Before the queue closes: the host takes a closed queue to mean nothing more is written.
        while self.saves.join_next().await.is_some() {}
        self.shutdown(commands, "the session's runner stopped; retry");
    }

    /// How serving ended: see [`Served`].
    async fn serve(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> Served {
        // Parking keeps the driver in memory without a task; passivation (the host) drops it later.
        let park_after = self.deps.config.park_after.min(self.deps.config.passivate_after);
        loop {
            let idle_for = tokio::time::sleep(park_after);
            // A steer deadline (SPEC §11): the driver keeps them; the runner only sleeps until the next.
            let timer = self.driver.next_timer();
            let timer_due =
                tokio::time::sleep(Duration::from_millis(timer.map_or(0, |at| at.saturating_sub(now_ms()))));
            // The span of what this iteration does: the command's, else the open step's or turn's.
            let mut span = None;
            tokio::select! {
                () = idle_for, if self.is_unloadable() && !self.draining => return Served::Park,
                () = timer_due, if timer.is_some() => self.driver.on_timer(now_ms()),
                Some(control) = self.control.recv() => match control {
                    Control::Drain => {
                        self.draining = true;
                        self.driver.on_drain();
                    }
                    Control::Stop => return Served::Unload,
                    Control::Dispose => {
                        self.disposed = true;
                        return Served::Unload;
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
                    let Some(CommandMsg { command, reply, traceparent }) = msg else { return Served::Unload };
                    span = Some(command_span(&self.session, command.name(), traceparent.as_deref()));
                    let id = self.next_command;
                    self.next_command += 1;
                    self.waiting.insert(id, reply);
                    self.driver.on_command(id, command, now_ms());
                }
            }
            let span = span.unwrap_or_else(|| self.spans.active());
            if !self.settle(commands).instrument(span).await {
                return Served::Lost;
            }
            self.snapshot(false).await;
            if self.draining && self.driver.is_parked() {
                return Served::Unload;
            }
        }
    }

    /// Serves the first command of a session the host has not seen (decision 0040). The driver starts from
    /// the empty fold; when the command's first effect is an append group, that group is written with
    /// [`SessionLog::append_first`] before anything is read. Written: the session was new, and the command
    /// is answered after that one round trip instead of a load and an append. Refused (the log has events)
    /// or not a write: the empty driver and its effects are dropped, none of them having happened, and the
    /// command runs on the session loaded from its log. False when the session can no longer be served.
    async fn serve_first(&mut self, first: CommandMsg, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        let CommandMsg { command, reply, traceparent } = first;
        let span = command_span(&self.session, command.name(), traceparent.as_deref());
        let id = self.next_command;
        self.next_command += 1;
        self.driver.on_command(id, command.clone(), now_ms());
        let mut effects = self.driver.ready().into_iter();
        let written = match effects.next() {
            Some(Effect::Append(group)) => self.write(group.events(), true).instrument(span.clone()).await,
            _ => Ok(None),
        };
        match written {
            Ok(Some(_)) => {
                self.waiting.insert(id, reply);
                return self.settle_after(effects.collect(), commands).instrument(span).await;
            }
            Ok(None) => {}
            // Only the lease check refuses that way here: another worker serves the session now.
            Err(e @ JournalError::Conflict { .. }) => {
                let _ = reply.send(Err(journal_to_command(e)));
                return false;
            }
            // The journal is away (or the outcome unknown): answered now, as commands are while a session
            // cannot load; the client's retry with the same id finds the group if it landed (SPEC §1).
            Err(e) => {
                tracing::warn!(session = %self.session, error = %e, "first append failed; loading the session");
                let _ = reply.send(Err(journal_to_command(e)));
                return self.load_from_log(commands).await && self.settle(commands).await;
            }
        }
        if !self.load_from_log(commands).await {
            let _ = reply.send(Err(CommandError::Unavailable(format!(
                "session {} could not be loaded; retry with the same message id",
                self.session
            ))));
            return false;
        }
        let id = self.next_command;
        self.next_command += 1;
        self.waiting.insert(id, reply);
        self.driver.on_command(id, command, now_ms());
        self.settle(commands).instrument(span).await
    }

    /// Replaces the empty driver of [`Runner::serve_first`] with the session loaded from its log, waiting
    /// out a journal outage. False when the session cannot be served.
    async fn load_from_log(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        let Some(driver) = load_until_available(&self.deps, &self.session, self.epoch, commands).await else {
            return false;
        };
        self.snapshot_seq = driver.state().last_seq;
        self.driver = driver;
        // The empty driver's turn span, if its group opened one, belongs to nothing that happened.
        self.spans = TurnSpans::default();
        true
    }

    /// Performs `effects` (the rest of an input's, after its first group was written), then settles.
    async fn settle_after(&mut self, effects: Vec<Effect>, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        match self.perform(effects).await {
            Ok(()) => self.settle(commands).await,
            Err(Stop::Lost) => false,
            Err(Stop::Reload) => self.reload(commands).await && self.settle(commands).await,
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
        match self.write(batch, false).await? {
            Some(last) => Ok(last),
            None => Err(JournalError::Conflict { session: self.session.clone(), expected, actual: expected }),
        }
    }

    /// Appends `batch`; with `new_log` as the first events of the session's log ([`SessionLog::append_first`]:
    /// `None` when the log has events and nothing was written).
    async fn write(&mut self, batch: &[Envelope], new_log: bool) -> Result<Option<u64>, JournalError> {
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
        let log = &self.deps.log;
        let result = if new_log {
            log.append_first(&self.session, batch, traceparent.as_deref()).instrument(span).await
        } else {
            log.append_traced(&self.session, expected, batch, traceparent.as_deref()).instrument(span).await.map(Some)
        };
        self.spans.end_append(batch);
        let counted = match &result {
            Ok(Some(last)) => Ok(*last),
            // A refused first group counts as a conflict: the log was not where the writer expected it.
            Ok(None) => Err(JournalError::Conflict { session: self.session.clone(), expected, actual: expected }),
            Err(e) => Err(e.clone()),
        };
        self.clock.appended(batch, started.elapsed(), &counted);
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
        let (tx, session, hooks) = (self.op_tx.clone(), self.session.clone(), self.deps.agents.hooks.clone());
        let task = async move {
            let outcome = tokio::select! {
                // Checked first: a hook that sees the abort returns an error, which must not be mistaken
                // for a hook failure.
                biased;
                () = token.cancelled() => PreStepOutcome::Aborted,
                r = hooks.decide(&session, &request, request.messages.clone(), &token) => match r {
                    Ok(HookVerdict::Pass(batch)) => PreStepOutcome::Decided(PreStepDecision::Enter(batch)),
                    Ok(HookVerdict::Reject { reason }) => PreStepOutcome::Decided(PreStepDecision::Reject { reason }),
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
        let identity = deps.agents.model.identity(&request.agent);
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
            let step = deps.agents.model.step(request, DeltaSink::new(delta_tx), token.clone());
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
                let r = deps.agents.tools.call(&session, &request, &token, &released).await;
                let call = &request.call;
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
