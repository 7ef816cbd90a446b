//! A2A push notifications (SPEC §19, decision 0155): a task's push configurations are webhooks of the
//! tenant's registry (SPEC §21) that serve that one task, so they are stored durably, held to the same
//! egress rule and delivered by the session's owner like any webhook: in seq order, retried, across
//! restarts and failover. This module has the four methods that manage them and the
//! [`TaskPushes`] sender, which renders each POST as A2A's `StreamResponse` (the body the `a2a-sdk`'s own
//! server sends) from the task's events in the log.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use turnstile_gateway::webhooks::TaskPushRequest;
use turnstile_journal::{RegisteredWebhook, SessionLog};
use turnstile_model::{Envelope, Secret};
use turnstile_proto::v1 as pb;
use turnstile_worker::webhooks::{Post, SendError, TaskSent, WebhookSender, WebhookTarget};

use super::call::{Call, read};
use super::rpc::{self, RpcError, code};
use super::task;
use crate::ids::TaskId;
use crate::turn::TurnFold;

/// The header A2A receivers check the configuration's token in.
pub const TOKEN_HEADER: &str = "X-A2A-Notification-Token";
/// Events read from the log at once while rendering.
const PAGE: usize = 256;
/// The most events between a configuration's `from_seq` and the event being sent that are read to render
/// it: a turn longer than this gets no further notifications (its stream and GetTask still serve it).
const MAX_RENDER_EVENTS: u64 = 20_000;

/// A push configuration the client gave (A2A `TaskPushNotificationConfig`), read from `params`.
pub(crate) struct Config {
    id: String,
    url: String,
    token: String,
    scheme: String,
    credentials: String,
}

impl Config {
    /// `field` names where the configuration sits in the request, for messages.
    pub(crate) fn read(params: &Map<String, Value>, field: &str) -> Result<Self, RpcError> {
        let at = |name: &str| if field.is_empty() { name.to_owned() } else { format!("{field}.{name}") };
        let string = |name: &str| {
            rpc::string(params, name)
                .map(|s| s.unwrap_or_default().to_owned())
                .map_err(|_| RpcError::invalid(format!("{} must be a string", at(name))))
        };
        let url = string("url")?;
        if url.is_empty() {
            return Err(RpcError::invalid(format!(
                "{} is required: the http(s) URL the task's updates are POSTed to",
                at("url")
            )));
        }
        let (scheme, credentials) = match rpc::object(params, "authentication")
            .map_err(|_| RpcError::invalid(format!("{} must be an object", at("authentication"))))?
        {
            None => (String::new(), String::new()),
            Some(auth) => {
                let scheme = rpc::string(auth, "scheme")?.unwrap_or_default().to_owned();
                let credentials = rpc::string(auth, "credentials")?.unwrap_or_default().to_owned();
                if scheme.is_empty() != credentials.is_empty() || scheme.contains(char::is_whitespace) {
                    return Err(RpcError::invalid(format!(
                        "{}: give both scheme (one word, e.g. Bearer) and credentials, or neither",
                        at("authentication")
                    )));
                }
                (scheme, credentials)
            }
        };
        Ok(Self { id: string("id")?, url, token: string("token")?, scheme, credentials })
    }

    fn request(self, session: &str, message_id: &str, from_seq: u64) -> TaskPushRequest {
        TaskPushRequest {
            session: session.to_owned(),
            message_id: message_id.to_owned(),
            from_seq,
            config_id: self.id,
            url: self.url,
            token: Secret::new(self.token),
            auth_scheme: self.scheme,
            auth_credentials: Secret::new(self.credentials),
        }
    }
}

/// Stores `config` for the task a send is about to deliver (its MessageId `message_id` into `session`,
/// whose events so far end before `from_seq`): made before the delivery, so that the delivery's own
/// write starts the notifications and none of the task's updates is missed.
pub(crate) async fn configure_before_send(
    call: &Call,
    config: Config,
    session: &str,
    message_id: &str,
    from_seq: u64,
) -> Result<(), RpcError> {
    call.api.create_task_push(config.request(session, message_id, from_seq)).await.map(drop).map_err(|mut e| {
        // The gateway names the field within the configuration (`url: …`).
        if e.code == code::INVALID_PARAMS {
            e.message = format!("configuration.taskPushNotificationConfig.{}", e.message);
        }
        e
    })
}

