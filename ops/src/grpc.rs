//! The gRPC server every Turnstile role serves on ([`server`]): one span per call in the caller's trace,
//! optional TLS, and `grpc.health.v1.Health` and gRPC reflection in both versions clients speak
//! (`grpc.reflection.v1` and `v1alpha`: Python's grpcio-reflection, Postman, Evans and older grpcurl know
//! only v1alpha), so those tools and gRPC health probes work without the proto files.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use prost_types::FileDescriptorSet;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_reflection::pb::v1::server_reflection_server::{ServerReflection, ServerReflectionServer};
use tonic_reflection::pb::v1alpha::server_reflection_server::{
    ServerReflection as ServerReflectionV1Alpha, ServerReflectionServer as ServerReflectionServerV1Alpha,
};

use crate::tls::LiveServerTls;

/// A server for `services` (their full names, as `NamedService::NAME`): each call gets a span in the
/// caller's trace (its `traceparent` metadata), and the health and reflection services (unauthenticated:
/// they reveal no session data). Add the role's own services to the returned router and [`serve`] it. The
/// health reporter is returned so a role can report NOT_SERVING later.
pub async fn server(services: &[&str]) -> (tonic::transport::server::Router, HealthReporter) {
    let mut builder = tonic::transport::Server::builder().trace_fn(|req| {
        let traceparent = req.headers().get(crate::trace::TRACEPARENT).and_then(|v| v.to_str().ok());
        crate::trace::grpc_request_span(req.uri().path(), traceparent)
    });
    let (reporter, health) = health(services).await;
    let router = builder
        .add_service(health)
        .add_optional_service(reflection(services))
        .add_optional_service(reflection_v1alpha(services));
    (router, reporter)
}

/// How long a server waits, once told to stop, for its open calls to end before it closes their
/// connections. A client that stopped reading a stream (a Watch it never reads) would otherwise hold the
/// graceful stop until SIGKILL: `turnstile dev` with one such Watch still ran 30 s after SIGTERM, and every
/// gateway replaced in a rolling upgrade under the fault campaign's hostile tenant took the harness's full
/// 15 s. Well under a gateway pod's 30 s termination grace less its 5 s preStop sleep.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown`: over TLS with the config `tls` holds when each
/// connection arrives (so a certificate reloaded from disk is used from the next connection on, decision
/// 0159), else in clear text. Once `shutdown` resolves, calls in flight get [`STOP_GRACE`] to end.
pub async fn serve(
    router: tonic::transport::server::Router,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<LiveServerTls>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping.send(());
    };
    match tls {
        None => bounded(router.serve_with_incoming_shutdown(incoming(listener), shutdown), stopped).await,
        Some(tls) => bounded(router.serve_with_incoming_shutdown(incoming_tls(listener, tls), shutdown), stopped).await,
    }
}

/// `serving`, or `Ok` once [`STOP_GRACE`] has passed since `stopped` fired: dropping the server closes the
/// connections still open.
async fn bounded(
    serving: impl Future<Output = Result<(), tonic::transport::Error>>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), tonic::transport::Error> {
    let grace = async {
        // An error means the server ended first (it dropped the sender): nothing to bound.
        if stopped.await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        served = serving => served,
        () = grace => {
            tracing::warn!(
                grace_s = STOP_GRACE.as_secs(),
                "calls still open after the stop grace (a client that does not read its stream?): closing them"
            );
            Ok(())
        }
    }
}

