//! The session host: one runner per loaded session, behind the gateway's [`CommandRouter`] seam.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use turnstile_cluster::CommandRouter;
use turnstile_journal::snapshot::{LoadError, NoSnapshots, SnapshotStore, load_state};
use turnstile_journal::{JournalError, LiveBus, SessionLog};
use turnstile_model::{CancelCause, Command, CommandError, CommandReply, Envelope, SessionRef, Status};

use crate::agent::Agents;
use crate::budget::Budgets;
use crate::command::{CommandMsg, Control, journal_error};
use crate::config::WorkerConfig;
use crate::deps::RunnerDeps;
use crate::ownership::Ownership;
use crate::park::{Home, Parked, Parking};
use crate::runner::{Runner, Start};
use crate::seen::SeenSessions;
use crate::sync::lock;

/// Errors of the host itself (not of one command).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("session {session} cannot be folded: {detail}")]
    Projection { session: SessionRef, detail: String },
}

/// A loaded session's runner.
struct RunnerHandle {
    commands: mpsc::Sender<CommandMsg>,
    control: mpsc::UnboundedSender<Control>,
    epoch: u64,
    /// Names this runner among the session's successive ones (see [`Home::park`]).
    id: u64,
}

/// What the host holds of a loaded session: a running runner, or the driver alone while it is idle.
enum Slot {
    Running(RunnerHandle),
    Parked(Box<Parked>),
}

impl Slot {
    fn running(&self) -> Option<&RunnerHandle> {
        match self {
            Slot::Running(h) => Some(h),
            Slot::Parked(_) => None,
        }
    }

    /// A running runner that still takes commands, or a parked driver.
    fn is_loaded(&self) -> bool {
        self.running().is_none_or(|h| !h.commands.is_closed())
    }
}

type Runners = Mutex<HashMap<SessionRef, Slot>>;

impl Home for Runners {
    fn park(
        &self,
        session: &SessionRef,
        id: u64,
        parked: Box<Parked>,
        commands: &mut mpsc::Receiver<CommandMsg>,
        control: &mpsc::UnboundedReceiver<Control>,
    ) -> Result<(), Box<Parked>> {
        let mut runners = lock(self);
        let Some(slot) = runners.get_mut(session) else { return Err(parked) };
        // Under the lock no sender can be handed out; one handed out before finds the queue closed and
        // asks the host again, which resumes the parked driver.
        if slot.running().is_none_or(|h| h.id != id) || !commands.is_empty() || !control.is_empty() {
            return Err(parked);
        }
        commands.close();
        *slot = Slot::Parked(parked);
        Ok(())
    }
}

/// Owns the drivers of the sessions this worker serves.
pub struct SessionHost {
    deps: Arc<RunnerDeps>,
    /// Shared with each runner's task, which removes its own entry when it ends (passivation included), so
    /// an unloaded session holds nothing here.
    runners: Arc<Runners>,
    /// Ids of runners, so a runner's exit and parking touch only their own entry.
    next_runner: std::sync::atomic::AtomicU64,
    /// Set once the passivation sweep of parked drivers runs.
    sweeping: std::sync::atomic::AtomicBool,
    /// Set once the waker of unloaded sessions with a schedule runs ([`SessionHost::start_waker`]).
    waking: std::sync::atomic::AtomicBool,
    /// This host, for its waker task (which must not keep it alive).
    me: std::sync::Weak<SessionHost>,
    /// Sessions this host started a runner for, approximately: their first command loads them first.
    seen: SeenSessions,
    /// Sessions a `DeleteSession` is removing: no runner starts for them and their commands are refused
    /// until it answers. Locked only while `runners` is held, so the two never disagree.
    deleting: Mutex<HashSet<SessionRef>>,
    /// Sessions an `ImportSessions` is writing (SPEC §18), with when its last group came: no runner starts
    /// for them until their last group, or until [`IMPORT_STALE`] passes without one (the importer went
    /// away). Locked only while `runners` is held, like `deleting`.
    importing: Mutex<HashMap<SessionRef, tokio::time::Instant>>,
}

