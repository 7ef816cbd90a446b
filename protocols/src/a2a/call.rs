//! One A2A JSON-RPC call ([`Call`]) and the read of its task from the log: what the methods
//! ([`super::methods`]) and the push configurations ([`super::push`]) both use.

use axum::http::HeaderMap;
use serde_json::Value;

use super::rpc::{RpcError, code};
use super::task;
use crate::api::Api;
use crate::ids::TaskId;
use crate::profiles::Profile;
use crate::turn::TurnFold;

/// One JSON-RPC call: the caller's view of the gateway, the agent it addressed, its HTTP headers (for
/// `Last-Event-ID`) and the request id its stream events echo.
pub(crate) struct Call {
    pub(crate) api: Api<RpcError>,
    pub(crate) profile: Profile,
    pub(crate) headers: HeaderMap,
    pub(crate) id: Value,
}

/// The task as the log has it now (a lagging log is waited for, [`Api::read_turn`]); not found when there is
/// no such delivery.
pub(crate) async fn read(api: &Api<RpcError>, id: &TaskId) -> Result<TurnFold, RpcError> {
    api.read_turn(&id.session, id.seq)
        .await
        .map_err(|e| not_found(e, id))?
        .ok_or_else(|| RpcError::task_not_found(&task::encode(id)))
}

/// A gateway NOT_FOUND for the task's session is the task not found, named by its id.
pub(crate) fn not_found(error: RpcError, id: &TaskId) -> RpcError {
    match error.code {
        code::TASK_NOT_FOUND => RpcError::task_not_found(&task::encode(id)),
        _ => error,
    }
}
