//! `tools/call`: a turn of the tool's agent in a new or named session, followed on the session's Watch to
//! its end. Progress notifications carry the reply's deltas (`progress` is the delta's position, decision
//! 0101's numbering, so it rises and is the same through any gateway); the call's cancellation cancels the
//! turn; a call awaiting approval is answered by an MRTR elicitation whose `requestState` names the call,
//! and the retried call decides it and follows the rest of the turn (decision 0127).

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content, ErrorData, InputRequiredResult,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use turnstile_proto::v1 as pb;

use super::resume::{Cursor, StreamClosed};
use super::tasks;
use super::tools::Arguments;
use super::{Fail, Server};
use crate::api::{Api, Delivery};
use crate::ids;
use crate::turn::{Call, Change, Outcome, SPAN, TurnFold};

/// The prefix of the sessions a call without `session` opens.
const SESSION_PREFIX: &str = "mcp";
/// The prefix of the `requestState` that names a call awaiting approval.
const STATE_PREFIX: &str = "mcpa_";
/// The key of the approval elicitation in `inputRequests`.
const APPROVAL_KEY: &str = "approval";

type Answer = Result<CallToolResponse, ErrorData>;

pub(crate) async fn call(
    server: &Server,
    api: Api<Fail>,
    tenant: &str,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Answer {
    let Some(profile) = server.profiles.get(&request.name, tenant) else {
        return Err(ErrorData::invalid_params(
            format!(
                "unknown tool {:?}: the tools are your tenant's agent profiles ({}); tools/list lists them",
                request.name,
                server.profiles.names_for(tenant)
            ),
            None,
        ));
    };
    let args = Arguments::read(request.arguments.as_ref()).map_err(|e| ErrorData::invalid_params(e, None))?;
    let progress = context.meta.get_progress_token();
    if let Some(state) = &request.request_state {
        let waiting = Waiting::decode(state)?;
        let decision = approval(request.input_responses.as_ref())?;
        let (approve, reason) = decision;
        if let Err(Fail(status)) = api.decide(&waiting.session, &waiting.call_id, approve, &reason).await {
            // Decided already (a retried round): the turn goes on either way.
            if status.code() != tonic::Code::FailedPrecondition {
                return Ok(failure(&waiting.session, &status).into());
            }
        }
        let after = waiting.call_seq * SPAN + 2;
        return follow(&api, &waiting.session, (waiting.seq, None), after, progress, &context).await;
    }

    let session = args.session.unwrap_or_else(|| ids::new_session(SESSION_PREFIX, None));
    let started = async {
        match api.find_session(&session).await? {
            Some(info) if info.agent == profile.name => {}
            Some(info) => drop(api.configure(&session, &profile.name, info.inject_mode).await?),
            None => drop(api.configure(&session, &profile.name, pb::InjectMode::Unspecified as i32).await?),
        }
        let message = user_message(&args.message);
        let reply = api.deliver(&session, message.clone(), Delivery::Followup).await?;
        Ok((reply, message.id))
    }
    .await;
    match started {
        // A client of the tasks extension gets the task at once and polls it (decision 0157).
        Ok((reply, _)) if tasks::wanted(&context) => Ok(tasks::created(&session, reply.seq).into()),
        Ok((reply, message)) => {
            follow(&api, &session, (reply.seq, Some(message.as_str())), 0, progress, &context).await
        }
        Err(Fail(status)) => Ok(failure(&session, &status).into()),
    }
}

/// A prompt from the MCP client: a user's message with a fresh MessageId (MCP request ids are not unique
/// beyond one connection, so they cannot name a delivery).
fn user_message(text: &str) -> pb::UserMessage {
    pb::UserMessage {
        id: uuid::Uuid::new_v4().to_string(),
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.to_owned() })),
        }],
        source: Some(pb::MessageSource { kind: Some(pb::message_source::Kind::User(pb::UserSource {})) }),
    }
}

