//! `ImportSessions` (SPEC §18, decision 0074): the owner appends an imported log group by group and holds
//! the session until its last group.

use std::time::Duration;

use tokio::time::Instant;
use turnstile_journal::JournalError;
use turnstile_model::{CommandError, CommandReply, Envelope, SessionRef};

use super::SessionHost;
use super::delete::being_deleted;
use super::table::{Sessions, Slot};
use crate::command::{Control, journal_error};
use crate::sync::lock;

/// How long an import may pause between two groups of one session before the session is let go (it then
/// takes commands as any session whose log ends there, repaired like one after a crash).
const IMPORT_STALE: Duration = Duration::from_secs(60);

/// A session an import holds.
pub(super) struct Importing {
    /// When its last group came.
    since: Instant,
}

impl Sessions {
    /// Whether an import holds `session` (an import whose importer went away lets go after
    /// [`IMPORT_STALE`]).
    pub(super) fn being_imported(&mut self, session: &SessionRef) -> bool {
        match self.importing.get(session) {
            Some(held) if held.since.elapsed() < IMPORT_STALE => true,
            Some(_) => {
                tracing::warn!(%session, "an import stopped between two groups; the session takes commands again");
                self.importing.remove(session);
                false
            }
            None => false,
        }
    }
}

impl SessionHost {
    /// Appends one group of an imported log as it is. The group from seq 1 goes only to a session without
    /// events (ALREADY_EXISTS otherwise); a later one must follow the log's end. From its first group to its
    /// `complete` one the session takes no other command; then, if it was running or has an active goal, it
    /// is loaded and resumes (its open turn repaired as after a crash).
    pub(super) async fn import(
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
            let mut table = lock(&self.table);
            if table.deleting.contains(session) {
                return Err(being_deleted(session));
            }
            table.importing.insert(session.clone(), Importing { since: Instant::now() });
            // A driver loaded here holds a log that is about to grow under it (an empty session's, or one
            // loaded from a part of the import): drop it; the next command loads the whole log.
            if let Some(Slot::Running(old)) = table.runners.remove(session) {
                old.order(Control::Stop);
            }
        }
        let written = self.append_imported(session, epoch, expected, &events).await;
        if written.is_err() || complete {
            lock(&self.table).importing.remove(session);
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
}

pub(super) fn being_imported(session: &SessionRef) -> CommandError {
    CommandError::Unavailable(format!("session {session} is being imported; retry once ImportSessions has answered"))
}
