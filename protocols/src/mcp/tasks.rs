//! The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663; decision 0157): a `tools/call` of a
//! client that declares the extension answers at once with a task, which the client polls with
//! `tasks/get`, answers with `tasks/update` when it waits for a person, and may end with `tasks/cancel`.
//!
//! A task is the turn of the call's delivery, as an A2A task is (decision 0128): its id encodes the session
//! and the delivery's seq, and every method reads the turn from the log through the caller's token, so any
//! gateway answers and nothing is kept.

use rmcp::model::{
    CreateTaskResult, DetailedTask, ErrorData, GetTaskResult, InputRequests, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{RequestContext, RoleServer};
use turnstile_model::time::rfc3339_utc;

use super::Fail;
use super::results::{approval, cancel, ended, input_requests, question};
use crate::api::Api;
use crate::ids::TaskId;
use crate::turn::{Outcome, TurnFold};

const PREFIX: &str = "mcpt_";
/// How often a client is asked to poll.
pub(crate) const POLL_INTERVAL_MS: u64 = 500;

/// A task's id: `mcpt_` + base64url(`session.seq`).
fn encode(task: &TaskId) -> String {
    task.token(PREFIX)
}

/// The task an [`encode`]d id names; an invalid-params error when it is not an id this server hands out.
fn decode(raw: &str) -> Result<TaskId, ErrorData> {
    TaskId::from_token(PREFIX, raw).ok_or_else(|| no_task(raw))
}

fn no_task(raw: &str) -> ErrorData {
    ErrorData::invalid_params(format!("no task {raw:?}: task ids are the taskId of a tools/call's task"), None)
}

/// Whether the caller declared the tasks extension (per request at 2026-07-28, else at `initialize`).
pub(crate) fn wanted(context: &RequestContext<RoleServer>) -> bool {
    context.client_capabilities().is_some_and(|c| c.supports_tasks())
}

/// The answer to a call that became a task: the task, working.
pub(crate) fn created(session: &str, seq: u64) -> CreateTaskResult {
    let now = rfc3339_utc(now_ms());
    let id = TaskId { session: session.to_owned(), seq };
    CreateTaskResult::new(
        Task::new(encode(&id), TaskStatus::Working, now.clone(), now).with_poll_interval_ms(POLL_INTERVAL_MS),
    )
}

/// Unix ms now: the task's creation, before its delivery is read back.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The task's turn as the log has it now (a lagging log is waited for, [`Api::read_turn`]).
async fn read(api: &Api<Fail>, id: &TaskId) -> Result<TurnFold, ErrorData> {
    api.read_turn(&id.session, id.seq).await.map_err(|e| gateway(e, id))?.ok_or_else(|| no_task(&encode(id)))
}

/// The gateway's refusal: another tenant's session is a task that does not exist.
fn gateway(Fail(status): Fail, id: &TaskId) -> ErrorData {
    match status.code() {
        tonic::Code::NotFound => no_task(&encode(id)),
        code => ErrorData::internal_error(format!("{code:?}: {}", status.message()), None),
    }
}

/// `tasks/get`: the task's state; its result once the turn ended.
pub(crate) async fn get(api: &Api<Fail>, raw: &str) -> Result<GetTaskResult, ErrorData> {
    let id = decode(raw)?;
    let fold = read(api, &id).await?;
    Ok(GetTaskResult::new(detailed(&id, &fold)))
}

fn detailed(id: &TaskId, fold: &TurnFold) -> DetailedTask {
    let (accepted, ended_ms) = fold.times_ms();
    let created = rfc3339_utc(accepted.unwrap_or_default());
    let updated = rfc3339_utc(ended_ms.or(accepted).unwrap_or_default());
    let mut task = Task::new(encode(id), TaskStatus::Working, created, updated).with_poll_interval_ms(POLL_INTERVAL_MS);
    let payload = match (fold.outcome(), fold.waiting()) {
        (Some(Outcome::Cancelled(message)), _) => {
            task = task.with_status_message(message.clone());
            TaskPayload::Cancelled
        }
        (Some(outcome), _) => {
            let result = serde_json::to_value(ended(&id.session, fold, outcome)).ok();
            match result {
                Some(serde_json::Value::Object(result)) => TaskPayload::Completed { result },
                _ => TaskPayload::Working,
            }
        }
        (None, Some(call)) => {
            task = task.with_status_message(question(call));
            match serde_json::from_value::<InputRequests>(input_requests(call)) {
                Ok(input_requests) => TaskPayload::InputRequired { input_requests },
                Err(_) => TaskPayload::Working,
            }
        }
        (None, None) => TaskPayload::Working,
    };
    DetailedTask::new(task, payload)
}

/// `tasks/update`: the person's answer to the call the task waits on.
pub(crate) async fn update(
    api: &Api<Fail>,
    raw: &str,
    responses: &rmcp::model::InputResponses,
) -> Result<(), ErrorData> {
    let id = decode(raw)?;
    let fold = read(api, &id).await?;
    let Some(call) = fold.waiting() else {
        return Err(ErrorData::invalid_params(
            format!("task {raw} waits for no input now; tasks/get says what it does"),
            None,
        ));
    };
    let (approve, reason) = approval(Some(responses))?;
    api.decide(&id.session, &call.call_id, approve, &reason).await.map_err(|e| gateway(e, &id))?;
    Ok(())
}

/// `tasks/cancel`: cancels the turn, or removes its message when it has not started.
pub(crate) async fn cancel_task(api: &Api<Fail>, raw: &str) -> Result<(), ErrorData> {
    let id = decode(raw)?;
    let fold = read(api, &id).await?;
    if fold.finished() {
        return Err(ErrorData::invalid_params(format!("task {raw} has ended: there is nothing to cancel"), None));
    }
    cancel(api, &id.session, &fold, fold.message_id()).await.map_err(|e| gateway(e, &id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids;

    #[test]
    fn task_ids_round_trip_and_anything_else_is_invalid_params() {
        let id = TaskId { session: "mcp-1".into(), seq: 3 };
        assert_eq!(decode(&encode(&id)).unwrap(), id);
        for bad in ["", "mcpt_", "task-1", &ids::token(PREFIX, &["a b", "1"]), &ids::token(PREFIX, &["s", "0"])] {
            assert_eq!(decode(bad).unwrap_err().code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
        }
    }
}
