//! `/v1/models` and `/v1/responses`: handlers that translate a request into gateway calls and a turn's
//! events into a Response (decision 0100).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value, json};
use turnstile_model::turn_tools;
use turnstile_proto::codec::encode_content_block;
use turnstile_proto::v1 as pb;

use super::api::{self, Api, Delivery};
use super::error::ApiError;
use super::fold::{Meta, ResponseFold};
use super::ids::{self, ResponseId};
use super::input::{self, ApprovalResponse, FunctionOutput, Role};
use super::{Shared, number, ok, param, query, sse};

/// How long a cancel waits for the cancelled turn to end before answering with the response as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

type Answer = Result<Response, ApiError>;

pub(crate) async fn list_models(State(shared): State<Shared>, headers: HeaderMap) -> Answer {
    let api = Api::new(&shared.gateway, &headers);
    let data: Vec<Value> = shared.models(&api).await?.iter().map(|name| model(name)).collect();
    Ok(ok(json!({"object": "list", "data": data})))
}

pub(crate) async fn get_model(State(shared): State<Shared>, headers: HeaderMap, Path(name): Path<String>) -> Answer {
    shared.agent(&Api::new(&shared.gateway, &headers), &name).await?;
    Ok(ok(model(&name)))
}

fn model(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": 0, "owned_by": "turnstile"})
}

