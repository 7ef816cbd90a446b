//! Wiring of Turnstile's roles from a configuration: [`dev`] (gateway and worker in one process),
//! [`gateway`] and [`worker`]. This is what the `turnstile` binary, the cross-process tests and the bench
//! start.
//!
//! Its place in the architecture (docs/ARCHITECTURE.md): `model` ← `driver` ← `worker` ← `agent`; `model` ←
//! `journal` ← `worker`, `gateway`; `agent`, `gateway` ← **`node`** ← `cli`. The node depends on the gateway,
//! worker, agent, journal, cluster, ops and config crates and puts them together: it loads the [`config`]
//! (the file, then command-line flags over it), builds the configuration's agents, binds the listeners,
//! opens the journal (embedded or JetStream), builds the session host (handing it the agents) or the cluster
//! router, serves the public or internal gRPC API and the ops HTTP endpoints ([`ops`]), reports the
//! bound addresses ([`report`]) and stops gracefully. Nothing depends back on it except the CLI, the tests
//! and the bench; clap parsing, client commands and rendering stay in the CLI.
//!
//! Each role has an `Options` struct (what every role shares is its [`role::Serving`]: listener, ops HTTP,
//! ready file, TLS, configuration) and an async `start` that returns once every listener is bound and the
//! bound addresses are reported, with a handle (for `dev` and `gateway` the same [`gateway::Handle`]) that
//! exposes those addresses and can be stopped
//! (`shutdown`), awaited (`wait`) or run until a signal (`run_until(`[`signal::shutdown_signal`]`())`).
//! Errors are [`NodeError`]s whose messages say what was wrong and how to fix it.

pub mod config;
pub mod dev;
mod error;
pub mod gateway;
mod journal;
pub mod ops;
mod reload;
pub mod report;
pub mod role;
mod running;
pub mod security;
pub mod signal;
pub mod telemetry;
pub mod tls;
pub mod worker;

pub use error::NodeError;
pub use journal::NatsOptions;
pub use turnstile_config::Config;

use std::sync::Arc;

use turnstile_cluster::{ClusterKv, ClusterRouter, ClusterRouterConfig, CommandRouter, GrpcTransport, WorkerTransport};
use turnstile_gateway::watch_buffer::BufferLimits;
use turnstile_gateway::{GatewayConfig, QuotaConfig, TenantQuota, TokenBudgets};
use turnstile_journal::UsageLedger;
use turnstile_worker::budget::Budgets;
use turnstile_worker::{Limits, WorkerConfig};

/// The driver settings of the configuration: `[limits]`, `[journal]` (agents are set by the role).
fn worker_config(config: &Config) -> WorkerConfig {
    WorkerConfig {
        limits: Limits {
            max_message_bytes: config.limits.max_message_bytes,
            max_pending: config.limits.max_pending,
            max_pending_bytes: config.limits.max_pending_bytes,
            dedup_horizon: config.journal.dedup_horizon,
            max_goal_rounds: config.limits.max_goal_rounds,
            // The journal's own limit, read by the host from its log.
            max_event_bytes: None,
        },
        default_when_idle_timeout: config.limits.when_idle_timeout(),
        snapshot_every: config.journal.snapshot_every,
        passivate_after: config.journal.passivate_after(),
        command_queue: config.limits.max_queued_commands,
        ..WorkerConfig::default()
    }
}

/// What the ops HTTP listener serves beside the probes: the web console with its gRPC-Web API (decision
/// 0029) and the agent protocols the configuration's `[protocols]` switches on (SPEC §19), all answered by
/// `gateway`'s service code.
fn http_routes(gateway: &turnstile_gateway::Gateway, config: &Config, auth_enabled: bool) -> axum::Router {
    let console = turnstile_gateway::console::router(gateway.clone(), auth_enabled);
    let agents = || turnstile_protocols::openai::Agents {
        names: config.agents.keys().cloned().collect(),
        default: config.default_agent.clone(),
        auth_enabled,
    };
    let openai = config.protocols.openai.then(agents);
    let agui = config.protocols.agui.then(agents);
    let profiles = turnstile_protocols::profiles::Profiles {
        list: config
            .agents
            .values()
            .map(|agent| turnstile_protocols::profiles::Profile {
                name: agent.name.clone(),
                description: match agent.description.as_str() {
                    "" => turnstile_protocols::profiles::default_description(&agent.name, &agent.model),
                    own => own.to_owned(),
                },
                tenants: agent.tenant_scope(),
            })
            .collect(),
        auth_enabled,
    };
    let protocols =
        turnstile_protocols::Protocols { openai, agui, mcp: config.protocols.mcp, a2a: config.protocols.a2a, profiles };
    console.merge(turnstile_protocols::router(gateway.clone(), protocols))
}

