//! Webhooks over HTTP (SPEC §15): the worker's [`WebhookSender`] seam, from the agents' `webhooks` tables.
//!
//! Each POST carries one durable event as `turnstile.v1.WebhookDelivery {session, event}` in the protobuf
//! JSON mapping, `Turnstile-Delivery: <tenant>/<session>/<seq>` and, when the webhook names a secret,
//! `Turnstile-Signature: sha256=<hex HMAC-SHA256 of the body>`. A 2xx answer delivers it; anything else
//! (another status, no answer within [`POST_TIMEOUT`], no connection) is a failure the worker retries.
//!
//! A webhook a tenant registered (SPEC §21) signs with its own key and is POSTed through a client whose
//! resolver drops every internal address ([`turnstile_ops::egress`]) unless the configuration's
//! `[webhooks] allow_private` allows them: the check at `CreateWebhook` cannot hold against a name that
//! later resolves elsewhere.
//!
//! ```
//! use turnstile_agent::webhooks::signature;
//! assert_eq!(
//!     signature(b"key", b"The quick brown fox jumps over the lazy dog"),
//!     "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
//! );
//! ```

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use sha2::{Digest, Sha256};
use turnstile_config::{Config, Secret, WebhookConfig};
use turnstile_model::Envelope;
use turnstile_proto::v1 as pb;
use turnstile_worker::webhooks::{Post, SendError, WebhookSender, WebhookTarget};

/// How long one POST may take before it counts as unanswered.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(turnstile_proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string()));

/// `sha256=` and the hex HMAC-SHA256 of `body` under `key`: the `Turnstile-Signature` header.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length (RFC 2104), so `new_from_slice` cannot fail here.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex(&mac.finalize().into_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The id of a webhook's position: the first 16 hex digits of SHA-256 over its URL and event types, so
/// editing either starts a new position rather than reusing another webhook's.
fn hook_id(config: &WebhookConfig) -> String {
    let mut h = Sha256::new();
    h.update(config.url.as_str().as_bytes());
    h.update([0]);
    h.update(config.events.join(",").as_bytes());
    hex(&h.finalize()[..8])
}

/// Why the webhooks of a configuration cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookSetupError {
    #[error("agent {agent:?} webhooks[{index}]: {source}")]
    Secret {
        agent: String,
        index: usize,
        #[source]
        source: Box<turnstile_config::ConfigError>,
    },
    #[error("webhooks: no HTTP client: {0}")]
    Client(String),
}

/// [`WebhookSender`] over reqwest.
pub struct HttpWebhooks {
    by_agent: HashMap<String, Vec<Arc<WebhookTarget>>>,
    secrets: HashMap<String, Secret>,
    client: reqwest::Client,
    /// For registered webhooks: [`PublicOnly`] resolution unless internal targets are allowed.
    registered_client: reqwest::Client,
    allow_private: bool,
}

/// A resolver that keeps only public addresses ([`turnstile_ops::egress::is_internal`]); a name with
/// none left does not resolve.
#[derive(Debug)]
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let public: Vec<std::net::SocketAddr> =
                found.filter(|a| !turnstile_ops::egress::is_internal(a.ip())).collect();
            if public.is_empty() {
                return Err(format!(
                    "{host} resolves to no public address (registered webhooks may not reach internal ones)"
                )
                .into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl std::fmt::Debug for HttpWebhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpWebhooks").field("by_agent", &self.by_agent).finish_non_exhaustive()
    }
}

impl HttpWebhooks {
    /// The webhooks of `config`'s agents, with their secrets read through `env`.
    pub fn from_config(config: &Config, env: impl Fn(&str) -> Option<String>) -> Result<Self, WebhookSetupError> {
        let mut by_agent: HashMap<String, Vec<Arc<WebhookTarget>>> = HashMap::new();
        let mut secrets = HashMap::new();
        for (agent, profile) in &config.agents {
            for (index, hook) in profile.webhooks.iter().enumerate() {
                let key = format!("agents.{agent}.webhooks[{index}].secret_env");
                let secret = hook.resolve_secret(&key, &env).map_err(|e| WebhookSetupError::Secret {
                    agent: agent.clone(),
                    index,
                    source: Box::new(e),
                })?;
                let id = hook_id(hook);
                if let Some(secret) = secret {
                    secrets.insert(id.clone(), secret);
                }
                by_agent.entry(agent.clone()).or_default().push(Arc::new(WebhookTarget {
                    id,
                    url: hook.url.as_str().to_owned(),
                    events: hook.events.clone(),
                    max_age: Duration::from_millis(hook.max_age_ms),
                    tenants: hook.tenant_scope(profile),
                    not_before_ms: 0,
                    signing_key: None,
                    registered: false,
                    task: None,
                }));
            }
        }
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let builder = || reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(POST_TIMEOUT);
        let client = builder().build().map_err(|e| WebhookSetupError::Client(e.to_string()))?;
        let allow_private = config.webhooks.allow_private;
        let registered_client = if allow_private { builder() } else { builder().dns_resolver(Arc::new(PublicOnly)) }
            .build()
            .map_err(|e| WebhookSetupError::Client(e.to_string()))?;
        Ok(Self { by_agent, secrets, client, registered_client, allow_private })
    }

