//! `CreateWebhook`, `ListWebhooks` and `DeleteWebhook` (SPEC §21, docs/decisions/0134): a tenant's
//! webhooks, registered at run time in the cluster's [`WebhookRegistry`] and delivered by the owners of the
//! tenant's sessions like an agent's webhooks (SPEC §15). The request's rules are checked here, once; the
//! egress rule for the URL is `turnstile_ops::egress`'s.

use std::sync::Arc;

use tonic::Status;
use turnstile_journal::{RegisteredWebhook, WebhookRegistry};
use turnstile_model::event::DURABLE_TYPES;
use turnstile_model::{Selector, Tenant};
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
        secret: if with_secret { hook.secret.clone() } else { String::new() },
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

    pub(crate) async fn create_webhook(
        &self,
        tenant: &Tenant,
        req: pb::CreateWebhookRequest,
    ) -> Result<pb::Webhook, Status> {
        let registry = self.registry()?;
        if req.url.len() > MAX_URL_BYTES {
            return Err(Status::invalid_argument(format!(
                "url: {} bytes is over the limit of {MAX_URL_BYTES}",
                req.url.len()
            )));
        }
        let allow_private = self.config.allow_private_webhooks;
        egress::check_url(&req.url, allow_private).await.map_err(|e| match e {
            EgressError::Unresolved { .. } => Status::invalid_argument(format!("url: {e}; use a name that resolves")),
            e => Status::invalid_argument(format!("url: {e}")),
        })?;
        let events = event_types(req.events)?;
        Selector::parse(&req.label_selector).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let max_age_ms = match req.max_age_ms {
            0 => DEFAULT_MAX_AGE_MS,
            ms if ms > MAX_MAX_AGE_MS => {
                return Err(Status::invalid_argument(format!(
                    "max_age_ms: {ms} is over the limit of {MAX_MAX_AGE_MS} (a week)"
                )));
            }
            ms => ms,
        };
        let count = registry.of_tenant(tenant.as_str()).len();
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
            secret,
        };
        registry.create(hook.clone()).await.map_err(status::from_journal)?;
        tracing::info!(tenant = %tenant, webhook = %hook.id, url = %hook.url, "webhook registered");
        Ok(encode(&hook, true))
    }

    pub(crate) fn list_webhooks(&self, tenant: &Tenant) -> Result<pb::ListWebhooksReply, Status> {
        let hooks = self.registry()?.of_tenant(tenant.as_str());
        Ok(pb::ListWebhooksReply { webhooks: hooks.iter().map(|h| encode(h, false)).collect() })
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
