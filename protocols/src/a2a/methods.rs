//! The A2A methods, each a translation onto the gateway's service: `SendMessage`, `SendStreamingMessage`,
//! `GetTask`, `ListTasks`, `CancelTask`, `SubscribeToTask`, and the push configurations' ([`super::push`]);
//! the extended-card method answers that there is none (docs/PROTOCOLS.md).

use std::time::Duration;

use axum::response::Response;
use serde_json::{Map, Value, json};
use turnstile_proto::v1 as pb;

use super::call::{Call, not_found, read};
use super::push;
use super::rpc::{self, RpcError, code};
use super::task::{self, MESSAGE_PREFIX};
use crate::api::{Api, Delivery, next};
use crate::ids::{self, TaskId};
use crate::sse;
use crate::turn::{SPAN, TurnFold};

/// How long a cancel waits for the cancelled turn to end before answering with the task as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// `ListTasks` page sizes: A2A's default and largest.
const PAGE_DEFAULT: u64 = 50;
const PAGE_MAX: u64 = 100;
/// The prefix of a `ListTasks` page token.
const PAGE_PREFIX: &str = "tasks-";

pub(crate) enum Answer {
    Result(Value),
    Stream(Response),
}

pub(crate) async fn dispatch(call: Call, method: &str, params: &Map<String, Value>) -> Result<Answer, RpcError> {
    match method {
        "SendMessage" => send(call, params, false).await,
        "SendStreamingMessage" => send(call, params, true).await,
        "GetTask" => get_task(&call, params).await.map(Answer::Result),
        "ListTasks" => list_tasks(&call, params).await.map(Answer::Result),
        "CancelTask" => cancel_task(&call, params).await.map(Answer::Result),
        "SubscribeToTask" => subscribe(call, params).await,
        "CreateTaskPushNotificationConfig" => push::create(&call, params).await.map(Answer::Result),
        "GetTaskPushNotificationConfig" => push::get(&call, params).await.map(Answer::Result),
        "ListTaskPushNotificationConfigs" => push::list(&call, params).await.map(Answer::Result),
        "DeleteTaskPushNotificationConfig" => push::delete(&call, params).await.map(Answer::Result),
        "GetExtendedAgentCard" => {
            Err(RpcError::new(code::NO_EXTENDED_CARD, "this agent has no extended card: its public card is all of it"))
        }
        other => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!(
                "unknown method {other:?}: A2A v1.0's are SendMessage, SendStreamingMessage, GetTask, ListTasks, \
                 CancelTask, SubscribeToTask and the four *TaskPushNotificationConfig(s)"
            ),
        )),
    }
}

/// The message of a send: its text, its data parts, and the ids it names.
struct Message {
    message_id: String,
    context_id: Option<String>,
    task_id: Option<String>,
    text: String,
    data: Vec<Value>,
}

