//! Projection reads: any gateway folds a session's log itself (from its latest snapshot, when a snapshot
//! store is configured), so reads keep working while a shard moves and never wait on a driver.

use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_journal::snapshot::{LoadError, SnapshotStore, load_state, load_state_keeping};
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{SessionRef, SessionState};

use crate::status;

/// The fold of `session`: latest usable snapshot + the events after it.
pub async fn project(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
) -> Result<SessionState, Status> {
    load_state(log, snapshots, session, DEFAULT_DEDUP_HORIZON).await.map_err(load_status)
}

/// [`project`], with the events after `after_seq` from the same read of the log (Watch's resume).
pub async fn project_after(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
    after_seq: u64,
) -> Result<(SessionState, Vec<turnstile_model::Envelope>), Status> {
    load_state_keeping(log, snapshots, session, DEFAULT_DEDUP_HORIZON, after_seq.saturating_add(1))
        .await
        .map_err(load_status)
}

fn load_status(e: LoadError) -> Status {
    match e {
        LoadError::Journal(e) => status::from_journal(e),
        LoadError::Projection { session, source } => status::from_projection(&session, source),
    }
}

/// The fold of an existing session; NOT_FOUND for a session with no accepted writes.
pub async fn existing(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
) -> Result<SessionState, Status> {
    let state = project(log, snapshots, session).await?;
    if !state.exists() {
        return Err(not_found(session));
    }
    Ok(state)
}

/// NOT_FOUND for `session`; also the answer for another tenant's session, so the two cannot be told apart.
pub fn not_found(session: &SessionRef) -> Status {
    Status::not_found(format!("session {session} does not exist: it has no accepted writes yet"))
}
