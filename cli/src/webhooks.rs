//! `webhook create|list|delete` (SPEC §21): the tenant's webhooks, registered at run time.

use anyhow::Result;
use turnstile_proto::v1 as pb;

use crate::args::WebhookCreateArgs;
use crate::client::Client;

fn webhook_line(w: &pb::Webhook) -> String {
    let selector = if w.label_selector.is_empty() { "*" } else { w.label_selector.as_str() };
    let mut line =
        format!("{} {} events={} sessions={selector} created={}", w.id, w.url, w.events.join(","), w.created_unix_ms);
    if !w.secret.is_empty() {
        line.push_str(&format!("\nsecret {} (shown only now: keep it to check Turnstile-Signature)", w.secret));
    }
    line
}

pub async fn create(client: &mut Client, a: WebhookCreateArgs) -> Result<()> {
    let request = pb::CreateWebhookRequest {
        tenant: client.tenant.clone(),
        url: a.url,
        events: a.events,
        label_selector: a.label,
        max_age_ms: a.max_age_ms,
    };
    let webhook = client.api.create_webhook(request).await?.into_inner();
    client.print(&webhook, &[], webhook_line)
}

pub async fn list(client: &mut Client) -> Result<()> {
    let request = pb::ListWebhooksRequest { tenant: client.tenant.clone() };
    for webhook in client.api.list_webhooks(request).await?.into_inner().webhooks {
        client.print(&webhook, &[], webhook_line)?;
    }
    Ok(())
}

pub async fn delete(client: &mut Client, id: &str) -> Result<()> {
    let request = pb::DeleteWebhookRequest { tenant: client.tenant.clone(), id: id.to_owned() };
    let webhook = client.api.delete_webhook(request).await?.into_inner();
    client.print(&webhook, &[], webhook_line)
}
