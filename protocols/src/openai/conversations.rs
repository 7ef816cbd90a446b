//! `/v1/conversations`: a conversation is a session (decision 0100). It is created in the `out-of-turn`
//! inject mode (SPEC §11), so the items a client adds are durable history at once and run no turn; its
//! `metadata` is the session's labels.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::session_event::Payload;

use super::api::{self, Api, Delivery};
use super::error::ApiError;
use super::fold::{Item, render_item};
use super::ids;
use super::input::{self, INSTRUCTIONS_FORM, InputMessage, PLUGIN};
use super::responses::{labels, message_item, page};
use super::{Shared, ok, query};

type Answer = Result<Response, ApiError>;

/// `POST /v1/conversations {items?, metadata?}`.
pub(crate) async fn create(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Answer {
    let api = Api::new(&shared.gateway, &headers);
    let body = input::object(&body)?;
    let metadata = input::metadata(&body)?;
    let items = input::items(body.get("items"), "items")?;
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty());
    let session = ids::new_session("conv", key);
    // A retried create (same Idempotency-Key) finds its session and writes nothing it already has.
    let mut info = match api.find_session(&session).await? {
        Some(info) => info,
        None => api.configure(&session, &shared.agents.default, pb::InjectMode::OutOfTurn as i32).await?,
    };
    let changed: Vec<_> = metadata.into_iter().flatten().filter(|(k, v)| info.labels.get(k) != Some(v)).collect();
    if !changed.is_empty() {
        info = api.set_labels(&session, changed, Vec::new()).await?;
    }
    add(&api, &session, &items, key).await?;
    Ok(ok(conversation(&api, &session, &info).await?))
}

/// Delivers `items` as injects: with the conversation idle each is a durable `user/message` of turn 0.
async fn add(api: &Api, session: &str, items: &[InputMessage], key: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let mut added = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let reply = api.deliver(session, item.to_pb(ids::message_id(key, i)), Delivery::Inject).await?;
        let role = match item.role {
            input::Role::User => "user",
            input::Role::Assistant => "assistant",
            input::Role::Developer | input::Role::Instructions => "developer",
        };
        added.push(message_item(&ids::item_id("msg", session, reply.seq), role, &item.text));
    }
    Ok(added)
}

async fn conversation(api: &Api, session: &str, info: &pb::SessionInfo) -> Result<Value, ApiError> {
    // The creation time is the time of the session's first event.
    let mut watch = api.watch(session, 0, false).await?;
    let created_ms = match api::next(&mut watch).await?.item {
        Some(pb::watch_item::Item::Event(e)) => e.time_unix_ms,
        _ => info.last_event_unix_ms,
    };
    Ok(json!({
        "id": ids::conversation_id(session),
        "object": "conversation",
        "created_at": created_ms / 1000,
        "metadata": labels(info),
    }))
}

async fn info(api: &Api, raw: &str) -> Result<(String, pb::SessionInfo), ApiError> {
    let session = ids::conversation_session(raw, "conversation_id")?;
    match api.find_session(&session).await? {
        Some(info) => Ok((session, info)),
        None => Err(ApiError::not_found("conversation_id", format!("Conversation with id '{raw}' not found."))),
    }
}

/// `GET /v1/conversations/{id}`.
pub(crate) async fn retrieve(api: Api, Path(raw): Path<String>) -> Answer {
    let (session, info) = info(&api, &raw).await?;
    Ok(ok(conversation(&api, &session, &info).await?))
}

/// `POST /v1/conversations/{id} {metadata}`: the labels become exactly `metadata`.
pub(crate) async fn update(api: Api, Path(raw): Path<String>, body: Bytes) -> Answer {
    let body = input::object(&body)?;
    let (session, info) = info(&api, &raw).await?;
    let pairs = input::metadata(&body)?
        .ok_or_else(|| ApiError::invalid("metadata", "metadata is required: the conversation's new metadata"))?;
    let remove: Vec<String> = info.labels.keys().filter(|k| !pairs.iter().any(|(p, _)| p == *k)).cloned().collect();
    let info = api.set_labels(&session, pairs, remove).await?;
    Ok(ok(conversation(&api, &session, &info).await?))
}

/// `DELETE /v1/conversations/{id}`: deletes the session (SPEC §12).
pub(crate) async fn delete(api: Api, Path(raw): Path<String>) -> Answer {
    let session = ids::conversation_session(&raw, "conversation_id")?;
    api.delete_session(&session).await.map_err(|e| match e.status {
        axum::http::StatusCode::NOT_FOUND => {
            ApiError::not_found("conversation_id", format!("Conversation with id '{raw}' not found."))
        }
        _ => e,
    })?;
    Ok(ok(json!({"id": raw, "object": "conversation.deleted", "deleted": true})))
}

/// `GET /v1/conversations/{id}/items`.
pub(crate) async fn list_items(api: Api, Path(raw): Path<String>, RawQuery(q): RawQuery) -> Answer {
    let (session, _) = info(&api, &raw).await?;
    let items = transcript(&api, &session).await?;
    Ok(ok(page(items, &query(q.as_deref()))?))
}