/// `CreateTaskPushNotificationConfig`: a configuration for a task that has not ended (the same `id` again
/// replaces it).
pub(crate) async fn create(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let (id, fold) = task_of(call, params, "taskId").await?;
    if fold.finished() {
        return Err(RpcError::new(
            code::UNSUPPORTED,
            format!(
                "task {} is done ({}): nothing more will be pushed; GetTask reads it",
                task::encode(&id),
                task::state(&fold)
            ),
        ));
    }
    let config = Config::read(params, "")?;
    let message_id = fold.message_id().unwrap_or_default();
    let hook = call.api.create_task_push(config.request(&id.session, message_id, id.seq)).await?;
    Ok(config_json(&id, &hook))
}

/// `GetTaskPushNotificationConfig`.
pub(crate) async fn get(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let (id, fold) = task_of(call, params, "taskId").await?;
    let config_id = rpc::string(params, "id")?.unwrap_or_default();
    let hooks = call.api.task_pushes(&id.session, fold.message_id().unwrap_or_default()).await?;
    hooks
        .iter()
        .find(|h| h.task.as_ref().is_some_and(|t| t.config_id == config_id))
        .map(|h| config_json(&id, h))
        .ok_or_else(|| no_config(&id, config_id))
}

/// `ListTaskPushNotificationConfigs`: every configuration of the task, in one page (a task has at most
/// ten).
pub(crate) async fn list(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let (id, fold) = task_of(call, params, "taskId").await?;
    let hooks = call.api.task_pushes(&id.session, fold.message_id().unwrap_or_default()).await?;
    let configs: Vec<Value> = hooks.iter().map(|h| config_json(&id, h)).collect();
    Ok(json!({"configs": configs, "nextPageToken": ""}))
}

/// `DeleteTaskPushNotificationConfig`: no POST of it starts afterwards (one under way may finish).
pub(crate) async fn delete(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let (id, fold) = task_of(call, params, "taskId").await?;
    let config_id = rpc::string(params, "id")?.unwrap_or_default();
    let message_id = fold.message_id().unwrap_or_default();
    if !call.api.delete_task_push(&id.session, message_id, config_id).await? {
        return Err(no_config(&id, config_id));
    }
    Ok(json!({}))
}

fn no_config(id: &TaskId, config_id: &str) -> RpcError {
    RpcError::new(
        code::TASK_NOT_FOUND,
        format!(
            "task {} has no push configuration {config_id:?} (they go when the task ends); \
             ListTaskPushNotificationConfigs lists the ones it has",
            task::encode(id)
        ),
    )
}

/// The task `params[field]` names, read through the caller's token (another tenant's is not found).
async fn task_of(call: &Call, params: &Map<String, Value>, field: &str) -> Result<(TaskId, TurnFold), RpcError> {
    let raw = rpc::string(params, field)?.ok_or_else(|| RpcError::invalid(format!("{field} is required")))?;
    let id = task::decode(raw).ok_or_else(|| RpcError::task_not_found(raw))?;
    let fold = read(&call.api, &id).await?;
    Ok((id, fold))
}

/// A stored configuration as A2A's `TaskPushNotificationConfig`. The credentials are not shown again.
fn config_json(id: &TaskId, hook: &RegisteredWebhook) -> Value {
    let Some(task) = &hook.task else { return json!({}) };
    let mut config = json!({"id": task.config_id, "taskId": task::encode(id), "url": hook.url});
    if !hook.secret.is_empty() {
        config["token"] = json!(hook.secret.expose());
    }
    if !task.auth_scheme.is_empty() {
        config["authentication"] = json!({"scheme": task.auth_scheme});
    }
    config
}

/// The webhook sender of the worker, with task push notifications rendered as A2A's: `send_task` reads
/// the task's events from the log and POSTs, through the inner sender (its signature, egress rule and
/// client), one `StreamResponse` per change of the task that the event makes (decision 0155). Every
/// other webhook goes to the inner sender as it is.
pub struct TaskPushes {
    inner: Arc<dyn WebhookSender>,
}

impl TaskPushes {
    pub fn wrap(inner: Arc<dyn WebhookSender>) -> Arc<dyn WebhookSender> {
        Arc::new(Self { inner })
    }
}

#[async_trait]
impl WebhookSender for TaskPushes {
    fn webhooks(&self, agent: &str) -> Vec<Arc<WebhookTarget>> {
        self.inner.webhooks(agent)
    }

