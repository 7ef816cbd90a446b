//! AG-UI (SPEC §19; docs/PROTOCOLS.md; decisions 0113–0115): `POST /ag-ui/{agent}` takes a
//! `RunAgentInput` and answers the run's AG-UI events as server-sent events.
//!
//! A thread is a session (`threadId` is the session id), a run is a turn. The request's messages the
//! session does not have yet are delivered (their ids are their MessageIds, so the history a client resends
//! adds nothing twice), its `tools` are the client tools of the turn (frontend tools, decision 0113), a
//! `tool` message answers the call of a frontend tool that waits for it (`CompleteToolCall`), and `resume`
//! answers the approval interrupt a run ended with (`Decide`). A request that brings nothing new joins the
//! thread: `MESSAGES_SNAPSHOT`, then the running turn's rest. Every event carries an SSE id naming the run's
//! start and its position (module [`run`]), so a reconnect with `Last-Event-ID` resumes with nothing lost.
//! Modules: [`thread`] (the thread as its log has it), [`run`] (a run's events).

pub mod run;
pub mod thread;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::middleware::from_fn_with_state;
use axum::response::Response;
use axum::routing::post;
use serde_json::{Map, Value, json};
use turnstile_gateway::Gateway;
use turnstile_model::tool_names::is_model_tool_name;
use turnstile_model::turn_tools::{self, TurnTool};
use turnstile_proto::codec::encode_content_block;
use turnstile_proto::v1 as pb;

use crate::openai::Agents;
use crate::openai::api::{self, Api, Delivery};
use crate::openai::error::ApiError;
use crate::openai::ids::is_session_id;
use crate::openai::input;
use run::{Event, RunFold};
use thread::Thread;

/// The plugin name of messages whose source is this adapter.
pub const PLUGIN: &str = "ag-ui";
/// The `form` of `system` messages.
pub const SYSTEM_FORM: &str = "instructions";
/// The `form` of `developer` messages.
pub const DEVELOPER_FORM: &str = "notice";

#[derive(Clone)]
struct Shared {
    gateway: Gateway,
    agents: Arc<Agents>,
}

/// The AG-UI route, answered by `gateway`'s service code.
pub fn router(gateway: Gateway, agents: Agents) -> Router {
    let auth_enabled = agents.auth_enabled;
    Router::new()
        .route("/ag-ui/{agent}", post(run_agent))
        .with_state(Shared { gateway, agents: Arc::new(agents) })
        .layer(from_fn_with_state(auth_enabled, crate::openai::confine))
}

type Answer = Result<Response, ApiError>;

/// What a `RunAgentInput` asks for.
struct RunInput {
    thread: String,
    run: String,
    messages: Vec<Value>,
    tools: Vec<TurnTool>,
    resume: Vec<Value>,
}

