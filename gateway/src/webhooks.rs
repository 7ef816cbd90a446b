//! `CreateWebhook`, `ListWebhooks` and `DeleteWebhook` (SPEC §21, docs/decisions/0134): a tenant's
//! webhooks, registered at run time in the cluster's [`WebhookRegistry`] and delivered by the owners of the
//! tenant's sessions like an agent's webhooks (SPEC §15). The request's rules are checked here, once; the
//! egress rule for the URL is `turnstile_ops::egress`'s.

use std::sync::Arc;

use tonic::Status;
use turnstile_journal::{RegisteredWebhook, TaskPush, WebhookRegistry};
use turnstile_model::event::DURABLE_TYPES;
use turnstile_model::{Secret, Selector, Tenant};
use turnstile_ops::egress::{self, EgressError};
use turnstile_proto::v1 as pb;

use crate::service::Gateway;
use crate::status;

/// Webhooks one tenant may register.
pub const MAX_WEBHOOKS_PER_TENANT: usize = 20;
/// The longest `url`, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// `max_age_ms` when the request says 0: a day, as for an agent's webhook.
pub const DEFAULT_MAX_AGE_MS: u64 = 24 * 60 * 60 * 1000;
/// The longest `max_age_ms`: a week.
pub const MAX_MAX_AGE_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Push configurations one task may have (A2A `CreateTaskPushNotificationConfig`, decision 0155).
pub const MAX_PUSHES_PER_TASK: usize = 10;
/// Push configurations of tasks that have not ended, per tenant (each is removed when its task ends).
pub const MAX_TASK_PUSHES_PER_TENANT: usize = 1000;
/// The durable types a task's push configuration is sent: those that change an A2A task (its turn's start,
/// reply, wait for a decision, decision and end).
pub const TASK_PUSH_EVENTS: [&str; 5] = ["user/message", "assistant/message", "tool/call", "tool/decision", "turn/end"];

/// `hook` as the API shows it; the secret only when `with_secret` (`CreateWebhook`'s reply).
fn encode(hook: &RegisteredWebhook, with_secret: bool) -> pb::Webhook {
    pb::Webhook {
        id: hook.id.clone(),
        tenant: hook.tenant.clone(),
        url: hook.url.clone(),
        events: hook.events.clone(),
        label_selector: hook.label_selector.clone(),
        max_age_ms: hook.max_age_ms,
        created_unix_ms: hook.created_unix_ms,
        secret: if with_secret { hook.secret.expose().to_owned() } else { String::new() },
    }
}

