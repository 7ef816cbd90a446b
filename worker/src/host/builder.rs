//! Putting a [`SessionHost`] together.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use turnstile_journal::snapshot::{NoSnapshots, SnapshotStore};
use turnstile_journal::{LiveBus, SessionLog};

use super::SessionHost;
use crate::agent::Agents;
use crate::budget::Budgets;
use crate::config::WorkerConfig;
use crate::deps::RunnerDeps;
use crate::ownership::Ownership;
use crate::seen::SeenSessions;

/// Puts a [`SessionHost`] together: [`SessionHost::builder`], then the optional parts, then
/// [`SessionHostBuilder::build`].
pub struct SessionHostBuilder {
    deps: RunnerDeps,
}

impl SessionHostBuilder {
    /// Loads and writes snapshots in `snapshots` (default: none, every load folds the whole log).
    pub fn snapshots(mut self, snapshots: Arc<dyn SnapshotStore>) -> Self {
        self.deps.snapshots = snapshots;
        self
    }

    /// Takes commands only for the sessions `ownership` grants (the shard leases of a cluster worker).
    /// Default: this host owns every session at `config.epoch`, as in `turnstile dev`.
    pub fn ownership(mut self, ownership: Arc<dyn Ownership>) -> Self {
        self.deps.ownership = Some(ownership);
        self
    }

    /// Checks `budgets` before each model request (SPEC §17; default: no budgets).
    pub fn budgets(mut self, budgets: Budgets) -> Self {
        self.deps.budgets = (!budgets.is_empty()).then_some(budgets);
        self
    }

    /// Keeps the session index in `index` (default: an index of its own in memory).
    pub fn index(mut self, index: Arc<dyn turnstile_journal::SessionIndex>) -> Self {
        self.deps.index = index;
        self
    }

    /// Keeps webhook positions in `positions` (default: in memory).
    pub fn webhook_positions(mut self, positions: Arc<dyn turnstile_journal::WebhookPositions>) -> Self {
        self.deps.webhook_positions = positions;
        self
    }

    /// Delivers the webhooks tenants register in `registry` (SPEC §21; default: an empty one in memory).
    pub fn webhook_registry(mut self, registry: Arc<dyn turnstile_journal::WebhookRegistry>) -> Self {
        self.deps.webhook_registry = registry;
        self
    }

    /// Driver and host settings (default: [`WorkerConfig::default`]).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.deps.config = config;
        self
    }

    pub fn build(mut self) -> Arc<SessionHost> {
        let d = &self.deps;
        let webhooks = crate::webhooks::Webhooks::new(
            d.agents.webhooks.clone(),
            d.webhook_positions.clone(),
            d.log.clone(),
            d.ownership.clone(),
        )
        .with_registry(d.webhook_registry.clone());
        self.deps.webhooks = Some(Arc::new(webhooks));
        Arc::new_cyclic(|me| SessionHost {
            deps: Arc::new(self.deps),
            table: Arc::default(),
            next_runner: AtomicU64::new(1),
            sweeping: AtomicBool::new(false),
            waking: AtomicBool::new(false),
            me: me.clone(),
            seen: SeenSessions::default(),
        })
    }
}

impl SessionHost {
    /// A host over the journal's `log` and `bus`, running `agents` (`turnstile_agent::AgentSetup` makes
    /// them from a configuration; its default is the scripted agent alone).
    pub fn builder(log: Arc<dyn SessionLog>, bus: Arc<dyn LiveBus>, agents: Agents) -> SessionHostBuilder {
        SessionHostBuilder {
            deps: RunnerDeps {
                log,
                bus,
                agents,
                snapshots: Arc::new(NoSnapshots),
                ownership: None,
                config: WorkerConfig::default(),
                budgets: None,
                wakes: Arc::default(),
                index: Arc::new(turnstile_journal::MemoryIndex::default()),
                webhook_positions: Arc::new(turnstile_journal::MemoryPositions::default()),
                webhook_registry: Arc::new(turnstile_journal::MemoryWebhooks::default()),
                webhooks: None,
            },
        }
    }
}