/// The gateway settings of the configuration: the `WhenIdle` default and the default agent.
fn gateway_config(config: &Config) -> GatewayConfig {
    GatewayConfig {
        when_idle_timeout: config.limits.when_idle_timeout(),
        default_agent: config.default_agent.clone(),
        max_request_bytes: config.limits.max_request_bytes(),
        max_message_bytes: config.limits.max_message_bytes,
        quotas: QuotaConfig {
            requests_per_minute: config.limits.tenant_requests_per_minute,
            request_burst: config.limits.tenant_request_burst,
            max_watches: config.limits.tenant_max_watches,
            tenants: config
                .tenants
                .iter()
                .map(|(name, t)| {
                    let quota = TenantQuota {
                        requests_per_s: t.requests_per_s,
                        request_burst: t.request_burst,
                        watch_limit: t.watch_limit,
                    };
                    (name.clone(), quota)
                })
                .collect(),
        },
        token_budgets: token_budgets(config),
        watch_buffers: BufferLimits {
            per_watcher: config.limits.watch_buffer_bytes,
            total: config.limits.watch_buffer_total_bytes,
        },
        approval_timeouts_ms: config
            .agents
            .iter()
            .filter_map(|(name, a)| Some((name.clone(), a.approval_timeout_ms?)))
            .collect(),
        allow_private_webhooks: config.webhooks.allow_private,
        ..GatewayConfig::default()
    }
}

/// The `[tenants.NAME] token_budget`s of the configuration, by tenant (SPEC §17).
fn token_budgets(config: &Config) -> TokenBudgets {
    config.tenants.iter().filter_map(|(name, t)| Some((name.clone(), t.token_budget?))).collect()
}

/// The budgets a worker checks before each model request, against the usage `ledger` reads; `None`
/// when no tenant has one.
fn budgets(config: &Config, ledger: Arc<dyn UsageLedger>) -> Option<Budgets> {
    let budgets = token_budgets(config);
    (!budgets.is_empty()).then(|| Budgets::new(budgets, ledger))
}

/// The agents, models and tools of the configuration, ready to run: the MCP servers the agents use are
/// started first (API keys and header values read from the environment).
/// Webhook POSTs of A2A task push configurations are rendered as A2A's (decision 0155).
async fn agents(loaded: &config::Loaded) -> Result<turnstile_agent::AgentSetup, NodeError> {
    let mut setup = turnstile_agent::setup::setup(&loaded.config)
        .await
        .map_err(|cause| NodeError::Agents { file: loaded.path.clone(), cause })?;
    setup.webhooks = turnstile_protocols::a2a::push::TaskPushes::wrap(setup.webhooks);
    Ok(setup)
}

/// The agents kept in `store` (SPEC §20): the file's imported as versions, followed as they change.
struct AgentDefinitions {
    directory: Arc<turnstile_agent::directory::Directory>,
    gateway: turnstile_gateway::agents::AgentDefinitions,
}

impl AgentDefinitions {
    /// The worker's agents, with the catalog following the store.
    fn agents(&self, setup: turnstile_agent::AgentSetup) -> turnstile_worker::agent::Agents {
        setup.versions.attach(self.directory.clone());
        let mut agents: turnstile_worker::agent::Agents = setup.into();
        agents.catalog = self.directory.catalogs();
        agents
    }
}

