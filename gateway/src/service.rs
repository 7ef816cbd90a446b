//! The `turnstile.v1.Agent` service: decode and validate, route commands to the owning driver, serve
//! reads from the log.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use turnstile_cluster::CommandRouter;
use turnstile_journal::snapshot::{NoSnapshots, SnapshotStore};
use turnstile_journal::{LiveBus, SessionLog};
use turnstile_model::message::{MessageSource, SessionRef, Target, UserMessage};
use turnstile_model::{Command, CommandReply, InjectMode, SessionState, SessionSummary};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::{Agent, AgentServer};

use crate::auth::{Authenticator, Caller};
use crate::feed::SessionFeeds;
use crate::quota::{QuotaConfig, Quotas};
use crate::resume::StepPosition;
use crate::tools::ToolHub;
use crate::watch::{self, WatchSpec};
use crate::{convert, read, status};

/// Knobs of the gateway.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Tenant used when a request's `session.tenant` is empty (no auth in front of the gateway).
    pub default_tenant: String,
    /// `WhenIdle` timeout when the request says 0.
    pub when_idle_timeout: Duration,
    /// Items buffered per Watch stream before the tail waits for the client.
    pub watch_buffer: usize,
    /// Items a session's shared Watch feed keeps for its slowest watcher; one further behind reads what
    /// it lost from the log (decision 0039).
    pub watch_feed_capacity: usize,
    /// The agent a session runs until `ConfigureSession` names another (config `default_agent`); reads
    /// report it for sessions never configured.
    pub default_agent: String,
    /// The largest encoded request decoded (config `limits.max_request_bytes()`, decision 0033); a larger
    /// one is refused by tonic with OUT_OF_RANGE ("decoded message length too large") before it is decoded.
    pub max_request_bytes: usize,
    /// Per-tenant request rate and open Watch streams (decision 0033); all off by default.
    pub quotas: QuotaConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            default_tenant: "default".into(),
            when_idle_timeout: Duration::from_secs(30),
            watch_buffer: 256,
            watch_feed_capacity: crate::feed::DEFAULT_CAPACITY,
            default_agent: "scripted".into(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            quotas: QuotaConfig::default(),
        }
    }
}

/// `max_request_bytes` of the default configuration: 4 MiB of pending content plus 1 MiB of envelope.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 5 * 1024 * 1024;

/// Default and largest `ListSessions` page.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The public gateway: one per process, cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    router: Arc<dyn CommandRouter>,
    log: Arc<dyn SessionLog>,
    snapshots: Arc<dyn SnapshotStore>,
    config: GatewayConfig,
    /// Resolves each call's tenant ([`Gateway::open`]); disabled unless [`Gateway::with_auth`].
    auth: Arc<Authenticator>,
    /// Ends every Watch stream at shutdown; the server's graceful drain would otherwise wait for them forever.
    shutdown: CancellationToken,
    /// The client tool executors connected here (`ServeTools`).
    tools: ToolHub,
    /// Per-tenant request rate and Watch slots, checked in every method (so gRPC-Web is covered too).
    quotas: Quotas,
    /// One shared log reader and live subscription per watched session, for all its Watch streams here.
    feeds: SessionFeeds,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("config", &self.config).field("auth", &self.auth).finish_non_exhaustive()
    }
}

impl Gateway {
    /// The tonic server of this gateway with its request size limit; the gRPC server and the console's
    /// gRPC-Web API both serve this.
    pub fn into_server(self) -> AgentServer<Self> {
        let limit = self.config.max_request_bytes;
        AgentServer::new(self).max_decoding_message_size(limit)
    }

    pub fn new(
        router: Arc<dyn CommandRouter>,
        log: Arc<dyn SessionLog>,
        bus: Arc<dyn LiveBus>,
        config: GatewayConfig,
    ) -> Self {
        Self {
            feeds: SessionFeeds::new(log.clone(), bus, config.watch_feed_capacity),
            router,
            log,
            snapshots: Arc::new(NoSnapshots),
            quotas: Quotas::new(config.quotas),
            config,
            auth: Arc::new(Authenticator::Disabled),
            shutdown: CancellationToken::new(),
            tools: ToolHub::new(),
        }
    }

