//! The session host: one runner per loaded session, behind the gateway's [`CommandRouter`] seam.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use turnstile_journal::snapshot::{LoadError, NoSnapshots, SnapshotStore, load_state};
use turnstile_journal::{
    Command, CommandError, CommandReply, CommandRouter, JournalError, LiveBus, SessionLog, SessionRef, Status,
};

use crate::config::WorkerConfig;
use crate::hooks::{ContentGuard, PreStepHook};
use crate::model::{Model, ScriptedModel};
use crate::runner::{CommandMsg, Runner, RunnerDeps};
use crate::tools::ToolRegistry;

/// Commands queued for one session before callers are pushed back.
const COMMAND_QUEUE: usize = 1024;

/// Errors of the host itself (not of one command).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("session {session} cannot be folded: {detail}")]
    Projection { session: SessionRef, detail: String },
}

/// Owns the drivers of the sessions this worker serves.
pub struct SessionHost {
    deps: Arc<RunnerDeps>,
    runners: Mutex<HashMap<SessionRef, mpsc::Sender<CommandMsg>>>,
}

impl SessionHost {
    /// A host with the scripted model, the built-in tools and the content guard.
    pub fn new(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, config: WorkerConfig) -> Arc<Self> {
        Self::with_snapshots(log, bus, Arc::new(NoSnapshots), config)
    }

    /// Like [`SessionHost::new`], loading and writing snapshots in `snapshots`.
    pub fn with_snapshots(
        log: Arc<dyn SessionLog>,
        bus: Arc<dyn LiveBus>,
        snapshots: Arc<dyn SnapshotStore>,
        config: WorkerConfig,
    ) -> Arc<Self> {
        let hooks: Vec<Arc<dyn PreStepHook>> = vec![Arc::new(ContentGuard)];
        Self::with_parts(log, bus, snapshots, Arc::new(ScriptedModel), ToolRegistry::builtin(), hooks, config)
    }

    pub fn with_parts(
        log: Arc<dyn SessionLog>,
        bus: Arc<dyn LiveBus>,
        snapshots: Arc<dyn SnapshotStore>,
        model: Arc<dyn Model>,
        tools: ToolRegistry,
        hooks: Vec<Arc<dyn PreStepHook>>,
        config: WorkerConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            deps: Arc::new(RunnerDeps { log, bus, model, tools, hooks, snapshots, config }),
            runners: Mutex::new(HashMap::new()),
        })
    }

    /// Loads every session whose log says it was running when the process stopped, so it is repaired
    /// and resumed (SPEC §6) without waiting for a command. Returns how many were loaded.
    pub async fn resume_running(&self) -> Result<usize, HostError> {
        let log = self.deps.log.as_ref();
        let mut after: Option<SessionRef> = None;
        let mut resumed = 0;
        loop {
            let page = log.list_sessions(None, after.as_ref(), 256).await?;
            let Some(last) = page.last().cloned() else { break };
            for session in page {
                let state =
                    load_state(log, self.deps.snapshots.as_ref(), &session, self.deps.config.limits.dedup_horizon)
                        .await
                        .map_err(|e| match e {
                            LoadError::Journal(e) => HostError::Journal(e),
                            LoadError::Projection { .. } => {
                                HostError::Projection { session: session.clone(), detail: e.to_string() }
                            }
                        })?;
                if state.status == Status::Running || state.wake_since_idle || state.open_turn.is_some() {
                    tracing::info!(%session, "resuming a session that was running");
                    self.runner(&session);
                    resumed += 1;
                }
            }
            after = Some(last);
        }
        Ok(resumed)
    }

    /// The runner of `session`, started (and loading) if there is none.
    fn runner(&self, session: &SessionRef) -> mpsc::Sender<CommandMsg> {
        let mut runners = self.runners.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = runners.get(session).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        runners.insert(session.clone(), tx.clone());
        tokio::spawn(Runner::run(session.clone(), self.deps.clone(), rx));
        tx
    }

    /// Sessions with a live runner.
    pub fn loaded_sessions(&self) -> usize {
        self.runners.lock().unwrap_or_else(PoisonError::into_inner).values().filter(|tx| !tx.is_closed()).count()
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
        session.validate().map_err(|e| CommandError::InvalidArgument(e.to_string()))?;
        let when_idle = matches!(command, Command::WhenIdle);
        let (reply_tx, reply_rx) = oneshot::channel();
        let runner = self.runner(session);
        runner.send(CommandMsg { command, reply: reply_tx }).await.map_err(|_| {
            CommandError::Unavailable(format!("session {session} is restarting; retry with the same message id"))
        })?;
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
