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

/// Why [`load_until_available`] gives no driver; every command that waited was answered.
pub(crate) enum NotLoaded {
    /// The host went away, or the journal failed in a way a retry cannot fix.
    Gone,
    /// The log cannot be folded: the session is quarantined (decision 0084), and this is its answer.
    Quarantined(CommandError),
}

/// Loads a session (snapshot + tail) into a driver and repairs it (its effects are still to perform).
async fn load_driver(deps: &RunnerDeps, session: &SessionRef, epoch: u64) -> Result<Driver, LoadError> {
    let state =
        load_state(deps.log.as_ref(), deps.snapshots.as_ref(), session, deps.config.limits.dedup_horizon).await?;
    let mut driver = deps.driver(state, epoch);
    driver.recover(now_ms());
    Ok(driver)
}

/// Loads the session, retrying with backoff while the journal is unavailable and answering commands
/// meanwhile with UNAVAILABLE, so service resumes by itself when the journal returns.
pub(crate) async fn load_until_available(
    deps: &RunnerDeps,
    session: &SessionRef,
    epoch: u64,
    commands: &mut mpsc::Receiver<CommandMsg>,
) -> Result<Driver, NotLoaded> {
    let mut backoff = RELOAD_BACKOFF;
    loop {
        let (error, unloaded) = match load_driver(deps, session, epoch).await {
            Ok(driver) => return Ok(driver),
            Err(LoadError::Journal(e)) => match journal_error(e) {
                e @ CommandError::Unavailable(_) => (e, None),
                e => (e, Some(NotLoaded::Gone)),
            },
            Err(LoadError::Projection { source, .. }) => {
                let e = CommandError::quarantined(session, source);
                (e.clone(), Some(NotLoaded::Quarantined(e)))
            }
        };
        if let Some(unloaded) = unloaded {
            tracing::error!(%session, error = %error, "cannot load session");
            commands.close();
            while let Some(msg) = commands.recv().await {
                let _ = msg.reply.send(Err(error.clone()));
            }
            return Err(unloaded);
        }
        tracing::warn!(%session, error = %error, retry_in = ?backoff, "cannot load session; retrying");
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                msg = commands.recv() => match msg {
                    Some(msg) => { let _ = msg.reply.send(Err(error.clone())); }
                    None => return Err(NotLoaded::Gone),
                },
            }
        }
        backoff = (backoff * 2).min(RELOAD_BACKOFF_MAX);
    }
}
