//! Loading a session into a driver: its snapshot and the log after it, repaired (SPEC §6), waiting out a
//! journal outage with backoff while the commands that arrive meanwhile are answered UNAVAILABLE.

use std::time::Duration;

use tokio::sync::mpsc;
use turnstile_driver::Driver;
use turnstile_journal::snapshot::{LoadError, load_state};
use turnstile_model::{CommandError, SessionRef};
use turnstile_ops::clock::now_ms;

use crate::command::{CommandMsg, journal_error};
use crate::deps::RunnerDeps;

/// First pause before loading a session again while the journal is unavailable; doubles up to the max.
const RELOAD_BACKOFF: Duration = Duration::from_millis(100);
const RELOAD_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Loads a session (snapshot + tail) into a driver and repairs it (its effects are still to perform).
async fn load_driver(deps: &RunnerDeps, session: &SessionRef, epoch: u64) -> Result<Driver, CommandError> {
    let state = load_state(deps.log.as_ref(), deps.snapshots.as_ref(), session, deps.config.limits.dedup_horizon)
        .await
        .map_err(|e| match e {
            LoadError::Journal(e) => journal_error(e),
            LoadError::Projection { .. } => CommandError::Internal(e.to_string()),
        })?;
    let mut driver = deps.driver(state, epoch);
    driver.recover(now_ms());
    Ok(driver)
}

/// Loads the session, retrying with backoff while the journal is unavailable and answering commands
/// meanwhile with UNAVAILABLE, so service resumes by itself when the journal returns. `None` when the
/// log cannot be folded (every waiting command gets that error) or the host went away.
pub(crate) async fn load_until_available(
    deps: &RunnerDeps,
    session: &SessionRef,
    epoch: u64,
    commands: &mut mpsc::Receiver<CommandMsg>,
) -> Option<Driver> {
    let mut backoff = RELOAD_BACKOFF;
    loop {
        let error = match load_driver(deps, session, epoch).await {
            Ok(driver) => return Some(driver),
            Err(e @ CommandError::Unavailable(_)) => e,
            Err(e) => {
                tracing::error!(%session, error = %e, "cannot load session");
                commands.close();
                while let Some(msg) = commands.recv().await {
                    let _ = msg.reply.send(Err(e.clone()));
                }
                return None;
            }
        };
        tracing::warn!(%session, error = %error, retry_in = ?backoff, "cannot load session; retrying");
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                msg = commands.recv() => match msg {
                    Some(msg) => { let _ = msg.reply.send(Err(error.clone())); }
                    None => return None,
                },
            }
        }
        backoff = (backoff * 2).min(RELOAD_BACKOFF_MAX);
    }
}