    /// Client tool executors register in `hub` (one reachable over NATS in a cluster).
    pub fn with_tools(mut self, hub: ToolHub) -> Self {
        self.tools = hub;
        self
    }

    /// Every call must carry a bearer token that `auth` resolves to a tenant, and is confined to it.
    pub fn with_auth(mut self, auth: Authenticator) -> Self {
        self.auth = Arc::new(auth);
        self
    }

    /// Reads start from the latest snapshot in `snapshots` instead of the start of the log.
    pub fn with_snapshots(mut self, snapshots: Arc<dyn SnapshotStore>) -> Self {
        self.snapshots = snapshots;
        self
    }

    /// This gateway's shared Watch feeds (tests read how many are open).
    pub fn feeds(&self) -> &SessionFeeds {
        &self.feeds
    }

    /// Where this gateway's Watch streams ask for a streaming step's output (tests run [`watch::run`]).
    pub fn owners(&self) -> watch::Owners {
        watch::Owners(self.router.clone())
    }

    /// This gateway's per-tenant quotas (tests read the open Watch count).
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Cancelling it ends every open Watch stream (with UNAVAILABLE, so clients reconnect elsewhere).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The one tenancy check, before anything else of a call: authenticates the caller and confines the
    /// request's session to the caller's tenant. An empty `session.tenant` becomes the caller's; another
    /// tenant's session is NOT_FOUND with the very message of a session that does not exist, so a caller
    /// learns nothing about other tenants.
    fn open<T: NamesSession>(&self, request: Request<T>) -> Result<T, Status> {
        let caller = self.auth.authenticate(request.metadata())?;
        let mut req = request.into_inner();
        if let (Caller::Tenant(tenant), Some(raw)) = (&caller, req.session_mut()) {
            if raw.tenant.is_empty() {
                raw.tenant.clone_from(tenant);
            } else if raw.tenant != *tenant {
                // Malformed names are still INVALID_ARGUMENT, as for the caller's own tenant.
                let named = self.session(Some(raw.clone()))?;
                return Err(read::not_found(&named));
            }
        }
        let tenant = match (&caller, req.session_mut()) {
            (Caller::Tenant(tenant), _) => tenant.clone(),
            (Caller::Anonymous, Some(raw)) if !raw.tenant.is_empty() => raw.tenant.clone(),
            (Caller::Anonymous, _) => self.config.default_tenant.clone(),
        };
        self.quotas.admit(&tenant)?;
        Ok(req)
    }

    fn session(&self, raw: Option<pb::SessionRef>) -> Result<SessionRef, Status> {
        convert::session(raw, &self.config.default_tenant).map_err(status::from_convert)
    }

    #[tracing::instrument(name = "command", skip_all, fields(%session, command = command.name()))]
    async fn execute(
        &self,
        session: &SessionRef,
        command: Command,
        timeout: Option<Duration>,
    ) -> Result<CommandReply, Status> {
        let name = command.name();
        let reply = self.router.execute(session, command, timeout).await;
        crate::ops::delivered(name, &reply);
        if let Err(e) = &reply {
            tracing::debug!(%session, command = name, error = %e, "command refused");
        }
        reply.map_err(status::from_command)
    }

    async fn deliver(&self, session: SessionRef, command: Command) -> Result<Response<pb::SendReply>, Status> {
        match self.execute(&session, command, None).await? {
            CommandReply::Sent { seq, turn } => Ok(Response::new(pb::SendReply { seq, turn })),
            other => Err(unexpected("a delivery", &other)),
        }
    }

    async fn written(&self, session: SessionRef, command: Command) -> Result<u64, Status> {
        let name = command.name();
        match self.execute(&session, command, None).await? {
            CommandReply::Written { seq } => Ok(seq),
            other => Err(unexpected(name, &other)),
        }
    }

    /// Decodes a `DeliverRequest`'s session and message; `default_source` fills a missing source.
    fn delivery(
        &self,
        req: pb::DeliverRequest,
        default_source: &MessageSource,
    ) -> Result<(SessionRef, UserMessage), Status> {
        let session = self.session(req.session)?;
        let message = convert::user_message("message", req.message, default_source).map_err(status::from_convert)?;
        Ok((session, message))
    }

