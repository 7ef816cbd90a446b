//! The session host: one runner per loaded session, behind the [`CommandRouter`] seam.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use turnstile_journal::{Command, CommandError, CommandReply, CommandRouter, LiveBus, SessionLog, SessionRef};

use crate::config::WorkerConfig;

/// Errors of the host itself (not of one command).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Journal(#[from] turnstile_journal::JournalError),
}

/// Owns the drivers of the sessions this worker serves.
pub struct SessionHost {
    #[allow(dead_code)]
    log: Arc<dyn SessionLog>,
    #[allow(dead_code)]
    bus: Arc<dyn LiveBus>,
    #[allow(dead_code)]
    config: WorkerConfig,
}

impl SessionHost {
    pub fn new(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, config: WorkerConfig) -> Arc<Self> {
        Arc::new(Self { log, bus, config })
    }

    /// Loads every session whose log says it was running (a crash or kill stopped it), repairs and
    /// resumes it (SPEC §6). Returns how many were resumed.
    pub async fn resume_running(&self) -> Result<usize, HostError> {
        Ok(0)
    }
}

#[async_trait]
impl CommandRouter for SessionHost {
    async fn execute(
        &self,
        _session: &SessionRef,
        _command: Command,
        _timeout: Option<Duration>,
    ) -> Result<CommandReply, CommandError> {
        Err(CommandError::Unavailable("driver not yet implemented".into()))
    }

    async fn owner(&self, _session: &SessionRef) -> Option<String> {
        Some(self.config.owner_id.clone())
    }
}