/// How long an import may pause between two groups of one session before the session is let go (it then
/// takes commands as any session whose log ends there, repaired like one after a crash).
const IMPORT_STALE: Duration = Duration::from_secs(60);

/// Puts a [`SessionHost`] together: [`SessionHost::builder`], then the optional parts, then
/// [`SessionHostBuilder::build`].
pub struct SessionHostBuilder {
    deps: RunnerDeps,
}

impl SessionHostBuilder {
    /// Loads and writes snapshots in `snapshots` (default: none, every load folds the whole log).
    pub fn snapshots(mut self, snapshots: Arc<dyn SnapshotStore>) -> Self {
        self.deps.snapshots = snapshots;
        self
    }

    /// Takes commands only for the sessions `ownership` grants (the shard leases of a cluster worker).
    /// Default: this host owns every session at `config.epoch`, as in `turnstile dev`.
    pub fn ownership(mut self, ownership: Arc<dyn Ownership>) -> Self {
        self.deps.ownership = Some(ownership);
        self
    }

    /// Checks `budgets` before each model request (SPEC §17; default: no budgets).
    pub fn budgets(mut self, budgets: Budgets) -> Self {
        self.deps.budgets = (!budgets.is_empty()).then_some(budgets);
        self
    }

    /// Keeps the session index in `index` (default: an index of its own in memory).
    pub fn index(mut self, index: Arc<dyn turnstile_journal::SessionIndex>) -> Self {
        self.deps.index = index;
        self
    }

    /// Keeps webhook positions in `positions` (default: in memory).
    pub fn webhook_positions(mut self, positions: Arc<dyn turnstile_journal::WebhookPositions>) -> Self {
        self.deps.webhook_positions = positions;
        self
    }

    /// Driver and host settings (default: [`WorkerConfig::default`]).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.deps.config = config;
        self
    }

    pub fn build(mut self) -> Arc<SessionHost> {
        let d = &self.deps;
        let webhooks = crate::webhooks::Webhooks::new(
            d.agents.webhooks.clone(),
            d.webhook_positions.clone(),
            d.log.clone(),
            d.ownership.clone(),
        );
        self.deps.webhooks = Some(Arc::new(webhooks));
        Arc::new_cyclic(|me| SessionHost {
            deps: Arc::new(self.deps),
            runners: Arc::default(),
            next_runner: std::sync::atomic::AtomicU64::new(1),
            sweeping: std::sync::atomic::AtomicBool::new(false),
            waking: std::sync::atomic::AtomicBool::new(false),
            me: me.clone(),
            seen: SeenSessions::default(),
            deleting: Mutex::default(),
            importing: Mutex::default(),
        })
    }
}

impl SessionHost {
    /// A host over the journal's `log` and `bus`, running `agents` (`turnstile_agent::AgentSetup` makes
    /// them from a configuration; its default is the scripted agent alone).
    pub fn builder(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, agents: Agents) -> SessionHostBuilder {
        SessionHostBuilder {
            deps: RunnerDeps {
                log,
                bus,
                agents,
                snapshots: Arc::new(NoSnapshots),
                ownership: None,
                config: WorkerConfig::default(),
                budgets: None,
                wakes: Arc::default(),
                index: Arc::new(turnstile_journal::MemoryIndex::default()),
                webhook_positions: Arc::new(turnstile_journal::MemoryPositions::default()),
                webhooks: None,
            },
        }
    }

    /// The epoch to serve `session` under, or NOT-OWNER.
    fn epoch_for(&self, session: &SessionRef) -> Result<u64, CommandError> {
        match &self.deps.ownership {
            None => Ok(self.deps.config.epoch),
            Some(ownership) => ownership
                .accepting(session)
                .map_err(|owner| CommandError::NotOwner { session: session.to_string(), owner }),
        }
    }