    async fn preset(
        &self,
        req: pb::DeliverRequest,
        target: Target,
        wakeup: bool,
        default_source: &MessageSource,
    ) -> Result<Response<pb::SendReply>, Status> {
        let (session, message) = self.delivery(req, default_source)?;
        self.deliver(session, Command::Send { message, target, wakeup, expected_turn: None, deadline: None }).await
    }

    async fn info(&self, state: &SessionState) -> pb::SessionInfo {
        let owner = self.router.owner(&state.session).await.unwrap_or_default();
        let agent = state.agent.clone().unwrap_or_else(|| self.config.default_agent.clone());
        codec::encode_session_info(&state.session, &SessionSummary::of(state, owner, agent))
    }

    /// `ListSessions {parent}`: the children of `parent` (SPEC §13) after `after`. Every child id starts with
    /// the parent's id prefix (`child::id_prefix`) and ids are listed in order, so only the ids sharing that
    /// prefix are read, and each is projected to check its parent link.
    async fn list_children(
        &self,
        parent: &SessionRef,
        after: Option<SessionRef>,
        page_size: usize,
    ) -> Result<pb::ListSessionsReply, Status> {
        let prefix = format!("{}-", turnstile_model::child::id_prefix(parent));
        let start = SessionRef { tenant: parent.tenant.clone(), id: prefix.clone() };
        let mut after = Some(after.filter(|a| *a > start).unwrap_or(start));
        let mut children = Vec::new();
        // One extra tells whether another page exists.
        'pages: while children.len() <= page_size {
            let refs = self
                .log
                .list_sessions(Some(&parent.tenant), after.as_ref(), page_size + 1)
                .await
                .map_err(status::from_journal)?;
            let Some(last) = refs.last().cloned() else { break };
            for session in refs {
                if session.tenant != parent.tenant || !session.id.starts_with(&prefix) {
                    break 'pages;
                }
                let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
                if state.parent.as_ref() == Some(parent) {
                    children.push(state);
                }
            }
            after = Some(last);
        }
        let more = children.len() > page_size;
        children.truncate(page_size);
        let mut sessions = Vec::with_capacity(children.len());
        for state in &children {
            sessions.push(self.info(state).await);
        }
        let next_page_token = match children.last() {
            Some(last) if more => page_token(&last.session),
            _ => String::new(),
        };
        Ok(pb::ListSessionsReply { sessions, next_page_token })
    }

    /// The state after a command the driver answered with `seq`: its event is durable before the reply,
    /// so a read that ends earlier is a lagging replica, and the caller may retry.
    async fn state_after(&self, session: &SessionRef, seq: u64, retry: &str) -> Result<SessionState, Status> {
        let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), session).await?;
        if state.last_seq < seq {
            return Err(Status::unavailable(format!(
                "session {session} wrote seq {seq} but the log read ends at {}; {retry}",
                state.last_seq
            )));
        }
        Ok(state)
    }

    /// The session's goal after a goal command answered with `seq`.
    async fn goal_after(&self, session: &SessionRef, seq: u64) -> Result<Response<pb::GoalInfo>, Status> {
        let state = self.state_after(session, seq, "read the goal with GetSession").await?;
        let goal = state.goals.current.as_ref().ok_or_else(|| {
            Status::internal(format!(
                "session {session} answered a goal command but its log holds no goal; this is a bug"
            ))
        })?;
        Ok(Response::new(codec::encode_goal_info(&goal.current())))
    }
}

/// Requests that name one session, so [`Gateway::open`] can confine it.
trait NamesSession {
    fn session_mut(&mut self) -> Option<&mut pb::SessionRef>;
}

macro_rules! names_session {
    ($($t:ty),+ $(,)?) => {
        $(impl NamesSession for $t {
            fn session_mut(&mut self) -> Option<&mut pb::SessionRef> {
                self.session.as_mut()
            }
        })+
    };
}

