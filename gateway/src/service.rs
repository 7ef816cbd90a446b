//! The [`Gateway`] behind the `turnstile.v1.Agent` service: its configuration and parts, and what its RPCs
//! (the `rpc` module) share: routing a command to the owning driver, reading the state a command left.
//! The tenancy check every RPC passes through is `scope.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::{Response, Status};
use turnstile_cluster::CommandRouter;
use turnstile_journal::snapshot::{NoSnapshots, SnapshotStore};
use turnstile_journal::{LiveBus, SessionLog, UsageLedger};
use turnstile_model::ValueError;
use turnstile_model::message::{MessageId, MessageSource, SessionRef, Target, UserMessage};
use turnstile_model::size::BLOCK_OVERHEAD_BYTES;
use turnstile_model::{Command, CommandReply, SessionState, SessionSummary};
use turnstile_proto::codec::{self, CodecError};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::AgentServer;

use crate::auth::Authenticator;
use crate::feed::SessionFeeds;
use crate::quota::{QuotaConfig, Quotas};
use crate::tools::ToolHub;
use crate::watch;
use crate::watch_buffer::{BufferLimits, WatchBuffers};
use crate::{convert, read, status};

/// Knobs of the gateway.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Tenant used when a request's `session.tenant` is empty (no auth in front of the gateway).
    pub default_tenant: String,
    /// `WhenIdle` timeout when the request says 0.
    pub when_idle_timeout: Duration,
    /// Bytes one Watch stream and all of this gateway's may hold for their clients (config
    /// `limits.watch_buffer_bytes`, `limits.watch_buffer_total_bytes`); a stream that falls further behind
    /// is cut, resumable (decision 0088).
    pub watch_buffers: BufferLimits,
    /// The agent a session runs until `ConfigureSession` names another (config `default_agent`); reads
    /// report it for sessions never configured.
    pub default_agent: String,
    /// The largest encoded request decoded (config `limits.max_request_bytes()`, decision 0033); a larger
    /// one is refused by tonic with OUT_OF_RANGE ("decoded message length too large") before it is decoded.
    pub max_request_bytes: usize,
    /// Per-tenant request rate and open Watch streams (decision 0033); all off by default.
    pub quotas: QuotaConfig,
    /// Tenants' daily token budgets (`[tenants.NAME] token_budget`), which `GetUsage` reports.
    pub token_budgets: TokenBudgets,
    /// Agents' `approval_timeout_ms`, by agent: the deadline `ListPendingApprovals` reports (the workers'
    /// drivers decide at it, from the same configuration).
    pub approval_timeouts_ms: std::collections::BTreeMap<String, u64>,
    /// The largest message a delivery may carry (config `limits.max_message_bytes`; the owner's driver checks
    /// the exact count): a message with more blocks than that can hold is refused here, before its blocks are
    /// decoded ([`Gateway::user_message`]).
    pub max_message_bytes: usize,
    /// Whether `CreateWebhook` accepts internal targets (config `[webhooks] allow_private`, SPEC §21).
    pub allow_private_webhooks: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            default_tenant: "default".into(),
            when_idle_timeout: Duration::from_secs(30),
            watch_buffers: BufferLimits::default(),
            default_agent: "scripted".into(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            quotas: QuotaConfig::default(),
            token_budgets: TokenBudgets::new(),
            approval_timeouts_ms: std::collections::BTreeMap::new(),
            max_message_bytes: 1024 * 1024,
            allow_private_webhooks: false,
        }
    }
}

/// The `[tenants.NAME] token_budget`s of a configuration, by tenant.
pub type TokenBudgets = std::collections::BTreeMap<String, u64>;

/// `max_request_bytes` of the default configuration: 4 MiB less 64 KiB of pending bytes plus 1 MiB of
/// envelope (decisions 0033, 0085).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 5 * 1024 * 1024 - 64 * 1024;

/// Default and largest `ListSessions` page.
pub(crate) const DEFAULT_PAGE: usize = 100;
pub(crate) const MAX_PAGE: usize = 1000;

/// A request's `page_size`: 0 means [`DEFAULT_PAGE`]; more than [`MAX_PAGE`] is INVALID_ARGUMENT.
pub(crate) fn page_size(raw: u32) -> Result<usize, Status> {
    crate::status::bounded("page_size", raw as usize, DEFAULT_PAGE, MAX_PAGE)
}