impl Message {
    fn read(params: &Map<String, Value>) -> Result<Self, RpcError> {
        let message = rpc::object(params, "message")?
            .ok_or_else(|| RpcError::invalid("message is required: {messageId, role, parts}"))?;
        let message_id = rpc::string(message, "messageId")?
            .filter(|m| !m.is_empty())
            .ok_or_else(|| RpcError::invalid("message.messageId is required (a client-minted id, e.g. a UUID)"))?;
        match rpc::string(message, "role")? {
            None | Some("ROLE_USER" | "user") => {}
            Some(other) => return Err(RpcError::invalid(format!("message.role is {other:?}: send ROLE_USER"))),
        }
        let parts = match message.get("parts") {
            Some(Value::Array(parts)) if !parts.is_empty() => parts,
            _ => {
                return Err(RpcError::invalid("message.parts is required: at least one part, e.g. {\"text\": \"hi\"}"));
            }
        };
        let (mut texts, mut data) = (Vec::new(), Vec::new());
        for (i, part) in parts.iter().enumerate() {
            match (part.get("text").and_then(Value::as_str), part.get("data")) {
                (Some(text), _) => texts.push(text.to_owned()),
                (None, Some(value)) => data.push(value.clone()),
                _ => {
                    return Err(RpcError::new(
                        code::CONTENT_TYPE,
                        format!(
                            "message.parts[{i}]: only text parts (and data parts answering an input-required task) \
                             are accepted; send files as text or links"
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            message_id: message_id.to_owned(),
            context_id: rpc::string(message, "contextId")?.filter(|c| !c.is_empty()).map(str::to_owned),
            task_id: rpc::string(message, "taskId")?.filter(|t| !t.is_empty()).map(str::to_owned),
            text: texts.join("\n"),
            data,
        })
    }

    fn to_pb(&self) -> pb::UserMessage {
        pb::UserMessage {
            id: ids::protocol_message_id(MESSAGE_PREFIX, &self.message_id),
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: self.text.clone() })),
            }],
            source: Some(pb::MessageSource { kind: Some(pb::message_source::Kind::User(pb::UserSource {})) }),
        }
    }

    /// The message as the answer to a call awaiting approval: a data part `{"approve": bool, "reason"?}`,
    /// else its text ("yes", "y", "approve", "approved", "ok" approve; anything else refuses, as the reason).
    fn decision(&self) -> (bool, String) {
        if let Some(approve) = self.data.iter().find_map(|d| d.get("approve").and_then(Value::as_bool)) {
            let reason = self.data.iter().find_map(|d| d.get("reason").and_then(Value::as_str)).unwrap_or_default();
            return (approve, reason.to_owned());
        }
        let word = self.text.trim().trim_end_matches(['.', '!']).to_lowercase();
        match word.as_str() {
            "yes" | "y" | "approve" | "approved" | "ok" => (true, String::new()),
            _ => (false, self.text.trim().to_owned()),
        }
    }
}

/// `SendMessage` / `SendStreamingMessage`: a new task in a new or named context, or the answer to a task
/// that waits for input.
async fn send(call: Call, params: &Map<String, Value>, streaming: bool) -> Result<Answer, RpcError> {
    let message = Message::read(params)?;
    let configuration = rpc::object(params, "configuration")?;
    let empty = Map::new();
    let configuration = configuration.unwrap_or(&empty);
    let history = rpc::number(configuration, "historyLength")?.map(|n| n as usize);
    let immediately = rpc::flag(configuration, "returnImmediately")?;
    const PUSH: &str = "configuration.taskPushNotificationConfig";
    let push = rpc::object(configuration, "taskPushNotificationConfig")
        .map_err(|_| RpcError::invalid(format!("{PUSH} must be an object")))?
        .map(|config| push::Config::read(config, PUSH))
        .transpose()?;

    let (id, after) = match &message.task_id {
        Some(task_id) if push.is_some() => {
            return Err(RpcError::invalid(format!(
                "{PUSH} configures a new task; for task {task_id} use CreateTaskPushNotificationConfig"
            )));
        }
        Some(task_id) => answer(&call, task_id, &message).await?,
        None => (start(&call, &message, push).await?, 0),
    };
    if streaming {
        return Ok(Answer::Stream(stream(call, id, after, true)));
    }
    let fold = if immediately { read(&call.api, &id).await? } else { follow(&call.api, &id, after).await? };
    Ok(Answer::Result(json!({"task": task::task(&id, &fold, history, true)})))
}

/// Delivers a new message as a followup in its context (a new session without one); the task is the
/// delivery's. Its push configuration, if it has one, is stored first (so no update is missed).
async fn start(call: &Call, message: &Message, push: Option<push::Config>) -> Result<TaskId, RpcError> {
    if message.text.trim().is_empty() {
        return Err(RpcError::invalid("message.parts has no text: say something to the agent"));
    }
    let session = match &message.context_id {
        Some(context) if ids::is_session_id(context) => context.clone(),
        Some(context) => {
            return Err(RpcError::invalid(format!(
                "message.contextId {context:?} is not a context of this server: 1-128 characters of A-Z, a-z, 0-9, \
                 `_` and `-` (or leave it out for a new context)"
            )));
        }
        None => ids::new_session(MESSAGE_PREFIX, None),
    };
    let agent = &call.profile.name;
    let found = call.api.find_session(&session).await?;
    let from_seq = found.as_ref().map_or(0, |info| info.last_seq) + 1;
    match found {
        Some(info) if info.agent == *agent => {}
        Some(info) => drop(call.api.configure(&session, agent, info.inject_mode).await?),
        None => drop(call.api.configure(&session, agent, pb::InjectMode::Unspecified as i32).await?),
    }
    let pb_message = message.to_pb();
    if let Some(push) = push {
        push::configure_before_send(call, push, &session, &pb_message.id, from_seq).await?;
    }
    let reply = call.api.deliver(&session, pb_message, Delivery::Followup).await?;
    Ok(TaskId { session, seq: reply.seq })
}

