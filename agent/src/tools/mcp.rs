//! MCP client tools (SPEC §9): the tools of the configuration's `[mcp.NAME]` servers, offered to the model
//! as `NAME__TOOL`.
//!
//! One [`McpServer`] per configured server runs a supervisor task that spawns the server (stdio: a child
//! process with its `args`, `env` and `cwd`, its standard error forwarded to tracing) or connects to it
//! (streamable HTTP), performs the MCP handshake, lists its tools, and reconnects with exponential backoff
//! whenever the connection ends (a crashed child). A `notifications/tools/list_changed` re-lists the tools
//! (logged; what the models are offered is fixed when the agents are built, see
//! docs/decisions/0012-mcp-tools.md).
//!
//! A call ([`McpServer::call`]) never outlives its deadline: a server that is down, hung or restarting
//! gives an error result (`tool_timeout` past the deadline), and an abort drops the pending request, which
//! sends `notifications/cancelled` to the server. An `isError` result is a tool error; the text content is
//! joined as the output.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, MetaObject, RequestMetaObject};
use rmcp::service::{NotificationContext, Peer, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use turnstile_config::{McpServerConfig, McpTransport, Secret};

pub use super::TOOL_TIMEOUT;
use super::{Tool, ToolContext, ToolReturn};

/// How long a start (spawn or connect, handshake, first `tools/list`) may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait before a restart; it doubles on each failure up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A connection that lived this long resets the backoff to [`INITIAL_BACKOFF`].
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// The `_meta` key of a `tools/call` request that carries the call's idempotency key (SPEC §20, decision
/// 0143): the same key when the call runs again after its worker stopped, so the server can refuse a side
/// effect it already made.
pub const IDEMPOTENCY_KEY_META: &str = "turnstile/idempotency_key";

/// The name the model sees for tool `tool` of server `server`: `SERVER__TOOL`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
}

/// One tool as its server lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct McpToolDef {
    /// The name on the server (without the `SERVER__` prefix).
    pub name: String,
    /// Its description (empty when the server gives none).
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: serde_json::Value,
}

/// Where a server's connection stands.
#[derive(Clone)]
enum Status {
    /// Starting for the first time, or restarting after a crash: calls wait (within their deadline).
    Starting,
    /// Connected.
    Ready { peer: Peer<RoleClient>, pid: Option<u32> },
    /// The last start failed (retried with backoff): calls fail at once with this error.
    Failed(String),
    /// Shut down.
    Stopped,
}

/// A server that could not be started, or a configuration it cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A header value cannot be read from the environment.
    #[error(transparent)]
    Config(#[from] turnstile_config::ConfigError),
    /// The first start failed or did not finish within [`START_TIMEOUT`].
    #[error("MCP server {server:?} did not start: {message}")]
    Start { server: String, message: String },
}

/// One `[mcp.NAME]` server: its supervisor task, connection and listed tools. Dropping the last handle
/// stops the supervisor, which closes the connection and ends the child process.
pub struct McpServer {
    name: String,
    status: watch::Receiver<Status>,
    tools: ToolList,
    _stop: DropGuard,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").field("name", &self.name).field("pid", &self.pid()).finish_non_exhaustive()
    }
}

impl McpServer {
    /// Starts the supervisor of `config` (within a Tokio runtime), header values read through `env`; it
    /// connects in the background: [`McpServer::ready`] waits for the first start.
    pub fn spawn(config: &McpServerConfig, env: impl Fn(&str) -> Option<String>) -> Result<Arc<Self>, McpError> {
        let headers = config.resolve_headers(env)?;
        let (status_tx, status) = watch::channel(Status::Starting);
        let tools = ToolList::default();
        let stop = CancellationToken::new();
        let supervisor = Supervisor {
            name: config.name.clone(),
            config: config.clone(),
            headers,
            status: status_tx,
            tools: tools.clone(),
            stop: stop.clone(),
        };
        tokio::spawn(supervisor.run());
        Ok(Arc::new(Self { name: config.name.clone(), status, tools, _stop: stop.drop_guard() }))
    }

