//! A task (a turn, found from the delivery that asked for it) in A2A v1.0's JSON shape, as a view of
//! [`TurnFold`]: its id, its state, its history and the reply as artifacts, and the streaming events.

use serde_json::{Value, json};
use turnstile_model::time::rfc3339_utc;

use crate::ids::TaskId;
use crate::turn::{Call, Change, Outcome, TurnFold};

/// The prefix of a task id.
const TASK_PREFIX: &str = "task-";
/// The MessageId prefix of messages delivered through A2A (before the client's own message id).
pub(crate) const MESSAGE_PREFIX: &str = "a2a";

/// A task's id: `task-` + base64url(`session.seq`); the session is the task's context.
pub(crate) fn encode(task: &TaskId) -> String {
    task.token(TASK_PREFIX)
}

/// The task an [`encode`]d id names; `None`: not an id this server hands out (a task that does not exist).
pub(crate) fn decode(id: &str) -> Option<TaskId> {
    TaskId::from_token(TASK_PREFIX, id)
}

/// A2A's task state of the turn as folded so far.
pub(crate) fn state(fold: &TurnFold) -> &'static str {
    match fold.outcome() {
        None if fold.waiting().is_some() => "TASK_STATE_INPUT_REQUIRED",
        None if fold.turn().is_none() => "TASK_STATE_SUBMITTED",
        None => "TASK_STATE_WORKING",
        Some(Outcome::Completed | Outcome::MaxTokens) => "TASK_STATE_COMPLETED",
        Some(Outcome::Blocked(_)) => "TASK_STATE_REJECTED",
        Some(Outcome::Cancelled(_)) => "TASK_STATE_CANCELED",
        Some(Outcome::Failed { .. }) => "TASK_STATE_FAILED",
    }
}

/// Whether a task in `state` gets no more changes unless a message answers it (A2A's terminal and
/// interrupted states): where a blocking send answers and a stream ends.
pub(crate) fn stops(state: &str) -> bool {
    !matches!(state, "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING")
}

/// The task's status: its state, when it was last changed, and for an end or a wait, the agent's word.
fn status(id: &TaskId, fold: &TurnFold) -> Value {
    let (accepted, ended) = fold.times_ms();
    let mut status = json!({"state": state(fold)});
    if let Some(ms) = ended.or(accepted) {
        status["timestamp"] = json!(rfc3339_utc(ms));
    }
    let said = match (fold.outcome(), fold.waiting()) {
        (_, Some(call)) => Some(question(call)),
        (Some(Outcome::Blocked(reason)), _) => {
            Some(format!("a hook blocked the turn: {}", reason.as_deref().unwrap_or("no reason given")))
        }
        (Some(Outcome::Cancelled(message)), _) => Some(message.clone()),
        (Some(Outcome::Failed { code, message }), _) => Some(format!("{code}: {message}")),
        _ => None,
    };
    if let Some(text) = said {
        let mut parts = vec![json!({"text": text})];
        if let Some(call) = fold.waiting() {
            parts.push(json!({"data": {"call_id": call.call_id, "name": call.name, "arguments": call.arguments}}));
        }
        status["message"] = agent_message(id, &format!("status-{}", fold.seq()), parts);
    }
    status
}

/// What the agent asks a person about a call awaiting approval, and how to answer.
fn question(call: &Call) -> String {
    let args = if call.arguments.is_empty() { "no arguments" } else { call.arguments.as_str() };
    format!(
        "The agent wants to run the tool `{}` with {args}. Approve? Answer this task with a message: \"yes\" (or a \
         data part {{\"approve\": true}}) runs it, anything else refuses it and is given to the agent as the reason.",
        call.name
    )
}

fn agent_message(id: &TaskId, message_id: &str, parts: Vec<Value>) -> Value {
    json!({"messageId": message_id, "contextId": id.session, "taskId": encode(id), "role": "ROLE_AGENT", "parts": parts})
}

/// The client's message that asked for the task, as history.
fn prompt(id: &TaskId, fold: &TurnFold) -> Value {
    let message_id = fold.message_id().unwrap_or_default();
    let own = message_id.strip_prefix(MESSAGE_PREFIX).and_then(|m| m.strip_prefix('-')).unwrap_or(message_id);
    json!({"messageId": own, "contextId": id.session, "taskId": encode(id), "role": "ROLE_USER",
           "parts": [{"text": fold.prompt()}]})
}

/// The artifact of the step whose `step/start` is at `step`: one per step of the reply.
fn artifact_id(step: u64) -> String {
    format!("reply-{step}")
}

/// The task as A2A's `Task`, with at most `history_length` history messages (`None`: all of them).
pub(crate) fn task(id: &TaskId, fold: &TurnFold, history_length: Option<usize>, artifacts: bool) -> Value {
    let mut history = vec![prompt(id, fold)];
    if !fold.reply().is_empty() {
        let parts = vec![json!({"text": fold.reply()})];
        history.push(agent_message(id, &format!("reply-{}", fold.seq()), parts));
    }
    if let Some(keep) = history_length {
        let drop = history.len().saturating_sub(keep);
        history.drain(..drop);
    }
    let mut task = json!({
        "id": encode(id),
        "contextId": id.session,
        "status": status(id, fold),
        "history": history,
        "metadata": {"turnstile": {"session": id.session, "turn": fold.turn(), "seq": id.seq}},
    });
    if artifacts {
        let list: Vec<Value> = fold
            .replies()
            .iter()
            .map(|(step, text)| json!({"artifactId": artifact_id(*step), "name": "reply", "parts": [{"text": text}]}))
            .collect();
        task["artifacts"] = json!(list);
    }
    task
}

/// The streaming event a change makes, if A2A has one: a status update for a change of state, an
/// artifact update for more of the reply.
pub(crate) fn event(id: &TaskId, fold: &TurnFold, change: &Change) -> Option<Value> {
    let (task_id, context) = (encode(id), id.session.clone());
    match change {
        Change::Text { step, piece } => {
            // The step's text so far is this piece: its first chunk, which starts the artifact.
            let first_chunk = fold.replies().iter().any(|(s, text)| s == step && text == piece);
            Some(json!({"artifactUpdate": {
            "taskId": task_id, "contextId": context,
            "artifact": {"artifactId": artifact_id(*step), "name": "reply", "parts": [{"text": piece}]},
            "append": !first_chunk, "lastChunk": false,
            }}))
        }
        Change::Started { .. } | Change::Waiting(_) | Change::Decided { .. } | Change::Ended(_) => {
            Some(json!({"statusUpdate": {"taskId": task_id, "contextId": context, "status": status(id, fold)}}))
        }
        Change::Accepted
        | Change::Replied { .. }
        | Change::ToolCall(_)
        | Change::ClientCall(_)
        | Change::ToolResult { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids;

    #[test]
    fn task_ids_round_trip_and_anything_else_is_no_task() {
        let id = TaskId { session: "a2a-1".into(), seq: 7 };
        assert_eq!(decode(&encode(&id)), Some(id));
        for bad in ["", "task-", "task-!!", "7", &ids::token("task-", &["a b", "1"]), &ids::token("task-", &["s", "0"])]
        {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
