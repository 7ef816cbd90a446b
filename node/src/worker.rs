//! `worker`: one worker of a cluster. It heartbeats, takes its fair share of shard leases, runs the drivers
//! of those shards' sessions and serves them to gateways over the internal `turnstile.cluster.v1.Worker`
//! API. Stopping drains its sessions and releases its leases before it ends, so the next owners start at
//! once instead of waiting for the leases to expire.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use turnstile_agent::tools::ChildSessions;
use turnstile_gateway::auth::Authenticator;
use turnstile_worker::cluster::service::{self, WorkerService};
use turnstile_worker::cluster::{LeaseConfig, WorkerHandle, WorkerOptions, start_worker};

use crate::journal::{NatsOptions, open_cluster_nats};
use crate::ops::{OpsHttp, install_metrics, worker_ready};
use crate::reload::{ClusterTlsWatch, Reloads};
use crate::report::{bind, bound_with_http, report_bound};
use crate::role::Serving;
use crate::running::{Running, handle_methods};
use crate::tls::{ClusterTls, ServerTls};
use crate::{NodeError, agents, budgets, cluster_router, replicas, worker_config};
use turnstile_journal::jetstream::{KvUsage, UsageFold};

/// `--listen` of a worker when it is not given.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7500";

/// How a worker is started.
#[derive(Clone, Debug)]
pub struct Options {
    /// The internal API's listener, the ops endpoints, TLS (gateways then dial with their cluster TLS) and
    /// the configuration (agents and models, `[cluster]` timings and layout, `[limits]`, `[journal]`).
    pub serving: Serving,
    /// The cluster's NATS, laid out by the configuration's `[cluster]`.
    pub nats: NatsOptions,
    /// The address gateways dial (in the heartbeat and the shard leases); `None` is the bound address, so
    /// `127.0.0.1:0` advertises the port the kernel picked.
    pub advertise: Option<String>,
    /// Unique worker id, reported as the session owner; `None`: `worker-<advertised address>`.
    pub id: Option<String>,
    /// Dial other workers over TLS (for `spawn_agent`'s child sessions), as a gateway does; `None` dials
    /// them in clear text.
    pub cluster_tls: Option<ClusterTls>,
}

impl Options {
    /// A worker on the cluster at `nats` with every other option at its default.
    pub fn new(nats: NatsOptions) -> Self {
        Self { serving: Serving::new(DEFAULT_LISTEN), nats, advertise: None, id: None, cluster_tls: None }
    }
}

/// A running worker.
#[derive(Debug)]
pub struct Handle {
    addr: SocketAddr,
    http: Option<SocketAddr>,
    id: String,
    advertise: String,
    running: Running,
}

impl Handle {
    /// The internal API's bound address.
    pub fn worker_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ops HTTP endpoints' bound address, when they are served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The worker's id, reported as the session owner.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The address in its heartbeat and shard leases.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    handle_methods!();
}

