//! Projection reads: any gateway folds a session's log itself (from its latest snapshot, when a snapshot
//! store is configured), so reads keep working while a shard moves and never wait on a driver.

use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_journal::snapshot::{LoadError, ReadFold, SnapshotStore, load_for_reads};
use turnstile_model::{CommandError, SessionRef, SessionState};

use crate::status;

/// The fold of `session` as reads see it (without the dedup index and the transcript): its latest read
/// snapshot + the events after it, read from the position the snapshot recorded (decision 0020).
pub async fn project(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
) -> Result<SessionState, Status> {
    Ok(project_with_tail(log, snapshots, session).await?.state)
}

/// [`project`], with the events it folded onto the snapshot (Watch serves a resume near the end from
/// them without another read of the log).
pub async fn project_with_tail(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
) -> Result<ReadFold, Status> {
    load_for_reads(log, snapshots, session).await.map_err(load_status)
}

fn load_status(e: LoadError) -> Status {
    match e {
        LoadError::Journal(e) => status::from_journal(e),
        LoadError::Projection { session, source } => status::from_projection(&session, *source),
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
    Status::not_found(CommandError::session_not_found(session).to_string())
}
