//! The OpenAI Responses and Conversations API (SPEC §19; docs/PROTOCOLS.md; decisions 0100–0103):
//! `/v1/models`, `/v1/responses`, `/v1/conversations`.
//!
//! A model is an agent profile, a conversation is a session, a response is a turn. Modules: [`api`] (the
//! gateway's service as the caller's token sees it), [`ids`] (ids that encode their log position),
//! [`input`] (request fields and input items), [`fold`] (a response as a view of its turn, with the
//! streaming events and their sequence numbers), [`sse`], `responses` and `conversations` (the handlers),
//! [`error`] (OpenAI's error shape).

pub mod api;
mod conversations;
pub mod error;
pub mod fold;
pub mod ids;
pub mod input;
pub mod items;
mod responses;
pub mod sse;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use turnstile_gateway::Gateway;

use crate::api::Api;
use error::ApiError;

/// What the adapter knows of the configuration: the agent profiles a `model` may name.
#[derive(Clone, Debug, Default)]
pub struct Agents {
    /// Every agent profile of the configuration, in order.
    pub names: Vec<String>,
    /// The configuration's `default_agent`: what a new conversation runs until a response names a model.
    pub default: String,
    /// Whether the gateway requires bearer tokens; without them only loopback callers are answered, as
    /// for the console (decision 0029).
    pub auth_enabled: bool,
}

#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) gateway: Gateway,
    pub(crate) agents: Arc<Agents>,
}

impl Shared {
    /// The models the caller may name (SPEC §20): every agent its tenant may run, the API's included, as
    /// the gateway's `ListAgents` answers it; the configuration's profiles when the gateway keeps no agent
    /// store.
    pub(crate) async fn models(&self, api: &Api<ApiError>) -> Result<Vec<String>, ApiError> {
        Ok(api.agent_names().await?.unwrap_or_else(|| self.agents.names.clone()))
    }

    /// `model` as an agent the caller may run, or OpenAI's 404 `model_not_found`.
    pub(crate) async fn agent(&self, api: &Api<ApiError>, model: &str) -> Result<(), ApiError> {
        let models = self.models(api).await?;
        match models.iter().any(|a| a == model) {
            true => Ok(()),
            false => Err(ApiError::unknown_model(model, &models)),
        }
    }
}

/// A handler's caller: the gateway as the request's `Authorization` sees it.
impl FromRequestParts<Shared> for Api<ApiError> {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, shared: &Shared) -> Result<Self, Self::Rejection> {
        Ok(Api::new(&shared.gateway, &parts.headers))
    }
}

/// The OpenAI routes, answered by `gateway`'s service code.
pub fn router(gateway: Gateway, agents: Agents) -> Router {
    let auth_enabled = agents.auth_enabled;
    let shared = Shared { gateway, agents: Arc::new(agents) };
    Router::new()
        .route("/v1/models", get(responses::list_models))
        .route("/v1/models/{model}", get(responses::get_model))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/v1/conversations", post(conversations::create))
        .route(
            "/v1/conversations/{id}",
            get(conversations::retrieve).post(conversations::update).delete(conversations::delete),
        )
        .route("/v1/conversations/{id}/items", get(conversations::list_items).post(conversations::add_items))
        .route("/v1/conversations/{id}/items/{item}", get(conversations::get_item))
        .with_state(shared)
        .layer(from_fn_with_state(auth_enabled, confine))
}

/// With auth off, answers only loopback callers that name a loopback host (the console's rule); every
/// protocol of this crate is behind it.
pub(crate) async fn confine(State(auth_enabled): State<bool>, req: Request, next: Next) -> Response {
    if auth_enabled || turnstile_gateway::console::is_local_caller(&req) {
        return next.run(req).await;
    }
    ApiError {
        status: StatusCode::FORBIDDEN,
        message: "auth is off, so the OpenAI API answers only loopback callers that use localhost or a loopback \
                  address; start the server with --auth-tokens or --jwt-key to serve it to others"
            .into(),
        kind: "permission_error",
        param: None,
        code: Some("permission_denied".into()),
    }
    .into_response()
}

/// A 200 with a JSON body.
pub(crate) fn ok(body: serde_json::Value) -> Response {
    let mut res = body.to_string().into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    res
}

/// The query string's pairs, percent-decoded.
pub(crate) fn query(raw: Option<&str>) -> Vec<(String, String)> {
    raw.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |j: usize| bytes.get(j).and_then(|b| (*b as char).to_digit(16));
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(hi), Some(lo)) => {
                    // Two hex digits make one byte: hi * 16 + lo < 256.
                    out.push((hi * 16 + lo) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query parameter as a number, naming it when it is not one.
pub(crate) fn number(pairs: &[(String, String)], name: &str) -> Result<Option<u64>, ApiError> {
    match pairs.iter().find(|(k, _)| k == name) {
        None => Ok(None),
        Some((_, v)) => v
            .parse()
            .map(Some)
            .map_err(|_| ApiError::invalid(name, format!("{name} must be a non-negative integer, not {v:?}"))),
    }
}

pub(crate) fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_are_split_and_decoded() {
        let q = query(Some("stream=true&starting_after=12&include%5B%5D=a+b&x"));
        assert_eq!(param(&q, "stream"), Some("true"));
        assert_eq!(number(&q, "starting_after").unwrap(), Some(12));
        assert_eq!(param(&q, "include[]"), Some("a b"));
        assert_eq!(param(&q, "x"), Some(""));
        assert!(number(&query(Some("limit=ten")), "limit").is_err());
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
