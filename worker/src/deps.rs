//! [`RunnerDeps`]: what every runner of a host shares.

use std::sync::Arc;

use turnstile_driver::Driver;
use turnstile_journal::snapshot::SnapshotStore;
use turnstile_journal::{IndexEntry, LiveBus, SessionIndex, SessionLog};
use turnstile_model::SessionState;

use crate::agent::Agents;
use crate::budget::Budgets;
use crate::config::WorkerConfig;
use crate::ownership::Ownership;

/// Everything a runner needs besides its session.
pub(crate) struct RunnerDeps {
    pub log: Arc<dyn SessionLog>,
    pub bus: Arc<dyn LiveBus>,
    /// The agents' catalog, and what answers their pre-step, model and tool effects.
    pub agents: Agents,
    pub snapshots: Arc<dyn SnapshotStore>,
    /// Shard ownership in a cluster; `None` in `turnstile dev`, which owns everything at its epoch.
    pub ownership: Option<Arc<dyn Ownership>>,
    pub config: WorkerConfig,
    /// Tenants' daily token budgets, checked before each model request (SPEC §17); `None`: no budgets.
    pub budgets: Option<Budgets>,
    /// When the unloaded sessions with a schedule must be loaded again (SPEC §15).
    pub wakes: Arc<crate::wakes::Wakes>,
    /// The session index `ListSessions` reads (SPEC §16): each runner submits its session's entry.
    pub index: Arc<dyn SessionIndex>,
    /// Where each webhook stands in each session (SPEC §15); the delivery tasks are built from it at
    /// [`crate::SessionHostBuilder::build`].
    pub webhook_positions: Arc<dyn turnstile_journal::WebhookPositions>,
    /// The webhooks tenants registered at run time (SPEC §21; default: none, in memory).
    pub webhook_registry: Arc<dyn turnstile_journal::WebhookRegistry>,
    /// The webhook delivery tasks (set by the builder).
    pub webhooks: Option<Arc<crate::webhooks::Webhooks>>,
}

impl RunnerDeps {
    /// The agent `state` runs (the configured one, else the default).
    pub(crate) fn agent_of(&self, state: &SessionState) -> String {
        self.agents.catalog.current().resolve(state.agent.as_deref(), &state.session.tenant).0.to_owned()
    }

    /// Tells the session's webhooks (its agent's and its tenant's, if any) that its log goes through
    /// `state.last_seq`.
    pub(crate) fn notify_webhooks(&self, state: &SessionState, epoch: u64) {
        if let Some(webhooks) = &self.webhooks
            && state.exists()
        {
            webhooks.notify(state, &self.agent_of(state), epoch);
        }
    }

    /// The index entry of the fold `state`, with the agent resolved as readers report it.
    pub(crate) fn index_entry(&self, state: &SessionState) -> IndexEntry {
        let agent = self.agent_of(state);
        IndexEntry::of(state, turnstile_model::SessionSummary::of(state, String::new(), agent))
    }

    /// A driver for the fold `state` of a session, writing under `epoch`. Its largest event is the
    /// journal's (read now: a reconnected NATS client may know another server's `max_payload`) unless the
    /// configuration set one.
    pub(crate) fn driver(&self, state: SessionState, epoch: u64) -> Driver {
        let mut limits = self.config.limits.clone();
        limits.max_event_bytes = limits.max_event_bytes.or_else(|| self.log.max_event_bytes());
        Driver::new(state, limits, self.agents.catalog.current(), epoch, self.config.owner_id.clone())
    }
}