/// `POST /v1/responses`.
pub(crate) async fn create(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Answer {
    let api = Api::new(&shared.gateway, &headers);
    let body = input::object(&body)?;
    let model = input::string(&body, "model")?.ok_or_else(|| {
        ApiError::invalid("model", "model is required: name an agent profile (GET /v1/models lists them)")
    })?;
    shared.agent(&api, model).await?;
    let stream = input::flag(&body, "stream")?;
    let background = input::flag(&body, "background")?;
    input::flag(&body, "store")?;
    let tools = input::tools(&body)?;
    let metadata = input::metadata(&body)?;
    let delivery = delivery(&body, metadata.as_deref())?;
    let approvals = input::approvals(&body)?;
    let messages = input::messages(&body)?;
    let output_schema = input::text_format(&body)?;
    if !approvals.is_empty() {
        if !messages.is_empty() {
            return Err(ApiError::invalid(
                "input",
                "send mcp_approval_response items alone: they continue the waiting turn, which other input cannot \
                 join; send the other input in the next request",
            ));
        }
        let (_, conversation, previous) = target(&body, None)?;
        let id = decide(&api, &approvals, Chain::new(previous.as_ref(), conversation)).await?;
        return resume(api, id, stream, background).await;
    }
    let outputs = input::function_outputs(&body)?;
    if !outputs.is_empty() {
        // The rest of the input is the history the client resends (the Agents SDK sends its whole run).
        let (_, conversation, previous) = target(&body, None)?;
        let id = complete(&api, &outputs, Chain::new(previous.as_ref(), conversation)).await?;
        return resume(api, id, stream, background).await;
    }
    if let Some(i) = input::first_function_call(&body) {
        return Err(ApiError::invalid(
            format!("input[{i}]"),
            "a function_call item is history this server already has: continue its response with \
             previous_response_id (or conversation) and send only the new input, or end the input with the \
             function_call_output items that answer the waiting calls",
        ));
    }
    if output_schema.is_some() && delivery == Delivery::Steer {
        return Err(ApiError::invalid(
            "text.format",
            "a steer joins the running turn, whose reply has its own format; send text.format with a followup, \
             queue, inject or interrupt",
        ));
    }
    if !messages.iter().any(|m| m.role != Role::Instructions) {
        return Err(ApiError::invalid("input", "input is required: a string or a list of input items"));
    }
    let key = idempotency_key(&headers)?;
    let (session, conversation, previous) = target(&body, key.as_deref())?;

    // The session runs `model` from this turn on; a session seen for the first time is created by it.
    let info = api.find_session(&session).await?;
    let mut info = match info {
        Some(info) if info.agent == model => info,
        Some(info) => api.configure(&session, model, info.inject_mode).await.map_err(|e| e.at("model"))?,
        None if previous.is_some() => {
            let previous = previous.as_ref().map(ResponseId::encode).unwrap_or_default();
            return Err(ApiError::not_found(
                "previous_response_id",
                format!("No response found with id '{previous}'."),
            ));
        }
        None if conversation => {
            return Err(ApiError::not_found(
                "conversation",
                format!("Conversation with id '{}' not found.", ids::conversation_id(&session)),
            ));
        }
        None => api.configure(&session, model, pb::InjectMode::Unspecified as i32).await.map_err(|e| e.at("model"))?,
    };
    // Only labels that change are written, so a retried create writes nothing.
    let changed: Vec<_> = metadata.into_iter().flatten().filter(|(k, v)| info.labels.get(k) != Some(v)).collect();
    if !changed.is_empty() {
        info = api.set_labels(&session, changed, Vec::new()).await?;
    }

    // A stream's Watch opens while the input is delivered, so its replay does not delay the first event.
    let early = stream.then(|| {
        let (api, session, from) = (api.clone(), session.clone(), info.last_seq);
        tokio::spawn(async move { api.watch(&session, from, true).await.map(|watch| (from, watch)) })
    });
    // Every message but the last is context for the same first step; the last one asks for the turn.
    let last = messages.len() - 1;
    let mut reply = pb::SendReply::default();
    for (i, message) in messages.iter().enumerate() {
        let how = if i == last { delivery } else { Delivery::Inject };
        let mut message = message.to_pb(ids::message_id(key.as_deref(), i));
        if i == last && !tools.is_empty() {
            // The function tools are the client tools of the turn this message opens (decision 0113).
            message.content.push(encode_content_block(&turn_tools::block(&tools)));
        }
        let schema = output_schema.clone().filter(|_| i == last).map(|schema| (schema, "text.format"));
        reply = api.deliver_with(&session, message, how, schema).await?;
    }
    let id = ResponseId { session, seq: reply.seq, turn: reply.turn.unwrap_or(0), conversation, after_approval: false };
    let meta = Meta { model: model.to_owned(), metadata: labels(&info), background };
    if let Some(Ok(Ok((from, watch)))) = match early {
        Some(early) => Some(early.await),
        None => None,
    } && from < id.seq
    {
        // (A retried create answers the original seq, which an early Watch may have started after.)
        return Ok(stream_response(api, id, meta, None, Some(watch)));
    }
    answer(api, id, meta, stream, background).await
}

/// A created response: its stream, its state now (background), or its state once it ended.
async fn answer(api: Api, id: ResponseId, meta: Meta, stream: bool, background: bool) -> Answer {
    if stream {
        return Ok(stream_response(api, id, meta, None, None));
    }
    let fold = if background { read(&api, id, meta).await? } else { follow(&api, id, meta).await? };
    Ok(ok(fold.snapshot()))
}

/// The rest of the turn a request that answers waiting calls resumes at `id`.
async fn resume(api: Api, id: ResponseId, stream: bool, background: bool) -> Answer {
    let meta = Meta { background, ..meta(&api, &id, "input").await? };
    answer(api, id, meta, stream, background).await
}

/// Decides the calls the approval responses name; the response is the rest of their turn from the first
/// one's call on (decision 0103).
async fn decide(api: &Api, approvals: &[ApprovalResponse], mut chain: Chain<'_>) -> Result<ResponseId, ApiError> {
    for (i, approval) in approvals.iter().enumerate() {
        let param = format!("input[{i}].approval_request_id");
        let call = ids::approval_call(&approval.request_id, &param)?;
        chain.join(&call, &param, "approval request")?;
        let reason = approval.reason.as_deref().unwrap_or_default();
        api.decide(&call.session, &call.call_id, approval.approve, reason).await.map_err(|e| e.at(&param))?;
    }
    chain.first("no mcp_approval_response item")
}

/// Gives each function call its output (`CompleteToolCall`); the response is the rest of their turn from
/// the first one's call on (decision 0113), like a decision's (decision 0103).
async fn complete(api: &Api, outputs: &[FunctionOutput], mut chain: Chain<'_>) -> Result<ResponseId, ApiError> {
    for (i, output) in outputs.iter().enumerate() {
        let param = format!("input[{i}].call_id");
        let call = ids::function_call(&output.call_id, &param)?;
        chain.join(&call, &param, "function call")?;
        api.complete_tool_call(&call.session, &call.call_id, &output.output, None).await.map_err(|e| e.at(&param))?;
    }
    chain.first("no function_call_output item")
}

/// The one rule of a request that answers waiting calls (decisions 0103, 0113): every call must be of the
/// chain the request answers — the first call's session, else the one `previous_response_id` names — and
/// the first call is where the response resumes.
struct Chain<'a> {
    previous: Option<&'a ResponseId>,
    conversation: bool,
    first: Option<ResponseId>,
}

