//! Webhooks (SPEC §15, decision 0068): the owner of a session POSTs its durable events of the types an
//! agent's webhook lists, in seq order, at least once, across restarts and failover.
//!
//! One delivery task per (session, webhook), started when the session's runner writes (or when a new owner
//! scans the shard it took): it reads the log after the webhook's durable position
//! ([`WebhookPositions`]), sends each matching event through the [`WebhookSender`] seam (the HTTP client is
//! `turnstile-agent`'s: this crate has none), retries a failure with exponential backoff and jitter until
//! the event is `max_age` old (then it is given up on: logged and counted), and saves the position after
//! each event it dealt with. The task ends once it has caught up and nothing new came for a while, or when
//! this worker no longer owns the session (its new owner's task goes on from the saved position; an event
//! both may send is a duplicate the receiver drops by `Turnstile-Delivery`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use turnstile_journal::{SessionLog, WebhookPositions};
use turnstile_model::{Envelope, SessionRef, TenantScope};

use crate::ownership::Ownership;
use crate::sync::lock;

/// One webhook of an agent, as the configuration resolved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookTarget {
    /// Stable and key-safe (hex), naming the webhook's position: a digest of its URL and event types.
    pub id: String,
    pub url: String,
    /// The durable types delivered.
    pub events: Vec<String>,
    /// How long an event is retried before it is given up on.
    pub max_age: Duration,
    /// The tenants whose sessions' events it receives (decision 0091): never another's, whatever agent
    /// such a session names.
    pub tenants: TenantScope,
}

/// Why one POST did not deliver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SendError(pub String);

/// Sends webhook POSTs: the seam `turnstile-agent` implements with its HTTP client.
#[async_trait]
pub trait WebhookSender: Send + Sync + 'static {
    /// The webhooks of the sessions running `agent` (none for most agents).
    fn webhooks(&self, agent: &str) -> Vec<Arc<WebhookTarget>>;
    /// POSTs `event` to `hook`; `Ok` once the receiver answered 2xx.
    async fn send(&self, hook: &WebhookTarget, event: &Envelope) -> Result<(), SendError>;
}

/// No webhooks (the default of a host built without a sender).
#[derive(Debug, Default)]
pub struct NoWebhooks;

#[async_trait]
impl WebhookSender for NoWebhooks {
    fn webhooks(&self, _agent: &str) -> Vec<Arc<WebhookTarget>> {
        Vec::new()
    }

    async fn send(&self, _hook: &WebhookTarget, _event: &Envelope) -> Result<(), SendError> {
        Err(SendError("no webhook sender is configured".into()))
    }
}

/// First pause after a failed POST; doubled (with jitter) up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Events read from the log at once.
const PAGE: usize = 256;
/// A caught-up task waits this long for news before it ends (a later write starts another).
const IDLE_END: Duration = Duration::from_secs(30);

/// The running delivery tasks, by (session, webhook id), with the last seq each was told of.
type Tasks = Mutex<HashMap<(SessionRef, String), watch::Sender<u64>>>;

/// The delivery tasks of one host.
pub(crate) struct Webhooks {
    sender: Arc<dyn WebhookSender>,
    positions: Arc<dyn WebhookPositions>,
    log: Arc<dyn SessionLog>,
    ownership: Option<Arc<dyn Ownership>>,
    /// The last seq each running task was told of, by (session, webhook id).
    tasks: Arc<Tasks>,
}

impl Webhooks {
    pub(crate) fn new(
        sender: Arc<dyn WebhookSender>,
        positions: Arc<dyn WebhookPositions>,
        log: Arc<dyn SessionLog>,
        ownership: Option<Arc<dyn Ownership>>,
    ) -> Self {
        Self { sender, positions, log, ownership, tasks: Arc::default() }
    }