/// `POST /ag-ui/{agent}`.
async fn run_agent(State(shared): State<Shared>, headers: HeaderMap, Path(agent): Path<String>, body: Bytes) -> Answer {
    let api = Api::new(&shared.gateway, &headers);
    if !shared.agents.names.contains(&agent) {
        api.authenticate().await?;
        return Err(ApiError::not_found(
            "agent",
            format!("no agent {agent:?}: the path names an agent profile ({})", shared.agents.names.join(", ")),
        ));
    }
    let input = parse(&input::object(&body)?)?;
    // A reconnect: the rest of the run the id names, after the event the client has.
    if let Some(last) = headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
        let (start, after) = last_event_id(last)?;
        let info = api.get_session(&input.thread).await.map_err(|e| e.at("threadId"))?;
        if start > info.last_seq {
            return Err(ApiError::not_found(
                "Last-Event-ID",
                format!("no run of thread {} starts at seq {start}", input.thread),
            ));
        }
        return Ok(stream(api, RunFold::new(&input.thread, &input.run, start, None, Some(after))));
    }
    let thread = read_thread(&api, &input.thread).await?;
    match api.find_session(&input.thread).await? {
        Some(info) if info.agent == agent => {}
        Some(info) => {
            api.configure(&input.thread, &agent, info.inject_mode).await.map_err(|e| e.at("agent"))?;
        }
        None => {
            api.configure(&input.thread, &agent, pb::InjectMode::Unspecified as i32)
                .await
                .map_err(|e| e.at("agent"))?;
        }
    }
    // Answers first: they continue the waiting turn, which this run then is.
    let mut continued = answer_interrupts(&api, &input, &thread).await?;
    continued = answer_tool_calls(&api, &input, &thread).await?.or(continued);
    if let (Some(waiting), None) = (&thread.waiting, continued) {
        // New input would wait behind a turn nobody answers: say what the thread waits for instead.
        if input.messages.iter().any(|m| is_new(m, &thread)) {
            let how = if waiting.client {
                format!("a tool message with toolCallId {:?} (the result of {})", waiting.call_id, waiting.name)
            } else {
                format!("a resume entry for interrupt {:?} (the approval of {})", waiting.call_id, waiting.name)
            };
            return Err(ApiError {
                status: axum::http::StatusCode::CONFLICT,
                message: format!("thread {} waits for {how}; send it with or before new messages", input.thread),
                kind: "invalid_request_error",
                param: Some("messages".into()),
                code: Some("failed_precondition".into()),
            });
        }
    }
    let delivered = deliver(&api, &input, &thread).await?;
    let fold = match (continued, delivered, thread.open_turn) {
        (Some(seq), _, _) => RunFold::new(&input.thread, &input.run, seq, None, None),
        (None, Some(reply), _) => RunFold::new(&input.thread, &input.run, reply.seq, reply.turn, None),
        // Nothing new: a join of the running turn, after the thread as it was before it.
        (None, None, Some(start)) => {
            RunFold::new(&input.thread, &input.run, start, None, None).with_snapshot(thread.snapshot(start))
        }
        (None, None, None) => return Ok(idle_join(&input, &thread)),
    };
    Ok(stream(api, fold))
}