/// Follows the turn of the delivery at `seq` (whose MessageId is `message` when this call sent it) from
/// position `after` to its end (or its wait for a decision), sending its deltas as progress; the call's
/// cancellation cancels the turn.
async fn follow(
    api: &Api<Fail>,
    session: &str,
    (seq, message): (u64, Option<&str>),
    after: u64,
    progress: Option<ProgressToken>,
    context: &RequestContext<RoleServer>,
) -> Answer {
    // At 2026-07-28 closing the stream cancels the call; before it, a closed stream resumes (decision 0156).
    let closed = context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<StreamClosed>())
        .filter(|_| modern(context))
        .map(|c| c.0.clone())
        .unwrap_or_default();
    let cursor = progress.as_ref().map(|token| Cursor {
        session: session.to_owned(),
        seq,
        position: after,
        request: serde_json::to_value(&context.id).unwrap_or(Value::Null),
        token: serde_json::to_value(token).unwrap_or(Value::Null),
    });
    let followed = async {
        let mut watch = api.watch(session, seq - 1, true).await?;
        let mut fold = TurnFold::new(seq, after);
        loop {
            let item = tokio::select! {
                item = crate::api::next(&mut watch) => item?,
                () = first_of(&context.ct, &closed) => {
                    cancel(api, session, &fold, message).await?;
                    return Ok(Err(ErrorData::new(
                        rmcp::model::ErrorCode::INVALID_REQUEST,
                        "the call was cancelled, and so was its turn",
                        None,
                    )));
                }
            };
            for step in fold.apply(&item) {
                match step.change {
                    Change::Text { piece, .. } => {
                        // Each notification carries its cursor, its SSE id (the stream resumes after it).
                        if let Some(note) = cursor.as_ref().and_then(|c| {
                            serde_json::from_value::<ProgressNotificationParam>(c.progress(step.position, &piece)).ok()
                        }) {
                            // A client that went away is seen by the cancellation above.
                            let _ = context.peer.notify_progress(note).await;
                        }
                    }
                    Change::Waiting(call) => return Ok(Ok(waiting(session, seq, &fold, &call, context))),
                    Change::Ended(outcome) => return Ok(Ok(ended(session, &fold, &outcome).into())),
                    _ => {}
                }
            }
        }
    }
    .await;
    match followed {
        Ok(answer) => answer,
        Err(Fail(status)) => Ok(failure(session, &status).into()),
    }
}

/// Waits until either token is cancelled.
async fn first_of(a: &tokio_util::sync::CancellationToken, b: &tokio_util::sync::CancellationToken) {
    tokio::select! {
        () = a.cancelled() => {}
        () = b.cancelled() => {}
    }
}

/// Cancels the turn being followed, or removes its message when the turn has not started (known by the
/// MessageId this call sent even before the Watch brought its delivery, so another client's turn running
/// in the session is not cancelled instead).
pub(crate) async fn cancel(api: &Api<Fail>, session: &str, fold: &TurnFold, message: Option<&str>) -> Result<(), Fail> {
    if fold.finished() {
        return Ok(());
    }
    if let (None, Some(message)) = (fold.turn(), fold.message_id().or(message))
        && api.remove(session, message).await?
    {
        return Ok(());
    }
    api.cancel(session).await?;
    Ok(())
}

/// The result of a turn that ended: its reply, and the session to continue in `structuredContent`.
pub(crate) fn ended(session: &str, fold: &TurnFold, outcome: &Outcome) -> CallToolResult {
    let (status, error) = match outcome {
        Outcome::Completed => ("completed", None),
        Outcome::MaxTokens => ("max_tokens", None),
        Outcome::Blocked(reason) => {
            ("blocked", Some(format!("a hook blocked the turn: {}", reason.as_deref().unwrap_or("no reason given"))))
        }
        Outcome::Cancelled(message) => ("cancelled", Some(message.clone())),
        Outcome::Failed { code, message } => ("failed", Some(format!("{code}: {message}"))),
    };
    let structured = json!({"session": session, "turn": fold.turn(), "status": status, "reply": fold.reply()});
    let mut result = match error {
        None => CallToolResult::success(vec![Content::text(fold.reply())]),
        Some(error) => CallToolResult::error(vec![Content::text(error)]),
    };
    result.structured_content = Some(structured);
    result
}

/// A gateway refusal as a tool error the caller reads: the gRPC code and the gateway's message.
pub(crate) fn failure(session: &str, status: &tonic::Status) -> CallToolResult {
    let code = format!("{:?}", status.code());
    let mut result = CallToolResult::error(vec![Content::text(format!("{code}: {}", status.message()))]);
    result.structured_content =
        Some(json!({"session": session, "status": "error", "error": {"code": code, "message": status.message()}}));
    result
}

/// The turn waits for a decision on `call`: an elicitation asking the person, where the client negotiated
/// 2026-07-28 (MRTR); before it, a result that says what waits (decided through another API).
fn waiting(
    session: &str,
    seq: u64,
    fold: &TurnFold,
    call: &Call,
    context: &RequestContext<RoleServer>,
) -> CallToolResponse {
    if modern(context) {
        let state = Waiting { session: session.to_owned(), seq, call_seq: call.seq, call_id: call.call_id.clone() };
        let result = json!({
            "resultType": "input_required",
            "inputRequests": input_requests(call),
            "requestState": state.encode(),
        });
        if let Ok(input) = serde_json::from_value::<InputRequiredResult>(result) {
            return input.into();
        }
    }
    waiting_result(session, fold, call).into()
}

/// The form elicitation that asks a person about `call`, keyed as its answer comes back (`inputRequests`).
pub(crate) fn input_requests(call: &Call) -> Value {
    json!({APPROVAL_KEY: {"method": "elicitation/create", "params": {
        "mode": "form",
        "message": question(call),
        "requestedSchema": {"type": "object", "properties": {
            "approve": {"type": "boolean", "title": "Approve", "description": "Run the call (true) or refuse it (false)."},
            "reason": {"type": "string", "title": "Reason", "description": "Why, for the agent and the log."}
        }, "required": ["approve"]}
    }}})
}

