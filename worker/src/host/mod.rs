//! The session host: one runner per loaded session, behind the gateway's [`CommandRouter`] seam.
//!
//! One job per module: [`table`] holds what the host knows per session behind its one lock; `lifecycle`
//! starts, replaces, drains and stops runners; `takeover` loads sessions when this host takes them over
//! (a start, a shard acquired) and resumes those that were running; `passivation` drops idle drivers;
//! `waker` loads sessions whose schedule is due; `delete` and `import` are `DeleteSession` and
//! `ImportSessions`, which the host performs around the driver; `quarantine` sets aside a session whose log
//! cannot be folded. This file routes commands.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use turnstile_cluster::CommandRouter;
use turnstile_journal::JournalError;
use turnstile_model::{Command, CommandError, CommandReply, SessionRef};

use crate::command::CommandMsg;
use crate::deps::RunnerDeps;
use crate::seen::SeenSessions;
use crate::sync::lock;

mod builder;
mod delete;
mod import;
mod lifecycle;
mod passivation;
mod quarantine;
mod table;
mod takeover;
mod waker;

pub use builder::SessionHostBuilder;
use table::{Slot, Table};

/// Errors of the host itself (not of one command).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Owns the drivers of the sessions this worker serves.
pub struct SessionHost {
    deps: Arc<RunnerDeps>,
    /// Runners, parked drivers and the sessions being deleted or imported, under one lock; shared with each
    /// runner's task, which removes its own entry when it ends.
    table: Arc<Table>,
    /// Ids of runners, so a runner's exit and parking touch only their own entry.
    next_runner: AtomicU64,
    /// Set once the passivation sweep of parked drivers runs.
    sweeping: AtomicBool,
    /// Set once the waker of unloaded sessions with a schedule runs.
    waking: AtomicBool,
    /// This host, for its waker task (which must not keep it alive).
    me: std::sync::Weak<SessionHost>,
    /// Sessions this host started a runner for, approximately: their first command loads them first.
    seen: SeenSessions,
}

impl SessionHost {
    /// The epoch to serve `session` under, or NOT-OWNER.
    fn epoch_for(&self, session: &SessionRef) -> Result<u64, CommandError> {
        match &self.deps.ownership {
            None => Ok(self.deps.config.epoch),
            Some(ownership) => ownership
                .accepting(session)
                .map_err(|owner| CommandError::NotOwner { session: session.to_string(), owner }),
        }
    }

    /// Commands waiting in `session`'s queue (0 when it is not loaded).
    pub fn queued_commands(&self, session: &SessionRef) -> usize {
        let table = lock(&self.table);
        table
            .runners
            .get(session)
            .and_then(Slot::running)
            .map_or(0, |h| h.commands.max_capacity() - h.commands.capacity())
    }

    /// Sessions in memory: with a live runner, or parked (idle, their driver alone).
    pub fn loaded_sessions(&self) -> usize {
        lock(&self.table).runners.values().filter(|slot| slot.is_loaded()).count()
    }

    /// Loaded sessions whose runner task is running (the rest are parked).
    pub fn running_sessions(&self) -> usize {
        let table = lock(&self.table);
        table.runners.values().filter_map(Slot::running).filter(|h| !h.commands.is_closed()).count()
    }

    /// Unloaded sessions waiting for a schedule's firing.
    pub fn waiting_sessions(&self) -> usize {
        self.deps.wakes.len()
    }

    /// Sessions the host holds anything for, loaded or ending (a runner's entry goes when its task ends).
    pub fn held_sessions(&self) -> usize {
        lock(&self.table).runners.len()
    }

    /// Writes the index entries its sessions submitted and the index still holds back (decision 0177),
    /// waiting at most `patience`: before a shard is handed over, so the next owner's take-over finds them
    /// and no late put of this worker's replaces a newer entry of the next owner's. Past `patience` (NATS
    /// away) the take-over's repair from the log covers what is missing.
    pub async fn flush_index(&self, patience: std::time::Duration) {
        if tokio::time::timeout(patience, self.deps.index.flush()).await.is_err() {
            tracing::warn!(
                patience_ms = patience.as_millis() as u64,
                "session index not flushed in time; the next owner repairs it"
            );
        }
    }
}

#[async_trait]
impl CommandRouter for SessionHost {
    async fn execute(
        &self,
        session: &SessionRef,
        command: Command,
        timeout: Option<Duration>,
    ) -> Result<CommandReply, CommandError> {
        // `session` was validated where it entered: the gateway's decoding or the internal codec's.
        if matches!(command, Command::Delete) {
            return self.delete(session).await;
        }
        if let Command::Import { events, complete } = command {
            return self.import(session, events, complete).await;
        }
        if matches!(command, Command::StreamingStep) {
            // A read for a joining Watch: a session with no live runner (unloaded, or parked idle) streams
            // nothing, and loading it to say so would cost a log read. Not-owner still routes it onwards.
            self.epoch_for(session)?;
            let running = lock(&self.table).runners.get(session).and_then(Slot::running).is_some();
            if !running {
                return Ok(CommandReply::Streaming(None));
            }
        }
        let when_idle = matches!(command, Command::WhenIdle);
        let (reply_tx, reply_rx) = oneshot::channel();
        // The caller's span (the internal RPC's, or the gateway's in `turnstile dev`) is the command's parent.
        let traceparent = turnstile_ops::trace::current_traceparent();
        let mut msg = Some(CommandMsg { command, reply: reply_tx, traceparent });
        // A runner that just unloaded (passivation) refuses the send; the second attempt starts a new one.
        for attempt in 0..2 {
            let epoch = self.epoch_for(session)?;
            let commands = self.runner(session, epoch, &mut msg)?;
            // The new runner took it as its start.
            let Some(next) = msg.take() else { break };
            // Refuse rather than wait: a caller held behind a full queue would hold its gateway's call,
            // and the next ones, for as long as the driver is busy.
            match commands.try_send(next) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(CommandError::ResourceExhausted(format!(
                        "session {session} has {} commands waiting for its driver (limits.max_queued_commands); \
                         nothing of this one was applied: retry with the same message id after a moment",
                        self.deps.config.command_queue
                    )));
                }
                Err(mpsc::error::TrySendError::Closed(back)) if attempt == 0 => msg = Some(back),
                Err(_) => {
                    return Err(CommandError::Unavailable(format!(
                        "session {session} is restarting; retry with the same message id"
                    )));
                }
            }
        }
        let wait = async {
            reply_rx.await.unwrap_or_else(|_| {
                Err(CommandError::Unavailable(format!(
                    "session {session} stopped before answering; retry with the same message id"
                )))
            })
        };
        if !when_idle {
            return wait.await;
        }
        let limit = timeout.unwrap_or(self.deps.config.default_when_idle_timeout);
        tokio::time::timeout(limit, wait).await.unwrap_or_else(|_| {
            Err(CommandError::DeadlineExceeded(format!(
                "session {session} did not become idle within {} ms",
                limit.as_millis()
            )))
        })
    }

    async fn owner(&self, _session: &SessionRef) -> Option<String> {
        Some(self.deps.config.owner_id.clone())
    }
}