/// A join of a thread that runs nothing: its messages, and the run ends at once.
fn idle_join(input: &RunInput, thread: &Thread) -> Response {
    let (tx, res) = crate::openai::sse::channel();
    let ids = json!({"threadId": input.thread, "runId": input.run});
    let mut started = ids.clone();
    started["type"] = json!("RUN_STARTED");
    let mut finished = ids;
    finished["type"] = json!("RUN_FINISHED");
    finished["outcome"] = json!({"type": "success"});
    let snapshot = json!({"type": "MESSAGES_SNAPSHOT", "messages": thread.snapshot(u64::MAX)});
    let frames: Vec<Bytes> =
        [started, snapshot, finished].into_iter().map(|body| frame(None, &Event { number: None, body })).collect();
    tokio::spawn(async move {
        for frame in frames {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    res
}

/// The run's events as server-sent events, until it ends.
fn stream(api: Api, mut fold: RunFold) -> Response {
    let (tx, res) = crate::openai::sse::channel();
    let thread = fold.thread_and_start();
    tokio::spawn(async move {
        let ended = async {
            let mut watch = api.watch(&thread.0, thread.1.saturating_sub(1), true).await?;
            while !fold.finished() {
                let item = api::next(&mut watch).await?;
                for event in fold.apply(&item) {
                    let id = event.number.map(|n| fold.sse_id(n));
                    if tx.send(frame(id.as_deref(), &event)).await.is_err() {
                        return Ok(());
                    }
                }
            }
            Ok::<_, ApiError>(())
        }
        .await;
        if let Err(error) = ended {
            let body = json!({"type": "RUN_ERROR", "message": error.message, "code": error.code});
            let _ = tx.send(frame(None, &Event { number: None, body })).await;
        }
    });
    res
}

/// One event as its SSE frame: `id:` when it is numbered, then `data:`.
fn frame(id: Option<&str>, event: &Event) -> Bytes {
    match id {
        Some(id) => Bytes::from(format!("id: {id}\ndata: {}\n\n", event.body)),
        None => Bytes::from(format!("data: {}\n\n", event.body)),
    }
}

/// `S0.N` of a `Last-Event-ID`: the run's start seq and the number of the last event the client has.
fn last_event_id(value: &str) -> Result<(u64, u64), ApiError> {
    let bad = || {
        ApiError::invalid(
            "Last-Event-ID",
            format!("Last-Event-ID {value:?} is not an id this server sent; send the id of the last event received"),
        )
    };
    let (start, after) = value.split_once('.').ok_or_else(bad)?;
    let start: u64 = start.parse().ok().filter(|s| *s > 0).ok_or_else(bad)?;
    Ok((start, after.parse().map_err(|_| bad())?))
}

/// The session's log read from the start until caught up.
async fn read_thread(api: &Api, session: &str) -> Result<Thread, ApiError> {
    let mut thread = Thread::default();
    if api.find_session(session).await?.is_none() {
        return Ok(thread);
    }
    let mut watch = api.watch(session, 0, false).await?;
    while !thread.apply(&api::next(&mut watch).await?) {}
    Ok(thread)
}

fn parse(body: &Map<String, Value>) -> Result<RunInput, ApiError> {
    let thread = input::string(body, "threadId")?
        .ok_or_else(|| ApiError::invalid("threadId", "threadId is required: the id of the conversation (a session)"))?;
    if !is_session_id(thread) {
        return Err(ApiError::invalid("threadId", "threadId must be 1-128 letters, digits, '_' or '-'"));
    }
    let run = input::string(body, "runId")?.ok_or_else(|| ApiError::invalid("runId", "runId is required"))?;
    let list = |field: &str| match body.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(_) => Err(ApiError::invalid(field, format!("{field} must be a list"))),
    };
    let messages = list("messages")?;
    let tools = list("tools")?.iter().enumerate().map(|(i, t)| tool(t, i)).collect::<Result<Vec<_>, _>>()?;
    Ok(RunInput { thread: thread.to_owned(), run: run.to_owned(), messages, tools, resume: list("resume")? })
}

/// One frontend tool: a client tool of the turn.
fn tool(value: &Value, i: usize) -> Result<TurnTool, ApiError> {
    let at = format!("tools[{i}]");
    let Value::Object(tool) = value else {
        return Err(ApiError::invalid(at.clone(), format!("{at} must be an object")));
    };
    let name = input::string(tool, "name").map_err(|e| e.at(&at))?.unwrap_or_default();
    if !is_model_tool_name(name) {
        return Err(ApiError::invalid(
            format!("{at}.name"),
            format!("{at}.name is {name:?}; a tool name is 1-64 letters, digits, '_' or '-'"),
        ));
    }
    let description = input::string(tool, "description").map_err(|e| e.at(&at))?.unwrap_or_default().to_owned();
    let parameters = match tool.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid(format!("{at}.parameters"), "parameters must be a JSON Schema object"));
        }
    };
    Ok(TurnTool { name: name.to_owned(), description, parameters })
}

/// Decides the approvals `resume` answers; the seq of the waiting call when one was answered.
async fn answer_interrupts(api: &Api, input: &RunInput, thread: &Thread) -> Result<Option<u64>, ApiError> {
    let mut continued = None;
    for (i, entry) in input.resume.iter().enumerate() {
        let at = format!("resume[{i}]");
        let id = entry.get("interruptId").and_then(Value::as_str).unwrap_or_default();
        let call = thread.call(id).filter(|c| !c.client).ok_or_else(|| {
            ApiError::not_found(format!("{at}.interruptId"), format!("no interrupt {id:?} in this thread"))
        })?;
        let (approve, reason) = decision(entry);
        api.decide(&input.thread, id, approve, &reason).await.map_err(|e| e.at(&at))?;
        continued.get_or_insert(call.seq);
    }
    Ok(continued)
}

/// A resume entry as a decision: `resolved` with a payload that approves (`true`, `{"approved": true}` or
/// `{"approve": true}`), else a denial with the payload's `reason`.
fn decision(entry: &Value) -> (bool, String) {
    let payload = &entry["payload"];
    let approve = entry["status"] == "resolved"
        && (payload == &Value::Bool(true) || payload["approved"] == true || payload["approve"] == true);
    let reason = match payload["reason"].as_str() {
        Some(reason) => reason.to_owned(),
        None if entry["status"] == "cancelled" => "cancelled".to_owned(),
        None => String::new(),
    };
    (approve, reason)
}