    /// [`McpServer::spawn`], then waits until the server is connected and has listed its tools.
    pub async fn start(config: &McpServerConfig, env: impl Fn(&str) -> Option<String>) -> Result<Arc<Self>, McpError> {
        let server = Self::spawn(config, env)?;
        server
            .ready(START_TIMEOUT)
            .await
            .map_err(|message| McpError::Start { server: config.name.clone(), message })?;
        Ok(server)
    }

    /// Waits up to `within` for a connection; the error of the failed start, or a timeout message.
    pub async fn ready(&self, within: Duration) -> Result<(), String> {
        let mut status = self.status.clone();
        let outcome = tokio::time::timeout(within, status.wait_for(|s| !matches!(s, Status::Starting))).await;
        match outcome {
            Err(_) => Err(format!("not connected within {} ms", within.as_millis())),
            Ok(Err(_)) => Err("the supervisor ended".to_owned()),
            Ok(Ok(s)) => match &*s {
                Status::Ready { .. } => Ok(()),
                Status::Failed(error) => Err(error.clone()),
                Status::Stopped | Status::Starting => Err("stopped".to_owned()),
            },
        }
    }

    /// The `[mcp.NAME]` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id of a connected stdio server.
    pub fn pid(&self) -> Option<u32> {
        match &*self.status.borrow() {
            Status::Ready { pid, .. } => *pid,
            _ => None,
        }
    }

    /// Whether the server is connected now.
    pub fn is_connected(&self) -> bool {
        matches!(&*self.status.borrow(), Status::Ready { peer, .. } if !peer.is_transport_closed())
    }

    /// The tools the server listed last.
    pub fn tools(&self) -> Vec<McpToolDef> {
        self.tools.get()
    }

    /// Calls `tool` with `arguments` (a JSON object, or empty for none), giving up at `deadline`
    /// (`tool_timeout`) or on `abort`; either sends `notifications/cancelled` for a request in flight.
    /// `idempotency_key`, when not empty, goes in the request's `_meta` as [`IDEMPOTENCY_KEY_META`].
    pub async fn call(
        &self,
        tool: &str,
        arguments: &str,
        idempotency_key: &str,
        deadline: Duration,
        abort: &CancellationToken,
    ) -> ToolReturn {
        let started = Instant::now();
        let arguments = match parse_arguments(arguments) {
            Ok(a) => a,
            Err(message) => return ToolReturn::failed(format!("{}: {message}", tool_name(&self.name, tool))),
        };
        let work = async {
            let peer = self.connected().await?;
            let mut params = CallToolRequestParams::new(tool.to_owned());
            params.arguments = arguments;
            if !idempotency_key.is_empty() {
                let mut meta = serde_json::Map::new();
                meta.insert(IDEMPOTENCY_KEY_META.to_owned(), idempotency_key.into());
                params.meta = Some(RequestMetaObject(MetaObject(meta)));
            }
            // Dropping this future before the response (deadline, abort) sends `notifications/cancelled`.
            peer.call_tool(params).await.map_err(|e| self.describe(&e))
        };
        tokio::select! {
            biased;
            () = abort.cancelled() => {
                ToolReturn::failed(format!("aborted after {} ms", started.elapsed().as_millis()))
            }
            () = tokio::time::sleep_until(started + deadline) => ToolReturn {
                output: format!(
                    "{} gave no result within {} ms; the call was cancelled",
                    tool_name(&self.name, tool),
                    deadline.as_millis()
                ),
                ..ToolReturn::failed(TOOL_TIMEOUT)
            },
            r = work => match r {
                Ok(result) => from_result(result),
                Err(message) => ToolReturn::failed(message),
            },
        }
    }

