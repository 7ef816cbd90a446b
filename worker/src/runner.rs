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

use tokio::sync::mpsc;
use tracing::Instrument as _;
use turnstile_driver::{CommandId, Driver, Effect};
use turnstile_journal::JournalError;
use turnstile_journal::snapshot::{Snapshot, empty_state};
use turnstile_model::{Command, CommandError, SessionRef};
use turnstile_ops::clock::now_ms;

use crate::command::{CommandMsg, Control, ReplyTx, journal_error};
use crate::deps::RunnerDeps;
use crate::load::{NotLoaded, load_until_available};
use crate::operations::Operations;
use crate::park::{Parked, Parking};
use crate::spans::{TurnSpans, command_span};

mod effects;

/// Why a batch of effects could not be completed.
enum Stop {
    /// Reload the driver from the log, then continue.
    Reload,
    /// Another writer owns the session: stop serving it.
    Lost,
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
    /// The pre-step, model and tool operations running as tasks.
    ops: Operations,
    /// The seq of the last snapshot written (or loaded).
    snapshot_seq: u64,
    /// The owner epoch this runner writes under.
    epoch: u64,
    control: mpsc::Receiver<Control>,
    draining: bool,
    /// Set by [`Control::Dispose`]: the session is being deleted.
    disposed: bool,
    /// Snapshot writes running in the background.
    saves: tokio::task::JoinSet<()>,
    clock: crate::metrics::SessionClock,
    spans: TurnSpans,
    /// The index entry last submitted for this session (SPEC §16).
    indexed: Option<turnstile_journal::IndexEntry>,
    /// Set when a load found that the log cannot be folded: the answer the host gives from then on.
    quarantined: Option<CommandError>,
}

