//! Registered webhooks in the JetStream KV bucket `turnstile_webhook_registry`: one key per webhook,
//! `<tenant>.<id>`, its JSON as the value. Every node mirrors the bucket in memory through a watch
//! ([`crate::webhook_registry::MemoryWebhooks`]), so a worker finds a tenant's webhooks without a request.

use std::sync::Arc;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use futures::StreamExt;

use crate::log::JournalError;
use crate::webhook_registry::{MemoryWebhooks, RegisteredWebhook, WebhookRegistry};

/// The bucket of registered webhooks.
pub const WEBHOOK_REGISTRY_BUCKET: &str = "turnstile_webhook_registry";

/// [`WebhookRegistry`] on a JetStream KV bucket.
pub struct KvWebhookRegistry {
    store: kv::Store,
    mirror: Arc<MemoryWebhooks>,
}

impl std::fmt::Debug for KvWebhookRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvWebhookRegistry").field("bucket", &WEBHOOK_REGISTRY_BUCKET).finish()
    }
}

fn key(tenant: &str, id: &str) -> String {
    format!("{tenant}.{id}")
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("webhook registry: {e}"))
}

impl KvWebhookRegistry {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket and returns once the mirror holds
    /// every webhook stored (so a worker that starts delivering right away misses none); the watch then
    /// goes on following changes.
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let description = "Turnstile webhooks registered at run time (CreateWebhook), by tenant";
        let store = super::open_bucket(client, WEBHOOK_REGISTRY_BUCKET, description, replicas).await?;
        let mirror = Arc::new(MemoryWebhooks::default());
        // Like the bucket, the watch and the status wait out a leader election of its stream.
        let (mut watch, empty) = super::while_starting("the webhook registry watch", || async {
            let watch = store.watch_with_history(">").await.map_err(unavailable)?;
            Ok::<_, JournalError>((watch, store.status().await.map_err(unavailable)?.values() == 0))
        })
        .await?;
        if !empty {
            // The history first: each entry up to the one the server marks as the last when the watch began.
            while let Some(entry) = watch.next().await {
                let entry = entry.map_err(unavailable)?;
                let last = entry.delta == 0;
                apply(&mirror, entry);
                if last {
                    break;
                }
            }
        }
        // Applying an entry twice changes nothing: the watch may be reopened with the history.
        let followed = mirror.clone();
        tokio::spawn(super::follow_bucket(store.clone(), watch, "webhook registry", move |entry| {
            apply(&followed, entry)
        }));
        Ok(Self { store, mirror })
    }
}

fn apply(mirror: &MemoryWebhooks, entry: kv::Entry) {
    match entry.operation {
        kv::Operation::Put => match serde_json::from_slice::<RegisteredWebhook>(&entry.value) {
            Ok(hook) => mirror.insert(hook),
            Err(e) => tracing::warn!(key = %entry.key, error = %e, "registered webhook not readable; skipped"),
        },
        kv::Operation::Delete | kv::Operation::Purge => {
            if let Some((tenant, id)) = entry.key.split_once('.') {
                mirror.remove(tenant, id);
            }
        }
    }
}

#[async_trait]
impl WebhookRegistry for KvWebhookRegistry {
    async fn create(&self, hook: RegisteredWebhook) -> Result<(), JournalError> {
        let value = serde_json::to_vec(&hook).map_err(|e| JournalError::Storage(e.to_string()))?;
        self.store.create(key(&hook.tenant, &hook.id), value.into()).await.map_err(unavailable)?;
        self.mirror.insert(hook);
        Ok(())
    }

    async fn delete(&self, tenant: &str, id: &str) -> Result<Option<RegisteredWebhook>, JournalError> {
        let key = key(tenant, id);
        let Some(bytes) = self.store.get(key.clone()).await.map_err(unavailable)? else {
            return Ok(None);
        };
        let hook: RegisteredWebhook = serde_json::from_slice(&bytes)
            .map_err(|e| JournalError::Storage(format!("registered webhook {key} not readable: {e}")))?;
        self.store.purge(key).await.map_err(unavailable)?;
        self.mirror.remove(tenant, id);
        Ok(Some(hook))
    }

    fn of_tenant(&self, tenant: &str) -> Vec<Arc<RegisteredWebhook>> {
        self.mirror.of_tenant(tenant)
    }
}