    /// The connection, waiting while the server (re)starts (also when it has just closed and the supervisor
    /// has not yet noticed); an error when its last start failed.
    async fn connected(&self) -> Result<Peer<RoleClient>, String> {
        let mut status = self.status.clone();
        let s = status
            .wait_for(|s| match s {
                Status::Starting => false,
                Status::Ready { peer, .. } => !peer.is_transport_closed(),
                Status::Failed(_) | Status::Stopped => true,
            })
            .await
            .map_err(|_| format!("MCP server {:?} is stopped", self.name))?;
        match &*s {
            Status::Ready { peer, .. } => Ok(peer.clone()),
            Status::Failed(error) => Err(format!("MCP server {:?} is down ({error}); restarting", self.name)),
            Status::Stopped | Status::Starting => Err(format!("MCP server {:?} is stopped", self.name)),
        }
    }

    fn describe(&self, error: &ServiceError) -> String {
        match error {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => format!(
                "MCP server {:?} closed the connection during the call (it may have crashed); it is restarted",
                self.name
            ),
            ServiceError::McpError(e) => format!("MCP server {:?}: error {}: {}", self.name, e.code.0, e.message),
            other => format!("MCP server {:?}: {other}", self.name),
        }
    }
}

/// `arguments` as an MCP arguments object: none for empty text, else a JSON object.
fn parse_arguments(arguments: &str) -> Result<Option<serde_json::Map<String, serde_json::Value>>, String> {
    if arguments.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(object)) => Ok(Some(object)),
        _ => Err(format!("the arguments must be a JSON object, got {arguments:?}")),
    }
}

/// A tool result as a [`ToolReturn`]: text blocks joined by newlines, other blocks as compact JSON without
/// their base64 payload, the structured content when there is no content; `isError` makes it an error.
fn from_result(result: CallToolResult) -> ToolReturn {
    let mut parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.text.clone(),
            other => describe_block(other),
        })
        .collect();
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    if result.is_error == Some(true) {
        let error = if text.is_empty() { "the tool reported an error without a message".to_owned() } else { text };
        return ToolReturn::failed(error);
    }
    ToolReturn::ok(text)
}

fn describe_block(block: &ContentBlock) -> String {
    let mut value = serde_json::to_value(block).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        if object.remove("data").is_some() {
            object.insert("data".into(), "<omitted>".into());
        }
        if let Some(resource) = object.get_mut("resource").and_then(serde_json::Value::as_object_mut)
            && resource.remove("blob").is_some()
        {
            resource.insert("blob".into(), "<omitted>".into());
        }
    }
    value.to_string()
}

/// A tool of an MCP server, registered as `SERVER__TOOL`.
pub struct McpTool {
    server: Arc<McpServer>,
    tool: McpToolDef,
    deadline: Duration,
}

impl McpTool {
    /// Tool `tool` of `server`, each call bounded by `deadline`.
    pub fn new(server: Arc<McpServer>, tool: McpToolDef, deadline: Duration) -> Self {
        Self { server, tool, deadline }
    }

    /// The deadline of a call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

#[async_trait]
impl Tool for McpTool {
    fn description(&self) -> &str {
        &self.tool.description
    }

    fn input_schema(&self) -> serde_json::Value {
        self.tool.input_schema.clone()
    }

    /// Bounded by the call's deadline ([`ToolContext::deadline`], the agent's for this tool), or the
    /// registered one when that is shorter (a call outside the registry's `Tools::call` has the default); the
    /// registry's own bound ends it at the same time, this one names the server in the message.
    async fn call(&self, ctx: &ToolContext, arguments: &str, abort: &CancellationToken) -> ToolReturn {
        let deadline = ctx.deadline.min(self.deadline);
        self.server.call(&self.tool.name, arguments, &ctx.idempotency_key, deadline, abort).await
    }
}

/// Hears `notifications/tools/list_changed`.
#[derive(Clone)]
struct Handler {
    tools_changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }
}

/// The tools a server listed last, shared by its handle and its supervisor. A panic while the list was
/// held cannot leave it half-written (it is only ever replaced whole), so a poisoned lock is recovered
/// rather than read as "no tools", which would silently take every tool of the server away.
#[derive(Clone, Default)]
struct ToolList(Arc<RwLock<Vec<McpToolDef>>>);

