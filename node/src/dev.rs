//! `dev`: gateway and worker in one process, on the embedded journal (in memory or in a data directory) or
//! on JetStream (`--nats URL`).

use std::path::PathBuf;
use std::sync::Arc;

use turnstile_agent::tools::ChildSessions;
use turnstile_cluster::CommandRouter;
use turnstile_gateway::{Gateway, ToolHub};
use turnstile_journal::jetstream::{KvAgents, KvIndex, KvUsage, KvWebhookPositions, KvWebhookRegistry, UsageFold};
use turnstile_journal::snapshot::{NoSnapshots, SnapshotStore};
use turnstile_journal::{
    AgentStore, EmbeddedLog, JetStreamConfig, LiveBus, LocalBus, MemoryAgents, MemoryIndex, MemoryPositions,
    MemoryWebhooks, SessionIndex, SessionLog, UsageLedger, WebhookPositions, WebhookRegistry,
};
use turnstile_ops::Readiness;
use turnstile_worker::SessionHost;

use crate::journal::{NatsOptions, open_nats};
use crate::ops::{OpsHttp, install_metrics, nats_ready};
use crate::reload::Reloads;
use crate::report::{Bound, bind, bound_with_http, client_url_for, report_bound};
use crate::role::Serving;
use crate::security::{AuthOptions, ServerSecurity, auth_line};
use crate::{NodeError, agents, budgets, gateway_config, replicas, worker_config};

/// `--listen` and the URL clients reach it at when it is not given: a gateway's, whose API `dev` serves.
pub use crate::gateway::{DEFAULT_LISTEN, DEFAULT_URL};

/// How a dev server is started.
#[derive(Clone, Debug)]
pub struct Options {
    /// The public API's listener, the ops endpoints, TLS and the configuration.
    pub serving: Serving,
    /// Keep sessions on disk in this directory (default: in memory). Ignored with `nats`.
    pub data_dir: Option<PathBuf>,
    /// Keep sessions in JetStream instead of the embedded journal, laid out by the configuration's
    /// `cluster.partitions` and `cluster.replicas`.
    pub nats: Option<NatsOptions>,
    pub auth: AuthOptions,
}

impl Default for Options {
    fn default() -> Self {
        Self { serving: Serving::new(DEFAULT_LISTEN), data_dir: None, nats: None, auth: AuthOptions::default() }
    }
}

/// A running dev server: a gateway's handle, since it serves the public API.
pub type Handle = crate::gateway::Handle;

/// The journal of `dev`: log, live bus, snapshots, how the banner names it, and what readiness follows.
struct Journal {
    log: Arc<dyn SessionLog>,
    bus: Arc<dyn LiveBus>,
    snapshots: Arc<dyn SnapshotStore>,
    describe: String,
    ready: Arc<dyn Readiness>,
    /// The NATS connection of a JetStream journal.
    nats: Option<async_nats::Client>,
    /// Where tenants' token usage is read (SPEC §17): counted by the embedded log as it appends, or folded
    /// from the event streams into KV.
    usage: Arc<dyn UsageLedger>,
    /// The fold of a JetStream journal's streams, running as long as the server.
    fold: Option<UsageFold>,
    /// The session index (SPEC §16): in memory with the embedded journal, a KV bucket on NATS.
    index: Arc<dyn SessionIndex>,
    /// Webhook positions (SPEC §15): in memory with the embedded journal, a KV bucket on NATS.
    webhook_positions: Arc<dyn WebhookPositions>,
    /// The webhooks tenants register (SPEC §21): in memory (or `webhooks.json` in the data directory) with
    /// the embedded journal, a KV bucket on NATS.
    webhooks: Arc<dyn WebhookRegistry>,
    /// Agent definitions and their versions (SPEC §20): in memory or the data directory's `agents.json`
    /// with the embedded journal, a KV bucket on NATS.
    agents: Arc<dyn AgentStore>,
    /// Tenants' memory (SPEC §20): in memory or the data directory's `memory.jsonl` with the embedded
    /// journal, a KV bucket on NATS.
    memory: Arc<dyn turnstile_journal::MemoryStore>,
}

