//! The web console (docs/OPERATIONS.md, "Web console"; decision 0029): a page and its script, built from
//! `console/` and embedded in the binary, and the public API over gRPC-Web on the same origin, so the page
//! calls `turnstile.v1.Agent` with the caller's own bearer token and can do nothing a client cannot.
//!
//! [`router`] is served on the `--http` listener beside `/metrics`, `/healthz` and `/readyz`. Same origin
//! means no CORS: the server sends no `Access-Control-*` headers, so a page from any other origin cannot
//! make a browser call the API (a gRPC-Web call needs a preflight, which fails). With auth off, the API
//! here answers only loopback peers that name a loopback host, the same exposure as the gRPC port
//! (auth off is loopback only) and no DNS-rebinding way in for another site's page.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post_service};
use tonic::server::NamedService;
use tonic::service::LayerExt;
use turnstile_proto::v1::agent_server::AgentServer;

use crate::Gateway;

/// The built console (`console/build.mjs` writes `console/dist`; `.ci/run` checks it is up to date).
const INDEX_HTML: &[u8] = include_bytes!("../../console/dist/index.html");
const CONSOLE_JS: &[u8] = include_bytes!("../../console/dist/console.js");
const CONSOLE_CSS: &[u8] = include_bytes!("../../console/dist/console.css");

/// The page may load only itself and call only its own origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/` (the console), its assets, and `POST /turnstile.v1.Agent/*` (gRPC-Web to `gateway`). `auth_enabled`
/// is whether `gateway` requires bearer tokens; without them only loopback callers are answered.
pub fn router(gateway: Gateway, auth_enabled: bool) -> Router {
    let api = tonic_web::GrpcWebLayer::new().named_layer(gateway.into_server());
    let path = format!("/{}/{{*method}}", <AgentServer<Gateway> as NamedService>::NAME);
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route("/console.js", get(|| asset("text/javascript; charset=utf-8", CONSOLE_JS)))
        .route("/console.css", get(|| asset("text/css; charset=utf-8", CONSOLE_CSS)))
        .route(&path, post_service(api).layer(from_fn_with_state(auth_enabled, confine)))
}

async fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    let mut res = Body::from(body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The assets change with the binary, not while it runs; `no-cache` revalidates after an upgrade.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    res
}

/// With auth off, refuses callers that are not on loopback or that name another host (a page of another
/// site whose name was rebound to 127.0.0.1), as a gRPC-Web PERMISSION_DENIED the console shows.
async fn confine(State(auth_enabled): State<bool>, req: Request, next: Next) -> Response {
    if auth_enabled {
        return next.run(req).await;
    }
    if is_local_caller(&req) {
        next.run(req).await
    } else {
        permission_denied(
            "auth is off, so the console's API answers only loopback callers that open it as localhost or a \
             loopback address; start the server with --auth-tokens or --jwt-key to serve it to others",
        )
    }
}

/// The rule for the `--http` port's APIs while auth is off (the console's, the agent protocols'): a caller
/// on loopback that names a loopback host, so a page of another site whose name was rebound to 127.0.0.1
/// cannot drive the API from a browser.
pub fn is_local_caller(req: &Request) -> bool {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    matches!((peer, host), (Some(peer), Some(host)) if peer.is_loopback() && is_loopback_host(host))
}

/// `localhost`, `*.localhost` or a loopback IP literal, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(ip, _)| ip),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A trailers-only gRPC-Web answer: HTTP 200 with the status in the headers.
fn permission_denied(message: &'static str) -> Response {
    let mut res = StatusCode::OK.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc-web+proto"));
    h.insert("grpc-status", HeaderValue::from(tonic::Code::PermissionDenied as i32));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_with_and_without_ports() {
        for host in [
            "localhost",
            "localhost:9090",
            "LOCALHOST.",
            "a.localhost:1",
            "127.0.0.1",
            "127.3.4.5:80",
            "[::1]:9090",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["example.com", "evil.example:9090", "10.0.0.1", "[2001:db8::1]:9090", "localhost.evil.com", ""] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn the_embedded_console_is_the_built_one() {
        let html = std::str::from_utf8(INDEX_HTML).unwrap();
        assert!(html.contains("<script src=\"/console.js\""), "{html}");
        assert!(html.contains("href=\"/console.css\""), "{html}");
        assert!(!CONSOLE_JS.is_empty() && !CONSOLE_CSS.is_empty());
    }
}