    async fn send(&self, hook: &WebhookTarget, event: &Envelope) -> Result<(), SendError> {
        self.inner.send(hook, event).await
    }

    async fn post(&self, hook: &WebhookTarget, post: Post) -> Result<(), SendError> {
        self.inner.post(hook, post).await
    }

    async fn send_task(
        &self,
        hook: &WebhookTarget,
        log: &dyn SessionLog,
        event: &Envelope,
    ) -> Result<TaskSent, SendError> {
        let Some(task) = &hook.task else {
            return self.inner.send(hook, event).await.map(|()| TaskSent::Delivered);
        };
        if event.seq.saturating_sub(task.from_seq) > MAX_RENDER_EVENTS {
            tracing::warn!(session = %event.session, config = %task.config_id, seq = event.seq,
                "task push configuration retired: its task runs past {MAX_RENDER_EVENTS} events");
            return Ok(TaskSent::Ended);
        }
        let mut events = Vec::new();
        let mut from = task.from_seq;
        while from <= event.seq {
            let page = log
                .read(&event.session, from, PAGE)
                .await
                .map_err(|e| SendError(format!("reading the task's events: {e}")))?;
            let Some(last) = page.last().map(|e| e.seq) else { break };
            events.extend(page.into_iter().filter(|e| e.seq <= event.seq));
            from = last + 1;
        }
        let events: Vec<pb::SessionEvent> =
            events.iter().map(turnstile_proto::codec::event::encode_session_event).collect();
        let Some(rendered) = render(&event.session.id, &task.message_id, &events, event.seq) else {
            return Ok(TaskSent::Delivered);
        };
        let mut headers = Vec::new();
        if let Some(token) = &hook.signing_key {
            headers.push((TOKEN_HEADER.to_owned(), token.expose().to_owned()));
        }
        if !task.auth_scheme.is_empty() {
            headers
                .push(("Authorization".to_owned(), format!("{} {}", task.auth_scheme, task.auth_credentials.expose())));
        }
        for (k, body) in rendered.bodies.into_iter().enumerate() {
            let mut delivery = format!("{}/{}/{}", event.session.tenant, event.session.id, event.seq);
            if k > 0 {
                delivery.push_str(&format!(".{k}"));
            }
            self.inner
                .post(hook, Post { delivery, body: body.to_string().into_bytes(), headers: headers.clone() })
                .await?;
        }
        Ok(if rendered.ended { TaskSent::Ended } else { TaskSent::Delivered })
    }
}

/// What the event at `seq` makes of the task asked for by the delivery of `message_id`.
#[derive(Debug, PartialEq)]
pub(crate) struct Rendered {
    /// A2A `StreamResponse`s: a status update per change of state, an artifact update per step's text.
    pub(crate) bodies: Vec<Value>,
    /// The task ended at this event.
    pub(crate) ended: bool,
}

/// Renders the event at `seq` of `events` (`session`'s, from at or before the task's delivery through
/// `seq`); `None` when the delivery is not among them (nothing of the task to send).
pub(crate) fn render(session: &str, message_id: &str, events: &[pb::SessionEvent], seq: u64) -> Option<Rendered> {
    let start = events.iter().position(|e| delivers(e, message_id))?;
    let id = TaskId { session: session.to_owned(), seq: events[start].seq };
    let mut fold = TurnFold::new(id.seq, 0);
    let mut bodies = Vec::new();
    for event in events[start..].iter().take_while(|e| e.seq <= seq) {
        let item = pb::WatchItem { item: Some(pb::watch_item::Item::Event(event.clone())) };
        let steps = fold.apply(&item);
        if event.seq == seq {
            bodies.extend(steps.iter().filter_map(|s| task::event(&id, &fold, &s.change)));
        }
    }
    Some(Rendered { bodies, ended: fold.finished() })
}

/// Whether `event` is the delivery of `message_id` (as [`TurnFold`] reads a delivery).
fn delivers(event: &pb::SessionEvent, message_id: &str) -> bool {
    use pb::session_event::Payload;
    let message = match &event.payload {
        Some(Payload::InboxSpliced(s)) => s.inserted.last(),
        Some(Payload::UserMessage(u)) => u.message.as_ref(),
        _ => None,
    };
    message.is_some_and(|m| m.id == message_id)
}

#[cfg(test)]
mod tests;