    /// Whether any agent has a webhook.
    pub fn is_empty(&self) -> bool {
        self.by_agent.is_empty()
    }
}

/// The POST body of `event`: `WebhookDelivery` in the protobuf JSON mapping.
pub fn body(event: &Envelope) -> Result<Vec<u8>, SendError> {
    use prost::Message as _;
    let delivery = pb::WebhookDelivery {
        session: Some(turnstile_proto::codec::encode_session_ref(&event.session)),
        event: Some(turnstile_proto::codec::event::encode_session_event(event)),
    };
    let pool = POOL.as_ref().map_err(|e| SendError(format!("protobuf descriptors do not decode: {e}")))?;
    let descriptor = pool
        .get_message_by_name("turnstile.v1.WebhookDelivery")
        .ok_or_else(|| SendError("no descriptor for turnstile.v1.WebhookDelivery".into()))?;
    let dynamic = DynamicMessage::decode(descriptor, delivery.encode_to_vec().as_slice())
        .map_err(|e| SendError(format!("re-decoding the delivery: {e}")))?;
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::new(&mut out);
    dynamic
        .serialize_with_options(&mut serializer, &SerializeOptions::new())
        .map_err(|e| SendError(format!("the delivery as JSON: {e}")))?;
    Ok(out)
}

#[async_trait]
impl WebhookSender for HttpWebhooks {
    fn webhooks(&self, agent: &str) -> Vec<Arc<WebhookTarget>> {
        self.by_agent.get(agent).cloned().unwrap_or_default()
    }

    async fn send(&self, hook: &WebhookTarget, event: &Envelope) -> Result<(), SendError> {
        let delivery = format!("{}/{}/{}", event.session.tenant, event.session.id, event.seq);
        self.post(hook, Post { delivery, body: body(event)?, headers: Vec::new() }).await
    }

    /// The one place a webhook POST goes out: the egress rule for a registered webhook, the signature,
    /// the delivery id.
    async fn post(&self, hook: &WebhookTarget, post: Post) -> Result<(), SendError> {
        let client = if hook.registered {
            // An IP literal is not resolved, so the resolver cannot drop it: the same rule, here.
            if !self.allow_private {
                turnstile_ops::egress::check_literal(&hook.url).map_err(|e| SendError(e.to_string()))?;
            }
            &self.registered_client
        } else {
            &self.client
        };
        let mut request = client
            .post(&hook.url)
            .header("content-type", "application/json")
            .header("turnstile-delivery", post.delivery);
        for (name, value) in &post.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let key =
            hook.signing_key.as_ref().map(|k| k.expose()).or_else(|| self.secrets.get(&hook.id).map(Secret::expose));
        if let Some(key) = key {
            request = request.header("turnstile-signature", signature(key.as_bytes(), &post.body));
        }
        let response = request
            .body(post.body)
            .send()
            .await
            .map_err(|e| SendError(format!("POST {}: {}", hook.url, turnstile_ops::error_chain(&e))))?;
        let status = response.status();
        if status.is_success() { Ok(()) } else { Err(SendError(format!("POST {} answered {status}", hook.url))) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use turnstile_journal::RegisteredWebhook;
    use turnstile_model::{EventPayload, SessionRef, Tenant};

    use super::*;

    fn registered(url: &str) -> WebhookTarget {
        let hook = RegisteredWebhook {
            tenant: "t".into(),
            id: "wh_0123456789abcdef".into(),
            url: url.into(),
            events: vec!["turn/start".into()],
            label_selector: String::new(),
            max_age_ms: 1000,
            created_unix_ms: 0,
            secret: turnstile_model::Secret::new("whsec_k"),
            task: None,
        };
        WebhookTarget::registered(&hook, Tenant::new("t").unwrap())
    }

    fn event() -> Envelope {
        let session = SessionRef::new("t", "s").unwrap();
        Envelope { session, seq: 1, time_ms: 1, epoch: 1, payload: EventPayload::TurnStart { turn: 1 } }
    }

    /// The egress rule holds at each POST, not only at `CreateWebhook`: a registered webhook whose name
    /// resolves to loopback (as one rebound after its creation would), or whose URL is an internal IP, is
    /// not reached unless the configuration allows internal targets. Nothing listens on port 9, so a POST
    /// that went out would fail differently (connection refused).
    #[tokio::test]
    async fn a_registered_webhook_never_reaches_an_internal_address_unless_allowed() {
        let strict = HttpWebhooks::from_config(&Config::default(), |_| None).unwrap();
        for url in ["http://localhost:9/hook", "http://127.0.0.1:9/hook", "http://[::1]:9/hook"] {
            let SendError(message) = strict.send(&registered(url), &event()).await.unwrap_err();
            assert!(message.contains("internal") || message.contains("no public address"), "{url}: {message}");
        }
        let config = Config::from_toml_str("[webhooks]\nallow_private = true\n").unwrap();
        let open = HttpWebhooks::from_config(&config, |_| None).unwrap();
        let SendError(message) = open.send(&registered("http://127.0.0.1:9/hook"), &event()).await.unwrap_err();
        assert!(!message.contains("internal") && !message.contains("no public address"), "{message}");
    }
}
