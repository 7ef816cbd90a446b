//! `gateway`: the public `turnstile.v1.Agent` service of a cluster. Stateless: commands go to the shard
//! owners through a [`turnstile_cluster::ClusterRouter`], reads fold the JetStream log (from snapshots) here.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use turnstile_ops::tls::LiveServerTls;

use tokio_util::sync::CancellationToken;
use turnstile_gateway::{Gateway, ToolHub};

use crate::journal::{NatsOptions, open_cluster_nats};
use crate::ops::{OpsHttp, install_metrics, nats_ready};
use crate::reload::{ClusterTlsWatch, Reloads};
use crate::report::{bind, bound_with_http, client_url_for, report_bound};
use crate::role::Serving;
use crate::running::{Running, handle_methods};
use crate::security::{AuthOptions, ServerSecurity, auth_line};
use crate::tls::ClusterTls;
use crate::{NodeError, cluster_router, gateway_config, replicas};
use turnstile_gateway::Quotas;
use turnstile_journal::SessionIndex;
use turnstile_journal::jetstream::{KvUsage, UsageFold};

/// How long a stopping `dev` waits for its last index writes (a few of the writer's windows).
const INDEX_FLUSH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// `--listen` of a gateway (and of `dev`) when it is not given.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";

/// The URL clients reach a dev server or gateway on [`DEFAULT_LISTEN`] at: client commands' default `--addr`.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7400";

/// How a gateway is started.
#[derive(Clone, Debug)]
pub struct Options {
    /// The public API's listener, the ops endpoints, TLS and the configuration.
    pub serving: Serving,
    /// The cluster's NATS, laid out by the configuration's `[cluster]`.
    pub nats: NatsOptions,
    pub auth: AuthOptions,
    /// Dial the workers over TLS; `None` dials them in clear text.
    pub cluster_tls: Option<ClusterTls>,
}

impl Options {
    /// A gateway on the cluster at `nats` with every other option at its default.
    pub fn new(nats: NatsOptions) -> Self {
        Self { serving: Serving::new(DEFAULT_LISTEN), nats, auth: AuthOptions::default(), cluster_tls: None }
    }
}

/// A running server of the public API: a gateway, or `dev` (which runs one in-process).
#[derive(Debug)]
pub struct Handle {
    grpc: SocketAddr,
    http: Option<SocketAddr>,
    url: String,
    running: Running,
}

impl Handle {
    /// The public API's bound address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// The ops HTTP endpoints' bound address, when they are served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The URL clients use (`https://` with TLS; a wildcard bind as loopback).
    pub fn url(&self) -> &str {
        &self.url
    }

    handle_methods!();
}

/// Serves `gateway` on `listener` (bound at `local`, reached at `url`) with `tls` until stopped, watching
/// the auth and TLS files when there are some (`reloads`) and stopping the ops endpoints `http` after it: how `dev` and a
/// gateway end their start. `fold` (dev's usage fold on JetStream) runs as long as the server; `index` (dev's) is flushed
/// when it stops.
#[allow(clippy::too_many_arguments)] // the parts of one start, each built by its caller
pub(crate) fn serve(
    gateway: Gateway,
    listener: TcpListener,
    local: SocketAddr,
    tls: Option<Arc<LiveServerTls>>,
    reloads: Option<Reloads>,
    http: OpsHttp,
    url: String,
    fold: Option<UsageFold>,
    index: Option<Arc<dyn SessionIndex>>,
) -> Handle {
    let stop = CancellationToken::new();
    if let Some(reloads) = reloads {
        reloads.spawn(stop.clone());
    }
    let serve = turnstile_gateway::serve_with(gateway, listener, tls, stop.clone().cancelled_owned());
    let http_addr = http.addr();
    let running = Running::spawn(stop, async move {
        let _fold = fold;
        let served = serve.await;
        // `dev` writes the index behind in batches (decision 0177): what its sessions submitted is in the
        // store before the process goes.
        if let Some(index) = index
            && tokio::time::timeout(INDEX_FLUSH_PATIENCE, index.flush()).await.is_err()
        {
            tracing::warn!("session index not flushed in time; a take-over repairs it from the logs");
        }
        http.stop();
        served.map_err(NodeError::Serve)?;
        tracing::info!("stopped");
        Ok(())
    });
    Handle { grpc: local, http: http_addr, url, running }
}

