//! `ImportSessions` (SPEC §18, decision 0074): the owner appends an imported log group by group and holds
//! the session until its last group. Each group is folded onto the fold of what is written before it, with
//! the fold every load uses ([`SessionState::apply`]), before anything of it is written: a log that could
//! not be loaded is never stored (decision 0083). Epochs and times are bounded first.

use std::time::Duration;

use tokio::time::Instant;
use turnstile_journal::JournalError;
use turnstile_journal::snapshot::{LoadError, empty_state, load_state};
use turnstile_model::{CommandError, CommandReply, Envelope, SessionRef, SessionState};

use super::SessionHost;
use super::delete::being_deleted;
use super::table::{Importing, Sessions, Slot};
use crate::command::{Control, journal_error};
use crate::sync::lock;

/// How long an import may pause between two groups of one session before the session is let go (it then
/// takes commands as any session whose log ends there, repaired like one after a crash).
const IMPORT_STALE: Duration = Duration::from_secs(60);

/// The largest epoch an imported event may carry: 2^53 - 1, the largest integer a JSON number holds exactly
/// in every client. A cluster's epochs count the lease acquisitions of a shard and stay far below it.
const MAX_IMPORTED_EPOCH: u64 = (1 << 53) - 1;

/// How far past this server's clock an imported event's time may be: the clocks of the exporting and the
/// importing cluster differ a little, never by this much. A time beyond it would hold every later event of
/// the session at that time (times never decrease) and sort the session first by activity for good.
const IMPORT_CLOCK_SKEW: Duration = Duration::from_secs(300);

impl Importing {
    /// Whether the import still holds `session`: its importer sent a group within [`IMPORT_STALE`].
    fn is_live(&self, session: &SessionRef) -> bool {
        let live = self.since.elapsed() < IMPORT_STALE;
        if !live {
            tracing::warn!(%session, "an import stopped between two groups; the session takes commands again");
        }
        live
    }
}

impl Sessions {
    /// Whether an import holds `session` (an import whose importer went away lets go after
    /// [`IMPORT_STALE`]).
    pub(super) fn being_imported(&mut self, session: &SessionRef) -> bool {
        match self.importing.get(session) {
            Some(held) if held.is_live(session) => true,
            Some(_) => {
                self.importing.remove(session);
                false
            }
            None => false,
        }
    }

    /// Lets go of the imports whose importer went away (their held folds with them).
    pub(super) fn drop_stale_imports(&mut self) {
        self.importing.retain(|session, held| held.is_live(session));
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
        let checked = match check_bounds(session, &events, turnstile_ops::clock::now_ms()) {
            Ok(()) => self.fold_group(session, expected, &events).await,
            Err(e) => Err(e),
        };
        let fold = match checked {
            Ok(fold) => fold,
            Err(e) => {
                // The import stops here; what it wrote before this group folds, and is the session's log.
                lock(&self.table).importing.remove(session);
                return Err(e);
            }
        };
        {
            let mut table = lock(&self.table);
            if table.deleting.contains(session) {
                return Err(being_deleted(session));
            }
            table.importing.insert(session.clone(), Importing { since: Instant::now(), fold: None });
            // The sweep lets go of an import whose importer goes away, with the fold it holds.
            self.start_sweep();
            // A driver loaded here holds a log that is about to grow under it (an empty session's, or one
            // loaded from a part of the import): drop it; the next command loads the whole log.
            if let Some(Slot::Running(old)) = table.runners.remove(session) {
                old.order(Control::Stop);
            }
        }
        let written = self.append_imported(session, epoch, expected, &events).await;
        {
            let mut table = lock(&self.table);
            match (&written, table.importing.get_mut(session)) {
                (Ok(_), Some(held)) if !complete => held.fold = Some(fold),
                _ => {
                    table.importing.remove(session);
                }
            }
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

    /// The fold of `session`'s log through seq `expected` with `events` folded on: INVALID_ARGUMENT naming
    /// the seq and the fault when they cannot follow it. The fold through `expected` is the one the import
    /// kept from its last group, else the log's as a load folds it (an import resumed by another worker).
    async fn fold_group(
        &self,
        session: &SessionRef,
        expected: u64,
        events: &[Envelope],
    ) -> Result<SessionState, CommandError> {
        let held = lock(&self.table)
            .importing
            .get_mut(session)
            .and_then(|held| held.fold.take())
            .filter(|fold| fold.last_seq == expected);
        let dedup_horizon = self.deps.config.limits.dedup_horizon;
        let mut fold = match held {
            Some(fold) => fold,
            None if expected == 0 => empty_state(session, dedup_horizon).map_err(|e| load_error(session, e))?,
            None => load_state(self.deps.log.as_ref(), self.deps.snapshots.as_ref(), session, dedup_horizon)
                .await
                .map_err(|e| load_error(session, e))?,
        };
        for event in events {
            if let Err(fault) = fold.apply(event) {
                let (first, last) = (expected + 1, expected + events.len() as u64);
                let written = match expected {
                    0 => String::new(),
                    n => format!(
                        "; its seqs 1..={n} were imported before this group: delete the session (DeleteSession) \
                         before importing it again"
                    ),
                };
                return Err(CommandError::InvalidArgument(format!(
                    "session {session} cannot be imported: {fault}; nothing of its seqs {first}..={last} was written{written}"
                )));
            }
        }
        Ok(fold)
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

/// A load of the log before an imported group failed: the journal's answer, or the quarantine of a log that
/// cannot be folded (only a log written past the import's checks can be one).
fn load_error(session: &SessionRef, e: LoadError) -> CommandError {
    match e {
        LoadError::Journal(e) => journal_error(e),
        LoadError::Projection { source, .. } => CommandError::quarantined(session, source),
    }
}

/// INVALID_ARGUMENT for the first event of `events` whose epoch or time is out of bounds
/// ([`MAX_IMPORTED_EPOCH`], [`IMPORT_CLOCK_SKEW`] past `now_ms`).
fn check_bounds(session: &SessionRef, events: &[Envelope], now_ms: u64) -> Result<(), CommandError> {
    let latest = now_ms.saturating_add(IMPORT_CLOCK_SKEW.as_millis() as u64);
    for e in events {
        if e.epoch > MAX_IMPORTED_EPOCH {
            return Err(CommandError::InvalidArgument(format!(
                "session {session} cannot be imported: event {} has epoch {}, above the largest an import takes \
                 ({MAX_IMPORTED_EPOCH}); nothing of this group was written",
                e.seq, e.epoch
            )));
        }
        if e.time_ms > latest {
            return Err(CommandError::InvalidArgument(format!(
                "session {session} cannot be imported: event {} has time_ms {}, more than {} s past this server's \
                 clock ({now_ms}); nothing of this group was written",
                e.seq,
                e.time_ms,
                IMPORT_CLOCK_SKEW.as_secs()
            )));
        }
    }
    Ok(())
}

pub(super) fn being_imported(session: &SessionRef) -> CommandError {
    CommandError::Unavailable(format!("session {session} is being imported; retry once ImportSessions has answered"))
}