names_session!(
    pb::SendRequest,
    pb::DeliverRequest,
    pb::SteerRequest,
    pb::CancelRequest,
    pb::ReplaceRequest,
    pb::RemoveRequest,
    pb::SpliceRequest,
    pb::ClearRequest,
    pb::GetInboxRequest,
    pb::GetSessionRequest,
    pb::ConfigureSessionRequest,
    pb::DecideRequest,
    pb::SetGoalRequest,
    pb::UpdateGoalRequest,
    pb::WatchRequest,
    pb::WhenIdleRequest,
    pb::CompactRequest,
    pb::ForkSessionRequest,
    pb::ReferenceSessionRequest,
);

// Session lifecycle (SPEC §12).
names_session!(pb::DeleteSessionRequest);

fn unexpected(what: &str, reply: &CommandReply) -> Status {
    Status::internal(format!("the driver answered {what} with {reply:?}; this is a bug, please report it"))
}

/// `tenant/id` of the last session of a page.
fn page_token(s: &SessionRef) -> String {
    format!("{}/{}", s.tenant, s.id)
}

fn parse_page_token(token: &str) -> Result<Option<SessionRef>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Status::invalid_argument(format!(
            "page_token {token:?} is not valid; pass the next_page_token of the previous reply, or empty to start"
        ))
    };
    let (tenant, id) = token.split_once('/').ok_or_else(bad)?;
    SessionRef::new(tenant, id).map(Some).map_err(|_| bad())
}

