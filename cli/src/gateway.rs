//! `turnstile gateway`: the public `turnstile.v1.Agent` service of a cluster. Stateless: commands go to
//! the shard owners through [`ClusterRouter`], reads fold the JetStream log (from snapshots) here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tonic::transport::ClientTlsConfig;
use turnstile_cluster::CommandRouter;
use turnstile_cluster::LeaseConfig;
use turnstile_cluster::kv::ClusterKv;
use turnstile_gateway::cluster_router::GrpcTransport;
use turnstile_gateway::{ClusterRouter, ClusterRouterConfig, Gateway, GatewayConfig};
use turnstile_journal::jetstream::NatsSecurity;

use crate::dev::{bind, bound_with_http, client_url_for, membership_error, report_bound, shutdown_signal};
use crate::security::{self, ServerSecurity};

/// Options of `turnstile gateway`.
#[derive(Clone, Debug)]
pub struct GatewayOpts {
    pub nats: String,
    pub listen: String,
    pub partitions: u32,
    pub replicas: usize,
    pub shards: u32,
    /// How long a command may wait for a shard owner before UNAVAILABLE.
    pub route_deadline: Duration,
    /// `--nats-creds`, `--nats-ca`, `--nats-tls-cert/--nats-tls-key`.
    pub nats_security: NatsSecurity,
    /// TLS to the workers (`--cluster-tls-ca`); `None` dials them in clear text.
    pub cluster_tls: Option<ClientTlsConfig>,
    /// `--http`: `/metrics`, `/healthz`, `/readyz`.
    pub http: Option<String>,
    /// `--ready-file`: where [`report_bound`] writes the bound addresses.
    pub ready_file: Option<PathBuf>,
}

pub async fn run(opts: GatewayOpts, security: ServerSecurity) -> Result<()> {
    crate::ops::install_metrics();
    let listener = bind(&opts.listen).await?;
    let local = listener.local_addr().context("cannot read the bound address")?;
    let auth_line = security::auth_line(&security.auth, local, &opts.listen)?;
    let (log, bus, snapshots) = crate::dev::open_nats_journal(
        &opts.nats,
        opts.partitions,
        opts.replicas,
        opts.shards,
        opts.nats_security.clone(),
    )
    .await?;
    let client = log.client().clone();
    // The workers' heartbeat TTL: whoever creates the workers bucket first sets its max age.
    let worker_ttl = LeaseConfig::default().worker_ttl;
    let kv = ClusterKv::open(&client, opts.replicas, opts.shards, worker_ttl)
        .await
        .map_err(|e| membership_error(&opts.nats, &e))?;
    let map = kv.watch_shards().await.map_err(|e| membership_error(&opts.nats, &e))?;
    let router_config = ClusterRouterConfig { deadline: opts.route_deadline, ..ClusterRouterConfig::default() };
    let router: Arc<dyn CommandRouter> = match opts.cluster_tls.clone() {
        Some(tls) => {
            let transport = Arc::new(GrpcTransport::with_tls(router_config.connect_timeout, tls));
            Arc::new(ClusterRouter::with_transport(map, transport, router_config))
        }
        None => Arc::new(ClusterRouter::new(map, router_config)),
    };
    let gateway = Gateway::new(router, Arc::new(log), Arc::new(bus), GatewayConfig::default())
        .with_snapshots(Arc::new(snapshots))
        .with_auth(security.auth);

    let http = crate::ops::OpsHttp::start(
        opts.http.as_deref(),
        Arc::new(crate::ops::nats_ready(client.clone(), opts.nats.clone())),
    )
    .await?;
    let url = client_url_for(local, security.tls.is_some());
    println!("turnstile gateway listening on {url}");
    println!("{auth_line}");
    println!("http: {}", http.describe());
    let bound = bound_with_http("grpc", local, &http);
    report_bound(&bound, &[], opts.ready_file.as_deref())?;
    tracing::info!(%local, nats = %opts.nats, shards = opts.shards, "serving turnstile.v1.Agent with cluster routing");
    turnstile_gateway::serve_with(gateway, listener, security.tls, shutdown_signal())
        .await
        .context("the gRPC server stopped")?;
    http.stop();
    tracing::info!("stopped");
    Ok(())
}