/// The public gateway: one per process, cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) router: Arc<dyn CommandRouter>,
    pub(crate) log: Arc<dyn SessionLog>,
    pub(crate) snapshots: Arc<dyn SnapshotStore>,
    pub(crate) config: GatewayConfig,
    /// Resolves each call's caller (`scope.rs`); disabled unless [`Gateway::with_auth`].
    pub(crate) auth: Arc<Authenticator>,
    /// Ends every Watch stream at shutdown; the server's graceful drain would otherwise wait for them forever.
    pub(crate) shutdown: CancellationToken,
    /// The client tool executors connected here (`ServeTools`).
    pub(crate) tools: ToolHub,
    /// Per-tenant request rate and Watch slots, checked in every method (so gRPC-Web is covered too).
    pub(crate) quotas: Quotas,
    /// The session index `ListSessions` and `ListSchedules` read (SPEC §16); without one they read logs.
    pub(crate) index: Option<Arc<dyn turnstile_journal::SessionIndex>>,
    /// One shared log reader and live subscription per watched session, for all its Watch streams here.
    pub(crate) feeds: SessionFeeds,
    /// Where `GetUsage` reads tenants' token usage (SPEC §17); `None`: it is UNIMPLEMENTED here.
    pub(crate) usage: Option<Arc<dyn UsageLedger>>,
    /// Where the webhooks tenants register are kept (SPEC §21); `None`: the webhook RPCs are UNIMPLEMENTED.
    pub(crate) webhooks: Option<Arc<dyn turnstile_journal::WebhookRegistry>>,
    /// Where agents put at run time are kept (SPEC §20); `None`: the agent RPCs are UNIMPLEMENTED here.
    pub(crate) agents: Option<crate::agent_definitions::AgentDefinitions>,
    /// Where tenants' memory is kept (SPEC §20); `None`: the memory RPCs are UNIMPLEMENTED here.
    pub(crate) memory: Option<Arc<dyn turnstile_journal::MemoryStore>>,
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
            feeds: SessionFeeds::new(log.clone(), bus, WatchBuffers::new(config.watch_buffers)),
            router,
            log,
            snapshots: Arc::new(NoSnapshots),
            quotas: Quotas::new(config.quotas.clone()),
            config,
            usage: None,
            auth: Arc::new(Authenticator::Disabled),
            shutdown: CancellationToken::new(),
            tools: ToolHub::new(),
            index: None,
            webhooks: None,
            agents: None,
            memory: None,
        }
    }

    /// `ListSessions` filters and orders from `index` (the one its node's workers write).
    pub fn with_index(mut self, index: Arc<dyn turnstile_journal::SessionIndex>) -> Self {
        self.index = Some(index);
        self
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

    /// Agents are put, read and versioned in `definitions` (SPEC §20).
    pub fn with_agents(mut self, definitions: crate::agent_definitions::AgentDefinitions) -> Self {
        self.agents = Some(definitions);
        self
    }

    /// `GetUsage` reads tenants' token usage from `ledger` (the journal's, SPEC §17).
    pub fn with_usage(mut self, ledger: Arc<dyn UsageLedger>) -> Self {
        self.usage = Some(ledger);
        self
    }

    /// Keeps tenants' memory in `store` (SPEC §20).
    pub fn with_memory(mut self, store: Arc<dyn turnstile_journal::MemoryStore>) -> Self {
        self.memory = Some(store);
        self
    }

    /// Keeps the webhooks tenants register in `registry` (SPEC §21).
    pub fn with_webhooks(mut self, registry: Arc<dyn turnstile_journal::WebhookRegistry>) -> Self {
        self.webhooks = Some(registry);
        self
    }

    /// Counts the quotas with `quotas` (e.g. [`Quotas::shared`] across a cluster's gateways) instead of
    /// in this process.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
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

    pub(crate) fn session(&self, raw: Option<pb::SessionRef>) -> Result<SessionRef, Status> {
        convert::session(raw, &self.config.default_tenant).map_err(status::from_convert)
    }

    #[tracing::instrument(name = "command", skip_all, fields(%session, command = command.name()))]
    pub(crate) async fn execute(
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

    pub(crate) async fn deliver(
        &self,
        session: SessionRef,
        command: Command,
    ) -> Result<Response<pb::SendReply>, Status> {
        match self.execute(&session, command, None).await? {
            CommandReply::Sent { seq, turn } => Ok(Response::new(pb::SendReply { seq, turn })),
            other => Err(unexpected("a delivery", &other)),
        }
    }

    pub(crate) async fn written(&self, session: SessionRef, command: Command) -> Result<u64, Status> {
        let name = command.name();
        match self.execute(&session, command, None).await? {
            CommandReply::Written { seq } => Ok(seq),
            other => Err(unexpected(name, &other)),
        }
    }

    /// Decodes a delivered message (`field` names it in errors); `default_source` fills a missing source. A
    /// message with more blocks than `max_message_bytes` can hold (each counts at least
    /// [`BLOCK_OVERHEAD_BYTES`], decision 0085) is refused before its blocks are decoded: decoding and
    /// routing hundreds of thousands of empty blocks would cost this gateway seconds that its other tenants
    /// wait through.
    pub(crate) fn user_message(
        &self,
        field: &str,
        raw: Option<pb::UserMessage>,
        default_source: &MessageSource,
    ) -> Result<UserMessage, Status> {
        if let Some(message) = &raw {
            let max = self.config.max_message_bytes;
            let max_blocks = max / BLOCK_OVERHEAD_BYTES;
            if message.content.len() > max_blocks {
                let id = MessageId(message.id.clone());
                let fault = ValueError::TooManyBlocks { id, blocks: message.content.len(), max_blocks, max };
                return Err(status::from_convert(CodecError::value(format!("{field}.content"), fault)));
            }
        }
        convert::user_message(field, raw, default_source).map_err(status::from_convert)
    }

    /// Decodes a `DeliverRequest`'s session and message; `default_source` fills a missing source.
    pub(crate) fn delivery(
        &self,
        req: pb::DeliverRequest,
        default_source: &MessageSource,
    ) -> Result<(SessionRef, UserMessage), Status> {
        let session = self.session(req.session)?;
        let mut message = self.user_message("message", req.message, default_source)?;
        if let Some(schema) = req.output_schema {
            message.push_block(turnstile_model::output::block(&output_schema(schema)?));
        }
        Ok((session, message))
    }

    pub(crate) async fn preset(
        &self,
        req: pb::DeliverRequest,
        target: Target,
        wakeup: bool,
        default_source: &MessageSource,
    ) -> Result<Response<pb::SendReply>, Status> {
        let (session, message) = self.delivery(req, default_source)?;
        self.deliver(session, Command::Send { message, target, wakeup, expected_turn: None, deadline: None }).await
    }

    pub(crate) async fn info(&self, state: &SessionState) -> pb::SessionInfo {
        let owner = self.router.owner(&state.session).await.unwrap_or_default();
        let agent = state.agent.clone().unwrap_or_else(|| self.config.default_agent.clone());
        let mut info = codec::encode_session_info(&state.session, &SessionSummary::of(state, owner, agent));
        info.awaiting_approval = self.pending(state);
        info.awaiting_client = self.awaiting_client(state);
        info.overrides = (!state.overrides.is_empty()).then(|| codec::encode_overrides(&state.overrides));
        info
    }

    /// `ListSessions {parent}`: the children of `parent` (SPEC §13) after `after`. Every child id starts with
    /// the parent's id prefix (`child::id_prefix`) and ids are listed in order, so only the ids sharing that
    /// prefix are read, and each is projected to check its parent link.
    pub(crate) async fn list_children(
        &self,
        parent: &SessionRef,
        after: Option<SessionRef>,
        page_size: usize,
        query: &turnstile_journal::index::Query,
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
                let agent = state.agent.clone().unwrap_or_else(|| self.config.default_agent.clone());
                let entry = turnstile_journal::IndexEntry::of(&state, SessionSummary::of(&state, String::new(), agent));
                if state.parent.as_ref() == Some(parent) && query.matches(&entry) {
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
    pub(crate) async fn state_after(
        &self,
        session: &SessionRef,
        seq: u64,
        retry: &str,
    ) -> Result<SessionState, Status> {
        let state = read::project(self.log.as_ref(), self.snapshots.as_ref(), session).await?;
        if state.last_seq < seq {
            return Err(Status::unavailable(format!(
                "session {session} wrote seq {seq} but the log read ends at {}; {retry}",
                state.last_seq
            )));
        }
        Ok(state)
    }

    /// Runs a goal command and answers with the goal as the command left it. The owner builds that
    /// reply; a worker of a version before it answers with a seq only, and then the log is folded (which
    /// may show a later round, as it did before).
    pub(crate) async fn goal_command(
        &self,
        session: &SessionRef,
        command: Command,
    ) -> Result<Response<pb::GoalInfo>, Status> {
        let name = command.name();
        let seq = match self.execute(session, command, None).await? {
            CommandReply::Goal { goal, .. } => return Ok(Response::new(codec::encode_goal_info(&goal))),
            CommandReply::Written { seq } => seq,
            other => return Err(unexpected(name, &other)),
        };
        let state = self.state_after(session, seq, "read the goal with GetSession").await?;
        let goal = state.goals.current.as_ref().ok_or_else(|| {
            Status::internal(format!(
                "session {session} answered a goal command but its log holds no goal; this is a bug"
            ))
        })?;
        Ok(Response::new(codec::encode_goal_info(&goal.current())))
    }
}

pub(crate) fn unexpected(what: &str, reply: &CommandReply) -> Status {
    Status::internal(format!("the driver answered {what} with {reply:?}; this is a bug, please report it"))
}

/// `tenant/id` of the last session of a page.
pub(crate) fn page_token(s: &SessionRef) -> String {
    format!("{}/{}", s.tenant, s.id)
}

pub(crate) fn parse_page_token(token: &str) -> Result<Option<SessionRef>, Status> {
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

/// A request's `output_schema` (SPEC §20), checked by the rule the configuration's agents are checked by:
/// INVALID_ARGUMENT naming the field and what is wrong.
fn output_schema(raw: pb::OutputSchema) -> Result<turnstile_model::output::OutputSchema, Status> {
    let schema = serde_json::from_str(&raw.schema_json).map_err(|e| {
        Status::invalid_argument(format!(
            "output_schema.schema_json: not JSON ({e}); give the JSON Schema as JSON text"
        ))
    })?;
    let schema = turnstile_model::output::OutputSchema { name: raw.name, schema, strict: raw.strict };
    turnstile_config::output::check(&schema).map_err(|problem| {
        let field = match problem.part {
            turnstile_config::output::SchemaPart::Name => "name",
            turnstile_config::output::SchemaPart::Schema => "schema_json",
        };
        Status::invalid_argument(format!("output_schema.{field}: {}", problem.why))
    })?;
    Ok(schema)
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