/// Starts a gateway: loads the security files, binds, opens the journal and the shard map, prints the
/// bound addresses, and serves until stopped.
pub async fn start(opts: Options) -> Result<Handle, NodeError> {
    install_metrics();
    let security = ServerSecurity::load(&opts.auth, opts.serving.tls.as_ref()).await?;
    let cluster_tls = opts.cluster_tls.as_ref().map(ClusterTls::load).transpose()?;
    let (listener, local) = bind(&opts.serving.listen).await?;
    let auth = auth_line(&security.auth, local, &opts.serving.listen)?;
    let config = &opts.serving.config.config;
    let c = &config.cluster;
    let url = opts.nats.url.as_str();
    let (log, bus, snapshots) = open_cluster_nats(&opts.nats, config).await?;
    let client = log.client().clone();
    let (cluster_tls, tls_config) = cluster_tls.map_or((None, None), |(live, tls)| (Some(live), Some(tls)));
    let (router, transport) = cluster_router(&client, url, config, tls_config).await?;
    let cluster_tls = cluster_tls.map(|files| ClusterTlsWatch { files, transport });
    let reloads = Reloads::install(&security.auth, security.tls.as_ref(), cluster_tls)?;
    let tools =
        ToolHub::with_nats(client.clone()).await.map_err(|cause| NodeError::ToolHub { url: url.to_owned(), cause })?;
    let auth_enabled = security.auth.is_enabled();
    // SPEC §17: usage as the workers fold it, and quotas counted across every gateway of the cluster.
    let usage = KvUsage::open(&client, replicas(config)).await.map_err(|e| NodeError::nats(url, e))?;
    let gateway_config = gateway_config(config);
    let quotas = Quotas::shared(gateway_config.quotas.clone(), &client, replicas(config))
        .await
        .map_err(|cause| NodeError::Quotas { url: url.to_owned(), cause })?;
    let index = turnstile_journal::jetstream::KvIndex::open(&client, crate::replicas(config))
        .await
        .map_err(|e| NodeError::nats(url, e))?;
    let webhooks = turnstile_journal::jetstream::KvWebhookRegistry::open(&client, crate::replicas(config))
        .await
        .map_err(|e| NodeError::nats(url, e))?;
    let agents = turnstile_journal::jetstream::KvAgents::open(&client, replicas(config))
        .await
        .map_err(|e| NodeError::nats(url, e))?;
    let definitions =
        turnstile_gateway::agents::AgentDefinitions { store: Arc::new(agents), config: Arc::new(config.clone()) };
    let memory = crate::kv_memory(&client, url, config).await?;
    let gateway = Gateway::new(router, Arc::new(log), Arc::new(bus), gateway_config)
        .with_agents(definitions)
        .with_memory(memory)
        .with_snapshots(Arc::new(snapshots))
        .with_index(Arc::new(index))
        .with_webhooks(Arc::new(webhooks))
        .with_auth(security.auth)
        .with_tools(tools)
        .with_usage(Arc::new(usage))
        .with_quotas(quotas);

    // The web console, its gRPC-Web calls and the agent protocols share the ops listener (decision 0029).
    let console = crate::http_routes(&gateway, config, auth_enabled);
    let ready = Arc::new(nats_ready(client, url.to_owned()));
    let http = OpsHttp::start_with(opts.serving.http.as_deref(), ready, console).await?;
    let client_url = client_url_for(local, security.tls.is_some());
    println!("turnstile gateway listening on {client_url}");
    println!("{auth}");
    println!("config: {}", opts.serving.config.describe());
    println!("http: {}", http.describe());
    println!("console: {}", http.console());
    let bound = bound_with_http("grpc", local, http.addr());
    report_bound(&bound, &[], opts.serving.ready_file.as_deref())?;
    tracing::info!(%local, nats = %url, shards = c.shards, "serving turnstile.v1.Agent with cluster routing");

    Ok(serve(gateway, listener, local, security.tls, reloads, http, client_url, None, None))
}