    /// Loads every session whose log says it was running when the process stopped, or whose goal is
    /// active, so it is repaired and resumed (SPEC §6, §10) without waiting for a command. Returns how many were loaded.
    pub async fn resume_running(&self) -> Result<usize, HostError> {
        self.resume_where(|_| true).await
    }

    /// Like [`SessionHost::resume_running`], for the sessions `wanted` selects (a newly acquired shard)
    /// and this worker may serve.
    pub async fn resume_where(&self, wanted: impl Fn(&SessionRef) -> bool) -> Result<usize, HostError> {
        let log = self.deps.log.as_ref();
        // The index mirror first catches up with its bucket, so only what differs is written again.
        let loading = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.deps.index.is_loaded() && tokio::time::Instant::now() < loading {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut after: Option<SessionRef> = None;
        let mut resumed = 0;
        loop {
            let page = log.list_sessions(None, after.as_ref(), 256).await?;
            let Some(last) = page.last().cloned() else { break };
            for session in page.into_iter().filter(|s| wanted(s)) {
                let Ok(epoch) = self.epoch_for(&session) else { continue };
                if self.take_over(&session, epoch).await? {
                    resumed += 1;
                }
            }
            after = Some(last);
        }
        Ok(resumed)
    }

    /// Takes `session` over from its log: puts its index entry right, lets its webhooks go on and arms its
    /// schedules, then starts its runner if the log says it was running or its goal is active, so it is
    /// repaired and resumed (SPEC §6, §10, §15, §16). Whether the runner started.
    async fn take_over(&self, session: &SessionRef, epoch: u64) -> Result<bool, HostError> {
        let log = self.deps.log.as_ref();
        let state = load_state(log, self.deps.snapshots.as_ref(), session, self.deps.config.limits.dedup_horizon)
            .await
            .map_err(|e| match e {
                LoadError::Journal(e) => HostError::Journal(e),
                LoadError::Projection { .. } => {
                    HostError::Projection { session: session.clone(), detail: e.to_string() }
                }
            })?;
        // The index follows the log (decision 0069): an entry a crash left behind the log, or one never
        // written (a session older than the index), is put right here.
        let entry = self.deps.index_entry(&state);
        if state.exists() && self.deps.index.get(session).as_ref() != Some(&entry) {
            self.deps.index.submit(entry);
        }
        // Webhooks go on from their saved positions (SPEC §15): what the old owner had not
        // delivered is delivered now.
        self.deps.notify_webhooks(&state, epoch);
        // A schedule's next firing (SPEC §15) loads the session then; one already due, now.
        if state.schedules.next_fire().is_some() {
            self.deps.wakes.set(session, state.next_timer());
            self.start_waker();
        }
        // An active goal may be owed its next round (the owner died between a round's `status idle` and the
        // continuation) or a pause; the driver's recovery decides which, if any.
        let goal_active = state.goals.active().is_some();
        let was_running = state.status == Status::Running || state.wake_since_idle || state.open_turn.is_some();
        // A session being deleted or imported is not resumed (`runner` refuses it).
        if (was_running || goal_active) && self.runner(session, epoch, &mut None).is_ok() {
            tracing::info!(%session, epoch, goal_active, "resuming a session that was running");
            return Ok(true);
        }
        Ok(false)
    }

    /// Hands over the loaded sessions `which` selects: each finishes its running step and stops claiming;
    /// after `timeout` the rest are stopped where they are (the next owner repairs them). Returns when
    /// every one of them has unloaded.
    pub async fn drain_where(&self, which: impl Fn(&SessionRef) -> bool, timeout: Duration) {
        let handles: Vec<(mpsc::Sender<CommandMsg>, mpsc::UnboundedSender<Control>)> = {
            let mut runners = lock(&self.runners);
            let chosen: Vec<SessionRef> = runners.keys().filter(|s| which(s)).cloned().collect();
            // A parked driver runs nothing and its state is in the log: it is only dropped.
            chosen
                .into_iter()
                .filter_map(|s| match runners.remove(&s)? {
                    Slot::Running(h) => Some((h.commands, h.control)),
                    Slot::Parked(_) => None,
                })
                .collect()
        };
        for (_, control) in &handles {
            let _ = control.send(Control::Drain);
        }
        let all_closed = futures::future::join_all(handles.iter().map(|(tx, _)| tx.closed()));
        if tokio::time::timeout(timeout, all_closed).await.is_err() {
            tracing::warn!(timeout_ms = timeout.as_millis() as u64, "drain timed out; stopping the rest");
            for (_, control) in &handles {
                let _ = control.send(Control::Stop);
            }
            futures::future::join_all(handles.iter().map(|(tx, _)| tx.closed())).await;
        }
    }

    /// Stops the loaded sessions `which` selects at once, abandoning what they run (the lease is gone).
    pub fn stop_where(&self, which: impl Fn(&SessionRef) -> bool) {
        let mut runners = lock(&self.runners);
        runners.retain(|session, slot| {
            if which(session) {
                if let Slot::Running(handle) = slot {
                    let _ = handle.control.send(Control::Stop);
                }
                false
            } else {
                true
            }
        });
    }

    /// The runner of `session` under `epoch`, started (and loading) if there is none. A runner of an older
    /// epoch (the shard was lost and won back) is replaced. A runner started for a session this host never
    /// served takes the command in `first` as its start when that command may create the session (decision
    /// 0040), leaving `None` there. UNAVAILABLE while the session is being deleted.
    fn runner(
        &self,
        session: &SessionRef,
        epoch: u64,
        first: &mut Option<CommandMsg>,
    ) -> Result<mpsc::Sender<CommandMsg>, CommandError> {
        let mut runners = lock(&self.runners);
        if lock(&self.deleting).contains(session) {
            return Err(being_deleted(session));
        }
        if self.being_imported(session) {
            return Err(being_imported(session));
        }
        if let Some(handle) =
            runners.get(session).and_then(Slot::running).filter(|h| !h.commands.is_closed() && h.epoch == epoch)
        {
            return Ok(handle.commands.clone());
        }
        // A parked driver of this epoch is resumed as it is; anything else is replaced by a fresh load.
        let start = match runners.remove(session) {
            Some(Slot::Parked(parked)) if parked.epoch == epoch => Start::Resume(parked),
            Some(Slot::Running(old)) => {
                let _ = old.control.send(Control::Stop);
                Start::Load
            }
            Some(Slot::Parked(_)) => Start::Load,
            // A session this host never served is most likely new (decision 0040).
            None => match first.take_if(|msg| may_create(&msg.command) && !self.seen.may_contain(session)) {
                Some(msg) => Start::Fresh(msg),
                None => Start::Load,
            },
        };
        self.seen.insert(session);
        self.start_sweep();
        self.start_waker();
        let (tx, rx) = mpsc::channel(self.deps.config.command_queue.max(1));
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let id = self.next_runner.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        runners.insert(
            session.clone(),
            Slot::Running(RunnerHandle { commands: tx.clone(), control: control_tx, epoch, id }),
        );
        let home: Arc<dyn Home> = self.runners.clone();
        let parking = Parking { home: Arc::downgrade(&home), id };
        drop(home);
        let run = Runner::run(session.clone(), self.deps.clone(), epoch, start, rx, control_rx, parking);
        let (map, session) = (Arc::downgrade(&self.runners), session.clone());
        tokio::spawn(async move {
            run.await;
            // The runner ended (unloaded or parked): drop its entry unless it parked there or a newer runner
            // took the session's place. A command that finds no entry starts a new runner.
            if let Some(map) = map.upgrade() {
                let mut runners = lock(&map);
                if runners.get(&session).and_then(Slot::running).is_some_and(|h| h.id == id) {
                    runners.remove(&session);
                }
            }
        });
        Ok(tx)
    }

    /// `DeleteSession` (SPEC §12). While it runs the session takes no other command. A loaded runner first
    /// cancels a running turn with cause `disposed`, keeping the inbox (its `turn/end aborted{disposed}` is
    /// written, as any cancel's; an idle session writes nothing), converges (bounded by the `WhenIdle` timeout, then it is stopped where it is) and unloads
    /// without a last snapshot; then the log and the snapshots (which hold the dedup index) are removed.
    /// The reply is the last seq the log had; NOT_FOUND when it had none.
    async fn delete(&self, session: &SessionRef) -> Result<CommandReply, CommandError> {
        self.epoch_for(session)?;
        let loaded = {
            let mut runners = lock(&self.runners);
            if !lock(&self.deleting).insert(session.clone()) {
                return Err(being_deleted(session));
            }
            match runners.get(session) {
                Some(Slot::Running(h)) => Some((h.commands.clone(), h.control.clone())),
                // An idle driver: nothing to cancel or wait for.
                Some(Slot::Parked(_)) => {
                    runners.remove(session);
                    None
                }
                None => None,
            }
        };
        let result = self.remove_session(session, loaded).await;
        // Its schedules, its index entry and its webhook positions went with its log.
        self.deps.wakes.set(session, None);
        if let (Some(webhooks), Some(entry)) = (&self.deps.webhooks, self.deps.index.get(session)) {
            webhooks.forget(session, &entry.summary.agent).await;
        }
        self.deps.index.remove(session);
        lock(&self.deleting).remove(session);
        result
    }

    async fn remove_session(
        &self,
        session: &SessionRef,
        loaded: Option<(mpsc::Sender<CommandMsg>, mpsc::UnboundedSender<Control>)>,
    ) -> Result<CommandReply, CommandError> {
        if let Some((commands, control)) = loaded.filter(|(tx, _)| !tx.is_closed()) {
            // Keeping the inbox: it goes with the log, so clearing it first would only write splices that
            // are deleted a moment later; an idle session gets no event at all.
            let cancel = Command::Cancel { cause: CancelCause::Disposed, keep_inbox: true };
            // A runner that cannot write (the journal is full or away: it answers UNAVAILABLE while it
            // reloads) cannot record the cancel; the log goes anyway, and deleting must work then most of
            // all, since it is how space comes back.
            if let Err(e) = ask(&commands, session, cancel).await {
                tracing::warn!(%session, error = %e, "deleting a session whose cancel was not written");
            } else {
                let limit = self.deps.config.default_when_idle_timeout;
                if tokio::time::timeout(limit, ask(&commands, session, Command::WhenIdle)).await.is_err() {
                    tracing::warn!(%session, timeout_ms = limit.as_millis() as u64, "deleting a session that did not converge");
                }
            }
            {
                let mut runners = lock(&self.runners);
                if runners.get(session).and_then(Slot::running).is_some_and(|h| h.commands.same_channel(&commands)) {
                    runners.remove(session);
                }
            }
            let _ = control.send(Control::Dispose);
            commands.closed().await;
        }
        let last = self.deps.log.delete(session).await.map_err(journal_error)?;
        self.deps.snapshots.delete(session).await.map_err(journal_error)?;
        if last == 0 {
            return Err(CommandError::session_not_found(session));
        }
        tracing::info!(%session, last_seq = last, "session deleted");
        Ok(CommandReply::Written { seq: last })
    }

    /// Whether an import holds `session` (an import whose importer went away lets go after
    /// [`IMPORT_STALE`]). Called with `runners` held.
    fn being_imported(&self, session: &SessionRef) -> bool {
        let mut importing = lock(&self.importing);
        match importing.get(session) {
            Some(since) if since.elapsed() < IMPORT_STALE => true,
            Some(_) => {
                tracing::warn!(%session, "an import stopped between two groups; the session takes commands again");
                importing.remove(session);
                false
            }
            None => false,
        }
    }

    /// `ImportSessions` (SPEC §18): appends one group of an imported log as it is. The group from seq 1 goes
    /// only to a session without events (ALREADY_EXISTS otherwise); a later one must follow the log's end.
    /// From its first group to its `complete` one the session takes no other command; then, if it was
    /// running or has an active goal, it is loaded and resumes (its open turn repaired as after a crash).
    async fn import(
        &self,
        session: &SessionRef,
        events: Vec<Envelope>,
        complete: bool,
    ) -> Result<CommandReply, CommandError> {
        let epoch = self.epoch_for(session)?;
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Err(CommandError::InvalidArgument(format!("an import group of {session} has no events")));
        };
        let expected = first.seq.saturating_sub(1);
        let last_seq = last.seq;
        let log_end = self.deps.log.last_seq(session).await.map_err(journal_error)?;
        if expected == 0 && log_end > 0 {
            return Err(CommandError::AlreadyExists(format!(
                "session {session} already has {log_end} events here; delete it (DeleteSession) or leave it out of the import"
            )));
        }
        if log_end != expected {
            return Err(CommandError::FailedPrecondition(format!(
                "the import of session {session} continues after seq {expected} but its log here ends at {log_end}: the \
                 import was interrupted; delete the session and import it again"
            )));
        }
        {
            let mut runners = lock(&self.runners);
            if lock(&self.deleting).contains(session) {
                return Err(being_deleted(session));
            }
            lock(&self.importing).insert(session.clone(), tokio::time::Instant::now());
            // A driver loaded here holds a log that is about to grow under it (an empty session's, or one
            // loaded from a part of the import): drop it; the next command loads the whole log.
            if let Some(Slot::Running(old)) = runners.remove(session) {
                let _ = old.control.send(Control::Stop);
            }
        }
        let written = self.append_imported(session, epoch, expected, &events).await;
        if written.is_err() || complete {
            lock(&self.importing).remove(session);
        }
        written?;
        self.seen.insert(session);
        if complete {
            tracing::info!(%session, last_seq, "session imported");
            if let Err(e) = self.take_over(session, epoch).await {
                tracing::warn!(%session, error = %e, "an imported session that was running did not resume; its next command loads it");
            }
        }
        Ok(CommandReply::Written { seq: last_seq })
    }

