//! The door of the JSON-RPC protocols (MCP, A2A): with auth off, only loopback callers that name a loopback
//! host (the console's rule, decision 0029); then the caller's token, whose tenant the handlers read from
//! the request's [`CallerTenant`]. Refusals are HTTP statuses, as both HTTP transports have them (401 with
//! `WWW-Authenticate: Bearer`, 403, 429), with a JSON-RPC error body saying what to do.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use turnstile_gateway::Gateway;

use crate::api::{Api, ProtocolError};

/// The tenant the caller acts in, resolved once per HTTP request by [`admit`].
#[derive(Clone, Debug)]
pub(crate) struct CallerTenant(pub(crate) String);

/// What [`admit`] needs: the gateway, whether tokens are required, and the protocol's name for messages.
#[derive(Clone)]
pub(crate) struct Admission {
    gateway: Gateway,
    auth_enabled: bool,
    what: &'static str,
}

impl Admission {
    pub(crate) fn new(gateway: Gateway, auth_enabled: bool, what: &'static str) -> Self {
        Self { gateway, auth_enabled, what }
    }
}

/// The gateway's refusal, kept as it came.
struct Refusal(tonic::Status);

impl From<tonic::Status> for Refusal {
    fn from(status: tonic::Status) -> Self {
        Self(status)
    }
}

impl ProtocolError for Refusal {}

pub(crate) async fn admit(State(door): State<Admission>, mut req: Request, next: Next) -> Response {
    if !door.auth_enabled && !turnstile_gateway::console::is_local_caller(&req) {
        let message = format!(
            "auth is off, so the {} answers only loopback callers that use localhost or a loopback address; start \
             the server with --auth-tokens or --jwt-key to serve it to others",
            door.what
        );
        return refuse(StatusCode::FORBIDDEN, &message);
    }
    let api: Api<Refusal> = Api::new(&door.gateway, req.headers());
    match api.tenant().await {
        Ok(tenant) => {
            req.extensions_mut().insert(CallerTenant(tenant));
            next.run(req).await
        }
        Err(Refusal(status)) => {
            let code = match status.code() {
                tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
                tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_REQUEST,
            };
            refuse(code, status.message())
        }
    }
}

/// A JSON-RPC error body (no id: the request was not read) with an HTTP status.
fn refuse(status: StatusCode, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}});
    let mut res = (status, body.to_string()).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::UNAUTHORIZED {
        res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    res
}
