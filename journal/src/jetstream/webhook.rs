//! Webhook positions in the JetStream KV bucket `turnstile_webhooks` (one key per session and webhook:
//! `<tenant>.<id>.<hook>`, the seq as decimal text).

use async_nats::jetstream::kv;
use async_trait::async_trait;
use turnstile_model::SessionRef;

use crate::log::JournalError;
use crate::webhook::WebhookPositions;

/// The bucket of webhook positions.
pub const WEBHOOK_BUCKET: &str = "turnstile_webhooks";

/// [`WebhookPositions`] on a JetStream KV bucket.
pub struct KvWebhookPositions {
    store: kv::Store,
}

impl std::fmt::Debug for KvWebhookPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvWebhookPositions").field("bucket", &WEBHOOK_BUCKET).finish()
    }
}

impl KvWebhookPositions {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket.
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let description = "Turnstile webhook positions (last seq dealt with per session and webhook)";
        let store = super::open_bucket(client, WEBHOOK_BUCKET, description, replicas).await?;
        Ok(Self { store })
    }
}

/// Tenants, session ids and hook ids (hex) are KV-key safe.
fn key(session: &SessionRef, hook: &str) -> String {
    format!("{}.{}.{hook}", session.tenant, session.id)
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("webhook positions: {e}"))
}

#[async_trait]
impl WebhookPositions for KvWebhookPositions {
    async fn load(&self, session: &SessionRef, hook: &str) -> Result<u64, JournalError> {
        let bytes = self.store.get(key(session, hook)).await.map_err(unavailable)?;
        Ok(bytes.and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok()).unwrap_or(0))
    }

    async fn save(&self, session: &SessionRef, hook: &str, seq: u64) -> Result<(), JournalError> {
        self.store.put(key(session, hook), seq.to_string().into()).await.map_err(unavailable)?;
        Ok(())
    }

    async fn delete(&self, session: &SessionRef, hooks: &[String]) -> Result<(), JournalError> {
        for hook in hooks {
            self.store.purge(key(session, hook)).await.map_err(unavailable)?;
        }
        Ok(())
    }
}