/// Whether the caller speaks 2026-07-28 or later (stateless by protocol: MRTR, and closing a call's stream
/// cancels it).
fn modern(context: &RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|v| v.as_str() >= "2026-07-28")
}

pub(crate) fn question(call: &Call) -> String {
    format!(
        "The agent wants to run the tool `{}` with {}. Approve?",
        call.name,
        if call.arguments.is_empty() { "no arguments" } else { call.arguments.as_str() }
    )
}

/// The result of a call whose turn waits for a decision, for a client before 2026-07-28: what waits, to be
/// decided through another API.
pub(crate) fn waiting_result(session: &str, fold: &TurnFold, call: &Call) -> CallToolResult {
    let question = question(call);
    let mut result = CallToolResult::success(vec![Content::text(format!(
        "{question} The turn waits for a decision on call {} of session {session} (Decide through the gRPC API, \
         the console or `turnstile decide`); call the tool again with this session to follow it.",
        call.call_id
    ))]);
    result.structured_content = Some(json!({
        "session": session, "turn": fold.turn(), "status": "input_required", "reply": fold.reply(),
        "awaiting_approval": {"call_id": call.call_id, "name": call.name, "arguments": call.arguments},
    }));
    result
}

/// The call awaiting approval that a `requestState` names: everything the retried call needs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Waiting {
    session: String,
    /// The seq of the delivery whose turn waits.
    seq: u64,
    /// The seq of the call's `tool/call`.
    call_seq: u64,
    call_id: String,
}

impl Waiting {
    fn encode(&self) -> String {
        ids::token(STATE_PREFIX, &[&self.session, &self.seq.to_string(), &self.call_seq.to_string(), &self.call_id])
    }

    /// The state names a session of the caller's tenant at most (the gateway confines it), so a forged one
    /// decides nothing the caller could not decide anyway.
    fn decode(state: &str) -> Result<Self, ErrorData> {
        let bad =
            || ErrorData::invalid_params("requestState is not one this server handed out; call the tool again", None);
        let parts = ids::parts(STATE_PREFIX, state, 4).ok_or_else(bad)?;
        let number = |s: &str| s.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(bad);
        let waiting = Self {
            session: parts[0].clone(),
            seq: number(&parts[1])?,
            call_seq: number(&parts[2])?,
            call_id: parts[3].clone(),
        };
        if !ids::is_session_id(&waiting.session) || waiting.call_id.is_empty() {
            return Err(bad());
        }
        Ok(waiting)
    }
}

/// The person's answer in `inputResponses`: approve (with a reason) or not. Declined or dismissed is no.
pub(crate) fn approval(responses: Option<&rmcp::model::InputResponses>) -> Result<(bool, String), ErrorData> {
    let answer = responses.and_then(|r| r.get(APPROVAL_KEY)).ok_or_else(|| {
        ErrorData::invalid_params(format!("inputResponses.{APPROVAL_KEY} is required with this requestState"), None)
    })?;
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("cancel");
    let content = answer.get("content");
    let approve = action == "accept" && content.and_then(|c| c.get("approve")).and_then(Value::as_bool) == Some(true);
    let reason = match (action, content.and_then(|c| c.get("reason")).and_then(Value::as_str)) {
        (_, Some(reason)) => reason.to_owned(),
        ("accept", None) => String::new(),
        (other, None) => format!("the MCP client's user answered {other:?}"),
    };
    Ok((approve, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_states_round_trip_and_forgeries_are_invalid_params() {
        let w = Waiting { session: "mcp-1".into(), seq: 4, call_seq: 9, call_id: "c.1".into() };
        assert_eq!(Waiting::decode(&w.encode()).unwrap(), w);
        for bad in ["", "mcpa_", "xyz", &ids::token(STATE_PREFIX, &["a b", "1", "2", "c"])] {
            assert_eq!(Waiting::decode(bad).unwrap_err().code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn only_an_accepted_true_approves() {
        let answer = |v: Value| {
            let map: rmcp::model::InputResponses = [(APPROVAL_KEY.to_owned(), v)].into_iter().collect();
            approval(Some(&map)).unwrap()
        };
        assert_eq!(answer(json!({"action": "accept", "content": {"approve": true}})), (true, String::new()));
        assert!(!answer(json!({"action": "accept", "content": {"approve": false, "reason": "no"}})).0);
        assert!(!answer(json!({"action": "decline"})).0);
        assert!(approval(None).is_err());
    }

    #[test]
    fn the_elicitation_is_an_input_required_result() {
        let state = Waiting { session: "s".into(), seq: 1, call_seq: 2, call_id: "c".into() }.encode();
        let value = json!({"resultType": "input_required", "inputRequests": {APPROVAL_KEY: {"method": "elicitation/create",
            "params": {"mode": "form", "message": "ok?", "requestedSchema": {"type": "object", "properties": {
                "approve": {"type": "boolean"}}, "required": ["approve"]}}}}, "requestState": state});
        let parsed = serde_json::from_value::<InputRequiredResult>(value).unwrap();
        assert_eq!(parsed.request_state.as_deref(), Some(state.as_str()));
    }
}