/// A message to a task: the answer to its call awaiting approval. Returns the task and the position the
/// rest of it follows (the call's).
async fn answer(call: &Call, task_id: &str, message: &Message) -> Result<(TaskId, u64), RpcError> {
    let id = task::decode(task_id).ok_or_else(|| RpcError::task_not_found(task_id))?;
    if message.context_id.as_deref().is_some_and(|c| c != id.session) {
        return Err(RpcError::invalid("message.contextId is not the task's context: leave it out or use the task's"));
    }
    let fold = read(&call.api, &id).await?;
    let Some(waiting) = fold.waiting() else {
        let state = task::state(&fold);
        let message = if fold.finished() {
            format!(
                "task {task_id} is done ({state}) and takes no more messages; send a new message with its contextId to go on"
            )
        } else {
            format!(
                "task {task_id} does not wait for input ({state}); send a message without taskId, with its contextId, to add to the conversation"
            )
        };
        return Err(RpcError::new(code::UNSUPPORTED, message));
    };
    let (approve, reason) = message.decision();
    call.api.decide(&id.session, &waiting.call_id, approve, &reason).await?;
    Ok((id.clone(), waiting.seq * SPAN + 2))
}

/// The task once it stops (ends or waits for input) after position `after`. Callers know the task exists
/// (they delivered it, or [`read`] found it), so a stream that catches up before it lags and the tail
/// brings it.
async fn follow(api: &Api<RpcError>, id: &TaskId, after: u64) -> Result<TurnFold, RpcError> {
    let mut watch = api.watch(&id.session, id.seq - 1, true).await.map_err(|e| not_found(e, id))?;
    let mut fold = TurnFold::new(id.seq, after);
    loop {
        let item = next(&mut watch).await?;
        let caught_up = matches!(item.item, Some(pb::watch_item::Item::CaughtUp(_)));
        let changed = !fold.apply(&item).is_empty();
        if (changed || caught_up) && !fold.missing() && task::stops(task::state(&fold)) {
            return Ok(fold);
        }
    }
}