async fn open_journal(opts: &Options) -> Result<Journal, NodeError> {
    // The embedded journal reads from memory, so it keeps no snapshots; JetStream keeps them in KV. The
    // embedded journal is ready once open; on NATS, readiness follows the connection.
    let always: Arc<dyn Readiness> = Arc::new(turnstile_ops::AlwaysReady);
    let embedded = |log: EmbeddedLog,
                    describe: String,
                    webhooks: MemoryWebhooks,
                    agents: MemoryAgents,
                    memory: turnstile_journal::LocalMemory| Journal {
        agents: Arc::new(agents),
        memory: Arc::new(memory),
        usage: log.usage(),
        fold: None,
        log: Arc::new(log),
        bus: Arc::new(LocalBus::new()),
        snapshots: Arc::new(NoSnapshots),
        describe,
        ready: always.clone(),
        nats: None,
        index: Arc::new(MemoryIndex::default()),
        webhook_positions: Arc::new(MemoryPositions::default()),
        webhooks: Arc::new(webhooks),
    };
    let limits = crate::memory_limits(&opts.serving.config.config);
    match (&opts.nats, &opts.data_dir) {
        (Some(nats), _) => {
            let cluster = &opts.serving.config.config.cluster;
            let (partitions, replicas) = (cluster.partitions, replicas(&opts.serving.config.config));
            // `dev` keeps the journal's own shard count: the file's `cluster.shards` is for clusters.
            let shards = JetStreamConfig::new(nats.url.clone()).shards;
            let (log, bus, snapshots) =
                open_nats(nats, partitions, replicas, shards, &opts.serving.config.config.journal).await?;
            let describe = format!(
                "JetStream at {} ({} partition{}, {} replica{})",
                nats.url,
                partitions,
                if partitions == 1 { "" } else { "s" },
                replicas,
                if replicas == 1 { "" } else { "s" },
            );
            let client = log.client().clone();
            let ready = Arc::new(nats_ready(client.clone(), nats.url.clone()));
            let usage = KvUsage::open(&client, replicas).await.map_err(|e| NodeError::nats(&nats.url, e))?;
            let fold = UsageFold::start(&client, partitions, usage.clone());
            let index = KvIndex::open(&client, replicas)
                .await
                .map_err(|e| NodeError::nats(&nats.url, e))?
                .observe_pending(turnstile_ops::gauge_setter(turnstile_ops::names::INDEX_WRITES_PENDING));
            let positions =
                KvWebhookPositions::open(&client, replicas).await.map_err(|e| NodeError::nats(&nats.url, e))?;
            let webhooks =
                KvWebhookRegistry::open(&client, replicas).await.map_err(|e| NodeError::nats(&nats.url, e))?;
            let agents = KvAgents::open(&client, replicas).await.map_err(|e| NodeError::nats(&nats.url, e))?;
            let memory = crate::kv_memory(&client, &nats.url, &opts.serving.config.config).await?;
            Ok(Journal {
                memory,
                log: Arc::new(log),
                bus: Arc::new(bus),
                snapshots: Arc::new(snapshots),
                describe,
                ready,
                nats: Some(client),
                usage: Arc::new(usage),
                fold: Some(fold),
                index: Arc::new(index),
                webhook_positions: Arc::new(positions),
                webhooks: Arc::new(webhooks),
                agents: Arc::new(agents),
            })
        }
        (None, Some(dir)) => {
            let log = EmbeddedLog::open(dir).map_err(|cause| NodeError::DataDir { dir: dir.clone(), cause })?;
            let webhooks = MemoryWebhooks::open(dir).map_err(|cause| NodeError::DataDir { dir: dir.clone(), cause })?;
            let agents = MemoryAgents::open(dir).map_err(|cause| NodeError::DataDir { dir: dir.clone(), cause })?;
            let memory = turnstile_journal::LocalMemory::open(dir, limits)
                .map_err(|cause| NodeError::DataDir { dir: dir.clone(), cause })?;
            Ok(embedded(log, format!("embedded, on disk in {}", dir.display()), webhooks, agents, memory))
        }
        (None, None) => Ok(embedded(
            EmbeddedLog::in_memory(),
            "embedded, in memory (lost on exit; pass --data-dir DIR to keep sessions)".to_owned(),
            MemoryWebhooks::default(),
            MemoryAgents::default(),
            turnstile_journal::LocalMemory::in_memory(limits),
        )),
    }
}