impl ToolList {
    fn get(&self) -> Vec<McpToolDef> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn len(&self) -> usize {
        self.0.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<McpToolDef>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps one server connected.
struct Supervisor {
    name: String,
    config: McpServerConfig,
    headers: Vec<(String, Secret)>,
    status: watch::Sender<Status>,
    tools: ToolList,
    stop: CancellationToken,
}

impl Supervisor {
    async fn run(self) {
        let mut backoff = INITIAL_BACKOFF;
        let tools_changed = Arc::new(Notify::new());
        loop {
            let started = Instant::now();
            let handler = Handler { tools_changed: tools_changed.clone() };
            let attempt = tokio::select! {
                () = self.stop.cancelled() => break,
                r = tokio::time::timeout(START_TIMEOUT, self.connect(handler)) => {
                    r.unwrap_or_else(|_| Err(format!("no handshake within {} ms", START_TIMEOUT.as_millis())))
                }
            };
            match attempt {
                Err(error) => {
                    tracing::warn!(server = %self.name, %error, retry_in_ms = backoff.as_millis() as u64, "MCP server did not start");
                    self.status.send_replace(Status::Failed(error));
                }
                Ok((running, pid)) => {
                    tracing::info!(
                        server = %self.name,
                        pid,
                        tools = self.tools.len(),
                        start_ms = started.elapsed().as_millis() as u64,
                        "MCP server connected"
                    );
                    let peer = running.peer().clone();
                    self.status.send_replace(Status::Ready { peer: peer.clone(), pid });
                    if self.serve(running, peer, &tools_changed).await.is_break() {
                        break;
                    }
                    if started.elapsed() >= HEALTHY_AFTER {
                        backoff = INITIAL_BACKOFF;
                    }
                    tracing::warn!(server = %self.name, pid, restart_in_ms = backoff.as_millis() as u64, "MCP server connection ended");
                    self.status.send_replace(Status::Starting);
                }
            }
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        self.status.send_replace(Status::Stopped);
    }

    /// Waits for the connection to end (continue: restart) or for the stop (break), re-listing the tools
    /// when the server says they changed.
    async fn serve(
        &self,
        running: RunningService<RoleClient, Handler>,
        peer: Peer<RoleClient>,
        tools_changed: &Notify,
    ) -> std::ops::ControlFlow<()> {
        let closer = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                quit = &mut waiting => {
                    tracing::debug!(server = %self.name, ?quit, "MCP service ended");
                    return std::ops::ControlFlow::Continue(());
                }
                () = self.stop.cancelled() => {
                    closer.cancel();
                    let _ = tokio::time::timeout(Duration::from_secs(3), waiting).await;
                    return std::ops::ControlFlow::Break(());
                }
                () = tools_changed.notified() => match tokio::time::timeout(START_TIMEOUT, list_tools(&peer)).await {
                    Ok(Ok(listed)) => self.replace_tools(listed),
                    Ok(Err(error)) => tracing::warn!(server = %self.name, %error, "MCP tools/list failed after list_changed"),
                    Err(_) => tracing::warn!(server = %self.name, "MCP tools/list timed out after list_changed"),
                },
            }
        }
    }

    /// Replaces the listed tools, logging the names that came or went (models keep the tools they were
    /// built with).
    fn replace_tools(&self, listed: Vec<McpToolDef>) {
        let mut tools = self.tools.write();
        let names = |t: &[McpToolDef]| t.iter().map(|d| d.name.clone()).collect::<std::collections::BTreeSet<_>>();
        let (old, new) = (names(&tools), names(&listed));
        if !tools.is_empty() && old != new {
            let added: Vec<_> = new.difference(&old).collect();
            let removed: Vec<_> = old.difference(&new).collect();
            tracing::warn!(
                server = %self.name, ?added, ?removed,
                "MCP server's tools changed; agents keep the tools they were built with until the worker restarts"
            );
        }
        *tools = listed;
    }

    /// Spawns or connects, shakes hands and lists the tools.
    async fn connect(&self, handler: Handler) -> Result<(RunningService<RoleClient, Handler>, Option<u32>), String> {
        let (running, pid) = match &self.config.transport {
            McpTransport::Stdio { command, args, env, cwd } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env).kill_on_drop(true);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot run {command:?}: {e}"))?;
                let pid = transport.id();
                if let Some(stderr) = stderr {
                    tokio::spawn(forward_stderr(self.name.clone(), pid, stderr));
                }
                let running = handler.serve(transport).await.map_err(|e| format!("MCP handshake failed: {e}"))?;
                (running, pid)
            }
            McpTransport::Http { url, .. } => {
                let client = http_client()?;
                let mut headers = HashMap::new();
                for (name, value) in &self.headers {
                    let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|e| format!("header {name}: {e}"))?;
                    let mut value = reqwest::header::HeaderValue::from_str(value.expose())
                        .map_err(|_| format!("the value of header {name} is not a valid header value"))?;
                    value.set_sensitive(true);
                    headers.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let running = handler.serve(transport).await.map_err(|e| format!("MCP handshake failed: {e}"))?;
                (running, None)
            }
        };
        let listed = list_tools(running.peer()).await?;
        self.replace_tools(listed);
        Ok((running, pid))
    }
}