/// Gives the frontend tool call waiting for it the result a `tool` message carries; the seq of that call.
/// Tool messages of calls answered before are history the client resends.
async fn answer_tool_calls(api: &Api, input: &RunInput, thread: &Thread) -> Result<Option<u64>, ApiError> {
    let mut continued = None;
    for (i, message) in input.messages.iter().enumerate() {
        if message["role"] != "tool" {
            continue;
        }
        let at = format!("messages[{i}]");
        let call_id = message["toolCallId"].as_str().unwrap_or_default();
        let Some(waiting) = thread.waiting.as_ref().filter(|w| w.client && w.call_id == call_id) else {
            if thread.call(call_id).is_some() {
                continue;
            }
            return Err(ApiError::not_found(
                format!("{at}.toolCallId"),
                format!("no tool call {call_id:?} in this thread"),
            ));
        };
        let output = content_text(&message["content"], &format!("{at}.content"))?;
        let error = message["error"].as_str().map(str::to_owned);
        api.complete_tool_call(&input.thread, &waiting.call_id, &output, error).await.map_err(|e| e.at(&at))?;
        continued = Some(waiting.seq);
    }
    Ok(continued)
}

/// Delivers the messages the session does not have yet: all but the last as `inject`, the last as a
/// `followup` carrying the run's frontend tools; the last one's reply.
async fn deliver(api: &Api, input: &RunInput, thread: &Thread) -> Result<Option<pb::SendReply>, ApiError> {
    let mut new = Vec::new();
    for (i, message) in input.messages.iter().enumerate() {
        if is_new(message, thread) {
            new.push(user_message(message, &format!("messages[{i}]"))?);
        }
    }
    let Some(last) = new.len().checked_sub(1) else { return Ok(None) };
    let mut reply = None;
    for (i, mut message) in new.into_iter().enumerate() {
        let how = if i == last { Delivery::Followup } else { Delivery::Inject };
        if i == last && !input.tools.is_empty() {
            message.content.push(encode_content_block(&turn_tools::block(&input.tools)));
        }
        reply = Some(api.deliver(&input.thread, message, how).await.map_err(|e| e.at("messages"))?);
    }
    Ok(reply)
}

/// A message of the request the session does not have: not a tool answer, not one the adapter minted.
fn is_new(message: &Value, thread: &Thread) -> bool {
    let id = message["id"].as_str().unwrap_or_default();
    let role = message["role"].as_str().unwrap_or_default();
    !(matches!(role, "tool" | "activity" | "reasoning") || thread.known.contains(id) || id.starts_with("ts-"))
}

/// An AG-UI message as the message delivered, its id the MessageId.
fn user_message(message: &Value, at: &str) -> Result<pb::UserMessage, ApiError> {
    use pb::message_source::Kind;
    let id = message["id"].as_str().filter(|id| !id.is_empty()).ok_or_else(|| {
        ApiError::invalid(
            format!("{at}.id"),
            "every message needs an id: it is its MessageId, so a resent one adds nothing",
        )
    })?;
    let plugin = |form: &str| Kind::Plugin(pb::PluginSource { plugin: PLUGIN.into(), form: form.into() });
    let kind = match message["role"].as_str() {
        Some("user") => Kind::User(pb::UserSource {}),
        Some("system") => plugin(SYSTEM_FORM),
        Some("developer") => plugin(DEVELOPER_FORM),
        Some("assistant") => Kind::Model(pb::ModelSource { provider: PLUGIN.into(), model: "input".into() }),
        other => {
            return Err(ApiError::invalid(
                format!("{at}.role"),
                format!("{at}.role is {other:?}; allowed: user, system, developer, assistant, tool"),
            ));
        }
    };
    let text = content_text(&message["content"], &format!("{at}.content"))?;
    Ok(pb::UserMessage {
        id: id.to_owned(),
        content: vec![pb::ContentBlock { block: Some(pb::content_block::Block::Text(pb::TextBlock { text })) }],
        source: Some(pb::MessageSource { kind: Some(kind) }),
    })
}

/// A message's content as text: a string, or text parts joined.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(text)) => texts.push(text),
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}[{j}]"),
                            "only text parts ({\"type\": \"text\", \"text\": ...}) are supported; images, audio and \
                             files are not yet",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid(at, format!("{at} must be a string or a list of parts"))),
    }
}
