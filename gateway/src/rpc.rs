//! The RPCs of `turnstile.v1.Agent` (docs/API.md): each method confines the request to its caller's tenant
//! ([`Gateway::open`]), turns it into a [`Command`](turnstile_model::Command) for the session's driver or
//! serves it as a read of the session's log, and answers.

use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use turnstile_model::message::{MessageSource, SessionRef, Target};
use turnstile_model::{Command, CommandReply, InjectMode};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::Agent;

use crate::auth::{Caller, Role};
use crate::resume::StepPosition;
use crate::scope::ToolsTenant;
use crate::service::{Gateway, page_size, parse_page_token, unexpected};
use crate::watch::{self, WatchSpec};
use crate::watch_buffer::ItemStream;
use crate::{convert, read, status, transcript};

#[tonic::async_trait]
impl Agent for Gateway {
    async fn send(&self, request: Request<pb::SendRequest>) -> Result<Response<pb::SendReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let target = convert::target("target", req.target).map_err(status::from_convert)?;
        let message = self.user_message("message", req.message, &MessageSource::User)?;
        self.deliver(
            session,
            Command::Send { message, target, wakeup: req.wakeup, expected_turn: None, deadline: None },
        )
        .await
    }

    async fn followup(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        self.preset(self.open(request).await?.1, Target::NextTurn, true, &MessageSource::User).await
    }

    async fn queue(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        self.preset(self.open(request).await?.1, Target::NextTurn, false, &MessageSource::User).await
    }

    async fn steer(&self, request: Request<pb::SteerRequest>) -> Result<Response<pb::SendReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let message = self.user_message("message", req.message, &MessageSource::User)?;
        let deadline = convert::steer_deadline(req.deadline_ms, req.on_deadline).map_err(status::from_convert)?;
        let command = Command::Send {
            message,
            target: Target::NextStep,
            wakeup: true,
            expected_turn: req.expected_turn,
            deadline,
        };
        self.deliver(session, command).await
    }

    async fn inject(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        self.preset(self.open(request).await?.1, Target::NextStep, false, &convert::inject_default_source()).await
    }

    async fn interrupt(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        let (session, message) = self.delivery(self.open(request).await?.1, &MessageSource::User)?;
        self.deliver(session, Command::Interrupt { message }).await
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Result<Response<pb::CancelReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let command = Command::Cancel { cause: convert::cancel_cause(req.cause), keep_inbox: req.keep_inbox };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::CancelReply { seq }))
    }

    async fn replace(&self, request: Request<pb::ReplaceRequest>) -> Result<Response<pb::EditReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let id = convert::message_id("id", req.id).map_err(status::from_convert)?;
        let message = self.user_message("message", req.message, &MessageSource::User)?;
        let seq = self.written(session, Command::Replace { id, message }).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Result<Response<pb::EditReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let id = convert::message_id("id", req.id).map_err(status::from_convert)?;
        let seq = self.written(session, Command::Remove { id }).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn splice(&self, request: Request<pb::SpliceRequest>) -> Result<Response<pb::EditReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let target = convert::target("target", req.target).map_err(status::from_convert)?;
        let inserted = req
            .inserted
            .into_iter()
            .enumerate()
            .map(|(i, m)| self.user_message(&format!("inserted[{i}]"), Some(m), &MessageSource::User))
            .collect::<Result<Vec<_>, _>>()?;
        let command = Command::Splice { target, start: req.start, delete_count: req.delete_count, inserted };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn clear(&self, request: Request<pb::ClearRequest>) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request).await?.1.session)?;
        let seq = self.written(session, Command::Clear).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn get_inbox(&self, request: Request<pb::GetInboxRequest>) -> Result<Response<pb::InboxSnapshot>, Status> {
        let session = self.session(self.open(request).await?.1.session)?;
        let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
        Ok(Response::new(codec::encode_inbox(&state.inbox, state.last_seq)))
    }

    /// SPEC §21: the conversation as items (`transcript.rs`).
    async fn get_transcript(
        &self,
        request: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::GetTranscriptReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let page_size = page_size(req.page_size)?;
        let reply = transcript::page(self.log.as_ref(), &session, req.after_seq, page_size).await?;
        Ok(Response::new(reply))
    }

    /// SPEC §21: the approvals inbox (`approvals.rs`).
    async fn list_pending_approvals(
        &self,
        request: Request<pb::ListPendingApprovalsRequest>,
    ) -> Result<Response<pb::ListPendingApprovalsReply>, Status> {
        let (scope, req) = self.open(request).await?;
        let page_size = page_size(req.page_size)?;
        let reply = match req.session {
            Some(session) => self.pending_approvals_of(&self.session(Some(session))?).await?,
            None => self.pending_approvals_in(&scope.tenant, &req.page_token, page_size).await?,
        };
        Ok(Response::new(reply))
    }

    // SPEC §20: memory, a tenant's own (`memory.rs`).
    async fn put_memory(&self, request: Request<pb::PutMemoryRequest>) -> Result<Response<pb::MemoryDocument>, Status> {
        let (scope, req) = self.open(request).await?;
        self.put_memory_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn get_memory(&self, request: Request<pb::GetMemoryRequest>) -> Result<Response<pb::MemoryDocument>, Status> {
        let (scope, req) = self.open(request).await?;
        self.get_memory_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn list_memory(
        &self,
        request: Request<pb::ListMemoryRequest>,
    ) -> Result<Response<pb::ListMemoryReply>, Status> {
        let (scope, req) = self.open(request).await?;
        self.list_memory_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn search_memory(
        &self,
        request: Request<pb::SearchMemoryRequest>,
    ) -> Result<Response<pb::SearchMemoryReply>, Status> {
        let (scope, req) = self.open(request).await?;
        self.search_memory_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn delete_memory(
        &self,
        request: Request<pb::DeleteMemoryRequest>,
    ) -> Result<Response<pb::MemoryDocument>, Status> {
        let (scope, req) = self.open(request).await?;
        self.delete_memory_in(&scope.tenant, req).await.map(Response::new)
    }

    // SPEC §20: agents as versioned objects of the caller's tenant (`agents.rs`).
    async fn put_agent(&self, request: Request<pb::PutAgentRequest>) -> Result<Response<pb::AgentInfo>, Status> {
        let (scope, req) = self.open(request).await?;
        self.put_agent_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn get_agent(&self, request: Request<pb::GetAgentRequest>) -> Result<Response<pb::AgentInfo>, Status> {
        let (scope, req) = self.open(request).await?;
        self.get_agent_in(&scope.tenant, req).await.map(Response::new)
    }

    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsReply>, Status> {
        let (scope, _) = self.open(request).await?;
        self.list_agents_in(&scope.tenant).await.map(Response::new)
    }

    async fn delete_agent(&self, request: Request<pb::DeleteAgentRequest>) -> Result<Response<pb::AgentInfo>, Status> {
        let (scope, req) = self.open(request).await?;
        self.delete_agent_in(&scope.tenant, &req.name).await.map(Response::new)
    }

    async fn list_agent_versions(
        &self,
        request: Request<pb::ListAgentVersionsRequest>,
    ) -> Result<Response<pb::ListAgentVersionsReply>, Status> {
        let (scope, req) = self.open(request).await?;
        self.list_agent_versions_in(&scope.tenant, &req.name).await.map(Response::new)
    }

    async fn migrate_sessions(
        &self,
        request: Request<pb::MigrateSessionsRequest>,
    ) -> Result<Response<pb::MigrateSessionsReply>, Status> {
        let (scope, req) = self.open(request).await?;
        self.migrate_in(&scope.tenant, req).await.map(Response::new)
    }

    // SPEC §20: evaluation (`eval/`).
    type EvaluateStream = ReceiverStream<Result<pb::EvaluateItem, Status>>;

    async fn evaluate(&self, request: Request<pb::EvaluateRequest>) -> Result<Response<Self::EvaluateStream>, Status> {
        let (scope, req) = self.open(request).await?;
        self.evaluate_in(&scope.tenant, req).await.map(|rx| Response::new(ReceiverStream::new(rx)))
    }

    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Result<Response<pb::SessionInfo>, Status> {
        let session = self.session(self.open(request).await?.1.session)?;
        let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
        Ok(Response::new(self.info(&state).await))
    }

    async fn configure_session(
        &self,
        request: Request<pb::ConfigureSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        if req.agent.is_empty() {
            return Err(Status::invalid_argument("agent: is empty; name one of the configured agents"));
        }
        let inject_mode = codec::inject_mode_at(req.inject_mode, "inject_mode", Some(InjectMode::Pending))
            .map_err(status::from_convert)?;
        let overrides = req
            .overrides
            .map(|o| codec::overrides_at(o, "overrides"))
            .transpose()
            .map_err(status::from_convert)?
            .unwrap_or_default();
        let version = self.version_to_configure(&session.tenant, &req.agent, req.version).await?;
        if version.is_none() {
            self.refuse_deleted(&session.tenant, &req.agent).await?;
        }
        let command = Command::Configure { agent: req.agent, inject_mode, version, overrides };
        let seq = self.written(session.clone(), command).await?;
        let state = self.state_after(&session, seq, "retry GetSession").await?;
        Ok(Response::new(self.info(&state).await))
    }

    async fn decide(&self, request: Request<pb::DecideRequest>) -> Result<Response<pb::EditReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        if req.call_id.is_empty() {
            return Err(Status::invalid_argument(
                "call_id: is empty; name the tool call to decide (the call_id of its tool/call event)",
            ));
        }
        let command = Command::Decide { call_id: req.call_id, approve: req.approve, reason: req.reason };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn complete_tool_call(
        &self,
        request: Request<pb::CompleteToolCallRequest>,
    ) -> Result<Response<pb::EditReply>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        if req.call_id.is_empty() {
            return Err(Status::invalid_argument(
                "call_id: is empty; name the call to complete (the call_id of its tool/call event with awaiting_client)",
            ));
        }
        let command = Command::CompleteToolCall { call_id: req.call_id, output: req.output, error: req.error };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn set_goal(&self, request: Request<pb::SetGoalRequest>) -> Result<Response<pb::GoalInfo>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        // The driver checks the objective and the round budget (it knows the limits) and writes nothing
        // when it refuses. A revision keeps the goal's own id, so the minted one may go unused.
        let goal_id = uuid::Uuid::new_v4().to_string();
        let command = Command::SetGoal { goal_id, objective: req.objective, max_rounds: req.max_rounds };
        self.goal_command(&session, command).await
    }

    async fn update_goal(&self, request: Request<pb::UpdateGoalRequest>) -> Result<Response<pb::GoalInfo>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        if req.goal_id.is_empty() {
            return Err(Status::invalid_argument(
                "goal_id: is empty; name the goal (SetGoal's reply and GetSession's goal carry its id)",
            ));
        }
        let action = codec::goal_action_at(req.action, "action").map_err(status::from_convert)?;
        self.goal_command(&session, Command::UpdateGoal { goal_id: req.goal_id, action }).await
    }

    /// SPEC §12: the owner cancels a running turn (cause `disposed`) and removes the log, snapshots and
    /// dedup state. Tenant-scoped by [`Gateway::open`] like every call: another tenant's session is NOT_FOUND.
    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request).await?.1.session)?;
        let seq = self.written(session, Command::Delete).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    /// SPEC §17: the tenant's token usage per model and its daily budget (`usage.rs`).
    async fn get_usage(&self, request: Request<pb::GetUsageRequest>) -> Result<Response<pb::TenantUsage>, Status> {
        let (scope, req) = self.open(request).await?;
        let Some(ledger) = &self.usage else {
            return Err(Status::unimplemented(
                "this gateway was started without a usage ledger, so it cannot report usage; ask a gateway of the \
                 cluster (turnstile gateway, turnstile dev)",
            ));
        };
        let budget = self.config.token_budgets.get(scope.tenant.as_str()).copied().unwrap_or(0);
        let now = turnstile_ops::clock::now_ms();
        crate::usage::tenant_usage(ledger.as_ref(), &scope.tenant, req.since_unix_ms, budget, now)
            .await
            .map(Response::new)
    }

    type ServeToolsStream = ReceiverStream<Result<pb::ToolTask, Status>>;

    async fn compact(&self, request: Request<pb::CompactRequest>) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request).await?.1.session)?;
        let seq = self.written(session, Command::Compact).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let (_, req) = self.open(request).await?;
        let source = self.session(req.session)?;
        if req.at_turn == 0 {
            return Err(Status::invalid_argument("at_turn: is 0; turns are numbered from 1"));
        }
        let new_session = self.session(Some(pb::SessionRef { tenant: source.tenant.clone(), id: req.new_session }))?;
        let fork = crate::history::fork_of(self.log.as_ref(), &source, req.at_turn).await?;
        let seq = self.written(new_session.clone(), Command::Fork(Box::new(fork))).await?;
        let state = self.state_after(&new_session, seq, "retry GetSession").await?;
        Ok(Response::new(self.info(&state).await))
    }

    async fn reference_session(
        &self,
        request: Request<pb::ReferenceSessionRequest>,
    ) -> Result<Response<pb::SendReply>, Status> {
        // `from_session` is confined like `session` (`scope.rs`): another tenant's session is NOT_FOUND.
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let from = req.from_session.ok_or_else(|| {
            Status::invalid_argument("from_session: is missing; name the session whose transcript to reference")
        })?;
        let from = self.session(Some(from))?;
        if req.upto_turn == Some(0) {
            return Err(Status::invalid_argument("upto_turn: is 0; turns are numbered from 1 (leave it out for all)"));
        }
        let (text, upto_seq) = crate::history::reference_text(self.log.as_ref(), &from, req.upto_turn).await?;
        let source = MessageSource::Session { tenant: from.tenant.clone(), session: from.id.clone(), upto_seq };
        let message = convert::user_message(
            "message",
            Some(pb::UserMessage {
                id: req.message_id,
                content: vec![pb::ContentBlock { block: Some(pb::content_block::Block::Text(pb::TextBlock { text })) }],
                source: Some(codec::encode_message_source(&source)),
            }),
            &source,
        )
        .map_err(status::from_convert)?;
        let command =
            Command::Send { message, target: Target::NextStep, wakeup: false, expected_turn: None, deadline: None };
        self.deliver(session, command).await
    }

    async fn serve_tools(
        &self,
        request: Request<tonic::Streaming<pb::ToolWorkerMessage>>,
    ) -> Result<Response<Self::ServeToolsStream>, Status> {
        // Tools are the call's tenant's. The stream names no session: the `turnstile-tenant` header names
        // the tenant (needed only without auth), as `session.tenant` does in other calls.
        let caller = self.caller(request.metadata(), Role::Member)?;
        let named = match request.metadata().get(crate::tools::TENANT_HEADER) {
            None => String::new(),
            Some(value) => value.to_str().map(str::to_owned).map_err(|_| {
                Status::invalid_argument(format!(
                    "header {}: is not ASCII; name a tenant of letters, digits, '-' and '_'",
                    crate::tools::TENANT_HEADER
                ))
            })?,
        };
        let scope = self.confine(caller, &mut ToolsTenant(named)).await?;
        let tenant = scope.tenant.into_string();
        let stream = self.tools.serve(tenant, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    type WatchStream = ItemStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let (_, req) = self.open(request).await?;
        let resume = req.resume.map(|r| StepPosition {
            turn: r.turn,
            step: r.step,
            text: r.text_offset,
            reasoning: r.reasoning_offset,
        });
        let spec = WatchSpec { session: self.session(req.session)?, after_seq: req.after_seq, live: req.live, resume };
        // The slot is held by the stream's task, which ends when the client goes away.
        let permit = self.quotas.open_watch(&spec.session.tenant).await?;
        let (tx, items) = self.feeds.buffers().watcher(&spec.session, spec.after_seq);
        let run = watch::run(
            self.log.clone(),
            self.feeds.clone(),
            self.snapshots.clone(),
            watch::Owners(self.router.clone()),
            spec,
            tx,
            self.shutdown.clone(),
        );
        tokio::spawn(async move {
            let _permit = permit;
            run.await;
        });
        Ok(Response::new(items))
    }

    async fn when_idle(&self, request: Request<pb::WhenIdleRequest>) -> Result<Response<pb::SessionInfo>, Status> {
        let (_, req) = self.open(request).await?;
        let session = self.session(req.session)?;
        let timeout = match req.timeout_ms {
            0 => self.config.when_idle_timeout,
            ms => Duration::from_millis(ms),
        };
        // The driver enforces the timeout; the gateway's own bound (with a little slack for the hop) keeps a
        // router that ignores it from holding the call forever.
        let call = self.execute(&session, Command::WhenIdle, Some(timeout));
        let reply = tokio::time::timeout(timeout + Duration::from_secs(1), call).await.map_err(|_| {
            Status::deadline_exceeded(format!(
                "session {session} did not become idle within {} ms; call WhenIdle again to keep waiting",
                timeout.as_millis()
            ))
        })??;
        let CommandReply::Idle(summary) = reply else {
            return Err(unexpected("when_idle", &reply));
        };
        Ok(Response::new(codec::encode_session_info(&session, &summary)))
    }

    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let (_, req) = self.open(request).await?;
        Ok(Response::new(Gateway::create_schedule(self, req).await?))
    }

    async fn delete_schedule(
        &self,
        request: Request<pb::DeleteScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let (_, req) = self.open(request).await?;
        Ok(Response::new(Gateway::delete_schedule(self, req).await?))
    }

    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesReply>, Status> {
        let (scope, req) = self.open(request).await?;
        let session = req.session.map(|s| self.session(Some(s))).transpose()?;
        let tenant = scope.tenant.into_string();
        let reply = Gateway::list_schedules(self, session, tenant, &req.page_token, req.page_size).await?;
        Ok(Response::new(reply))
    }

    async fn set_labels(&self, request: Request<pb::SetLabelsRequest>) -> Result<Response<pb::SessionInfo>, Status> {
        let (_, req) = self.open(request).await?;
        Ok(Response::new(Gateway::set_labels(self, req).await?))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsReply>, Status> {
        let (scope, req) = self.open(request).await?;
        let page_size = page_size(req.page_size)?;
        // Without auth, naming no tenant lists every tenant's sessions; otherwise the call's tenant.
        let tenant = match (&scope.caller, req.tenant.is_empty()) {
            (Caller::Anonymous, true) => None,
            _ => Some(scope.tenant.as_str().to_owned()),
        };
        let mut query = crate::search::query_of(&req)?;
        if !req.parent.is_empty() {
            // A parent is in one tenant: the call's (the caller's, the one named, or the default one).
            let parent = SessionRef::in_tenant(&scope.tenant, req.parent)
                .map_err(|e| Status::invalid_argument(format!("parent: {e}")))?;
            if query.order == turnstile_journal::index::Order::Id {
                // Children's ids share their parent's prefix: the log lists them without any index.
                let after = parse_page_token(&req.page_token)?;
                return self.list_children(&parent, after, page_size, &query).await.map(Response::new);
            }
            query.parent = Some(parent);
        }
        query.tenant = tenant;
        self.search(query, &req.page_token, page_size).await.map(Response::new)
    }

    /// SPEC §21: webhooks registered at run time (`webhooks.rs`).
    async fn create_webhook(
        &self,
        request: Request<pb::CreateWebhookRequest>,
    ) -> Result<Response<pb::Webhook>, Status> {
        let (scope, req) = self.open(request).await?;
        Gateway::create_webhook(self, &scope.tenant, req).await.map(Response::new)
    }

    async fn list_webhooks(
        &self,
        request: Request<pb::ListWebhooksRequest>,
    ) -> Result<Response<pb::ListWebhooksReply>, Status> {
        let (scope, _) = self.open(request).await?;
        Gateway::list_webhooks(self, &scope.tenant).map(Response::new)
    }

    async fn delete_webhook(
        &self,
        request: Request<pb::DeleteWebhookRequest>,
    ) -> Result<Response<pb::Webhook>, Status> {
        let (scope, req) = self.open(request).await?;
        Gateway::delete_webhook(self, &scope.tenant, &req.id).await.map(Response::new)
    }

    // SPEC §18: export and import (`export.rs`).
    type ExportSessionsStream = ReceiverStream<Result<pb::ExportItem, Status>>;

    async fn export_sessions(
        &self,
        request: Request<pb::ExportSessionsRequest>,
    ) -> Result<Response<Self::ExportSessionsStream>, Status> {
        self.export(request).await.map(Response::new)
    }

    async fn import_sessions(
        &self,
        request: Request<tonic::Streaming<pb::ExportItem>>,
    ) -> Result<Response<pb::ImportReply>, Status> {
        self.import(request).await.map(Response::new)
    }
}
