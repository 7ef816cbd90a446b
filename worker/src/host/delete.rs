//! `DeleteSession` (SPEC §12), performed by the host around the session's runner.

use tokio::sync::{mpsc, oneshot};
use turnstile_model::{CancelCause, Command, CommandError, CommandReply, SessionRef};

use super::SessionHost;
use super::table::Slot;
use crate::command::{CommandMsg, Control, journal_error};
use crate::sync::lock;

/// The queues of a runner a delete talks to.
type Loaded = (mpsc::Sender<CommandMsg>, mpsc::Sender<Control>);

impl SessionHost {
    /// While it runs the session takes no other command. A loaded runner first cancels a running turn with
    /// cause `disposed`, keeping the inbox (its `turn/end aborted{disposed}` is written, as any cancel's; an
    /// idle session writes nothing), converges (bounded by the `WhenIdle` timeout, then it is stopped where
    /// it is) and unloads without a last snapshot; then the log and the snapshots (which hold the dedup
    /// index) are removed. The reply is the last seq the log had; NOT_FOUND when it had none.
    pub(super) async fn delete(&self, session: &SessionRef) -> Result<CommandReply, CommandError> {
        self.epoch_for(session)?;
        let loaded = {
            let mut table = lock(&self.table);
            if !table.deleting.insert(session.clone()) {
                return Err(being_deleted(session));
            }
            match table.runners.get(session) {
                Some(Slot::Running(h)) => Some((h.commands.clone(), h.control.clone())),
                // An idle driver, or a quarantined log: nothing to cancel or wait for.
                Some(Slot::Parked(_) | Slot::Quarantined(_)) => {
                    table.runners.remove(session);
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
        lock(&self.table).deleting.remove(session);
        result
    }

    async fn remove_session(&self, session: &SessionRef, loaded: Option<Loaded>) -> Result<CommandReply, CommandError> {
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
                let mut table = lock(&self.table);
                let ours = table.runners.get(session).and_then(Slot::running);
                if ours.is_some_and(|h| h.commands.same_channel(&commands)) {
                    table.runners.remove(session);
                }
            }
            // A runner that already ended has dropped its queue: nothing to tell it.
            let _ = control.send(Control::Dispose).await;
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

pub(super) fn being_deleted(session: &SessionRef) -> CommandError {
    CommandError::Unavailable(format!("session {session} is being deleted; retry once DeleteSession has answered"))
}