impl<'a> Chain<'a> {
    fn new(previous: Option<&'a ResponseId>, conversation: bool) -> Self {
        Self { previous, conversation, first: None }
    }

    /// Adds `call` (at `param`) to the chain; `what` names the kind of call in the refusal.
    fn join(&mut self, call: &ids::ApprovalCall, param: &str, what: &str) -> Result<(), ApiError> {
        let named = self.first.as_ref().or(self.previous).map(|r| r.session.as_str());
        if named.is_some_and(|s| s != call.session) {
            return Err(ApiError::invalid(
                param,
                format!("this {what} belongs to another response chain than the rest of the request"),
            ));
        }
        let conversation = self.conversation || self.previous.is_some_and(|p| p.conversation);
        self.first.get_or_insert_with(|| ResponseId {
            session: call.session.clone(),
            seq: call.seq,
            turn: call.turn,
            conversation,
            after_approval: true,
        });
        Ok(())
    }

    /// Where the response resumes; `none` says what the input lacked when it named no call.
    fn first(self, none: &str) -> Result<ResponseId, ApiError> {
        self.first.ok_or_else(|| ApiError::invalid("input", none))
    }
}

/// `delivery` (body) or `metadata.turnstile_delivery`: how the input reaches a busy session.
fn delivery(body: &Map<String, Value>, metadata: Option<&[(String, String)]>) -> Result<Delivery, ApiError> {
    if let Some(value) = input::string(body, "delivery")? {
        return Delivery::parse(value, "delivery");
    }
    match metadata.and_then(|m| m.iter().find(|(k, _)| k == "turnstile_delivery")) {
        Some((_, value)) => Delivery::parse(value, "metadata.turnstile_delivery"),
        None => Ok(Delivery::Followup),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(key) if !key.is_empty() && key.len() <= 256 => Ok(Some(key.to_owned())),
            _ => Err(ApiError::invalid(
                "Idempotency-Key",
                "the Idempotency-Key header must be 1-256 visible ASCII characters",
            )),
        },
    }
}

/// The session a create runs in: its `conversation`, its `previous_response_id`'s (with that response), or
/// a new one; and whether it is a conversation.
fn target(body: &Map<String, Value>, key: Option<&str>) -> Result<(String, bool, Option<ResponseId>), ApiError> {
    let conversation = match body.get("conversation") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.as_str()),
        Some(Value::Object(c)) => Some(c.get("id").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid("conversation.id", "conversation must be an id or an object with a string id")
        })?),
        Some(_) => return Err(ApiError::invalid("conversation", "conversation must be an id or an object with an id")),
    };
    let previous = input::string(body, "previous_response_id")?;
    match (conversation, previous) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "previous_response_id",
            "give conversation or previous_response_id, not both: both name the session the response continues",
        )),
        (Some(c), None) => Ok((ids::conversation_session(c, "conversation")?, true, None)),
        (None, Some(p)) => {
            let previous = ResponseId::decode(p, "previous_response_id")?;
            Ok((previous.session.clone(), previous.conversation, Some(previous)))
        }
        (None, None) => Ok((ids::new_session("resp", key), false, None)),
    }
}

