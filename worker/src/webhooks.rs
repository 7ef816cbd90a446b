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
//!
//! Two kinds of webhook feed it: an agent's, from the configuration (through the sender), and a tenant's,
//! registered at run time (`CreateWebhook`, SPEC §21) and read from the [`WebhookRegistry`]'s mirror. A
//! registered one serves only its tenant's sessions whose labels match its selector when they write,
//! delivers only events written after its creation, and stops once it is deleted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use turnstile_journal::{MemoryWebhooks, RegisteredWebhook, SessionLog, TaskPush, WebhookPositions, WebhookRegistry};
use turnstile_model::{Envelope, Secret, Selector, SessionRef, SessionState, Tenant, TenantScope};

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
    /// Events written before this time (Unix ms) are not delivered: 0 for an agent's webhook, the creation
    /// time of a registered one.
    pub not_before_ms: u64,
    /// The `Turnstile-Signature` key of a registered webhook (an agent's comes from the sender's
    /// configuration).
    pub signing_key: Option<Secret>,
    /// Registered at run time by a tenant (SPEC §21): its URL is held to the egress rule on every POST, and
    /// its deliveries stop once it is deleted.
    pub registered: bool,
    /// The task whose push notifications this registered webhook carries (A2A, SPEC §19): it serves that
    /// session alone, a layer above renders its bodies ([`WebhookSender::send_task`]), and it is removed once
    /// the task has ended.
    pub task: Option<TaskPush>,
}

impl WebhookTarget {
    /// The target of webhook `hook` a tenant registered.
    pub fn registered(hook: &RegisteredWebhook, tenant: Tenant) -> Self {
        Self {
            id: hook.id.clone(),
            url: hook.url.clone(),
            events: hook.events.clone(),
            max_age: Duration::from_millis(hook.max_age_ms),
            tenants: TenantScope::only([tenant]),
            not_before_ms: hook.created_unix_ms,
            // A task's push configuration may have no token: its POSTs are then unsigned.
            signing_key: (!hook.secret.is_empty()).then(|| hook.secret.clone()),
            registered: true,
            task: hook.task.clone(),
        }
    }
}

/// Why one POST did not deliver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SendError(pub String);

/// A POST whose body a layer above rendered (an A2A push notification): sent like every webhook POST
/// (signed with the hook's key, held to the egress rule), with these headers besides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Post {
    /// `Turnstile-Delivery`: what a receiver deduplicates by.
    pub delivery: String,
    pub body: Vec<u8>,
    /// Further headers, such as the protocol's own token.
    pub headers: Vec<(String, String)>,
}

/// What sending one event of a task's webhook came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskSent {
    /// Delivered (or nothing of the task to send); the task goes on.
    Delivered,
    /// Delivered, and the task has ended: the webhook has nothing more to send and is removed.
    Ended,
}

