//! Where each webhook stands in each session (SPEC §15): the seq of the last event it has dealt with
//! (delivered, given up on, or not of its types). The session's owner saves it after each delivery; a new
//! owner starts from it, so delivery goes on across restarts and failover without starting over.
//!
//! [`MemoryPositions`] serves the embedded journal (positions last as long as the process);
//! [`crate::jetstream::KvWebhookPositions`] keeps them in the KV bucket `turnstile_webhooks`.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use turnstile_model::SessionRef;

use crate::log::JournalError;

/// The durable position of each (session, webhook).
#[async_trait]
pub trait WebhookPositions: Send + Sync + 'static {
    /// The last seq webhook `hook` dealt with in `session` (0: none yet).
    async fn load(&self, session: &SessionRef, hook: &str) -> Result<u64, JournalError>;
    /// Records that `hook` dealt with every event of `session` through `seq`.
    async fn save(&self, session: &SessionRef, hook: &str, seq: u64) -> Result<(), JournalError>;
    /// Forgets a deleted session's positions for `hooks`.
    async fn delete(&self, session: &SessionRef, hooks: &[String]) -> Result<(), JournalError>;
}

/// Positions in memory.
#[derive(Debug, Default)]
pub struct MemoryPositions {
    seqs: Mutex<HashMap<(SessionRef, String), u64>>,
}

#[async_trait]
impl WebhookPositions for MemoryPositions {
    async fn load(&self, session: &SessionRef, hook: &str) -> Result<u64, JournalError> {
        Ok(crate::sync::lock(&self.seqs).get(&(session.clone(), hook.to_owned())).copied().unwrap_or(0))
    }

    async fn save(&self, session: &SessionRef, hook: &str, seq: u64) -> Result<(), JournalError> {
        crate::sync::lock(&self.seqs).insert((session.clone(), hook.to_owned()), seq);
        Ok(())
    }

    async fn delete(&self, session: &SessionRef, hooks: &[String]) -> Result<(), JournalError> {
        let mut seqs = crate::sync::lock(&self.seqs);
        for hook in hooks {
            seqs.remove(&(session.clone(), hook.clone()));
        }
        Ok(())
    }
}