/// The session's labels as OpenAI `metadata`.
pub(crate) fn labels(info: &pb::SessionInfo) -> Value {
    Value::Object(info.labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// What the fold needs from the session; a session the caller cannot see is a response that does not exist.
async fn meta(api: &Api, id: &ResponseId, param: &str) -> Result<Meta, ApiError> {
    let mut info = api.find_session(&id.session).await?.ok_or_else(|| not_found(id, param))?;
    // A seq past the log's end is no response, unless the read lags behind a write the caller saw (a
    // replica on JetStream): look again a few times before saying so.
    let mut pause = Duration::from_millis(50);
    while id.seq > info.last_seq {
        if pause > SEQ_WAIT {
            return Err(not_found(id, param));
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
        info = api.find_session(&id.session).await?.ok_or_else(|| not_found(id, param))?;
    }
    Ok(Meta { model: info.agent.clone(), metadata: labels(&info), background: false })
}

fn not_found(id: &ResponseId, param: &str) -> ApiError {
    ApiError::not_found(param, format!("No response found with id '{}'.", id.encode()))
}

/// The response as the log has it now. Callers have checked that the session's log reaches the response's
/// seq; a read that catches up before it (a lagging replica on JetStream) waits for the tail to bring it,
/// for at most [`LAG_WAIT`].
async fn read(api: &Api, id: ResponseId, meta: Meta) -> Result<ResponseFold, ApiError> {
    let mut watch = api.watch(&id.session, id.seq - 1, false).await?;
    let mut fold = ResponseFold::new(id, meta, None);
    let deadline = tokio::time::Instant::now() + LAG_WAIT;
    loop {
        let item = match tokio::time::timeout_at(deadline, api::next(&mut watch)).await {
            Ok(item) => item?,
            Err(_) => return Err(not_found(fold.id(), "response_id")),
        };
        let caught_up = matches!(item.item, Some(pb::watch_item::Item::CaughtUp(_)));
        fold.apply(&item);
        if (caught_up && !fold.missing()) || fold.finished() {
            return Ok(fold);
        }
    }
}

/// The last pause before a response id past the log's end is answered 404 (the pauses double from 50 ms:
/// about 1.5 s in all).
const SEQ_WAIT: Duration = Duration::from_millis(800);

/// How long a read waits for a log that lags behind the seq a caller saw.
const LAG_WAIT: Duration = Duration::from_secs(10);

/// The response once its turn has ended.
async fn follow(api: &Api, id: ResponseId, meta: Meta) -> Result<ResponseFold, ApiError> {
    let mut watch = api.watch(&id.session, id.seq - 1, true).await?;
    let mut fold = ResponseFold::new(id, meta, None);
    while !fold.finished() {
        // The response's delivery is durable (its caller saw its seq), so a stream that catches up before it
        // lags and the tail brings it.
        fold.apply(&api::next(&mut watch).await?);
    }
    Ok(fold)
}

/// The response's events after `starting_after` as server-sent events, until it ends.
/// `watch`: one already open from before the response's delivery (events before it are skipped).
fn stream_response(
    api: Api,
    id: ResponseId,
    meta: Meta,
    starting_after: Option<u64>,
    watch: Option<api::Watch>,
) -> Response {
    let (tx, res) = sse::channel();
    tokio::spawn(async move {
        let mut last = starting_after.unwrap_or(0);
        let ended = async {
            let mut watch = match watch {
                Some(watch) => watch,
                None => api.watch(&id.session, id.seq - 1, true).await?,
            };
            let mut fold = ResponseFold::new(id, meta, starting_after);
            while !fold.finished() {
                let item = api::next(&mut watch).await?;
                for event in fold.apply(&item) {
                    last = last.max(event.number);
                    if tx.send(sse::frame(&event)).await.is_err() {
                        return Ok(());
                    }
                }
            }
            Ok::<_, ApiError>(())
        }
        .await;
        if let Err(error) = ended {
            let _ = tx.send(sse::error_frame(&error, last)).await;
        }
    });
    res
}

/// The response a request's path names (`response_id`), read with the caller's credentials.
async fn named(api: &Api, raw: &str) -> Result<(ResponseId, Meta), ApiError> {
    let id = ResponseId::decode(raw, "response_id")?;
    let meta = meta(api, &id, "response_id").await?;
    Ok((id, meta))
}

/// `GET /v1/responses/{id}`, and with `stream=true` its events again (after `starting_after`, or the
/// `Last-Event-ID` of an EventSource reconnect).
pub(crate) async fn retrieve(api: Api, headers: HeaderMap, Path(raw): Path<String>, RawQuery(q): RawQuery) -> Answer {
    let (id, meta) = named(&api, &raw).await?;
    let pairs = query(q.as_deref());
    if param(&pairs, "stream") == Some("true") {
        let last_event = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let after = number(&pairs, "starting_after")?.or(last_event);
        return Ok(stream_response(api, id, meta, after, None));
    }
    Ok(ok(read(&api, id, meta).await?.snapshot()))
}

/// `POST /v1/responses/{id}/cancel`: cancels the turn (keeping the session's other pending input), or
/// removes the input of a response whose turn has not started. An ended response is answered as it is.
pub(crate) async fn cancel(api: Api, Path(raw): Path<String>) -> Answer {
    let (id, meta) = named(&api, &raw).await?;
    let fold = read(&api, id.clone(), meta.clone()).await?;
    if fold.finished() {
        return Ok(ok(fold.snapshot()));
    }
    let removed = match (fold.turn(), fold.message_id()) {
        (None, Some(message)) => api.remove(&id.session, message).await?,
        _ => false,
    };
    if !removed {
        api.cancel(&id.session).await?;
    }
    let fold = match tokio::time::timeout(CANCEL_WAIT, follow(&api, id.clone(), meta.clone())).await {
        Ok(fold) => fold?,
        Err(_) => read(&api, id, meta).await?,
    };
    Ok(ok(fold.snapshot()))
}

/// `DELETE /v1/responses/{id}`: deletes the session the response chain lives in (decision 0100); a
/// conversation's response is deleted with its conversation.
pub(crate) async fn delete(api: Api, Path(raw): Path<String>) -> Answer {
    let id = ResponseId::decode(&raw, "response_id")?;
    if id.conversation {
        return Err(ApiError::invalid(
            "response_id",
            format!(
                "response {raw} belongs to conversation {}; delete the conversation (DELETE /v1/conversations/ID) \
                 to delete its responses",
                ids::conversation_id(&id.session)
            ),
        ));
    }
    let meta = meta(&api, &id, "response_id").await?;
    read(&api, id.clone(), meta).await?;
    api.delete_session(&id.session).await?;
    Ok(ok(json!({"id": raw, "object": "response", "deleted": true})))
}

/// `GET /v1/responses/{id}/input_items`: the messages the response's turn entered.
pub(crate) async fn input_items(api: Api, Path(raw): Path<String>, RawQuery(q): RawQuery) -> Answer {
    let (id, meta) = named(&api, &raw).await?;
    let pairs = query(q.as_deref());
    let fold = read(&api, id, meta).await?;
    let items: Vec<Value> = fold.inputs().iter().map(|i| message_item(&i.id, i.role, &i.text)).collect();
    Ok(ok(page(items, &pairs)?))
}

/// An input message as a list item.
pub(crate) fn message_item(id: &str, role: &str, text: &str) -> Value {
    let part = if role == "assistant" { "output_text" } else { "input_text" };
    json!({"id": id, "type": "message", "role": role, "status": "completed", "content": [{"type": part, "text": text}]})
}

/// A cursor page of `items` (oldest first) by `order` (default `desc`), `after` and `limit` (1-100, default
/// 20), in OpenAI's list shape.
pub(crate) fn page(mut items: Vec<Value>, pairs: &[(String, String)]) -> Result<Value, ApiError> {
    let limit = number(pairs, "limit")?.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("limit is {limit}; allowed: 1 to 100")));
    }
    match param(pairs, "order") {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => return Err(ApiError::invalid("order", format!("order is {other:?}; allowed: asc, desc"))),
    }
    if let Some(after) = param(pairs, "after") {
        let at = items.iter().position(|i| i["id"] == after).ok_or_else(|| {
            ApiError::invalid("after", format!("after is {after:?}, which is not an item of this list"))
        })?;
        items.drain(..=at);
    }
    let has_more = items.len() as u64 > limit;
    items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let first = items.first().map_or(Value::Null, |i| i["id"].clone());
    let last = items.last().map_or(Value::Null, |i| i["id"].clone());
    Ok(json!({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": has_more}))
}