/// Sends webhook POSTs: the seam `turnstile-agent` implements with its HTTP client.
#[async_trait]
pub trait WebhookSender: Send + Sync + 'static {
    /// The webhooks of the sessions running `agent` (none for most agents).
    fn webhooks(&self, agent: &str) -> Vec<Arc<WebhookTarget>>;
    /// POSTs `event` to `hook`; `Ok` once the receiver answered 2xx.
    async fn send(&self, hook: &WebhookTarget, event: &Envelope) -> Result<(), SendError>;
    /// POSTs a rendered body to `hook`; `Ok` once the receiver answered 2xx.
    async fn post(&self, _hook: &WebhookTarget, _post: Post) -> Result<(), SendError> {
        Err(SendError("this webhook sender cannot POST rendered bodies".into()))
    }
    /// Sends `event` to the webhook of a task (`hook.task` is set), whose body depends on the task's events
    /// before it (read from `log`). The default sends the event as any webhook's.
    async fn send_task(
        &self,
        hook: &WebhookTarget,
        _log: &dyn SessionLog,
        event: &Envelope,
    ) -> Result<TaskSent, SendError> {
        self.send(hook, event).await.map(|()| TaskSent::Delivered)
    }
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
    /// The webhooks tenants registered (SPEC §21).
    registry: Arc<dyn WebhookRegistry>,
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
        let registry = Arc::new(MemoryWebhooks::default());
        Self { sender, registry, positions, log, ownership, tasks: Arc::default() }
    }

    /// Also delivers the webhooks tenants registered in `registry`.
    pub(crate) fn with_registry(mut self, registry: Arc<dyn WebhookRegistry>) -> Self {
        self.registry = registry;
        self
    }

    /// The session of `state` (running `agent`, written under `epoch`) has events through its last seq:
    /// each of the agent's webhooks that serves the session's tenant, and each webhook its tenant
    /// registered whose selector matches its labels, delivers what it has not dealt with yet. Cheap when
    /// there are none. This is the one place a delivery starts, so the tenant checks here are the ones that
    /// keep a tenant's events from another tenant's receiver.
    pub(crate) fn notify(&self, state: &SessionState, agent: &str, epoch: u64) {
        let session = &state.session;
        for hook in self.sender.webhooks(agent) {
            if hook.tenants.allows(&session.tenant) {
                self.start_or_tell(session, epoch, state.last_seq, &hook.id.clone(), || hook);
            }
        }
        for hook in self.registry.of_tenant(&session.tenant) {
            if hook.tenant != session.tenant.as_str() || !selects(&hook, state) {
                continue;
            }
            if hook.task.as_ref().is_some_and(|task| task.session != session.id) {
                continue;
            }
            let Ok(tenant) = Tenant::new(hook.tenant.clone()) else { continue };
            self.start_or_tell(session, epoch, state.last_seq, &hook.id, || {
                Arc::new(WebhookTarget::registered(&hook, tenant))
            });
        }
    }

    /// Tells the running task of (`session`, webhook `id`) that the log goes through `last_seq`, or starts
    /// one for the webhook `target` makes.
    fn start_or_tell(
        &self,
        session: &SessionRef,
        epoch: u64,
        last_seq: u64,
        id: &str,
        target: impl FnOnce() -> Arc<WebhookTarget>,
    ) {
        let key = (session.clone(), id.to_owned());
        let mut tasks = lock(&self.tasks);
        if let Some(tx) = tasks.get(&key)
            && tx.send(last_seq).is_ok()
        {
            return;
        }
        let (tx, rx) = watch::channel(last_seq);
        tasks.insert(key.clone(), tx);
        let task = Delivery {
            session: session.clone(),
            hook: target(),
            epoch,
            sender: self.sender.clone(),
            registry: self.registry.clone(),
            positions: self.positions.clone(),
            log: self.log.clone(),
            ownership: self.ownership.clone(),
        };
        let running = Arc::downgrade(&self.tasks);
        tokio::spawn(async move {
            task.run(rx).await;
            if let Some(tasks) = running.upgrade() {
                let mut tasks = lock(&tasks);
                // Only this task's entry: a newer one may have replaced it.
                if tasks.get(&key).is_some_and(|tx| tx.is_closed()) {
                    tasks.remove(&key);
                }
            }
        });
    }

    /// A deleted session's positions go with it.
    pub(crate) async fn forget(&self, session: &SessionRef, agent: &str) {
        let configured = self.sender.webhooks(agent).into_iter().map(|h| h.id.clone());
        let registered = self.registry.of_tenant(&session.tenant).into_iter().map(|h| h.id.clone());
        let hooks: Vec<String> = configured.chain(registered).collect();
        if hooks.is_empty() {
            return;
        }
        if let Err(e) = self.positions.delete(session, &hooks).await {
            tracing::warn!(%session, error = %e, "webhook positions of a deleted session not removed");
        }
    }
}

/// Whether the labels of `state` match the selector of the registered `hook` (checked when it was created;
/// one that no longer parses serves nothing).
fn selects(hook: &RegisteredWebhook, state: &SessionState) -> bool {
    match Selector::parse(&hook.label_selector) {
        Ok(selector) => selector.matches(&state.labels),
        Err(e) => {
            tracing::warn!(webhook = %hook.id, error = %e, "registered webhook's label_selector does not parse; skipped");
            false
        }
    }
}

/// One (session, webhook) delivery task.
struct Delivery {
    session: SessionRef,
    hook: Arc<WebhookTarget>,
    epoch: u64,
    sender: Arc<dyn WebhookSender>,
    registry: Arc<dyn WebhookRegistry>,
    positions: Arc<dyn WebhookPositions>,
    log: Arc<dyn SessionLog>,
    ownership: Option<Arc<dyn Ownership>>,
}