/// The task's events as server-sent events, each a JSON-RPC result carrying a `StreamResponse`, with the
/// event's position as its SSE `id`: with `snapshot`, the task as it is first, then its changes, until it
/// stops; without, only the changes after position `after` (a resumed stream). Callers know the task
/// exists, so a catch-up before it (a lagging log) waits for the tail.
fn stream(call: Call, id: TaskId, after: u64, snapshot: bool) -> Response {
    let (tx, res) = sse::channel();
    tokio::spawn(async move {
        let rpc_id = call.id.clone();
        let ended = async {
            let mut watch = call.api.watch(&id.session, id.seq - 1, true).await.map_err(|e| not_found(e, &id))?;
            let mut fold = TurnFold::new(id.seq, if snapshot { 0 } else { after });
            let mut last = after;
            let (mut live, mut caught_up) = (!snapshot, false);
            loop {
                let item = next(&mut watch).await?;
                caught_up |= matches!(item.item, Some(pb::watch_item::Item::CaughtUp(_)));
                let steps = fold.apply(&item);
                if !live {
                    // Until caught up (and past the task's delivery, when the log lags), the snapshot gathers
                    // the changes; then it is sent at the last one's position.
                    last = steps.iter().map(|s| s.position).fold(last, u64::max);
                    if caught_up && !fold.missing() {
                        live = true;
                        let body = rpc::result(&rpc_id, json!({"task": task::task(&id, &fold, None, true)}));
                        if tx.send(sse::frame(Some(&last.to_string()), None, &body.to_string())).await.is_err() {
                            return Ok(());
                        }
                    }
                } else {
                    for step in steps {
                        last = step.position;
                        let Some(event) = task::event(&id, &fold, &step.change) else { continue };
                        let body = rpc::result(&rpc_id, event);
                        if tx.send(sse::frame(Some(&last.to_string()), None, &body.to_string())).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                if live && task::stops(task::state(&fold)) {
                    return Ok(());
                }
            }
        }
        .await;
        if let Err(error) = ended {
            let body = rpc::error(&rpc_id, &error);
            let _ = tx.send(sse::frame(None, Some("error"), &body.to_string())).await;
        }
    });
    res
}

fn task_id(params: &Map<String, Value>) -> Result<TaskId, RpcError> {
    let raw = rpc::string(params, "id")?.ok_or_else(|| RpcError::invalid("id is required: the task's id"))?;
    task::decode(raw).ok_or_else(|| RpcError::task_not_found(raw))
}

/// `GetTask`.
async fn get_task(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let id = task_id(params)?;
    let history = rpc::number(params, "historyLength")?.map(|n| n as usize);
    let fold = read(&call.api, &id).await?;
    Ok(task::task(&id, &fold, history, true))
}

/// `CancelTask`: cancels the turn (keeping the session's other pending messages), or removes the message
/// of a task whose turn has not started; answers the task once it ended (or as it is after 30 s).
async fn cancel_task(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let id = task_id(params)?;
    let fold = read(&call.api, &id).await?;
    if fold.finished() {
        return Err(RpcError::new(
            code::TASK_NOT_CANCELABLE,
            format!("task {} is done ({}): there is nothing to cancel", task::encode(&id), task::state(&fold)),
        ));
    }
    let removed = match (fold.turn(), fold.message_id()) {
        (None, Some(message)) => call.api.remove(&id.session, message).await?,
        _ => false,
    };
    if !removed {
        call.api.cancel(&id.session).await?;
    }
    let ended = async {
        let mut watch = call.api.watch(&id.session, id.seq - 1, true).await?;
        let mut fold = TurnFold::new(id.seq, 0);
        while !fold.finished() {
            fold.apply(&next(&mut watch).await?);
        }
        Ok::<_, RpcError>(fold)
    };
    let fold = match tokio::time::timeout(CANCEL_WAIT, ended).await {
        Ok(fold) => fold?,
        Err(_) => read(&call.api, &id).await?,
    };
    Ok(task::task(&id, &fold, None, true))
}

/// `SubscribeToTask`: the task as it is, then its changes until it stops. With `Last-Event-ID` (beyond
/// the specification: the replay cursor), only the changes after that event, so a subscriber that lost its
/// stream (to a gateway that died, say) misses nothing and gets nothing twice.
async fn subscribe(call: Call, params: &Map<String, Value>) -> Result<Answer, RpcError> {
    let id = task_id(params)?;
    let cursor = match sse::last_event_id(&call.headers) {
        None => None,
        Some(raw) => Some(raw.parse::<u64>().map_err(|_| {
            RpcError::invalid(format!("Last-Event-ID {raw:?} is not an event id of this task's stream (a number)"))
        })?),
    };
    let fold = read(&call.api, &id).await?;
    if cursor.is_none() && fold.finished() {
        return Err(RpcError::new(
            code::UNSUPPORTED,
            format!(
                "task {} is done ({}): there is nothing to subscribe to; GetTask reads it (or resubscribe with \
                 Last-Event-ID to replay what a lost stream missed)",
                task::encode(&id),
                task::state(&fold)
            ),
        ));
    }
    Ok(Answer::Stream(stream(call, id, cursor.unwrap_or(0), cursor.is_none())))
}

/// `ListTasks`: the tasks of the caller's tenant that this agent runs (each context's, or one context's),
/// newest change first, filtered by `status` and `statusTimestampAfter`, in pages.
async fn list_tasks(call: &Call, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let size = rpc::number(params, "pageSize")?.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&size) {
        return Err(RpcError::invalid(format!("pageSize is {size}; allowed: 1 to {PAGE_MAX}")));
    }
    let offset = match rpc::string(params, "pageToken")?.filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => ids::parts(PAGE_PREFIX, token, 1)
            .and_then(|p| p[0].parse::<usize>().ok())
            .ok_or_else(|| RpcError::invalid("pageToken is not one this server handed out: start without it"))?,
    };
    let status = rpc::string(params, "status")?.filter(|s| *s != "TASK_STATE_UNSPECIFIED");
    let after_ms = match rpc::string(params, "statusTimestampAfter")? {
        None => None,
        Some(raw) => Some(
            chrono::DateTime::parse_from_rfc3339(raw)
                .map_err(|_| RpcError::invalid(format!("statusTimestampAfter {raw:?} is not an RFC 3339 time")))?
                .timestamp_millis(),
        ),
    };
    let history = rpc::number(params, "historyLength")?.map(|n| n as usize);
    let artifacts = rpc::flag(params, "includeArtifacts")?;

    let sessions = match rpc::string(params, "contextId")?.filter(|c| !c.is_empty()) {
        Some(context) if ids::is_session_id(context) => vec![context.to_owned()],
        Some(context) => {
            return Err(RpcError::invalid(format!("contextId {context:?} is not a context of this server")));
        }
        None => agent_sessions(&call.api, &call.profile.name).await?,
    };
    let mut tasks = Vec::new();
    for session in sessions {
        for (id, fold) in session_tasks(&call.api, &session).await? {
            let (accepted, ended) = fold.times_ms();
            let changed = ended.or(accepted).unwrap_or_default();
            let state = task::state(&fold);
            if status.is_some_and(|s| s != state)
                || after_ms.is_some_and(|t| i64::try_from(changed).unwrap_or(i64::MAX) <= t)
            {
                continue;
            }
            tasks.push((changed, task::task(&id, &fold, history, artifacts)));
        }
    }
    tasks.sort_by_key(|t| std::cmp::Reverse(t.0));
    let total = tasks.len();
    let page: Vec<Value> = tasks.into_iter().skip(offset).take(size as usize).map(|(_, t)| t).collect();
    let end = offset + page.len();
    let next = if end < total { ids::token(PAGE_PREFIX, &[&end.to_string()]) } else { String::new() };
    Ok(json!({"tasks": page, "nextPageToken": next, "pageSize": size, "totalSize": total}))
}