    async fn append_imported(
        &self,
        session: &SessionRef,
        epoch: u64,
        expected: u64,
        events: &[Envelope],
    ) -> Result<u64, CommandError> {
        // As a runner does before each append: a worker whose lease lapsed must not write.
        if let Some(ownership) = &self.deps.ownership
            && !ownership.may_write(session, epoch)
        {
            return Err(journal_error(JournalError::Fenced { session: session.clone(), epoch }));
        }
        let log = &self.deps.log;
        let traceparent = turnstile_ops::trace::current_traceparent();
        let result = if expected == 0 {
            log.append_first(session, events, traceparent.as_deref()).await
        } else {
            log.append(session, expected, events, traceparent.as_deref()).await
        };
        result.map_err(|e| match e {
            JournalError::FirstRefused { .. } => CommandError::AlreadyExists(format!(
                "session {session} got its first events while it was being imported; delete it or leave it out of the import"
            )),
            JournalError::Conflict { .. } => CommandError::FailedPrecondition(format!(
                "session {session} was written by someone else while it was being imported ({e}); delete it and import it again"
            )),
            JournalError::InvalidBatch { .. } | JournalError::Corrupt { .. } => CommandError::InvalidArgument(e.to_string()),
            other => journal_error(other),
        })
    }

    /// Commands waiting in `session`'s queue (0 when it is not loaded).
    pub fn queued_commands(&self, session: &SessionRef) -> usize {
        let runners = lock(&self.runners);
        runners.get(session).and_then(Slot::running).map_or(0, |h| h.commands.max_capacity() - h.commands.capacity())
    }