/// `GET /v1/conversations/{id}/items/{item}`.
pub(crate) async fn get_item(api: Api, Path((raw, item)): Path<(String, String)>) -> Answer {
    let (session, _) = info(&api, &raw).await?;
    let items = transcript(&api, &session).await?;
    match items.into_iter().find(|i| i["id"] == item.as_str()) {
        Some(found) => Ok(ok(found)),
        None => Err(ApiError::not_found("item_id", format!("Item with id '{item}' not found in {raw}."))),
    }
}

/// `POST /v1/conversations/{id}/items {items}`: appends items to the conversation's history.
pub(crate) async fn add_items(api: Api, headers: HeaderMap, Path(raw): Path<String>, body: Bytes) -> Answer {
    let body = input::object(&body)?;
    let (session, _) = info(&api, &raw).await?;
    let items = input::items(body.get("items"), "items")?;
    if items.is_empty() {
        return Err(ApiError::invalid("items", "items is required: the input items to add"));
    }
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty());
    let added = add(&api, &session, &items, key).await?;
    let first = added.first().map_or(Value::Null, |i| i["id"].clone());
    let last = added.last().map_or(Value::Null, |i| i["id"].clone());
    Ok(ok(json!({"object": "list", "data": added, "first_id": first, "last_id": last, "has_more": false})))
}

/// The conversation's items, oldest first, folded from its whole log: entered messages, the agent's
/// replies (ids as in the responses that streamed them), its tool calls.
async fn transcript(api: &Api, session: &str) -> Result<Vec<Value>, ApiError> {
    let mut watch = api.watch(session, 0, false).await?;
    let mut steps = std::collections::HashMap::new();
    let mut items: Vec<Value> = Vec::new();
    let mut calls: Vec<(String, usize, Item)> = Vec::new();
    // Calls of client tools: their call id, and the `call_id` their items carry.
    let mut function_calls: Vec<(String, String)> = Vec::new();
    loop {
        let item = api::next(&mut watch).await?;
        let event = match item.item {
            Some(pb::watch_item::Item::Event(event)) => event,
            Some(pb::watch_item::Item::CaughtUp(_)) => break,
            _ => continue,
        };
        let seq = event.seq;
        match event.payload {
            Some(Payload::StepStart(s)) => {
                steps.insert((s.turn, s.step), seq);
            }
            Some(Payload::UserMessage(u)) => {
                let Some(message) = u.message else { continue };
                items.push(message_item(&ids::item_id("msg", session, seq), role(&message), &message.text()));
            }
            Some(Payload::AssistantMessage(a)) if !a.text.is_empty() || a.tool_calls.is_empty() => {
                let anchor = steps.get(&(a.turn, a.step)).copied().unwrap_or(seq);
                let item = Item::Message {
                    id: ids::item_id("msg", session, anchor),
                    text: a.text,
                    done: true,
                    interrupted: a.interrupted,
                };
                items.push(render_item(&item));
            }
            Some(Payload::ToolCall(c)) if c.awaiting_client => {
                let call_id = ids::function_call_id(session, c.turn, seq, &c.call_id);
                let item = Item::FunctionCall {
                    id: ids::item_id("fc", session, seq),
                    call_id: call_id.clone(),
                    name: c.name,
                    arguments: c.arguments,
                };
                items.push(render_item(&item));
                function_calls.push((c.call_id, call_id));
            }
            Some(Payload::ToolResult(r)) if function_calls.iter().any(|(call, _)| *call == r.call_id) => {
                let call_id = function_calls.iter().find(|(call, _)| *call == r.call_id).map(|(_, id)| id.clone());
                let output = match r.error {
                    Some(error) => error,
                    None => r.output,
                };
                items.push(json!({"id": ids::item_id("fco", session, seq), "type": "function_call_output",
                                  "call_id": call_id, "output": output, "status": "completed"}));
            }
            Some(Payload::ToolCall(c)) => {
                let item = Item::Tool {
                    id: ids::item_id("mcp", session, seq),
                    call_id: c.call_id.clone(),
                    name: c.name,
                    arguments: c.arguments,
                    output: None,
                    error: None,
                };
                calls.push((c.call_id, items.len(), item.clone()));
                items.push(render_item(&item));
            }
            Some(Payload::ToolResult(r)) => {
                if let Some((_, index, Item::Tool { output, error, .. })) =
                    calls.iter_mut().find(|(call, _, _)| *call == r.call_id)
                {
                    *output = Some(r.output);
                    *error = r.error;
                    let index = *index;
                    if let Some((_, _, item)) = calls.iter().find(|(call, _, _)| *call == r.call_id) {
                        items[index] = render_item(item);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(items)
}

fn role(message: &pb::UserMessage) -> &'static str {
    use pb::message_source::Kind;
    match message.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(Kind::Plugin(p)) if p.plugin == PLUGIN && p.form == INSTRUCTIONS_FORM => "developer",
        Some(Kind::Plugin(_)) => "developer",
        Some(Kind::Model(_)) => "assistant",
        _ => "user",
    }
}
