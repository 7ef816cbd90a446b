//! Webhooks registered at run time (`CreateWebhook`, SPEC §21; docs/decisions/0134): a tenant's webhooks,
//! stored durably and read by every worker from a mirror it keeps in memory.
//!
//! [`MemoryWebhooks`] serves the embedded journal (in memory, or in `<data_dir>/webhooks.json` so that a
//! `turnstile dev --data-dir` keeps them across restarts); [`crate::jetstream::KvWebhookRegistry`] keeps
//! them in the KV bucket `turnstile_webhook_registry` (one key per webhook, `<tenant>.<id>`, replicated like
//! the other buckets) and follows it with a watch, so a webhook created at one gateway is delivered by
//! whichever worker owns a matching session.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use turnstile_model::Secret;

use crate::log::JournalError;
use crate::sync;

/// A webhook a tenant registered. Its `secret` is kept (the owner signs with it) but never printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisteredWebhook {
    pub tenant: String,
    /// `wh_` and 16 hex digits: key-safe, and never one of the configuration's webhook ids (bare hex).
    pub id: String,
    pub url: String,
    /// The durable types delivered.
    pub events: Vec<String>,
    /// The sessions served (SPEC §16 syntax); empty: all of the tenant's.
    pub label_selector: String,
    /// How long an event is retried before it is given up on.
    pub max_age_ms: u64,
    /// Events written before this time are not delivered: a new webhook does not replay history.
    pub created_unix_ms: u64,
    /// The HMAC key of `Turnstile-Signature`.
    pub secret: Secret,
    /// Set for the push notifications of one A2A task (SPEC §19): the webhook serves that task's session
    /// alone, its POSTs carry the protocol's body, and it is removed once the task ends. The secret is then
    /// the client's token. Absent in webhooks created by `CreateWebhook` (and in records older than it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskPush>,
}

/// What a webhook serving one task's push notifications knows of the task (docs/decisions/0155).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPush {
    /// The task's session.
    pub session: String,
    /// The MessageId of the delivery that asked for the task (the task is the turn answering it).
    pub message_id: String,
    /// Where that delivery is at or after: the task's seq, or the session's next seq when the
    /// configuration was made before the message was delivered (so that its first events are not missed).
    pub from_seq: u64,
    /// The client's id of this push configuration (unique per task).
    pub config_id: String,
    /// `Authorization: <scheme> <credentials>` on each POST, when the client gave a scheme.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auth_scheme: String,
    #[serde(default, skip_serializing_if = "Secret::is_empty")]
    pub auth_credentials: Secret,
}

/// Where registered webhooks are kept.
#[async_trait]
pub trait WebhookRegistry: Send + Sync + 'static {
    /// Stores `hook` (its id is new).
    async fn create(&self, hook: RegisteredWebhook) -> Result<(), JournalError>;
    /// Removes `tenant`'s webhook `id`; `None` when it has none by that id.
    async fn delete(&self, tenant: &str, id: &str) -> Result<Option<RegisteredWebhook>, JournalError>;
    /// `tenant`'s webhooks as this node knows them now, oldest first: what it created or deleted itself at
    /// once, others' changes as soon as the store tells it.
    fn of_tenant(&self, tenant: &str) -> Vec<Arc<RegisteredWebhook>>;
}

/// Registered webhooks in memory, optionally saved to a file after each change.
#[derive(Debug, Default)]
pub struct MemoryWebhooks {
    /// By tenant, then id.
    hooks: Mutex<BTreeMap<String, BTreeMap<String, Arc<RegisteredWebhook>>>>,
    file: Option<PathBuf>,
}

