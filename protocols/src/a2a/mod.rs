//! A2A v1.0 (SPEC §19; docs/PROTOCOLS.md; decision 0128): each agent profile the caller's tenant may run is
//! an A2A agent at `/a2a/{agent}` (JSON-RPC binding), its card at `/a2a/{agent}/.well-known/agent-card.json`.
//!
//! A context is a session, a task is a turn, found from the delivery that asked for it (`ids::TaskId`
//! encodes the session and the delivery's seq, so any gateway answers it). A call awaiting approval is
//! `TASK_STATE_INPUT_REQUIRED`; the next message to the task answers it. Streams carry SSE `id:`s that are
//! positions in the turn ([`crate::turn`]), so `SubscribeToTask` with `Last-Event-ID` resumes after any
//! event through any gateway (the replay cursor, beyond the specification).

mod call;
mod methods;
pub mod push;
mod rpc;
mod task;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use turnstile_gateway::Gateway;

use crate::admit::{Admission, CallerTenant, admit};
use crate::api::Api;
use crate::profiles::{Profile, Profiles};
use rpc::{RpcError, code};

/// The card's path under an agent's URL, where A2A clients look for it.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) gateway: Gateway,
    pub(crate) profiles: Arc<Profiles>,
}

/// The A2A routes, answered by `gateway`'s service code.
pub fn router(gateway: Gateway, profiles: Profiles) -> Router {
    let door = Admission::new(gateway.clone(), profiles.auth_enabled, "A2A API");
    let shared = Shared { gateway, profiles: Arc::new(profiles) };
    Router::new()
        .route("/a2a/{agent}", post(call))
        .route(&format!("/a2a/{{agent}}{CARD_PATH}"), get(card))
        .with_state(shared)
        .layer(from_fn_with_state(door, admit))
}

/// The profile the path names, if the caller's tenant may run it; else A2A's answer for an agent that is
/// not there, naming the tenant's agents (a confined agent is, to another tenant, not there: decision 0091).
fn profile<'a>(shared: &'a Shared, agent: &str, tenant: &str) -> Result<&'a Profile, (StatusCode, String)> {
    shared.profiles.get(agent, tenant).ok_or_else(|| {
        let known = shared.profiles.names_for(tenant);
        (StatusCode::NOT_FOUND, format!("no agent {agent:?} here: the agents are /a2a/NAME for NAME in {known}"))
    })
}

/// `GET /a2a/{agent}/.well-known/agent-card.json`.
async fn card(
    State(shared): State<Shared>,
    Extension(tenant): Extension<CallerTenant>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    let profile = match profile(&shared, &agent, &tenant.0) {
        Ok(profile) => profile,
        Err((status, message)) => return json_response(status, &json!({"error": message})),
    };
    json_response(StatusCode::OK, &agent_card(profile, &base_url(&headers, &agent)))
}

/// The agent's URL as the caller reached it (the card must carry an absolute one).
fn base_url(headers: &HeaderMap, agent: &str) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = match headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()) {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}/a2a/{agent}")
}

/// The agent card of `profile`: one JSON-RPC interface, streaming, push notifications, one skill (the
/// profile itself), bearer tokens.
fn agent_card(profile: &Profile, url: &str) -> Value {
    json!({
        "name": profile.name,
        "description": profile.description,
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "provider": {"organization": "Turnstile", "url": url},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": true},
        "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "description": "A Turnstile tenant token or JWT"}}},
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": profile.name,
            "name": profile.name,
            "description": profile.description,
            "tags": ["turnstile", "agent"],
            "inputModes": ["text/plain"],
            "outputModes": ["text/plain"],
        }],
    })
}

/// `POST /a2a/{agent}`: one JSON-RPC request.
async fn call(
    State(shared): State<Shared>,
    Extension(tenant): Extension<CallerTenant>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match rpc::Request::read(&body) {
        Ok(request) => request,
        Err((id, error)) => return json_response(StatusCode::OK, &rpc::error(&id, &error)),
    };
    let profile = match profile(&shared, &agent, &tenant.0) {
        Ok(profile) => profile.clone(),
        Err((_, message)) => {
            let error = RpcError::new(code::METHOD_NOT_FOUND, message);
            return json_response(StatusCode::NOT_FOUND, &rpc::error(&request.id, &error));
        }
    };
    let call = call::Call { api: Api::new(&shared.gateway, &headers), profile, headers, id: request.id.clone() };
    match methods::dispatch(call, &request.method, &request.params).await {
        Ok(methods::Answer::Result(result)) => json_response(StatusCode::OK, &rpc::result(&request.id, result)),
        Ok(methods::Answer::Stream(response)) => response,
        Err(error) => json_response(StatusCode::OK, &rpc::error(&request.id, &error)),
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut res = (status, body.to_string()).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}