#[tonic::async_trait]
impl Agent for Gateway {
    async fn send(&self, request: Request<pb::SendRequest>) -> Result<Response<pb::SendReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let target = convert::target("target", req.target).map_err(status::from_convert)?;
        let message =
            convert::user_message("message", req.message, &MessageSource::User).map_err(status::from_convert)?;
        self.deliver(
            session,
            Command::Send { message, target, wakeup: req.wakeup, expected_turn: None, deadline: None },
        )
        .await
    }

    async fn followup(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        self.preset(self.open(request)?, Target::NextTurn, true, &MessageSource::User).await
    }

    async fn queue(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        self.preset(self.open(request)?, Target::NextTurn, false, &MessageSource::User).await
    }

    async fn steer(&self, request: Request<pb::SteerRequest>) -> Result<Response<pb::SendReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let message =
            convert::user_message("message", req.message, &MessageSource::User).map_err(status::from_convert)?;
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
        self.preset(self.open(request)?, Target::NextStep, false, &convert::inject_default_source()).await
    }

    async fn interrupt(&self, request: Request<pb::DeliverRequest>) -> Result<Response<pb::SendReply>, Status> {
        let (session, message) = self.delivery(self.open(request)?, &MessageSource::User)?;
        self.deliver(session, Command::Interrupt { message }).await
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Result<Response<pb::CancelReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let command = Command::Cancel { cause: convert::cancel_cause(req.cause), keep_inbox: req.keep_inbox };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::CancelReply { seq }))
    }

    async fn replace(&self, request: Request<pb::ReplaceRequest>) -> Result<Response<pb::EditReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let id = convert::message_id("id", req.id).map_err(status::from_convert)?;
        let message =
            convert::user_message("message", req.message, &MessageSource::User).map_err(status::from_convert)?;
        let seq = self.written(session, Command::Replace { id, message }).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn remove(&self, request: Request<pb::RemoveRequest>) -> Result<Response<pb::EditReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let id = convert::message_id("id", req.id).map_err(status::from_convert)?;
        let seq = self.written(session, Command::Remove { id }).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn splice(&self, request: Request<pb::SpliceRequest>) -> Result<Response<pb::EditReply>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        let target = convert::target("target", req.target).map_err(status::from_convert)?;
        let inserted = req
            .inserted
            .into_iter()
            .enumerate()
            .map(|(i, m)| convert::user_message(&format!("inserted[{i}]"), Some(m), &MessageSource::User))
            .collect::<Result<Vec<_>, _>>()
            .map_err(status::from_convert)?;
        let command = Command::Splice { target, start: req.start, delete_count: req.delete_count, inserted };
        let seq = self.written(session, command).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn clear(&self, request: Request<pb::ClearRequest>) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request)?.session)?;
        let seq = self.written(session, Command::Clear).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn get_inbox(&self, request: Request<pb::GetInboxRequest>) -> Result<Response<pb::InboxSnapshot>, Status> {
        let session = self.session(self.open(request)?.session)?;
        let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
        Ok(Response::new(codec::encode_inbox(&state.inbox, state.last_seq)))
    }

    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Result<Response<pb::SessionInfo>, Status> {
        let session = self.session(self.open(request)?.session)?;
        let state = read::existing(self.log.as_ref(), self.snapshots.as_ref(), &session).await?;
        Ok(Response::new(self.info(&state).await))
    }

    async fn configure_session(
        &self,
        request: Request<pb::ConfigureSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        if req.agent.is_empty() {
            return Err(Status::invalid_argument("agent: is empty; name one of the configured agents"));
        }
        let inject_mode = codec::inject_mode_at(req.inject_mode, "inject_mode", Some(InjectMode::Pending))
            .map_err(status::from_convert)?;
        let seq = self.written(session.clone(), Command::Configure { agent: req.agent, inject_mode }).await?;
        let state = self.state_after(&session, seq, "retry GetSession").await?;
        Ok(Response::new(self.info(&state).await))
    }

    async fn decide(&self, request: Request<pb::DecideRequest>) -> Result<Response<pb::EditReply>, Status> {
        let req = self.open(request)?;
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

    async fn set_goal(&self, request: Request<pb::SetGoalRequest>) -> Result<Response<pb::GoalInfo>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        // The driver checks the objective and the round budget (it knows the limits) and writes nothing
        // when it refuses. A revision keeps the goal's own id, so the minted one may go unused.
        let goal_id = uuid::Uuid::new_v4().to_string();
        let command = Command::SetGoal { goal_id, objective: req.objective, max_rounds: req.max_rounds };
        let seq = self.written(session.clone(), command).await?;
        self.goal_after(&session, seq).await
    }

    async fn update_goal(&self, request: Request<pb::UpdateGoalRequest>) -> Result<Response<pb::GoalInfo>, Status> {
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        if req.goal_id.is_empty() {
            return Err(Status::invalid_argument(
                "goal_id: is empty; name the goal (SetGoal's reply and GetSession's goal carry its id)",
            ));
        }
        let action = codec::goal_action_at(req.action, "action").map_err(status::from_convert)?;
        let seq = self.written(session.clone(), Command::UpdateGoal { goal_id: req.goal_id, action }).await?;
        self.goal_after(&session, seq).await
    }

    /// SPEC §12: the owner cancels a running turn (cause `disposed`) and removes the log, snapshots and
    /// dedup state. Tenant-scoped by [`Gateway::open`] like every call: another tenant's session is NOT_FOUND.
    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request)?.session)?;
        let seq = self.written(session, Command::Delete).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    type ServeToolsStream = ReceiverStream<Result<pb::ToolTask, Status>>;

    async fn compact(&self, request: Request<pb::CompactRequest>) -> Result<Response<pb::EditReply>, Status> {
        let session = self.session(self.open(request)?.session)?;
        let seq = self.written(session, Command::Compact).await?;
        Ok(Response::new(pb::EditReply { seq }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let req = self.open(request)?;
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
        let caller = self.auth.authenticate(request.metadata())?;
        let req = self.open(request)?;
        let session = self.session(req.session)?;
        // `from_session` is confined like `session`: another tenant's session is NOT_FOUND.
        let mut raw_from = req.from_session.ok_or_else(|| {
            Status::invalid_argument("from_session: is missing; name the session whose transcript to reference")
        })?;
        if raw_from.tenant.is_empty() {
            raw_from.tenant.clone_from(&session.tenant);
        }
        let from = self.session(Some(raw_from))?;
        if let Caller::Tenant(tenant) = &caller
            && from.tenant != *tenant
        {
            return Err(read::not_found(&from));
        }
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
        // Tools are the caller's tenant's. Without auth there is no caller tenant, and the stream names no
        // session: the `turnstile-tenant` header names it, as `session.tenant` does in other calls.
        let tenant = match self.auth.authenticate(request.metadata())? {
            Caller::Tenant(tenant) => tenant,
            Caller::Anonymous => match request.metadata().get(crate::tools::TENANT_HEADER) {
                None => self.config.default_tenant.clone(),
                Some(value) => {
                    let tenant = value.to_str().unwrap_or_default().to_owned();
                    SessionRef::new(tenant.clone(), "x").map_err(|e| {
                        Status::invalid_argument(format!(
                            "header {}: {e}; name a tenant of letters, digits, '-' and '_'",
                            crate::tools::TENANT_HEADER
                        ))
                    })?;
                    tenant
                }
            },
        };
        self.quotas.admit(&tenant)?;
        let stream = self.tools.serve(tenant, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    type WatchStream = ReceiverStream<Result<pb::WatchItem, Status>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = self.open(request)?;
        let resume = req.resume.map(|r| StepPosition {
            turn: r.turn,
            step: r.step,
            text: r.text_offset,
            reasoning: r.reasoning_offset,
        });
        let spec = WatchSpec { session: self.session(req.session)?, after_seq: req.after_seq, live: req.live, resume };
        // The slot is held by the stream's task, which ends when the client goes away.
        let permit = self.quotas.open_watch(&spec.session.tenant)?;
        let (tx, rx) = mpsc::channel(self.config.watch_buffer.max(1));
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
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn when_idle(&self, request: Request<pb::WhenIdleRequest>) -> Result<Response<pb::SessionInfo>, Status> {
        let req = self.open(request)?;
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

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsReply>, Status> {
        let caller = self.auth.authenticate(request.metadata())?;
        let mut req = request.into_inner();
        if let Caller::Tenant(own) = &caller {
            // Confined to the caller's tenant: naming another one is refused without saying whether it exists.
            if !req.tenant.is_empty() && req.tenant != *own {
                return Err(Status::permission_denied(format!(
                    "your credentials are for tenant {own:?}; ListSessions lists only your tenant's sessions: \
                     leave tenant empty"
                )));
            }
            req.tenant.clone_from(own);
        }
        self.quotas.admit(if req.tenant.is_empty() { &self.config.default_tenant } else { &req.tenant })?;
        let page_size = match req.page_size as usize {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(Status::invalid_argument(format!(
                    "page_size {n} is over the limit of {MAX_PAGE}; ask for at most {MAX_PAGE} (0 means {DEFAULT_PAGE})"
                )));
            }
            n => n,
        };
        let tenant = (!req.tenant.is_empty()).then_some(req.tenant);
        if let Some(t) = &tenant {
            // Reuse the session-name rule for the tenant half.
            SessionRef::new(t.clone(), "x").map_err(|e| Status::invalid_argument(format!("tenant: {e}")))?;
        }
        let after = parse_page_token(&req.page_token)?;
        if !req.parent.is_empty() {
            // A parent is in one tenant: the caller's, the one named, or the default one.
            let tenant = tenant.unwrap_or_else(|| self.config.default_tenant.clone());
            let parent =
                SessionRef::new(tenant, req.parent).map_err(|e| Status::invalid_argument(format!("parent: {e}")))?;
            return self.list_children(&parent, after, page_size).await.map(Response::new);
        }
        // One extra tells whether another page exists without an empty last page.
        let mut refs = self
            .log
            .list_sessions(tenant.as_deref(), after.as_ref(), page_size + 1)
            .await
            .map_err(status::from_journal)?;
        let more = refs.len() > page_size;
        refs.truncate(page_size);
        let mut sessions = Vec::with_capacity(refs.len());
        for session in &refs {
            let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), session).await?;
            sessions.push(self.info(&state).await);
        }
        let next_page_token = match refs.last() {
            Some(last) if more => page_token(last),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListSessionsReply { sessions, next_page_token }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_bad_ones_say_what_to_pass() {
        let s = SessionRef::new("acme", "s1").unwrap();
        assert_eq!(parse_page_token(&page_token(&s)).unwrap(), Some(s));
        assert_eq!(parse_page_token("").unwrap(), None);
        let err = parse_page_token("nonsense").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("next_page_token"), "{}", err.message());
    }
}
