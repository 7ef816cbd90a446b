//! `ListPendingApprovals` (SPEC §21): the approvals inbox, read from each session's fold (its open turn's
//! call awaiting a decision), never from a driver.

use std::collections::BTreeMap;

use tonic::Status;
use turnstile_model::{SessionRef, SessionState, Tenant};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::read;
use crate::search::query_of;
use crate::service::Gateway;

/// The call `state` waits on, if any, with its deadline when its agent has an `approval_timeout_ms`.
fn pending(state: &SessionState, timeouts: &BTreeMap<String, u64>, default_agent: &str) -> Option<pb::PendingApproval> {
    let open = state.open_turn.as_ref()?;
    let call = open.awaiting.as_ref()?;
    let (seq, since) = open.awaiting_since.unwrap_or_default();
    let agent = state.agent.as_deref().unwrap_or(default_agent);
    let deadline_unix_ms = timeouts.get(agent).map(|ms| since.saturating_add(*ms));
    Some(pb::PendingApproval {
        session: Some(codec::encode_session_ref(&state.session)),
        turn: open.turn,
        step: open.step,
        call_id: call.call_id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        seq,
        since_unix_ms: since,
        deadline_unix_ms,
    })
}

impl Gateway {
    pub(crate) fn pending(&self, state: &SessionState) -> Option<pb::PendingApproval> {
        pending(state, &self.config.approval_timeouts_ms, &self.config.default_agent)
    }

    /// The call of a client tool the running turn waits on (`CompleteToolCall` answers it), if any.
    pub(crate) fn awaiting_client(&self, state: &SessionState) -> Option<pb::ToolCall> {
        let open = state.open_turn.as_ref()?;
        let call = open.awaiting_client.as_ref()?;
        Some(pb::ToolCall {
            turn: open.turn,
            step: open.step,
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            awaiting_approval: false,
            awaiting_client: true,
            idempotency_key: turnstile_model::tool_key::idempotency_key(
                &state.session,
                open.turn,
                open.step,
                &call.call_id,
            ),
        })
    }

    /// The call `session` waits on (none or one); NOT_FOUND for a session without events.
    pub(crate) async fn pending_approvals_of(
        &self,
        session: &SessionRef,
    ) -> Result<pb::ListPendingApprovalsReply, Status> {
        let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), session).await?;
        Ok(pb::ListPendingApprovalsReply {
            approvals: self.pending(&state).into_iter().collect(),
            next_page_token: String::new(),
        })
    }

    /// The calls waiting in a page of `tenant`'s running sessions (a call waits only in a running turn).
    pub(crate) async fn pending_approvals_in(
        &self,
        tenant: &Tenant,
        page_token: &str,
        page_size: usize,
    ) -> Result<pb::ListPendingApprovalsReply, Status> {
        let request = pb::ListSessionsRequest {
            tenant: tenant.as_str().to_owned(),
            status: pb::SessionStatus::Running.into(),
            ..Default::default()
        };
        let mut query = query_of(&request)?;
        query.tenant = Some(tenant.as_str().to_owned());
        let page = self.search(query, page_token, page_size).await?;
        let mut approvals = Vec::new();
        for info in page.sessions {
            let session = self.session(info.session)?;
            let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
            approvals.extend(self.pending(&state));
        }
        Ok(pb::ListPendingApprovalsReply { approvals, next_page_token: page.next_page_token })
    }
}
