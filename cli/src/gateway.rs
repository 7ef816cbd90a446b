//! `turnstile gateway`: the public `turnstile.v1.Agent` service of a cluster. Stateless: commands go to
//! the shard owners through [`ClusterRouter`], reads fold the JetStream log (from snapshots) here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use turnstile_gateway::{ClusterRouter, ClusterRouterConfig, Gateway, GatewayConfig};
use turnstile_journal::jetstream::KvSnapshots;
use turnstile_journal::jetstream::shards::ClusterKv;
use turnstile_journal::{CommandRouter, JetStreamConfig, JetStreamLog, NatsBus};
use turnstile_worker::cluster::LeaseConfig;

use crate::dev::{bind, client_url, nats_error, shutdown_signal};

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
}

pub async fn run(opts: GatewayOpts) -> Result<()> {
    let listener = bind(&opts.listen).await?;
    let local = listener.local_addr().context("cannot read the bound address")?;
    let mut config = JetStreamConfig::new(opts.nats.clone());
    config.partitions = opts.partitions;
    config.replicas = opts.replicas;
    config.shards = opts.shards;
    let log = JetStreamLog::connect(config).await.map_err(|e| nats_error(&opts.nats, &e))?;
    let client = log.client().clone();
    let bus = NatsBus::new(client.clone());
    let snapshots = KvSnapshots::open(&client, opts.replicas).await.map_err(|e| nats_error(&opts.nats, &e))?;
    // The workers' heartbeat TTL: whoever creates the workers bucket first sets its max age.
    let worker_ttl = LeaseConfig::default().worker_ttl;
    let kv = ClusterKv::open(&client, opts.replicas, opts.shards, worker_ttl)
        .await
        .map_err(|e| nats_error(&opts.nats, &e))?;
    let map = kv.watch_shards().await.map_err(|e| nats_error(&opts.nats, &e))?;
    let router_config = ClusterRouterConfig { deadline: opts.route_deadline, ..ClusterRouterConfig::default() };
    let router: Arc<dyn CommandRouter> = Arc::new(ClusterRouter::new(map, router_config));
    let gateway = Gateway::new(router, Arc::new(log), Arc::new(bus), GatewayConfig::default())
        .with_snapshots(Arc::new(snapshots));

    let url = client_url(local);
    println!("turnstile gateway listening on {url}");
    tracing::info!(%local, nats = %opts.nats, shards = opts.shards, "serving turnstile.v1.Agent with cluster routing");
    turnstile_gateway::serve(gateway, listener, shutdown_signal()).await.context("the gRPC server stopped")?;
    tracing::info!("stopped");
    Ok(())
}
