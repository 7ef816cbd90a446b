//! What a `tools/call` answers, shared by the call itself ([`super::call`]), its resumed stream
//! ([`super::resume`]) and its task ([`super::tasks`]): the result of a turn that ended, a gateway refusal, a
//! turn waiting for a decision (and the elicitation that asks it), the person's answer, and the cancel.

use rmcp::model::{CallToolResult, ContentBlock as Content, ErrorData};
use serde_json::{Value, json};

use super::Fail;
use crate::api::Api;
use crate::turn::{Call, Outcome, TurnFold};

/// The key of the approval elicitation in `inputRequests`.
pub(crate) const APPROVAL_KEY: &str = "approval";

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

/// The question put to a person about `call`.
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
}