/// Starts a worker: sets up the configuration's agents, loads the TLS files, binds, opens the journal, joins the cluster, prints the bound
/// addresses, and serves until stopped.
pub async fn start(opts: Options) -> Result<Handle, NodeError> {
    install_metrics();
    let agents = agents(&opts.serving.config).await?;
    let tls = opts.serving.tls.as_ref().map(ServerTls::load).transpose()?;
    let cluster_tls = opts.cluster_tls.as_ref().map(ClusterTls::load).transpose()?;
    let (listener, local) = bind(&opts.serving.listen).await?;
    check_worker_exposure(opts.serving.tls.as_ref(), local, &opts.serving.listen)?;
    let advertise = opts.advertise.clone().unwrap_or_else(|| local.to_string());
    let id = opts.id.clone().unwrap_or_else(|| format!("worker-{advertise}"));
    let config = &opts.serving.config.config;
    let c = &config.cluster;
    let url = opts.nats.url.as_str();

    let (log, bus, snapshots) = open_cluster_nats(&opts.nats, config).await?;
    let client = log.client().clone();
    let leases = LeaseConfig {
        shards: c.shards,
        ttl: c.lease_ttl(),
        renew_every: c.renew_every(),
        worker_ttl: c.worker_ttl(),
        drain_timeout: c.drain_timeout(),
        ..LeaseConfig::default()
    };
    let drain = leases.drain_timeout;
    // SPEC §17: the workers fold the event streams into the usage bucket (idempotently: several folds
    // count each message once) and check the tenants' budgets against it. Partition p is folded by the
    // holder of shard p (its lowest shard, shard mod P = p), so one fold reads each message (decision 0180).
    let usage = KvUsage::open(&client, replicas(config)).await.map_err(|e| NodeError::nats(url, e))?;
    let holder: Arc<std::sync::OnceLock<Arc<turnstile_worker::cluster::Leases>>> = Arc::default();
    let mine = {
        let holder = holder.clone();
        Arc::new(move |partition: u32| holder.get().is_some_and(|l| l.held_shards().contains(&partition)))
    };
    let fold = UsageFold::start_where(&client, c.partitions, usage.clone(), mine);
    let options = WorkerOptions {
        id: id.clone(),
        advertise_addr: advertise.clone(),
        leases,
        worker: worker_config(config),
        budgets: budgets(config, Arc::new(usage)),
    };
    let (log, bus, snapshots) = (Arc::new(log), Arc::new(bus), Arc::new(snapshots));
    // Client tools are NATS requests to the gateways holding their executors.
    agents.tools.set_client_tools(Arc::new(turnstile_cluster::NatsToolBus::new(client.clone())));
    // `spawn_agent` reaches its child sessions' owners as a gateway would, and reads their logs here.
    let (cluster_tls, tls_config) = cluster_tls.map_or((None, None), |(live, tls)| (Some(live), Some(tls)));
    let (router, transport) = cluster_router(&client, url, config, tls_config).await?;
    let cluster_tls = cluster_tls.map(|files| ClusterTlsWatch { files, transport });
    let reloads = Reloads::install(&Authenticator::Disabled, tls.as_ref(), cluster_tls)?;
    agents.tools.set_child_sessions(ChildSessions { router, log: log.clone() });
    // The memory tools (SPEC §20) reach the cluster's memory bucket.
    agents.tools.set_memory(crate::kv_memory(&client, url, config).await?);
    // SPEC §20: the file's agents imported as versions, every agent followed as it changes.
    let store = turnstile_journal::jetstream::KvAgents::open(&client, replicas(config))
        .await
        .map_err(|e| NodeError::nats(url, e))?;
    let definitions = crate::agent_definitions(config, Arc::new(store)).await?;
    let worker = start_worker(options, definitions.agents(agents), &client, replicas(config), log, bus, snapshots)
        .await
        .map_err(|e| NodeError::membership(url, e))?;
    let _ = holder.set(worker.leases());

    // The server keeps answering while the worker drains (not-owner for released shards tells gateways
    // to look again), so it stops only after the worker has left the cluster.
    let stop_server = CancellationToken::new();
    // gRPC health is NOT_SERVING from the start of the drain (issue 14).
    let draining = CancellationToken::new();
    let mut server = tokio::spawn(service::serve_draining(
        WorkerService::new(worker.host()).with_max_request_bytes(config.limits.max_request_bytes()),
        listener,
        tls,
        draining.clone(),
        stop_server.clone().cancelled_owned(),
    ));
    let ready = worker_ready(client, url.to_owned(), worker.leases());
    let http = match OpsHttp::start(opts.serving.http.as_deref(), Arc::new(ready)).await {
        Ok(http) => http,
        Err(e) => {
            leave(worker, drain, &stop_server).await;
            return Err(e);
        }
    };
    println!("turnstile worker {id} serving on {advertise}");
    println!("config: {}", opts.serving.config.describe());
    println!("http: {}", http.describe());
    let bound = bound_with_http("worker", local, http.addr());
    if let Err(e) = report_bound(
        &bound,
        &[("id", id.clone()), ("advertise", advertise.clone())],
        opts.serving.ready_file.as_deref(),
    ) {
        // It may hold leases by now: leave the cluster so the shards move on at once.
        leave(worker, drain, &stop_server).await;
        http.stop();
        return Err(e);
    }
    tracing::info!(%id, %local, %advertise, shards = c.shards, "serving turnstile.cluster.v1.Worker");

    let http_addr = http.addr();
    let stop = CancellationToken::new();
    if let Some(reloads) = reloads {
        reloads.spawn(stop.clone());
    }
    let stopped = stop.clone();
    let task_id = id.clone();
    let running = Running::spawn(stop, async move {
        let id = task_id;
        // The fold counts for as long as the worker runs.
        let _fold = fold;
        tokio::select! {
            () = stopped.cancelled() => {}
            served = &mut server => {
                // The server ended by itself: leave the cluster anyway so the shards move on at once.
                worker.shutdown(drain).await;
                http.stop();
                return served.map_err(NodeError::Panicked)?.map_err(NodeError::WorkerServe);
            }
        }
        let drain_timeout_ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(%id, drain_timeout_ms, "draining and releasing shards");
        draining.cancel();
        worker.shutdown(drain).await;
        stop_server.cancel();
        let served = server.await;
        http.stop();
        served.map_err(NodeError::Panicked)?.map_err(NodeError::WorkerServe)?;
        tracing::info!(%id, "stopped");
        Ok(())
    });
    Ok(Handle { addr: local, http: http_addr, id, advertise, running })
}

/// The internal API runs any command on any tenant's session, so beyond loopback it takes only callers
/// with a certificate of the cluster CA (`--tls-client-ca`): mTLS, decision 0026. Like the gateway's auth
/// check (decision 0007's loopback rule), it runs after binding (so `--listen` names the real address)
/// and before the worker joins the cluster.
pub(crate) fn check_worker_exposure(tls: Option<&ServerTls>, bound: SocketAddr, listen: &str) -> Result<(), NodeError> {
    if bound.ip().is_loopback() || tls.is_some_and(|t| t.client_ca.is_some()) {
        return Ok(());
    }
    Err(NodeError::WorkerExposed { listen: listen.to_owned() })
}

/// Leaves the cluster (drain, release, no heartbeat) and stops the internal server, for a start that fails
/// after joining.
async fn leave(worker: WorkerHandle, drain: std::time::Duration, server: &CancellationToken) {
    worker.shutdown(drain).await;
    server.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_api_beyond_loopback_needs_client_certificates() {
        let loopback: SocketAddr = "127.0.0.1:7500".parse().unwrap();
        let anywhere: SocketAddr = "0.0.0.0:7500".parse().unwrap();
        assert!(check_worker_exposure(None, loopback, "127.0.0.1:7500").is_ok());
        let err = check_worker_exposure(None, anywhere, "0.0.0.0:7500").unwrap_err().to_string();
        assert!(err.starts_with("refusing to serve the worker API on 0.0.0.0:7500"), "{err}");
        assert!(err.contains("--tls-client-ca"), "{err}");
        // Server TLS alone encrypts but lets anyone in: still refused.
        let tls = ServerTls { cert: "c.pem".into(), key: "k.pem".into(), client_ca: None };
        assert!(check_worker_exposure(Some(&tls), anywhere, "0.0.0.0:7500").is_err());
        let mtls = ServerTls { client_ca: Some("ca.pem".into()), ..tls };
        assert!(check_worker_exposure(Some(&mtls), anywhere, "0.0.0.0:7500").is_ok());
    }
}