/// The event types of a request: each a durable type (SPEC §5), at least one, repeats dropped.
fn event_types(events: Vec<String>) -> Result<Vec<String>, Status> {
    if events.is_empty() {
        return Err(Status::invalid_argument(format!(
            "events: name at least one durable event type to deliver (for example turn/end); known types: {}",
            DURABLE_TYPES.join(", ")
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(events.len());
    for event in events {
        if !DURABLE_TYPES.contains(&event.as_str()) {
            return Err(Status::invalid_argument(format!(
                "events: {event:?} is not a durable event type; use one of {}",
                DURABLE_TYPES.join(", ")
            )));
        }
        if !out.contains(&event) {
            out.push(event);
        }
    }
    Ok(out)
}

/// A new id (`wh_` and 16 hex digits) and signing secret (`whsec_` and 64 hex digits: 244 random bits from
/// the system's generator, through UUID v4).
fn mint() -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let secret = format!("whsec_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    (format!("wh_{}", &id[..16]), secret)
}

impl Gateway {
    fn registry(&self) -> Result<&Arc<dyn WebhookRegistry>, Status> {
        self.webhooks.as_ref().ok_or_else(|| {
            Status::unimplemented(
                "this gateway was started without a webhook registry; ask a gateway of the cluster (turnstile \
                 gateway, turnstile dev)",
            )
        })
    }

    /// The egress rule and length bound of a URL a tenant names, with the field to blame.
    async fn check_target(&self, field: &str, url: &str) -> Result<(), Status> {
        if url.len() > MAX_URL_BYTES {
            return Err(Status::invalid_argument(format!(
                "{field}: {} bytes is over the limit of {MAX_URL_BYTES}",
                url.len()
            )));
        }
        egress::check_url(url, self.config.allow_private_webhooks).await.map_err(|e| match e {
            EgressError::Unresolved { .. } => {
                Status::invalid_argument(format!("{field}: {e}; use a name that resolves"))
            }
            e => Status::invalid_argument(format!("{field}: {e}")),
        })?;
        Ok(())
    }

    pub(crate) async fn create_webhook(
        &self,
        tenant: &Tenant,
        req: pb::CreateWebhookRequest,
    ) -> Result<pb::Webhook, Status> {
        let registry = self.registry()?;
        self.check_target("url", &req.url).await?;
        let events = event_types(req.events)?;
        Selector::parse(&req.label_selector).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let max_age_ms = status::bounded("max_age_ms", req.max_age_ms, DEFAULT_MAX_AGE_MS, MAX_MAX_AGE_MS)?;
        let count = registry.of_tenant(tenant.as_str()).iter().filter(|h| h.task.is_none()).count();
        if count >= MAX_WEBHOOKS_PER_TENANT {
            return Err(Status::resource_exhausted(format!(
                "tenant {tenant} has {count} webhooks, the limit is {MAX_WEBHOOKS_PER_TENANT}; delete one first \
                 (DeleteWebhook)"
            )));
        }
        let (id, secret) = mint();
        let hook = RegisteredWebhook {
            tenant: tenant.as_str().to_owned(),
            id,
            url: req.url,
            events,
            label_selector: req.label_selector,
            max_age_ms,
            created_unix_ms: turnstile_ops::clock::now_ms(),
            secret: Secret::new(secret),
            task: None,
        };
        registry.create(hook.clone()).await.map_err(status::from_journal)?;
        tracing::info!(tenant = %tenant, webhook = %hook.id, url = %hook.url, "webhook registered");
        Ok(encode(&hook, true))
    }

    pub(crate) fn list_webhooks(&self, tenant: &Tenant) -> Result<pb::ListWebhooksReply, Status> {
        let hooks = self.registry()?.of_tenant(tenant.as_str());
        let webhooks = hooks.iter().filter(|h| h.task.is_none()).map(|h| encode(h, false)).collect();
        Ok(pb::ListWebhooksReply { webhooks })
    }

    pub(crate) async fn delete_webhook(&self, tenant: &Tenant, id: &str) -> Result<pb::Webhook, Status> {
        let deleted = self.registry()?.delete(tenant.as_str(), id).await.map_err(status::from_journal)?;
        match deleted {
            Some(hook) => {
                tracing::info!(tenant = %tenant, webhook = %hook.id, "webhook deleted");
                Ok(encode(&hook, false))
            }
            None => Err(Status::not_found(format!(
                "id: tenant {tenant} has no webhook {id:?}; ListWebhooks lists the ones it has"
            ))),
        }
    }
}

/// A task's push configuration as a protocol gives it (A2A `TaskPushNotificationConfig`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPushRequest {
    /// The task's session (of the caller's tenant: the protocol read the task through the caller's token,
    /// or is about to deliver its message with it).
    pub session: String,
    /// The MessageId of the delivery that asks for the task.
    pub message_id: String,
    /// The delivery's seq, or a seq at or before it (see [`TaskPush::from_seq`]).
    pub from_seq: u64,
    /// The client's id for the configuration; a new one when empty. The same id again replaces it.
    pub config_id: String,
    pub url: String,
    /// Sent back on each POST and the key of its `Turnstile-Signature`; may be empty.
    pub token: Secret,
    pub auth_scheme: String,
    pub auth_credentials: Secret,
}

/// The push configurations of tasks (A2A push notifications, SPEC §19, decision 0155): webhooks of the
/// registry (SPEC §21) that serve one task, created and read here so that a protocol holds them to the
/// same rules (egress, bounds, tenancy) as `CreateWebhook`.
impl Gateway {
    /// Stores `req` for `tenant`'s task; replaces the task's configuration of the same id.
    pub async fn create_task_push(&self, tenant: &str, req: TaskPushRequest) -> Result<RegisteredWebhook, Status> {
        let registry = self.registry()?;
        self.check_target("url", &req.url).await?;
        let config_id = if req.config_id.is_empty() { uuid::Uuid::new_v4().to_string() } else { req.config_id };
        if config_id.len() > 128 {
            return Err(Status::invalid_argument(format!("id: {} bytes is over the limit of 128", config_id.len())));
        }
        let existing = self.task_pushes(tenant, &req.session, &req.message_id)?;
        let replaced = existing.iter().find(|h| h.task.as_ref().is_some_and(|t| t.config_id == config_id));
        if replaced.is_none() && existing.len() >= MAX_PUSHES_PER_TASK {
            return Err(Status::resource_exhausted(format!(
                "the task has {} push configurations, the limit is {MAX_PUSHES_PER_TASK}; delete one first",
                existing.len()
            )));
        }
        let pending = registry.of_tenant(tenant).iter().filter(|h| h.task.is_some()).count();
        if replaced.is_none() && pending >= MAX_TASK_PUSHES_PER_TENANT {
            return Err(Status::resource_exhausted(format!(
                "tenant {tenant} has {pending} push configurations of running tasks, the limit is \
                 {MAX_TASK_PUSHES_PER_TENANT}; each goes when its task ends, or delete some"
            )));
        }
        let (id, _) = mint();
        let hook = RegisteredWebhook {
            tenant: tenant.to_owned(),
            id,
            url: req.url,
            events: TASK_PUSH_EVENTS.map(str::to_owned).to_vec(),
            label_selector: String::new(),
            max_age_ms: DEFAULT_MAX_AGE_MS,
            created_unix_ms: turnstile_ops::clock::now_ms(),
            secret: req.token,
            task: Some(TaskPush {
                session: req.session,
                message_id: req.message_id,
                from_seq: req.from_seq,
                config_id,
                auth_scheme: req.auth_scheme,
                auth_credentials: req.auth_credentials,
            }),
        };
        registry.create(hook.clone()).await.map_err(status::from_journal)?;
        if let Some(old) = replaced {
            registry.delete(tenant, &old.id).await.map_err(status::from_journal)?;
        }
        tracing::info!(tenant, webhook = %hook.id, url = %hook.url, "task push configuration registered");
        Ok(hook)
    }

    /// The push configurations of `tenant`'s task (the delivery of `message_id` in `session`), oldest first.
    pub fn task_pushes(
        &self,
        tenant: &str,
        session: &str,
        message_id: &str,
    ) -> Result<Vec<Arc<RegisteredWebhook>>, Status> {
        let hooks = self.registry()?.of_tenant(tenant);
        let of_task = |t: &TaskPush| t.session == session && t.message_id == message_id;
        Ok(hooks.into_iter().filter(|h| h.task.as_ref().is_some_and(of_task)).collect())
    }

    /// Removes the push configuration `config_id` of `tenant`'s task; `false` when it has none by that id.
    pub async fn delete_task_push(
        &self,
        tenant: &str,
        session: &str,
        message_id: &str,
        config_id: &str,
    ) -> Result<bool, Status> {
        let found = self.task_pushes(tenant, session, message_id)?;
        let Some(hook) = found.iter().find(|h| h.task.as_ref().is_some_and(|t| t.config_id == config_id)) else {
            return Ok(false);
        };
        Ok(self.registry()?.delete(tenant, &hook.id).await.map_err(status::from_journal)?.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_are_durable_types_named_once() {
        assert_eq!(event_types(vec!["turn/end".into(), "turn/end".into()]).unwrap(), ["turn/end"]);
        let empty = event_types(Vec::new()).unwrap_err();
        assert_eq!(empty.code(), tonic::Code::InvalidArgument);
        assert!(empty.message().starts_with("events: "), "{}", empty.message());
        let unknown = event_types(vec!["agent/delta".into()]).unwrap_err();
        assert!(unknown.message().starts_with("events: \"agent/delta\""), "{}", unknown.message());
    }

    #[test]
    fn minted_ids_and_secrets_have_their_shapes_and_differ() {
        let (id, secret) = mint();
        assert!(id.starts_with("wh_") && id.len() == 19, "{id}");
        assert!(secret.starts_with("whsec_") && secret.len() == 70, "{secret}");
        assert_ne!(mint(), mint());
    }
}
