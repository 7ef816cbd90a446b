//! The remote hook scorer: one HTTP POST per reply, its JSON answer the score. The URL is a tenant's, so
//! it passes the egress rule of registered webhooks ([`turnstile_ops::egress`]) when the evaluation
//! starts, and the addresses checked then are the only ones the client dials (a name that later resolves
//! elsewhere cannot redirect the POSTs; redirects are not followed).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tonic::Status;
use turnstile_ops::egress;
use turnstile_proto::v1 as pb;

use super::scorer::{hook_answer, score};

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What the hook is sent for one reply.
#[derive(Debug, Serialize)]
pub(crate) struct HookRequest<'a> {
    /// `tenant/id` of the recorded session.
    pub(crate) session: String,
    pub(crate) turn: u64,
    /// `recorded` or `candidate`.
    pub(crate) side: &'a str,
    pub(crate) input: &'a str,
    pub(crate) reply: &'a str,
    pub(crate) recorded_reply: &'a str,
    pub(crate) tools: &'a [String],
}

/// A client that POSTs to one checked URL.
#[derive(Clone, Debug)]
pub(crate) struct HookClient {
    client: reqwest::Client,
    url: url::Url,
}

fn bad(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("scorer.hook.url: {e}"))
}

impl HookClient {
    /// Checks `url` by the egress rule (`allow_private`: the operator's `[webhooks] allow_private`) and pins
    /// the addresses it resolved to.
    pub(crate) async fn new(raw: &str, timeout_ms: u64, allow_private: bool) -> Result<Self, Status> {
        if raw.len() > crate::webhooks::MAX_URL_BYTES {
            return Err(bad(format!("{} bytes is over the limit of {}", raw.len(), crate::webhooks::MAX_URL_BYTES)));
        }
        let url = egress::check_url(raw, allow_private).await.map_err(bad)?;
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // `Err` means another thread installed one meanwhile; either way there is one now.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(Duration::from_millis(timeout_ms));
        if let (Some(url::Host::Domain(name)), false) = (url.host(), allow_private) {
            let port = url.port_or_known_default().unwrap_or(80);
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| bad(format!("the host {name:?} does not resolve: {e}")))?
                .collect();
            if let Some(internal) = found.iter().find(|a| egress::is_internal(a.ip())) {
                return Err(bad(egress::EgressError::Internal { host: name.to_owned(), addr: internal.ip() }));
            }
            builder = builder.resolve_to_addrs(name, &found);
        }
        let client = builder.build().map_err(|e| Status::internal(format!("no HTTP client for the hook: {e}")))?;
        Ok(Self { client, url })
    }

    /// The hook's score of one reply; a hook that fails scores 0 with why.
    pub(crate) async fn score(&self, request: &HookRequest<'_>) -> pb::EvalScore {
        match self.post(request).await {
            Ok(s) => s,
            Err(why) => score(0.0, format!("the hook failed: {why}")),
        }
    }

    async fn post(&self, request: &HookRequest<'_>) -> Result<pb::EvalScore, String> {
        let mut response = self.client.post(self.url.clone()).json(request).send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_ANSWER_BYTES {
                return Err(format!("its answer is over {MAX_ANSWER_BYTES} bytes"));
            }
        }
        if !status.is_success() {
            return Err(format!("it answered {status}"));
        }
        hook_answer(&body)
    }
}
