//! `/metrics`, `/healthz` and `/readyz` on a plain HTTP/1.1 listener of their own, apart from gRPC, so a
//! scraper or a kubelet probe never competes with (or needs) the gRPC stack.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::recorder::render_metrics;

/// Whether this server should receive traffic now. `Err` carries the reason `/readyz` reports.
pub trait Readiness: Send + Sync + 'static {
    fn ready(&self) -> Result<(), String>;
}

/// Any `Fn() -> Result<(), String>` is a readiness check.
impl<F> Readiness for F
where
    F: Fn() -> Result<(), String> + Send + Sync + 'static,
{
    fn ready(&self) -> Result<(), String> {
        self()
    }
}

/// Always ready: a server whose only dependency is already open (the embedded journal).
#[derive(Clone, Copy, Debug, Default)]
pub struct AlwaysReady;

impl Readiness for AlwaysReady {
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The HTTP server stopped for a reason other than `shutdown`.
#[derive(Debug, thiserror::Error)]
#[error("HTTP server failed: {0}")]
pub struct HttpError(#[from] std::io::Error);

/// The routes, for tests that drive them without a socket.
pub fn router(readiness: Arc<dyn Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

/// Serves the ops endpoints on an already bound listener (port 0 in tests) until `shutdown` resolves.
/// Installs the metrics recorder if nobody did yet.
pub async fn serve_http(
    listener: TcpListener,
    readiness: Arc<dyn Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    serve_http_with(listener, readiness, Router::new(), shutdown).await
}

/// [`serve_http`] with `extra` routes beside the ops endpoints (a gateway's web console). Each request
/// carries the peer's address as `ConnectInfo<SocketAddr>`, for routes that answer loopback peers only.
pub async fn serve_http_with(
    listener: TcpListener,
    readiness: Arc<dyn Readiness>,
    extra: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    if let Err(e) = crate::install_metrics() {
        // Health and readiness still matter without metrics; /metrics answers 500 with this error.
        tracing::warn!(error = %e, "serving /healthz and /readyz without metrics");
    }
    let app = router(readiness).merge(extra);
    // TCP_NODELAY, as on the gRPC listeners (`grpc::incoming`): a stream of small writes (the SSE events
    // of the agent protocols) otherwise meets Nagle's algorithm and the client's delayed ACK, and an event
    // after an unacknowledged one waited ~40 ms (measured with `turnstile-bench`'s protocols phase).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on an HTTP connection");
        }
    });
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

async fn metrics() -> Response {
    match render_metrics() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The process is alive and answering: always 200.
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(readiness): State<Arc<dyn Readiness>>) -> Response {
    match readiness.ready() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out.split(' ').nth(1).unwrap().parse().unwrap();
        (code, out.split_once("\r\n\r\n").unwrap().1.to_owned())
    }

    #[tokio::test]
    async fn readyz_reports_the_reason_and_healthz_is_always_ok() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let readiness: Arc<dyn Readiness> = Arc::new(|| Err("NATS is disconnected".to_owned()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, readiness, async {
            let _ = stopped.await;
        }));
        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_owned()));
        assert_eq!(get(addr, "/readyz").await, (503, "not ready: NATS is disconnected\n".to_owned()));
        metrics::counter!(crate::names::STEPS).increment(2);
        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("# TYPE turnstile_steps_total counter"), "{body}");
        assert!(body.contains("turnstile_steps_total 2"), "{body}");
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