    /// Sessions in memory: with a live runner, or parked (idle, their driver alone).
    pub fn loaded_sessions(&self) -> usize {
        let runners = lock(&self.runners);
        runners.values().filter(|slot| slot.is_loaded()).count()
    }

    /// Loaded sessions whose runner task is running (the rest are parked).
    pub fn running_sessions(&self) -> usize {
        let runners = lock(&self.runners);
        runners.values().filter_map(Slot::running).filter(|h| !h.commands.is_closed()).count()
    }

    /// Starts, once, the task that passivates parked drivers: it drops each once its `until` has passed
    /// (their state is in the log; nothing is written) and ends with the host.
    fn start_sweep(&self) {
        use std::sync::atomic::Ordering;
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let every = (self.deps.config.passivate_after / 8).clamp(Duration::from_millis(10), Duration::from_secs(30));
        let (map, log) = (Arc::downgrade(&self.runners), self.deps.log.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(map) = map.upgrade() else { return };
                let now = tokio::time::Instant::now();
                let dropped: Vec<(SessionRef, Slot)> = {
                    let mut runners = lock(&map);
                    let due: Vec<SessionRef> = runners
                        .iter()
                        .filter(|(_, slot)| matches!(slot, Slot::Parked(p) if p.until <= now))
                        .map(|(s, _)| s.clone())
                        .collect();
                    due.into_iter().filter_map(|s| runners.remove_entry(&s)).collect()
                };
                if !dropped.is_empty() {
                    tracing::debug!(sessions = dropped.len(), "passivated idle sessions");
                }
                for (session, _) in &dropped {
                    log.unloaded(session);
                }
                // The drivers are freed here, outside the lock.
                drop(dropped);
            }
        });
    }

    /// Starts, once, the task that loads unloaded sessions when their next schedule firing is due
    /// ([`crate::wakes::Wakes`]): it starts (or resumes) the session's runner, whose driver's timer then
    /// fires. A session this worker no longer owns is skipped: its new owner scanned it when it took the
    /// shard. The task ends with the host.
    fn start_waker(&self) {
        use std::sync::atomic::Ordering;
        if self.waking.swap(true, Ordering::Relaxed) {
            return;
        }
        let (me, wakes) = (self.me.clone(), self.deps.wakes.clone());
        tokio::spawn(async move {
            loop {
                let now = turnstile_ops::clock::now_ms();
                // Bounded, so a host dropped meanwhile ends the task soon.
                let wait = wakes.next().map_or(30_000, |at| at.saturating_sub(now)).min(30_000);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    () = wakes.changed() => {}
                }
                let Some(host) = me.upgrade() else { return };
                for session in wakes.take_due(turnstile_ops::clock::now_ms()) {
                    let Ok(epoch) = host.epoch_for(&session) else { continue };
                    match host.runner(&session, epoch, &mut None) {
                        Ok(_) => tracing::debug!(%session, "woke a session for its schedule"),
                        Err(e) => tracing::warn!(%session, error = %e, "could not wake a session for its schedule"),
                    }
                }
            }
        });
    }

    /// Unloaded sessions waiting for a schedule's firing.
    pub fn waiting_sessions(&self) -> usize {
        self.deps.wakes.len()
    }

    /// Sessions the host holds anything for, loaded or ending (a runner's entry goes when its task ends).
    pub fn held_sessions(&self) -> usize {
        lock(&self.runners).len()
    }
}

