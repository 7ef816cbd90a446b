//! Taking sessions over (SPEC §6): when the process starts, or a shard is acquired, every session of it is
//! read from its log; its index entry, webhooks and schedules are put right, and the sessions that were
//! running (or have an active goal) are loaded, repaired and resumed without waiting for a command.

use std::time::Duration;

use turnstile_journal::snapshot::{LoadError, load_state};
use turnstile_model::{CommandError, SessionRef, Status};

use super::{HostError, SessionHost};

/// How long a take-over waits for the index mirror to catch up with its store before it goes on anyway
/// (then it may write entries the store already holds, which costs writes, not correctness).
const INDEX_LOAD_PATIENCE: Duration = Duration::from_secs(30);

/// Sessions listed per page of the log.
const LIST_PAGE: usize = 256;

impl SessionHost {
    /// Loads every session whose log says it was running when the process stopped, or whose goal is
    /// active, so it is repaired and resumed (SPEC §6, §10) without waiting for a command. Returns how many were loaded.
    pub async fn resume_running(&self) -> Result<usize, HostError> {
        self.resume_where(|_| true).await
    }

    /// Like [`SessionHost::resume_running`], for the sessions `wanted` selects (a newly acquired shard)
    /// and this worker may serve.
    pub async fn resume_where(&self, wanted: impl Fn(&SessionRef) -> bool) -> Result<usize, HostError> {
        let log = self.deps.log.as_ref();
        // The index mirror first catches up with its bucket, so only what differs is written again. A
        // mirror that stopped (its sender gone) has nothing more to say.
        let mut loaded = self.deps.index.loaded();
        if tokio::time::timeout(INDEX_LOAD_PATIENCE, loaded.wait_for(|done| *done)).await.is_err() {
            tracing::warn!(
                patience_s = INDEX_LOAD_PATIENCE.as_secs(),
                "the session index has not caught up with its store; taking sessions over anyway"
            );
        }
        let mut after: Option<SessionRef> = None;
        let mut resumed = 0;
        loop {
            let page = log.list_sessions(None, after.as_ref(), LIST_PAGE).await?;
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
    /// repaired and resumed (SPEC §6, §10, §15, §16). Whether the runner started. A log that cannot be
    /// folded quarantines its session and the take-over goes on with the next (decision 0084).
    pub(super) async fn take_over(&self, session: &SessionRef, epoch: u64) -> Result<bool, HostError> {
        let log = self.deps.log.as_ref();
        let dedup_horizon = self.deps.config.limits.dedup_horizon;
        let state = match load_state(log, self.deps.snapshots.as_ref(), session, dedup_horizon).await {
            Ok(state) => state,
            Err(LoadError::Journal(e)) => return Err(HostError::Journal(e)),
            Err(LoadError::Projection { source, .. }) => {
                self.quarantine(session, CommandError::quarantined(session, source));
                return Ok(false);
            }
        };
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
}