impl MemoryWebhooks {
    /// Webhooks kept in `<data_dir>/webhooks.json`, read now if it exists.
    pub fn open(data_dir: &std::path::Path) -> Result<Self, JournalError> {
        let file = data_dir.join("webhooks.json");
        let registry = Self { hooks: Mutex::default(), file: Some(file.clone()) };
        match std::fs::read(&file) {
            Ok(bytes) => {
                let hooks: Vec<RegisteredWebhook> = serde_json::from_slice(&bytes)
                    .map_err(|e| JournalError::Storage(format!("{} is not readable: {e}", file.display())))?;
                for hook in hooks {
                    registry.insert(hook);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JournalError::Storage(format!("cannot read {}: {e}", file.display()))),
        }
        Ok(registry)
    }

    /// Adds or replaces `hook` in memory only (the KV mirror's and this type's one way in).
    pub fn insert(&self, hook: RegisteredWebhook) {
        let mut hooks = sync::lock(&self.hooks);
        hooks.entry(hook.tenant.clone()).or_default().insert(hook.id.clone(), Arc::new(hook));
    }

    /// Removes a webhook from memory only.
    pub fn remove(&self, tenant: &str, id: &str) -> Option<RegisteredWebhook> {
        let mut hooks = sync::lock(&self.hooks);
        let of_tenant = hooks.get_mut(tenant)?;
        let removed = of_tenant.remove(id);
        if of_tenant.is_empty() {
            hooks.remove(tenant);
        }
        removed.map(|hook| (*hook).clone())
    }

    /// Writes every webhook to the file (a new file renamed over the old one, so a crash leaves one whole).
    fn save(&self) -> Result<(), JournalError> {
        let Some(file) = &self.file else { return Ok(()) };
        let all: Vec<RegisteredWebhook> =
            sync::lock(&self.hooks).values().flat_map(|t| t.values().map(|h| (**h).clone())).collect();
        let bytes = serde_json::to_vec_pretty(&all).map_err(|e| JournalError::Storage(e.to_string()))?;
        let partial = file.with_extension("json.partial");
        let write = || -> std::io::Result<()> {
            std::fs::write(&partial, &bytes)?;
            std::fs::File::open(&partial)?.sync_all()?;
            std::fs::rename(&partial, file)
        };
        write().map_err(|e| JournalError::Storage(format!("cannot write {}: {e}", file.display())))
    }
}

#[async_trait]
impl WebhookRegistry for MemoryWebhooks {
    async fn create(&self, hook: RegisteredWebhook) -> Result<(), JournalError> {
        let (tenant, id) = (hook.tenant.clone(), hook.id.clone());
        self.insert(hook);
        self.save().inspect_err(|_| {
            self.remove(&tenant, &id);
        })
    }

    async fn delete(&self, tenant: &str, id: &str) -> Result<Option<RegisteredWebhook>, JournalError> {
        let Some(removed) = self.remove(tenant, id) else { return Ok(None) };
        self.save().inspect_err(|_| self.insert(removed.clone()))?;
        Ok(Some(removed))
    }

    fn of_tenant(&self, tenant: &str) -> Vec<Arc<RegisteredWebhook>> {
        let mut hooks: Vec<_> =
            sync::lock(&self.hooks).get(tenant).map(|t| t.values().cloned().collect()).unwrap_or_default();
        hooks.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        hooks
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn hook(tenant: &str, id: &str, created: u64) -> RegisteredWebhook {
        RegisteredWebhook {
            tenant: tenant.into(),
            id: id.into(),
            url: "https://example.com/hook".into(),
            events: vec!["turn/end".into()],
            label_selector: String::new(),
            max_age_ms: 1000,
            created_unix_ms: created,
            secret: Secret::new("whsec_x"),
            task: None,
        }
    }

    #[tokio::test]
    async fn a_data_directory_keeps_webhooks_per_tenant_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let registry = MemoryWebhooks::open(dir.path()).unwrap();
        registry.create(hook("a", "wh_2", 2)).await.unwrap();
        registry.create(hook("a", "wh_1", 1)).await.unwrap();
        registry.create(hook("b", "wh_3", 3)).await.unwrap();
        assert_eq!(registry.delete("b", "wh_1").await.unwrap(), None, "another tenant's id is not found");
        assert_eq!(registry.delete("b", "wh_3").await.unwrap().map(|h| h.id), Some("wh_3".into()));

        let reopened = MemoryWebhooks::open(dir.path()).unwrap();
        let ids: Vec<String> = reopened.of_tenant("a").iter().map(|h| h.id.clone()).collect();
        assert_eq!(ids, ["wh_1", "wh_2"], "oldest first");
        assert_eq!(reopened.of_tenant("a")[0].secret.expose(), "whsec_x");
        assert!(reopened.of_tenant("b").is_empty());
        assert!(!format!("{:?}", reopened.of_tenant("a")[0]).contains("whsec_x"), "Debug hides the secret");
    }
}