impl Runner {
    /// Loads the session (or resumes a parked driver) and serves `commands` until the host drops the
    /// sender, ownership is lost, or the session parks. Returns the quarantine answer when the log cannot
    /// be folded (decision 0084).
    pub(crate) async fn run(
        session: SessionRef,
        deps: Arc<RunnerDeps>,
        epoch: u64,
        start: Start,
        mut commands: mpsc::Receiver<CommandMsg>,
        control: mpsc::Receiver<Control>,
        parking: Parking,
    ) -> Option<CommandError> {
        let mut first = None;
        let (driver, snapshot_seq, loaded) = match start {
            Start::Load => {
                let loaded = crate::metrics::loaded();
                let driver = match load_until_available(&deps, &session, epoch, &mut commands).await {
                    Ok(driver) => driver,
                    Err(NotLoaded::Quarantined(answer)) => return Some(answer),
                    Err(NotLoaded::Gone) => return None,
                };
                let snapshot_seq = driver.state().last_seq;
                (driver, snapshot_seq, loaded)
            }
            // No repair: the driver it came from was quiescent.
            Start::Resume(parked) => {
                let Parked { state, snapshot_seq, loaded, .. } = *parked;
                (deps.driver(state, epoch), snapshot_seq, loaded)
            }
            Start::Fresh(msg) => {
                let loaded = crate::metrics::loaded();
                let empty = match empty_state(&session, deps.config.limits.dedup_horizon) {
                    Ok(state) => state,
                    Err(e) => {
                        let _ = msg.reply.send(Err(CommandError::Internal(e.to_string())));
                        return None;
                    }
                };
                first = Some(msg);
                (deps.driver(empty, epoch), 0, loaded)
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
        // A load may have repaired the session (SPEC §6): the index gets what the log now says.
        runner.index(false);
        runner.deps.notify_webhooks(runner.driver.state(), runner.epoch);
        let mut loaded = Some(loaded);
        loop {
            match runner.serve(&mut commands).await {
                Served::Unload => {
                    runner.deps.wakes.set(&runner.session, runner.driver.next_timer());
                    return runner.end(&mut commands, true).await;
                }
                Served::Lost => return runner.end(&mut commands, false).await,
                Served::Park => {
                    runner.index(true);
                    // Snapshot writes in flight finish first: dropping the runner would abort them.
                    while runner.saves.join_next().await.is_some() {}
                    let (Some(home), Some(guard)) = (parking.home.upgrade(), loaded.take()) else {
                        return runner.end(&mut commands, true).await;
                    };
                    let config = &runner.deps.config;
                    let until = tokio::time::Instant::now() + config.passivate_after.saturating_sub(config.park_after);
                    // Parking needs nothing of the runner but the driver: nothing runs or waits.
                    let Runner { session, deps, driver, snapshot_seq, epoch, control, .. } = runner;
                    // Parked or passivated, the session is woken by the host for its next firing.
                    deps.wakes.set(&session, driver.next_timer());
                    let parked =
                        Box::new(Parked { state: driver.into_state(), epoch, snapshot_seq, until, loaded: guard });
                    match home.park(&session, parking.id, parked, &mut commands, &control) {
                        Ok(()) => {
                            tracing::debug!(%session, "parked idle session");
                            return None;
                        }
                        // A command or control message came in meanwhile: serve it.
                        Err(parked) => {
                            let Parked { state, loaded: guard, .. } = *parked;
                            loaded = Some(guard);
                            let driver = deps.driver(state, epoch);
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
        control: mpsc::Receiver<Control>,
    ) -> Self {
        Runner {
            session,
            deps,
            driver,
            waiting: HashMap::new(),
            next_command: 1,
            ops: Operations::new(),
            snapshot_seq,
            epoch,
            control,
            draining: false,
            disposed: false,
            saves: tokio::task::JoinSet::new(),
            clock: crate::metrics::SessionClock::default(),
            spans: TurnSpans::default(),
            indexed: None,
            quarantined: None,
        }
    }

    /// Unloads: a last snapshot when `clean` (the driver's state is exactly the log) and the session is not
    /// being deleted, then every waiting caller is answered.
    async fn end(mut self, commands: &mut mpsc::Receiver<CommandMsg>, clean: bool) -> Option<CommandError> {
        if clean && !self.disposed {
            self.index(true);
            // Keep a snapshot so the next load reads only what follows it. After a failed append the state
            // may hold events the log does not, so nothing is written then.
            self.snapshot(true).await;
        }
        // Before the queue closes: the host takes a closed queue to mean nothing more is written.
        while self.saves.join_next().await.is_some() {}
        self.shutdown(commands, "the session's runner stopped; retry");
        self.quarantined
    }

    /// Hands the driver the worker's current agents when they changed (SPEC §20): an input like any other,
    /// before the next one.
    fn refresh_agents(&mut self) {
        let current = self.deps.agents.catalog.current();
        if !current.same(self.driver.agents()) {
            self.driver.set_agents(current);
        }
    }

    /// A command naming a version of an agent (ConfigureSession, MigrateSessions) finds it in the catalog
    /// even when it was put a moment ago through another node: the catalog is fetched anew if it lacks it.
    async fn agents_for(&mut self, command: &Command) {
        let (agent, version) = match command {
            Command::Configure { agent, version: Some(version), .. } | Command::Migrate { agent, version } => {
                (agent, *version)
            }
            _ => return,
        };
        self.deps.agents.catalog.ensure(agent, &self.session.tenant, version).await;
        self.refresh_agents();
    }

    /// How serving ended: see [`Served`].
    async fn serve(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> Served {
        // Parking keeps the driver in memory without a task; passivation (the host) drops it later.
        let park_after = self.deps.config.park_after.min(self.deps.config.passivate_after);
        loop {
            self.refresh_agents();
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
                Some(outcome) = self.ops.next() => self.ops.deliver(outcome, &mut self.driver, now_ms()),
                msg = commands.recv() => {
                    let Some(CommandMsg { command, reply, traceparent }) = msg else { return Served::Unload };
                    span = Some(command_span(&self.session, command.name(), traceparent.as_deref()));
                    self.agents_for(&command).await;
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
            self.index(false);
            self.deps.notify_webhooks(self.driver.state(), self.epoch);
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
        self.agents_for(&command).await;
        let id = self.next_command;
        self.next_command += 1;
        self.driver.on_command(id, command.clone(), now_ms());
        let mut effects = self.driver.ready().into_iter();
        let written = match effects.next() {
            Some(Effect::Append(group)) => self.write(group.events(), true).instrument(span.clone()).await,
            // Not a write: nothing happened, the command runs on the loaded session.
            _ => Err(JournalError::FirstRefused { session: self.session.clone() }),
        };
        match written {
            Ok(_) => {
                self.waiting.insert(id, reply);
                // A new session is in the index before its creator hears back.
                self.index(false);
                return self.settle_after(effects.collect(), commands).instrument(span).await;
            }
            Err(JournalError::FirstRefused { .. }) => {}
            // The lease check: another worker serves the session now.
            Err(e) if e.is_lost_ownership() => {
                let _ = reply.send(Err(journal_error(e)));
                return false;
            }
            // The journal is away (or the outcome unknown): answered now, as commands are while a session
            // cannot load; the client's retry with the same id finds the group if it landed (SPEC §1).
            Err(e) => {
                tracing::warn!(session = %self.session, error = %e, "first append failed; loading the session");
                let _ = reply.send(Err(journal_error(e)));
                return self.load_from_log(commands).await && self.settle(commands).await;
            }
        }
        if !self.load_from_log(commands).await {
            let answer = self.quarantined.clone().unwrap_or_else(|| {
                CommandError::Unavailable(format!(
                    "session {} could not be loaded; retry with the same message id",
                    self.session
                ))
            });
            let _ = reply.send(Err(answer));
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
        let Some(driver) = self.load(commands).await else { return false };
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
        // A pending steer deadline must fire on time, so its session stays loaded; a schedule's next firing
        // is left to the host, which wakes the session then (`Wakes`).
        self.driver.is_quiescent()
            && self.waiting.is_empty()
            && self.ops.is_empty()
            && self.driver.next_steer_deadline().is_none()
    }

    /// Submits the session's index entry when a query could see it differently: anything but its last
    /// activity changed, or that moved by a second or more; with `final_`, any change (the runner stops).
    fn index(&mut self, final_: bool) {
        let state = self.driver.state();
        if !state.exists() {
            return;
        }
        let entry = self.deps.index_entry(state);
        let due = match &self.indexed {
            None => true,
            Some(last) if final_ => *last != entry,
            Some(last) => {
                !last.same_but_activity(&entry) || entry.summary.last_time_ms >= last.summary.last_time_ms + 1_000
            }
        };
        if due {
            self.deps.index.submit(entry.clone());
            self.indexed = Some(entry);
        }
    }

    /// Writes a snapshot every `snapshot_every` events (or always when `final_`), in the background so
    /// the session is not held up, then archives the history it seals; a failed snapshot only costs a
    /// longer fold later.
    async fn snapshot(&mut self, final_: bool) {
        let state = self.driver.state();
        let due = state.last_seq > self.snapshot_seq
            && (final_ || state.last_seq - self.snapshot_seq >= self.deps.config.snapshot_every);
        if !due {
            return;
        }
        self.snapshot_seq = state.last_seq;
        let (snapshot, store, session) = (Snapshot::of(state), self.deps.snapshots.clone(), self.session.clone());
        // Not on the final snapshot: a stopping runner does not wait for it.
        let log = (!final_).then(|| self.deps.log.clone());
        let save = async move {
            if let Err(e) = store.save(&snapshot).await {
                tracing::warn!(%session, error = %e, "snapshot not written");
                return;
            }
            // The history the snapshot holds is sealed: the log archives it (decision 0181), after the
            // snapshot and off the driver. A failure only leaves the archive shorter.
            if let Some(log) = log
                && let Err(e) = log.archive(&session, snapshot.seq()).await
            {
                tracing::debug!(%session, error = %e, "history not archived");
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

    /// Drops the driver and its operations and loads the session again from the log, waiting out a
    /// journal outage. False when the session cannot be served any more.
    async fn reload(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> bool {
        self.ops.release();
        // Callers waiting on the old driver (when_idle) learn that it is gone; they may ask again.
        for (_, tx) in self.waiting.drain() {
            let _ = tx.send(Err(CommandError::Unavailable(format!(
                "session {} is reloading after a journal error; retry",
                self.session
            ))));
        }
        match self.load(commands).await {
            Some(driver) => {
                self.driver = driver;
                true
            }
            None => false,
        }
    }

    /// The session loaded from its log, or `None` (then a quarantine is kept for [`Runner::end`]).
    async fn load(&mut self, commands: &mut mpsc::Receiver<CommandMsg>) -> Option<Driver> {
        match load_until_available(&self.deps, &self.session, self.epoch, commands).await {
            Ok(driver) => Some(driver),
            Err(NotLoaded::Quarantined(answer)) => {
                self.quarantined = Some(answer);
                None
            }
            Err(NotLoaded::Gone) => None,
        }
    }

    fn shutdown(&mut self, commands: &mut mpsc::Receiver<CommandMsg>, message: &str) {
        self.ops.stop();
        for (_, tx) in self.waiting.drain() {
            let _ = tx.send(Err(CommandError::Unavailable(message.to_owned())));
        }
        commands.close();
        while let Ok(msg) = commands.try_recv() {
            let _ = msg.reply.send(Err(CommandError::Unavailable(message.to_owned())));
        }
    }
}