/// How long a client has to finish its TLS handshake before its connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections accepted on `listener`, `TCP_NODELAY` set, each handshake done in a task of its own
/// (a slow or silent client holds up no other) with the acceptor `tls` holds when the connection arrives.
/// Failed handshakes (plain HTTP/2, an untrusted client certificate) are dropped and logged at debug level,
/// as tonic's own TLS does. The accepting task ends when the server drops the stream.
fn incoming_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<LiveServerTls>,
) -> ReceiverStream<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    // A few handshakes finished but not yet taken by the server; the server takes them as they come.
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning; the listener stays.
                    tracing::warn!(error = %e, "accepting a TLS connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Best effort, as `incoming`: a socket that refuses the option still works.
            let _ = stream.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        // The server stopped taking connections: this one is dropped with the send.
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The connections a role's gRPC server accepts on `listener`, with `TCP_NODELAY` set on each.
///
/// Without it a stream of small messages (a Watch's events, a tool call's frames) meets Nagle's
/// algorithm and the client's delayed ACK: each small write after an unacknowledged one waited up to
/// ~40 ms, so a `tool/call` reached a watcher only with its `tool/result` (measured with
/// `turnstile-bench tools`). `serve_with_incoming` does not apply the builder's `tcp_nodelay`.
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The health service, reporting `""` (the whole server) and each of `services` as SERVING. Keep the
/// reporter to change a status later (NOT_SERVING while draining, say).
pub async fn health(services: &[&str]) -> (HealthReporter, HealthServer<impl Health>) {
    let (reporter, server) = tonic_health::server::health_reporter();
    for service in services {
        reporter.set_service_status(*service, ServingStatus::Serving).await;
    }
    (reporter, server)
}

/// Reports the whole server (`""`) and each of `services` as NOT_SERVING: a role calls it when it starts
/// to drain, so health probes and load balancers stop sending new work while in-flight calls finish.
pub async fn report_draining(reporter: &HealthReporter, services: &[&str]) {
    reporter.set_service_status("", ServingStatus::NotServing).await;
    for service in services {
        reporter.set_service_status(*service, ServingStatus::NotServing).await;
    }
}

/// Reflection (v1) over Turnstile's protos and the health service, listing only `services` (plus health and
/// both reflection versions): a gateway does not advertise the internal Worker API, a worker not the public
/// one, though every message type stays resolvable.
///
/// `None` only if a compiled-in descriptor set does not decode, which the tests below rule out; the
/// server then runs without reflection rather than not at all, and says so in the log.
pub fn reflection(services: &[&str]) -> Option<ServerReflectionServer<impl ServerReflection>> {
    reflection_builder(services).and_then(|b| b.build_v1().map_err(|e| e.to_string())).map_or_else(disabled, Some)
}

/// [`reflection`] in the older `grpc.reflection.v1alpha` protocol, the same answers.
pub fn reflection_v1alpha(services: &[&str]) -> Option<ServerReflectionServerV1Alpha<impl ServerReflectionV1Alpha>> {
    reflection_builder(services).and_then(|b| b.build_v1alpha().map_err(|e| e.to_string())).map_or_else(disabled, Some)
}

/// One builder per version (building consumes it). Each version's service lists both, so a client that
/// asks either learns that the other is there.
fn reflection_builder(services: &[&str]) -> Result<tonic_reflection::server::Builder<'static>, String> {
    Ok(tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_file_descriptor_set(descriptors(services)?)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET))
}

fn disabled<T>(e: String) -> Option<T> {
    tracing::error!(error = %e, "gRPC reflection disabled: the descriptor set is unusable");
    None
}

/// Turnstile's descriptor set with the services this server does not run removed.
fn descriptors(services: &[&str]) -> Result<FileDescriptorSet, String> {
    let mut set = FileDescriptorSet::decode(turnstile_proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())?;
    for file in &mut set.file {
        let package = file.package().to_owned();
        file.service.retain(|s| services.contains(&format!("{package}.{}", s.name()).as_str()));
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn served(set: &FileDescriptorSet) -> Vec<String> {
        set.file.iter().flat_map(|f| f.service.iter().map(move |s| format!("{}.{}", f.package(), s.name()))).collect()
    }

    #[test]
    fn only_the_served_services_are_listed_and_every_descriptor_decodes() {
        assert_eq!(served(&descriptors(&["turnstile.v1.Agent"]).unwrap()), ["turnstile.v1.Agent"]);
        assert_eq!(served(&descriptors(&["turnstile.cluster.v1.Worker"]).unwrap()), ["turnstile.cluster.v1.Worker"]);
        assert!(reflection(&["turnstile.v1.Agent"]).is_some());
        assert!(reflection_v1alpha(&["turnstile.v1.Agent"]).is_some());
    }
}
