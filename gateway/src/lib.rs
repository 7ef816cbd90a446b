//! Turnstile's public gRPC gateway (`turnstile.v1.Agent`, docs/API.md).
//!
//! Place in the architecture: clients talk only to a gateway. It validates each request, turns it into
//! a [`Command`](turnstile_model::Command) and hands it to a
//! [`CommandRouter`](turnstile_cluster::CommandRouter), which reaches the driver that owns the session
//! (the in-process worker host in `turnstile dev`, the shard owner over internal gRPC in a cluster).
//! Reads — `GetInbox`, `GetSession`, `ListSessions` and `Watch` — never touch a driver: the gateway folds
//! the session's log itself, so any gateway can serve any session while shards move.
//!
//! Modules: [`convert`] (request validation), [`status`] (error → gRPC code),
//! [`read`] (projection reads), [`merge`], [`feed`], [`watch_buffer`] and [`watch`] (the resumable Watch stream over one
//! shared feed per watched session), [`service`] (the [`Gateway`] and what its RPCs share; the RPCs
//! themselves are in `rpc`), [`auth`] (bearer tokens → tenant and role), `scope` (the one tenancy rule
//! every RPC passes through: authenticate, resolve the call's tenant, confine the request to it), [`quota`] (per-tenant request rate and open Watch streams, checked in the service
//! methods, counted across a cluster's gateways in NATS KV), `usage` (`GetUsage`, SPEC §17), [`tools`]
//! (client tool executors on `ServeTools` streams), `transcript`, `approvals` and `webhooks` (`GetTranscript`, `ListPendingApprovals`, the webhook RPCs, SPEC §21) and [`export`] (`ExportSessions` and `ImportSessions`,
//! SPEC §18), [`eval`] (`Evaluate`, SPEC §20: recorded turns rerun on another agent version and scored). [`console`] serves the web console
//! and the same service over gRPC-Web for it, on the ops HTTP listener. In a cluster the router is
//! `turnstile_cluster::ClusterRouter` (the internal hop, shared with the workers); TLS configs come from
//! `turnstile_ops::tls`.

mod agent_definitions;
pub mod agents;
mod approvals;
pub mod auth;
pub mod console;
pub mod convert;
mod encoded;
pub mod eval;
pub mod export;
pub mod feed;
mod feed_item;
mod history;
pub mod memory;
pub mod merge;
mod ops;
pub mod quota;
pub mod read;
pub mod resume;
mod rpc;
mod schedules;
mod scope;
mod search;
pub mod service;
pub mod status;
pub mod tools;
mod transcript;
mod usage;
pub mod watch;
pub mod watch_buffer;
pub mod webhooks;

use std::future::Future;

pub use quota::{QuotaConfig, Quotas, TenantQuota};
pub use service::TokenBudgets;
pub use service::{Gateway, GatewayConfig};
use tokio::net::TcpListener;
pub use tools::ToolHub;
use turnstile_ops::tls::LiveServerTls;
use turnstile_proto::v1::agent_server::AgentServer;

/// The gRPC server stopped for a reason other than `shutdown`.
#[derive(Debug, thiserror::Error)]
#[error("gRPC server failed: {0}")]
pub struct ServeError(#[from] tonic::transport::Error);

/// Serves `gateway` on an already bound listener (bind port 0 in tests) until `shutdown` resolves;
/// open Watch streams are ended and in-flight calls drained first.
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(gateway, listener, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is set (`turnstile_ops::tls::LiveServerTls`: its certificate is read again
/// when the files change).
pub async fn serve_with(
    gateway: Gateway,
    listener: TcpListener,
    tls: Option<std::sync::Arc<LiveServerTls>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let watches = gateway.shutdown_token();
    let served = [<AgentServer<Gateway> as tonic::server::NamedService>::NAME];
    let (router, health) = turnstile_ops::grpc::server(&served).await;
    let shutdown = async move {
        shutdown.await;
        // Draining: probes on open connections see NOT_SERVING while in-flight calls finish.
        turnstile_ops::grpc::report_draining(&health, &served).await;
        watches.cancel();
    };
    // Watch streams send each feed item's bytes encoded once for all of them (decision 0178).
    let server = encoded::WatchEncodedOnce::new(gateway);
    turnstile_ops::grpc::serve(router.add_service(server), listener, tls, shutdown).await?;
    Ok(())
}
