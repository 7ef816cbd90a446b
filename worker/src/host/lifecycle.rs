//! Runner lifecycle: a session's runner is started (or its parked driver resumed) by its first command,
//! replaced when the epoch changes, and drained or stopped when its shard leaves this worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use turnstile_model::{Command, CommandError, SessionRef};

use super::SessionHost;
use super::delete::being_deleted;
use super::import::being_imported;
use super::table::{CONTROL_QUEUE, Quarantine, RunnerHandle, Slot};
use crate::command::{CommandMsg, Control};
use crate::park::{Home, Parking};
use crate::runner::{Runner, Start};
use crate::sync::lock;

impl SessionHost {
    /// Hands over the loaded sessions `which` selects: each finishes its running step and stops claiming;
    /// after `timeout` the rest are stopped where they are (the next owner repairs them). Returns when
    /// every one of them has unloaded.
    pub async fn drain_where(&self, which: impl Fn(&SessionRef) -> bool, timeout: Duration) {
        let handles: Vec<RunnerHandle> = {
            let mut table = lock(&self.table);
            let chosen: Vec<SessionRef> = table.runners.keys().filter(|s| which(s)).cloned().collect();
            // A parked driver runs nothing and its state is in the log: it is only dropped, as a quarantine
            // is (the next owner finds the same log).
            chosen
                .into_iter()
                .filter_map(|s| match table.runners.remove(&s)? {
                    Slot::Running(h) => Some(h),
                    Slot::Parked(_) | Slot::Quarantined(_) => None,
                })
                .collect()
        };
        // Out of the table, so only this call orders them: the queues have room (`CONTROL_QUEUE`).
        for h in &handles {
            let _ = h.control.send(Control::Drain).await;
        }
        let all_closed = futures::future::join_all(handles.iter().map(|h| h.commands.closed()));
        if tokio::time::timeout(timeout, all_closed).await.is_err() {
            tracing::warn!(timeout_ms = timeout.as_millis() as u64, "drain timed out; stopping the rest");
            for h in &handles {
                let _ = h.control.send(Control::Stop).await;
            }
            futures::future::join_all(handles.iter().map(|h| h.commands.closed())).await;
        }
    }

    /// Stops the loaded sessions `which` selects at once, abandoning what they run (the lease is gone).
    pub fn stop_where(&self, which: impl Fn(&SessionRef) -> bool) {
        lock(&self.table).runners.retain(|session, slot| {
            if !which(session) {
                return true;
            }
            if let Slot::Running(handle) = slot {
                handle.order(Control::Stop);
            }
            false
        });
    }

    /// The runner of `session` under `epoch`, started (and loading) if there is none. A runner of an older
    /// epoch (the shard was lost and won back) is replaced. A runner started for a session this host never
    /// served takes the command in `first` as its start when that command may create the session (decision
    /// 0040), leaving `None` there. UNAVAILABLE while the session is being deleted or imported.
    pub(super) fn runner(
        &self,
        session: &SessionRef,
        epoch: u64,
        first: &mut Option<CommandMsg>,
    ) -> Result<mpsc::Sender<CommandMsg>, CommandError> {
        let mut table = lock(&self.table);
        if table.deleting.contains(session) {
            return Err(being_deleted(session));
        }
        if table.being_imported(session) {
            return Err(being_imported(session));
        }
        match table.runners.get(session) {
            Some(Slot::Quarantined(q)) => return Err(q.answer.clone()),
            Some(Slot::Running(h)) if !h.commands.is_closed() && h.epoch == epoch => return Ok(h.commands.clone()),
            _ => {}
        }
        // A parked driver of this epoch is resumed as it is; anything else is replaced by a fresh load.
        let start = match table.runners.remove(session) {
            Some(Slot::Parked(parked)) if parked.epoch == epoch => Start::Resume(parked),
            Some(Slot::Running(old)) => {
                old.order(Control::Stop);
                Start::Load
            }
            // (A quarantine was answered above.)
            Some(Slot::Parked(_) | Slot::Quarantined(_)) => Start::Load,
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
        let (control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE);
        let id = self.next_runner.fetch_add(1, Ordering::Relaxed);
        let handle = RunnerHandle { commands: tx.clone(), control: control_tx, epoch, id };
        table.runners.insert(session.clone(), Slot::Running(handle));
        drop(table);
        let home: Arc<dyn Home> = self.table.clone();
        let parking = Parking { home: Arc::downgrade(&home), id };
        drop(home);
        let run = Runner::run(session.clone(), self.deps.clone(), epoch, start, rx, control_rx, parking);
        let (table, session) = (Arc::downgrade(&self.table), session.clone());
        tokio::spawn(async move {
            let quarantined = run.await;
            // The runner ended (unloaded or parked): drop its entry unless it parked there or a newer runner
            // took the session's place. A command that finds no entry starts a new runner; one that finds a
            // quarantine gets its answer.
            if let Some(table) = table.upgrade() {
                let mut table = lock(&table);
                if table.runners.get(&session).and_then(Slot::running).is_some_and(|h| h.id == id) {
                    match quarantined {
                        Some(answer) => {
                            table.runners.insert(session.clone(), Slot::Quarantined(Quarantine::new(&session, answer)));
                        }
                        None => {
                            table.runners.remove(&session);
                        }
                    }
                }
            }
        });
        Ok(tx)
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
