//! The MCP server (SPEC §19; docs/PROTOCOLS.md; decision 0127): `/mcp`, Streamable HTTP, served by
//! `rmcp` statelessly (no MCP session: any gateway answers any request).
//!
//! Each agent profile the caller's tenant may run is a tool (`tools`); a call runs a turn in a new or
//! named session and answers with its reply, progress notifications carry the reply's deltas, and closing
//! the call's stream (the 2026-07-28 cancellation) cancels the turn. A call awaiting approval asks the
//! client through an MRTR elicitation where the protocol has it (`call`). A stream cut before its answer
//! resumes with `Last-Event-ID` through any gateway, rebuilt from the log (`resume`).

mod call;
mod results;
mod resume;
mod tasks;
mod tools;

use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::get;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ErrorData, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use turnstile_gateway::Gateway;

use crate::admit::{Admission, CallerTenant, admit};
use crate::api::{Api, ProtocolError};
use crate::profiles::Profiles;

/// The path the server answers on.
pub const PATH: &str = "/mcp";

/// A gateway answer on the way to an MCP client.
#[derive(Debug)]
pub(crate) struct Fail(pub(crate) tonic::Status);

impl From<tonic::Status> for Fail {
    fn from(status: tonic::Status) -> Self {
        Self(status)
    }
}

impl ProtocolError for Fail {}

#[derive(Clone)]
pub(crate) struct Server {
    pub(crate) gateway: Gateway,
    pub(crate) profiles: Arc<Profiles>,
}

impl Server {
    /// The caller's view of the gateway and its tenant, from the HTTP request `context` carries.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<(Api<Fail>, String), ErrorData> {
        let parts = context
            .extensions
            .get::<axum::http::request::Parts>()
            .ok_or_else(|| ErrorData::internal_error("the MCP request carries no HTTP request", None))?;
        let tenant = parts
            .extensions
            .get::<CallerTenant>()
            .ok_or_else(|| ErrorData::internal_error("the MCP request was not admitted", None))?;
        Ok((Api::new(&self.gateway, &parts.headers), tenant.0.clone()))
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build());
        info.server_info = Implementation::new("turnstile", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Each tool is a Turnstile agent: `message` is the prompt, `session` (optional) continues a \
             conversation; the result's structuredContent names the session to pass next time."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (_, tenant) = self.caller(&context)?;
        Ok(ListToolsResult::with_all_items(self.profiles.for_tenant(&tenant).map(tools::tool).collect()))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        // Only for the 2026-07-28 header checks; the tenant's list is answered by `list_tools`.
        self.profiles.list.iter().find(|p| p.name == name).map(tools::tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (api, tenant) = self.caller(&context)?;
        call::call(self, api, &tenant, request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (api, _) = self.caller(&context)?;
        tasks::get(&api, &request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (api, _) = self.caller(&context)?;
        tasks::update(&api, &request.task_id, &request.input_responses).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (api, _) = self.caller(&context)?;
        tasks::cancel_task(&api, &request.task_id).await
    }
}

/// The `/mcp` route, answered by `gateway`'s service code.
pub fn router(gateway: Gateway, profiles: Profiles) -> Router {
    let auth_enabled = profiles.auth_enabled;
    let server = Server { gateway: gateway.clone(), profiles: Arc::new(profiles) };
    // Without auth only loopback callers naming a loopback host get here ([`admit`](crate::admit)), the DNS-rebinding
    // guard rmcp's host list would give; with auth the token is the guard, and the host any name.
    // No priming event: it is stored before the call runs, so its id could name no position to resume from.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_retry(None)
        .disable_allowed_hosts()
        .with_cancellation_token(gateway.shutdown_token().child_token());
    let sessions = NeverSessionManager::default().with_event_store(Arc::new(resume::Cursors));
    let handler = server.clone();
    let service = StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(sessions), config);
    Router::new()
        .route(PATH, get(resume::resume).fallback_service(service))
        .with_state(server)
        .layer(axum::middleware::from_fn(resume::watch_close))
        .layer(from_fn_with_state(Admission::new(gateway, auth_enabled, "MCP server"), admit))
}