    /// `session` (running `agent`, written under `epoch`) has events through `last_seq`: each of the agent's
    /// webhooks that serves the session's tenant delivers what it has not dealt with yet. Cheap when the
    /// agent has none. This is the one place a delivery starts, so the tenant check here is the one that
    /// keeps a tenant's events from another tenant's receiver.
    pub(crate) fn notify(&self, session: &SessionRef, agent: &str, epoch: u64, last_seq: u64) {
        for hook in self.sender.webhooks(agent) {
            if !hook.tenants.allows(&session.tenant) {
                continue;
            }
            let key = (session.clone(), hook.id.clone());
            let mut tasks = lock(&self.tasks);
            if let Some(tx) = tasks.get(&key)
                && tx.send(last_seq).is_ok()
            {
                continue;
            }
            let (tx, rx) = watch::channel(last_seq);
            tasks.insert(key.clone(), tx);
            let task = Delivery {
                session: session.clone(),
                hook,
                epoch,
                sender: self.sender.clone(),
                positions: self.positions.clone(),
                log: self.log.clone(),
                ownership: self.ownership.clone(),
            };
            let registry = Arc::downgrade(&self.tasks);
            tokio::spawn(async move {
                task.run(rx).await;
                if let Some(tasks) = registry.upgrade() {
                    let mut tasks = lock(&tasks);
                    // Only this task's entry: a newer one may have replaced it.
                    if tasks.get(&key).is_some_and(|tx| tx.is_closed()) {
                        tasks.remove(&key);
                    }
                }
            });
        }
    }

    /// A deleted session's positions go with it.
    pub(crate) async fn forget(&self, session: &SessionRef, agent: &str) {
        let hooks: Vec<String> = self.sender.webhooks(agent).iter().map(|h| h.id.clone()).collect();
        if hooks.is_empty() {
            return;
        }
        if let Err(e) = self.positions.delete(session, &hooks).await {
            tracing::warn!(%session, error = %e, "webhook positions of a deleted session not removed");
        }
    }
}

/// One (session, webhook) delivery task.
struct Delivery {
    session: SessionRef,
    hook: Arc<WebhookTarget>,
    epoch: u64,
    sender: Arc<dyn WebhookSender>,
    positions: Arc<dyn WebhookPositions>,
    log: Arc<dyn SessionLog>,
    ownership: Option<Arc<dyn Ownership>>,
}

impl Delivery {
    fn owned(&self) -> bool {
        self.ownership.as_ref().is_none_or(|o| o.may_write(&self.session, self.epoch))
    }

    async fn run(self, mut latest: watch::Receiver<u64>) {
        let Some(mut position) =
            self.retry_io("load the position", || self.positions.load(&self.session, &self.hook.id)).await
        else {
            return;
        };
        loop {
            if !self.owned() {
                return;
            }
            let target = *latest.borrow_and_update();
            if position >= target {
                match tokio::time::timeout(IDLE_END, latest.changed()).await {
                    Ok(Ok(())) => continue,
                    // Nothing new for a while, or the host is gone: a later write starts another task.
                    _ => return,
                }
            }
            let Some(page) = self.retry_io("read the log", || self.log.read(&self.session, position + 1, PAGE)).await
            else {
                return;
            };
            if page.is_empty() {
                // The log ends before what we were told (it was deleted): nothing left to send.
                return;
            }
            for event in &page {
                if self.hook.events.iter().any(|t| t == event.event_type()) {
                    if !self.deliver(event).await {
                        return;
                    }
                    position = event.seq;
                    if self
                        .retry_io("save the position", || self.positions.save(&self.session, &self.hook.id, position))
                        .await
                        .is_none()
                    {
                        return;
                    }
                } else {
                    position = event.seq;
                }
            }
            // Events of other types only move the position; it is saved with the next delivery, or here.
            let _ = self.positions.save(&self.session, &self.hook.id, position).await;
        }
    }