impl Delivery {
    /// Whether this worker still owns the session and the webhook still exists (a deleted registered
    /// webhook gets no further POST).
    fn active(&self) -> bool {
        self.ownership.as_ref().is_none_or(|o| o.may_write(&self.session, self.epoch))
            && (!self.hook.registered
                || self.registry.of_tenant(&self.session.tenant).iter().any(|h| h.id == self.hook.id))
    }

    async fn run(self, mut latest: watch::Receiver<u64>) {
        let Some(mut position) =
            self.retry_io("load the position", || self.positions.load(&self.session, &self.hook.id)).await
        else {
            return;
        };
        loop {
            if !self.active() {
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
                if self.wanted(event) {
                    match self.deliver(event).await {
                        Dealt::Delivered => {}
                        Dealt::Lost => return,
                        Dealt::TaskEnded => {
                            self.retire().await;
                            return;
                        }
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

    /// Whether `event` is one this webhook delivers: of its types, written after its creation (and for a
    /// task's webhook, from the task's delivery on, and its end whenever it was written: a configuration made
    /// as its task ended still tells the receiver so, and is then removed).
    fn wanted(&self, event: &Envelope) -> bool {
        let of_type = self.hook.events.iter().any(|t| t == event.event_type());
        match &self.hook.task {
            None => of_type && event.time_ms >= self.hook.not_before_ms,
            Some(task) => {
                of_type
                    && event.seq >= task.from_seq
                    && (event.time_ms >= self.hook.not_before_ms || event.event_type() == "turn/end")
            }
        }
    }

    /// A task's webhook whose task ended is removed: nothing more can follow (decision 0155).
    async fn retire(&self) {
        let Some(task) = &self.hook.task else { return };
        match self.registry.delete(&self.session.tenant, &self.hook.id).await {
            Ok(_) => tracing::debug!(session = %self.session, webhook = %self.hook.id, config = %task.config_id,
                "task push configuration removed: its task ended"),
            Err(e) => tracing::warn!(session = %self.session, webhook = %self.hook.id, error = %e,
                "task push configuration of an ended task not removed"),
        }
    }

    /// Sends `event` until the receiver takes it or it is `max_age` old.
    async fn deliver(&self, event: &Envelope) -> Dealt {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0u32;
        loop {
            if !self.active() {
                return Dealt::Lost;
            }
            attempt += 1;
            let sent = match &self.hook.task {
                None => self.sender.send(&self.hook, event).await.map(|()| TaskSent::Delivered),
                Some(_) => self.sender.send_task(&self.hook, self.log.as_ref(), event).await,
            };
            match sent {
                Ok(sent) => {
                    metrics::counter!(turnstile_ops::names::WEBHOOK_DELIVERIES, "outcome" => "delivered").increment(1);
                    return match sent {
                        TaskSent::Delivered => Dealt::Delivered,
                        TaskSent::Ended => Dealt::TaskEnded,
                    };
                }
                Err(e) => {
                    metrics::counter!(turnstile_ops::names::WEBHOOK_DELIVERIES, "outcome" => "failed").increment(1);
                    let age = turnstile_ops::clock::now_ms().saturating_sub(event.time_ms);
                    if Duration::from_millis(age) >= self.hook.max_age {
                        metrics::counter!(turnstile_ops::names::WEBHOOK_GIVEN_UP).increment(1);
                        tracing::error!(session = %self.session, seq = event.seq, url = %self.hook.url, attempt,
                            error = %e, "webhook delivery given up: the event is older than max_age_ms");
                        return Dealt::Delivered;
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
                    if !self.active() {
                        return None;
                    }
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// What became of one event.
enum Dealt {
    /// Delivered, or given up on: the position moves past it.
    Delivered,
    /// This worker no longer owns the session (its new owner goes on), or the webhook was deleted.
    Lost,
    /// Delivered, and it ended the task of a task's webhook.
    TaskEnded,
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
            not_before_ms: 0,
            signing_key: None,
            registered: false,
            task: None,
        })
    }

    /// Decision 0091: a webhook confined to tenant `a` gets no delivery task for a session of `b` (so no
    /// POST can ever carry `b`'s events there); the one for every tenant gets one.
    #[tokio::test]
    async fn a_session_starts_deliveries_only_to_the_webhooks_of_its_tenant() {
        let only_a = hook("only-a", TenantScope::only([Tenant::new("a").unwrap()]));
        let every = hook("every", TenantScope::All);
        let webhooks = webhooks_of(vec![only_a, every]);
        let b = SessionRef::new("b", "s").unwrap();
        webhooks.notify(&state(&b, &[]), "shared", 1);
        assert_eq!(started(&webhooks, &b), ["every"]);
        let a = SessionRef::new("a", "s").unwrap();
        webhooks.notify(&state(&a, &[]), "shared", 1);
        assert_eq!(started(&webhooks, &a), ["every", "only-a"]);
    }

    /// Webhooks of `hooks` (the configured ones), positions and log in memory.
    fn webhooks_of(hooks: Vec<Arc<WebhookTarget>>) -> Webhooks {
        Webhooks::new(
            Arc::new(TwoHooks(hooks)),
            Arc::new(MemoryPositions::default()),
            Arc::new(EmbeddedLog::in_memory()),
            None,
        )
    }

    /// The ids of the webhooks whose deliveries `webhooks` started for `session`, sorted.
    fn started(webhooks: &Webhooks, session: &SessionRef) -> Vec<String> {
        let mut ids: Vec<String> =
            lock(&webhooks.tasks).keys().filter(|(s, _)| s == session).map(|(_, id)| id.clone()).collect();
        ids.sort();
        ids
    }

    /// The fold of a session with events through seq 3 and `labels`.
    fn state(session: &SessionRef, labels: &[(&str, &str)]) -> SessionState {
        let mut state = SessionState::new(session.clone(), 16);
        state.last_seq = 3;
        state.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        state
    }

    fn registered(tenant: &str, id: &str, label_selector: &str) -> RegisteredWebhook {
        RegisteredWebhook {
            tenant: tenant.into(),
            id: id.into(),
            url: format!("http://127.0.0.1:9/{id}"),
            events: vec!["turn/end".into()],
            label_selector: label_selector.into(),
            max_age_ms: 1000,
            created_unix_ms: 0,
            secret: Secret::new("k"),
            task: None,
        }
    }

    /// SPEC §21: a webhook a tenant registered serves only that tenant's sessions whose labels match its
    /// selector; another tenant's session of the same agent starts no delivery to it.
    #[tokio::test]
    async fn a_registered_webhook_starts_deliveries_only_for_its_tenants_matching_sessions() {
        let registry = Arc::new(MemoryWebhooks::default());
        registry.insert(registered("a", "wh_all", ""));
        registry.insert(registered("a", "wh_blue", "team=blue"));
        registry.insert(registered("b", "wh_b", ""));
        let webhooks = webhooks_of(Vec::new()).with_registry(registry);
        let red = SessionRef::new("a", "red").unwrap();
        webhooks.notify(&state(&red, &[("team", "red")]), "scripted", 1);
        assert_eq!(started(&webhooks, &red), ["wh_all"]);
        let blue = SessionRef::new("a", "blue").unwrap();
        webhooks.notify(&state(&blue, &[("team", "blue")]), "scripted", 1);
        assert_eq!(started(&webhooks, &blue), ["wh_all", "wh_blue"]);
        let other = SessionRef::new("b", "blue").unwrap();
        webhooks.notify(&state(&other, &[("team", "blue")]), "scripted", 1);
        assert_eq!(started(&webhooks, &other), ["wh_b"], "tenant b's session reaches only b's webhook");
    }

    /// A task's push configuration (decision 0155) serves its own session only, even within its tenant.
    #[tokio::test]
    async fn a_task_push_starts_deliveries_only_for_its_session() {
        let registry = Arc::new(MemoryWebhooks::default());
        let mut push = registered("a", "wh_task", "");
        push.task = Some(TaskPush {
            session: "mine".into(),
            message_id: "a2a-m".into(),
            from_seq: 1,
            config_id: "c".into(),
            auth_scheme: String::new(),
            auth_credentials: Secret::default(),
        });
        registry.insert(push);
        let webhooks = webhooks_of(Vec::new()).with_registry(registry);
        let started = |session: &SessionRef| lock(&webhooks.tasks).keys().filter(|(s, _)| s == session).count();
        let other = SessionRef::new("a", "other").unwrap();
        webhooks.notify(&state(&other, &[]), "scripted", 1);
        assert_eq!(started(&other), 0);
        let mine = SessionRef::new("a", "mine").unwrap();
        webhooks.notify(&state(&mine, &[]), "scripted", 1);
        assert_eq!(started(&mine), 1);
    }
}