/// How long a starting node waits for a bucket it reads at start (the agent definitions, memory) to answer.
const STARTUP_STORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `attempt` until it succeeds, retrying while the journal is unavailable, for up to
/// [`STARTUP_STORE_PATIENCE`]: a bucket just created at R3 answers "no responders" (or its stream "not
/// found" on another server) until its stream has a leader, and a NATS node may be restarting, so a start-up
/// read waits as the other start-up reads do.
async fn while_unavailable<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, turnstile_journal::JournalError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, turnstile_journal::JournalError>>,
{
    let started = tokio::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(100);
    loop {
        match attempt().await {
            Err(turnstile_journal::JournalError::Unavailable(why)) if started.elapsed() < STARTUP_STORE_PATIENCE => {
                tracing::info!(%why, "{what} cannot be read yet; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

async fn agent_definitions(
    config: &Config,
    store: Arc<dyn turnstile_journal::AgentStore>,
) -> Result<AgentDefinitions, NodeError> {
    let config = Arc::new(config.clone());
    // Importing the file's agents again is a no-op for the unchanged ones, so a retried start is harmless.
    let directory = while_unavailable("the agent definitions", || {
        turnstile_agent::directory::Directory::start(
            config.clone(),
            store.clone(),
            Box::new(turnstile_agent::setup::profile_of),
        )
    })
    .await
    .map_err(NodeError::AgentStore)?;
    Ok(AgentDefinitions { directory, gateway: turnstile_gateway::agents::AgentDefinitions { store, config } })
}

/// The router to every session's owner over the shard map in `client`'s KV, dialing the workers with
/// `cluster_tls` when given: a gateway's, and a worker's for `spawn_agent`.
async fn cluster_router(
    client: &async_nats::Client,
    url: &str,
    config: &Config,
    cluster_tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<(Arc<dyn CommandRouter>, Arc<GrpcTransport>), NodeError> {
    let c = &config.cluster;
    // The workers' heartbeat TTL: whoever creates the workers bucket first sets its max age.
    let kv = ClusterKv::open(client, replicas(config), c.shards, c.worker_ttl())
        .await
        .map_err(|e| NodeError::membership(url, e))?;
    let router_config = ClusterRouterConfig { deadline: c.route_deadline(), ..ClusterRouterConfig::default() };
    // Kept by the caller too: a reload of the cluster TLS files swaps its config (decision 0159).
    let transport = Arc::new(match cluster_tls {
        Some(tls) => GrpcTransport::with_tls(router_config.connect_timeout, tls),
        None => GrpcTransport::new(router_config.connect_timeout),
    });
    let map = kv.watch_shards().await.map_err(|e| NodeError::membership(url, e))?;
    let router = ClusterRouter::with_transport(map, Arc::clone(&transport) as Arc<dyn WorkerTransport>, router_config);
    Ok((Arc::new(router), transport))
}

/// The memory limits of the configuration's `[memory]` (SPEC §20).
fn memory_limits(config: &Config) -> turnstile_journal::MemoryLimits {
    let m = &config.memory;
    turnstile_journal::MemoryLimits {
        max_document_bytes: m.max_document_bytes,
        max_documents_per_tenant: m.max_documents_per_tenant,
        max_bytes_per_tenant: m.max_bytes_per_tenant,
    }
}

/// Opens the memory bucket (SPEC §20) on `client`, waiting while it is unavailable (a new R3 bucket).
async fn kv_memory(
    client: &async_nats::Client,
    url: &str,
    config: &Config,
) -> Result<std::sync::Arc<dyn turnstile_journal::MemoryStore>, NodeError> {
    let limits = memory_limits(config);
    let store = while_unavailable("the memory bucket", || {
        turnstile_journal::jetstream::KvMemory::open(client, replicas(config), limits)
    })
    .await
    .map_err(|e| NodeError::nats(url, e))?;
    Ok(std::sync::Arc::new(store))
}

/// Replicas as the journal counts them; the configuration bounds them to 1..=5.
fn replicas(config: &Config) -> usize {
    usize::try_from(config.cluster.replicas).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_file_the_roles_run_on_their_old_defaults() {
        let config = Config::default();
        let worker = worker_config(&config);
        let old = WorkerConfig::default();
        assert_eq!(worker.limits, old.limits);
        assert_eq!(
            (worker.default_when_idle_timeout, worker.snapshot_every, worker.passivate_after),
            (old.default_when_idle_timeout, old.snapshot_every, old.passivate_after)
        );
        let gateway = gateway_config(&config);
        let old = GatewayConfig::default();
        assert_eq!((gateway.when_idle_timeout, &gateway.default_agent), (old.when_idle_timeout, &old.default_agent));
        assert_eq!(gateway.watch_buffers, old.watch_buffers);
        assert_eq!(replicas(&config), 1);
    }

    #[test]
    fn the_file_sets_limits_and_journal_settings() {
        let config = Config::from_toml_str(
            "default_agent = \"scripted\"\n[limits]\nmax_message_bytes = 64\nmax_pending = 3\nwhen_idle_timeout_ms = 5\n\
             [journal]\nsnapshot_every = 7\npassivate_after_ms = 9\ndedup_horizon = 20000\n",
        )
        .unwrap();
        let worker = worker_config(&config);
        assert_eq!(
            (worker.limits.max_message_bytes, worker.limits.max_pending, worker.limits.dedup_horizon),
            (64, 3, 20_000)
        );
        assert_eq!(worker.snapshot_every, 7);
        assert_eq!(worker.passivate_after, std::time::Duration::from_millis(9));
        assert_eq!(gateway_config(&config).when_idle_timeout, std::time::Duration::from_millis(5));
    }

    #[test]
    fn the_file_sets_pending_bytes_the_request_size_and_the_tenant_quotas() {
        let config = Config::from_toml_str(
            "[limits]\nmax_message_bytes = 64\nmax_pending_bytes = 100\ntenant_requests_per_minute = 600\n\
             tenant_request_burst = 50\ntenant_max_watches = 4\nwatch_buffer_bytes = 1000\n\
             watch_buffer_total_bytes = 5000\n",
        )
        .unwrap();
        assert_eq!(worker_config(&config).limits.max_pending_bytes, 100);
        let gateway = gateway_config(&config);
        assert_eq!(gateway.max_request_bytes, 100 + turnstile_config::REQUEST_ENVELOPE_BYTES);
        assert_eq!(
            gateway.quotas,
            QuotaConfig { requests_per_minute: 600, request_burst: 50, max_watches: 4, ..QuotaConfig::default() }
        );
        assert_eq!(gateway.watch_buffers, BufferLimits { per_watcher: 1000, total: 5000 });
    }
}