async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<McpToolDef>, String> {
    let tools = peer.list_all_tools().await.map_err(|e| format!("tools/list failed: {e}"))?;
    Ok(tools
        .into_iter()
        .map(|t| McpToolDef {
            name: t.name.into_owned(),
            description: t.description.map(|d| d.into_owned()).unwrap_or_default(),
            input_schema: serde_json::Value::Object((*t.input_schema).clone()),
        })
        .collect())
}

/// Forwards a stdio server's standard error to tracing, line by line.
async fn forward_stderr(server: String, pid: Option<u32>, stderr: tokio::process::ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(server = %server, pid, "MCP server stderr: {line}");
    }
}

/// The HTTP client of streamable HTTP servers: rustls with ring (the workspace's one crypto provider), no
/// redirects, no overall timeout (an SSE stream stays open; calls have their own deadlines).
fn http_client() -> Result<reqwest::Client, String> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_tool_list_poisoned_by_a_panic_keeps_its_tools() {
        let list = ToolList::default();
        let def = McpToolDef { name: "echo".into(), description: String::new(), input_schema: serde_json::json!({}) };
        *list.write() = vec![def.clone()];
        let held = list.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = held.write();
            panic!("a panic while the list is held poisons its lock");
        })
        .join();
        assert!(panicked.is_err() && list.0.is_poisoned());
        assert_eq!((list.get(), list.len()), (vec![def.clone()], 1));
        *list.write() = Vec::new();
        assert_eq!(list.len(), 0, "the recovered lock is still written through");
    }

    #[test]
    fn arguments_are_a_json_object_or_nothing() {
        assert_eq!(parse_arguments("  ").unwrap(), None);
        assert_eq!(parse_arguments(r#"{"a": 1}"#).unwrap().unwrap()["a"], 1);
        assert!(parse_arguments("[1]").unwrap_err().contains("must be a JSON object"));
        assert!(parse_arguments("hello").is_err());
    }

    #[test]
    fn results_join_text_and_is_error_makes_an_error() {
        let ok = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(from_result(ok), ToolReturn::ok("a\nb"));
        let err = CallToolResult::error(vec![ContentBlock::text("no such file")]);
        assert_eq!(from_result(err), ToolReturn::failed("no such file"));
        let image = CallToolResult::success(vec![ContentBlock::image("AAAA", "image/png")]);
        let out = from_result(image).output;
        assert!(out.contains("image/png") && out.contains("<omitted>") && !out.contains("AAAA"), "{out}");
    }

    #[test]
    fn tool_names_carry_the_server() {
        assert_eq!(tool_name("files", "read_file"), "files__read_file");
    }
}