fn banner(url: &str, journal: &str, config: &str, auth: &str) -> String {
    let addr_flag = if url == DEFAULT_URL { String::new() } else { format!(" --addr {url}") };
    format!(
        "turnstile dev: gateway + worker in one process\n  \
         listening  {url}\n  \
         journal    {journal}\n  \
         config     {config}\n  \
         {auth}\n  \
         try        turnstile{addr_flag} followup s1 \"hello\"\n             \
         turnstile{addr_flag} watch s1 --until-idle\n  \
         stop       Ctrl-C\n"
    )
}

/// Starts a dev server: sets up the configuration's agents, loads the security files, binds, opens the journal, resumes the sessions that were
/// running, prints the banner and the bound addresses, and serves until stopped.
pub async fn start(opts: Options) -> Result<Handle, NodeError> {
    install_metrics();
    let agents = agents(&opts.serving.config).await?;
    let security = ServerSecurity::load(&opts.auth, opts.serving.tls.as_ref()).await?;
    let (listener, local) = bind(&opts.serving.listen).await?;
    let auth = auth_line(&security.auth, local, &opts.serving.listen)?;
    let reloads = Reloads::install(&security.auth, security.tls.as_ref(), None)?;
    let journal = open_journal(&opts).await?;
    // Client tools: over NATS when the journal is there (other gateways' executors too), else straight to
    // this process's gateway.
    let tools = match &journal.nats {
        Some(client) => {
            let url = opts.nats.as_ref().map_or("", |n| n.url.as_str());
            let hub = ToolHub::with_nats(client.clone())
                .await
                .map_err(|cause| NodeError::ToolHub { url: url.to_owned(), cause })?;
            agents.tools.set_client_tools(Arc::new(turnstile_cluster::NatsToolBus::new(client.clone())));
            hub
        }
        None => {
            let hub = ToolHub::new();
            agents.tools.set_client_tools(Arc::new(hub.clone()));
            hub
        }
    };
    let config = &opts.serving.config.config;
    let registry = agents.tools.clone();
    registry.set_memory(journal.memory.clone());
    let definitions = crate::agent_definitions(config, journal.agents.clone()).await?;
    let mut host = SessionHost::builder(journal.log.clone(), journal.bus.clone(), definitions.agents(agents))
        .snapshots(journal.snapshots.clone())
        .index(journal.index.clone())
        .webhook_positions(journal.webhook_positions.clone())
        .webhook_registry(journal.webhooks.clone())
        .config(worker_config(config));
    if let Some(budgets) = budgets(config, journal.usage.clone()) {
        host = host.budgets(budgets);
    }
    let host = host.build();
    // `spawn_agent` reaches its children through this same host (before resuming: a resumed turn may call it).
    registry.set_child_sessions(ChildSessions { router: host.clone(), log: journal.log.clone() });
    let resumed = host.resume_running().await.map_err(NodeError::Resume)?;
    if resumed > 0 {
        tracing::info!(resumed, "resumed sessions that were running when the last process stopped");
    }
    let router: Arc<dyn CommandRouter> = host;
    let index = journal.index.clone();
    let auth_enabled = security.auth.is_enabled();
    let gateway = Gateway::new(router, journal.log, journal.bus, gateway_config(config))
        .with_snapshots(journal.snapshots)
        .with_index(index.clone())
        .with_auth(security.auth)
        .with_tools(tools)
        .with_usage(journal.usage)
        .with_webhooks(journal.webhooks)
        .with_memory(journal.memory)
        .with_agents(definitions.gateway);
    // The web console, its gRPC-Web calls and the agent protocols share the ops listener (decision 0029).
    let console = crate::http_routes(&gateway, config, auth_enabled);
    let http = OpsHttp::start_with(opts.serving.http.as_deref(), journal.ready, console).await?;

    let url = client_url_for(local, security.tls.is_some());
    print!("{}", banner(&url, &journal.describe, &opts.serving.config.describe(), &auth));
    println!("  http       {}", http.describe());
    println!("  console    {}", http.console());
    let bound: Vec<Bound> = bound_with_http("grpc", local, http.addr());
    report_bound(&bound, &[], opts.serving.ready_file.as_deref())?;
    tracing::info!(%local, tls = security.tls.is_some(), "serving turnstile.v1.Agent");

    Ok(crate::gateway::serve(gateway, listener, local, security.tls, reloads, http, url, journal.fold, Some(index)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_names_the_address_in_examples_only_when_it_is_not_the_default() {
        assert!(!banner(DEFAULT_URL, "mem", "none", "auth: off (loopback only)").contains("--addr"));
        let b = banner("http://127.0.0.1:9", "mem", "t.toml", "auth: off (loopback only)");
        assert!(b.contains("\n  auth: off (loopback only)\n"), "{b}");
        assert!(b.contains("\n  config     t.toml\n"), "{b}");
        assert!(b.contains("turnstile --addr http://127.0.0.1:9 followup s1"), "{b}");
    }

    #[tokio::test]
    async fn a_dev_server_starts_on_port_zero_reports_its_addresses_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready.json");
        let serving = Serving {
            http: Some("127.0.0.1:0".into()),
            ready_file: Some(ready.clone()),
            ..Serving::new("127.0.0.1:0")
        };
        let opts = Options { serving, ..Options::default() };
        let node = start(opts).await.unwrap();
        assert_ne!(node.grpc_addr().port(), 0);
        let http = node.http_addr().unwrap();
        assert_eq!(node.url(), format!("http://{}", node.grpc_addr()));
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&ready).unwrap()).unwrap();
        assert_eq!(json["grpc"], node.grpc_addr().to_string());
        assert_eq!(json["http"], http.to_string());
        let grpc = node.grpc_addr();
        node.shutdown().await.unwrap();
        assert!(tokio::net::TcpStream::connect(grpc).await.is_err(), "the listener is closed once stopped");
    }

    /// One HTTP/1.1 request on a fresh connection; the whole answer (headers and body) as text.
    async fn http_exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_console_and_its_grpc_web_api_are_served_on_the_http_port_to_loopback_names_only() {
        let serving = Serving { http: Some("127.0.0.1:0".into()), ..Serving::new("127.0.0.1:0") };
        let opts = Options { serving, ..Options::default() };
        let node = start(opts).await.unwrap();
        let http = node.http_addr().unwrap();
        let page = http_exchange(http, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", b"").await;
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("content-security-policy: default-src 'none'"), "{page}");
        assert!(page.contains("<script src=\"/console.js\""), "{page}");
        // An empty ListSessionsRequest in one gRPC-Web frame.
        let call = |host: &str| {
            format!(
                "POST /turnstile.v1.Agent/ListSessions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/grpc-web+proto\r\n\
                 X-Grpc-Web: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
            )
        };
        let frame = [0u8; 5];
        let ok = http_exchange(http, &call(&format!("localhost:{}", http.port())), &frame).await;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("grpc-status:0"), "{ok}");
        // With auth off, a page of another site whose name resolves to 127.0.0.1 gets nothing.
        let rebound = http_exchange(http, &call("evil.example"), &frame).await;
        assert!(rebound.contains("grpc-status: 7"), "{rebound}");
        assert!(!rebound.contains("access-control-allow-origin"), "no CORS: {rebound}");
        node.shutdown().await.unwrap();
    }
}