/// Every session of the caller's tenant that runs `agent`.
async fn agent_sessions(api: &Api<RpcError>, agent: &str) -> Result<Vec<String>, RpcError> {
    let (mut sessions, mut token) = (Vec::new(), String::new());
    loop {
        let page = api.list_sessions(agent, 1000, &token).await?;
        sessions.extend(page.sessions.into_iter().filter_map(|s| s.session.map(|r| r.id)));
        if page.next_page_token.is_empty() {
            return Ok(sessions);
        }
        token = page.next_page_token;
    }
}

/// The A2A tasks of a session (its deliveries whose MessageId this server minted), each folded from one
/// read of the log.
async fn session_tasks(api: &Api<RpcError>, session: &str) -> Result<Vec<(TaskId, TurnFold)>, RpcError> {
    let mut watch = match api.watch(session, 0, false).await {
        Ok(watch) => watch,
        Err(e) if e.code == code::TASK_NOT_FOUND => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut folds: Vec<(TaskId, TurnFold)> = Vec::new();
    loop {
        let item = next(&mut watch).await?;
        if let Some(pb::watch_item::Item::Event(event)) = &item.item
            && let Some(pb::session_event::Payload::InboxSpliced(splice)) = &event.payload
            && splice.inserted.last().is_some_and(|m| m.id.starts_with(&format!("{MESSAGE_PREFIX}-")))
        {
            folds.push((TaskId { session: session.to_owned(), seq: event.seq }, TurnFold::new(event.seq, 0)));
        }
        for (_, fold) in &mut folds {
            fold.apply(&item);
        }
        if matches!(item.item, Some(pb::watch_item::Item::CaughtUp(_))) {
            return Ok(folds);
        }
    }
}