    /// Sends `event` until the receiver takes it or it is `max_age` old. False when this worker no longer
    /// owns the session (the new owner goes on).
    async fn deliver(&self, event: &Envelope) -> bool {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0u32;
        loop {
            if !self.owned() {
                return false;
            }
            attempt += 1;
            match self.sender.send(&self.hook, event).await {
                Ok(()) => {
                    metrics::counter!(turnstile_ops::names::WEBHOOK_DELIVERIES, "outcome" => "delivered").increment(1);
                    return true;
                }
                Err(e) => {
                    metrics::counter!(turnstile_ops::names::WEBHOOK_DELIVERIES, "outcome" => "failed").increment(1);
                    let age = turnstile_ops::clock::now_ms().saturating_sub(event.time_ms);
                    if Duration::from_millis(age) >= self.hook.max_age {
                        metrics::counter!(turnstile_ops::names::WEBHOOK_GIVEN_UP).increment(1);
                        tracing::error!(session = %self.session, seq = event.seq, url = %self.hook.url, attempt,
                            error = %e, "webhook delivery given up: the event is older than max_age_ms");
                        return true;
                    }
                    tracing::warn!(session = %self.session, seq = event.seq, url = %self.hook.url, attempt,
                        error = %e, retry_in_ms = backoff.as_millis() as u64, "webhook delivery failed; retrying");
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Runs a journal call until it succeeds (backing off) or this worker no longer owns the session.
    async fn retry_io<T, F, Fut>(&self, what: &str, mut call: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, turnstile_journal::JournalError>>,
    {
        let mut backoff = FIRST_BACKOFF;
        loop {
            match call().await {
                Ok(value) => return Some(value),
                Err(e) => {
                    tracing::warn!(session = %self.session, error = %e, "webhook delivery could not {what}; retrying");
                    if !self.owned() {
                        return None;
                    }
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// `pause` scaled by a random factor in [0.5, 1.5): retries of many sessions do not line up.
fn jitter(pause: Duration) -> Duration {
    pause.mul_f64(0.5 + fastrand::f64())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use turnstile_journal::embedded::EmbeddedLog;
    use turnstile_journal::webhook::MemoryPositions;
    use turnstile_model::Tenant;

    use super::*;

    /// Two webhooks of one agent: one for tenant `a` only, one for every tenant. Nothing is ever sent.
    struct TwoHooks(Vec<Arc<WebhookTarget>>);

    #[async_trait]
    impl WebhookSender for TwoHooks {
        fn webhooks(&self, _agent: &str) -> Vec<Arc<WebhookTarget>> {
            self.0.clone()
        }

        async fn send(&self, _hook: &WebhookTarget, _event: &Envelope) -> Result<(), SendError> {
            Err(SendError("not in this test".into()))
        }
    }

    fn hook(id: &str, tenants: TenantScope) -> Arc<WebhookTarget> {
        Arc::new(WebhookTarget {
            id: id.into(),
            url: format!("http://127.0.0.1:9/{id}"),
            events: vec!["turn/end".into()],
            max_age: Duration::from_secs(1),
            tenants,
        })
    }

    /// Decision 0091: a webhook confined to tenant `a` gets no delivery task for a session of `b` (so no
    /// POST can ever carry `b`'s events there); the one for every tenant gets one.
    #[tokio::test]
    async fn a_session_starts_deliveries_only_to_the_webhooks_of_its_tenant() {
        let only_a = hook("only-a", TenantScope::only([Tenant::new("a").unwrap()]));
        let every = hook("every", TenantScope::All);
        let webhooks = Webhooks::new(
            Arc::new(TwoHooks(vec![only_a, every])),
            Arc::new(MemoryPositions::default()),
            Arc::new(EmbeddedLog::in_memory()),
            None,
        );
        let started = |session: &SessionRef| -> Vec<String> {
            let mut ids: Vec<String> =
                lock(&webhooks.tasks).keys().filter(|(s, _)| s == session).map(|(_, id)| id.clone()).collect();
            ids.sort();
            ids
        };
        let b = SessionRef::new("b", "s").unwrap();
        webhooks.notify(&b, "shared", 1, 3);
        assert_eq!(started(&b), ["every"]);
        let a = SessionRef::new("a", "s").unwrap();
        webhooks.notify(&a, "shared", 1, 3);
        assert_eq!(started(&a), ["every", "only-a"]);
    }
}
