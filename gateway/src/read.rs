//! Projection reads: any gateway folds a session's log itself, so reads keep working while a shard
//! moves and never wait on a driver.

use tonic::Status;
use turnstile_journal::log::read_all;
use turnstile_journal::state::DEFAULT_DEDUP_HORIZON;
use turnstile_journal::{Envelope, SessionLog, SessionRef, SessionState};

use crate::status;

/// The whole log of `session` and its fold.
pub async fn project(log: &dyn SessionLog, session: &SessionRef) -> Result<(Vec<Envelope>, SessionState), Status> {
    let events = read_all(log, session, 1).await.map_err(status::from_journal)?;
    let state = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events)
        .map_err(|e| status::from_projection(session, e))?;
    Ok((events, state))
}

/// The fold of an existing session; NOT_FOUND for a session with no accepted writes.
pub async fn existing(log: &dyn SessionLog, session: &SessionRef) -> Result<SessionState, Status> {
    let (_, state) = project(log, session).await?;
    if !state.exists() {
        return Err(Status::not_found(format!("session {session} does not exist: it has no accepted writes yet")));
    }
    Ok(state)
}
