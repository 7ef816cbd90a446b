//! `tools/call`: a turn of the tool's agent in a new or named session, followed on the session's Watch to
//! its end. Progress notifications carry the reply's deltas (`progress` is the delta's position, decision
//! 0101's numbering, so it rises and is the same through any gateway); the call's cancellation cancels the
//! turn; a call awaiting approval is answered by an MRTR elicitation whose `requestState` names the call,
//! and the retried call decides it and follows the rest of the turn (decision 0127).

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, InputRequiredResult, ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use turnstile_proto::v1 as pb;

use super::results::{approval, cancel, ended, failure, input_requests, waiting_result};
use super::resume::{Cursor, StreamClosed};
use super::tasks;
use super::tools::Arguments;
use super::{Fail, Server};
use crate::api::{Api, Delivery};
use crate::ids;
use crate::turn::{Call, Change, SPAN, TurnFold};

/// The prefix of the sessions a call without `session` opens.
const SESSION_PREFIX: &str = "mcp";
/// The prefix of the `requestState` that names a call awaiting approval.
const STATE_PREFIX: &str = "mcpa_";

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

/// Whether the caller speaks 2026-07-28 or later (stateless by protocol: MRTR, and closing a call's stream
/// cancels it).
fn modern(context: &RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|v| v.as_str() >= "2026-07-28")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::results::APPROVAL_KEY;

    #[test]
    fn request_states_round_trip_and_forgeries_are_invalid_params() {
        let w = Waiting { session: "mcp-1".into(), seq: 4, call_seq: 9, call_id: "c.1".into() };
        assert_eq!(Waiting::decode(&w.encode()).unwrap(), w);
        for bad in ["", "mcpa_", "xyz", &ids::token(STATE_PREFIX, &["a b", "1", "2", "c"])] {
            assert_eq!(Waiting::decode(bad).unwrap_err().code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
        }
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