#[async_trait]
impl CommandRouter for SessionHost {
    async fn execute(
        &self,
        session: &SessionRef,
        command: Command,
        timeout: Option<Duration>,
    ) -> Result<CommandReply, CommandError> {
        // `session` was validated where it entered: the gateway's decoding or the internal codec's.
        if matches!(command, Command::Delete) {
            return self.delete(session).await;
        }
        if let Command::Import { events, complete } = command {
            return self.import(session, events, complete).await;
        }
        if matches!(command, Command::StreamingStep) {
            // A read for a joining Watch: a session with no live runner (unloaded, or parked idle) streams
            // nothing, and loading it to say so would cost a log read. Not-owner still routes it onwards.
            self.epoch_for(session)?;
            let running = lock(&self.runners).get(session).and_then(Slot::running).is_some();
            if !running {
                return Ok(CommandReply::Streaming(None));
            }
        }
        let when_idle = matches!(command, Command::WhenIdle);
        let (reply_tx, reply_rx) = oneshot::channel();
        // The caller's span (the internal RPC's, or the gateway's in `turnstile dev`) is the command's parent.
        let traceparent = turnstile_ops::trace::current_traceparent();
        let mut msg = Some(CommandMsg { command, reply: reply_tx, traceparent });
        // A runner that just unloaded (passivation) refuses the send; the second attempt starts a new one.
        for attempt in 0..2 {
            let epoch = self.epoch_for(session)?;
            let commands = self.runner(session, epoch, &mut msg)?;
            // The new runner took it as its start.
            let Some(next) = msg.take() else { break };
            // Refuse rather than wait: a caller held behind a full queue would hold its gateway's call,
            // and the next ones, for as long as the driver is busy.
            match commands.try_send(next) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(CommandError::ResourceExhausted(format!(
                        "session {session} has {} commands waiting for its driver (limits.max_queued_commands); \
                         nothing of this one was applied: retry with the same message id after a moment",
                        self.deps.config.command_queue
                    )));
                }
                Err(mpsc::error::TrySendError::Closed(back)) if attempt == 0 => msg = Some(back),
                Err(_) => {
                    return Err(CommandError::Unavailable(format!(
                        "session {session} is restarting; retry with the same message id"
                    )));
                }
            }
        }
        let wait = async {
            reply_rx.await.unwrap_or_else(|_| {
                Err(CommandError::Unavailable(format!(
                    "session {session} stopped before answering; retry with the same message id"
                )))
            })
        };
        if !when_idle {
            return wait.await;
        }
        let limit = timeout.unwrap_or(self.deps.config.default_when_idle_timeout);
        tokio::time::timeout(limit, wait).await.unwrap_or_else(|_| {
            Err(CommandError::DeadlineExceeded(format!(
                "session {session} did not become idle within {} ms",
                limit.as_millis()
            )))
        })
    }

    async fn owner(&self, _session: &SessionRef) -> Option<String> {
        Some(self.deps.config.owner_id.clone())
    }
}

/// Whether `command` writes on a session without events, so a runner started for it may write it as the
/// session's first group before the load says whether the session has any (decision 0040). Only a speed
/// choice: the runner checks that the driver's first effect is an append group, and a session with events
/// refuses the write.
fn may_create(command: &Command) -> bool {
    matches!(
        command,
        Command::Send { .. }
            | Command::Interrupt { .. }
            | Command::Configure { .. }
            | Command::SetGoal { .. }
            | Command::Fork { .. }
            | Command::Spawn { .. }
    )
}

/// Sends one command to a runner and waits for its answer.
async fn ask(
    commands: &mpsc::Sender<CommandMsg>,
    session: &SessionRef,
    command: Command,
) -> Result<CommandReply, CommandError> {
    let (reply, answer) = oneshot::channel();
    let traceparent = turnstile_ops::trace::current_traceparent();
    let stopped =
        || CommandError::Unavailable(format!("session {session} stopped while being deleted; delete it again"));
    commands.send(CommandMsg { command, reply, traceparent }).await.map_err(|_| stopped())?;
    answer.await.unwrap_or_else(|_| Err(stopped()))
}

fn being_imported(session: &SessionRef) -> CommandError {
    CommandError::Unavailable(format!("session {session} is being imported; retry once ImportSessions has answered"))
}

fn being_deleted(session: &SessionRef) -> CommandError {
    CommandError::Unavailable(format!("session {session} is being deleted; retry once DeleteSession has answered"))
}
