//! `turnstile acp [--agent NAME] [--session ID]`: Turnstile as an editor's agent over the Agent Client
//! Protocol (SPEC §19; docs/PROTOCOLS.md; decision 0129): JSON-RPC 2.0, one message a line, on stdin and
//! stdout, talking to any gateway with the CLI's address, token and TLS options.
//!
//! `session/new` opens a session (a new one, or `--session`), `session/load` replays a session's whole
//! history as `session/update`s and then follows it live, `session/prompt` delivers a followup and answers
//! with the turn's stop reason once it ends, `session/cancel` cancels the turn, and a call awaiting approval
//! is a `session/request_permission` whose answer decides it. Each open session has one follower ([`view`])
//! that turns its Watch into the updates, so an update is sent once whatever asked for it.

mod view;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use turnstile_model::sync::lock;
use turnstile_proto::v1 as pb;

use crate::client::{self, Client};
use view::{Signal, Stop, View, Waiting};

/// The ACP version spoken.
const PROTOCOL_VERSION: u64 = 1;

mod code {
    pub(super) const PARSE: i64 = -32700;
    pub(super) const METHOD_NOT_FOUND: i64 = -32601;
    pub(super) const INVALID_PARAMS: i64 = -32602;
    pub(super) const INTERNAL: i64 = -32603;
}

/// A JSON-RPC error answered to the editor.
#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn invalid(message: impl Into<String>) -> Self {
        Self { code: code::INVALID_PARAMS, message: message.into() }
    }
}

/// The gateway's refusals keep their message (it says what was wrong); bad input is invalid params.
impl From<tonic::Status> for RpcError {
    fn from(status: tonic::Status) -> Self {
        let code = match status.code() {
            tonic::Code::InvalidArgument | tonic::Code::NotFound | tonic::Code::FailedPrecondition => {
                code::INVALID_PARAMS
            }
            _ => code::INTERNAL,
        };
        Self { code, message: format!("{:?}: {}", status.code(), status.message()) }
    }
}

/// What the agent process shares between its tasks.
struct Agent {
    client: Client,
    agent: Option<String>,
    session: Option<String>,
    out: mpsc::UnboundedSender<Value>,
    /// Requests sent to the editor, waiting for its answer.
    asked: Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>,
    next_id: AtomicU64,
    /// The sessions followed, by id.
    sessions: Mutex<HashMap<String, Arc<Followed>>>,
}

/// One followed session: the prompts waiting for their turn's end.
#[derive(Default)]
struct Followed {
    /// MessageId of a prompt → where its stop reason goes.
    prompts: Mutex<HashMap<String, oneshot::Sender<Stop>>>,
    /// Turn → the prompt MessageId it answers.
    turns: Mutex<HashMap<u64, String>>,
    /// Messages this process delivered, to tell the view before they come back.
    own: Mutex<Vec<String>>,
}

pub async fn run(client: &Client, agent: Option<String>, session: Option<String>) -> Result<()> {
    let (out, mut outgoing) = mpsc::unbounded_channel::<Value>();
    // One writer: each message one line on stdout (nothing else of this process writes there).
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let stdout = std::io::stdout();
        while let Some(message) = outgoing.blocking_recv() {
            let mut lock = stdout.lock();
            if writeln!(lock, "{message}").and_then(|()| lock.flush()).is_err() {
                return;
            }
        }
    });
    let agent = Arc::new(Agent {
        client: client.clone(),
        agent,
        session,
        out,
        asked: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        sessions: Mutex::new(HashMap::new()),
    });
    let mut lines = crate::chat::stdin_lines();
    while let Some(line) = lines.recv().await {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(e) => {
                agent.send(json!({"jsonrpc": "2.0", "id": null, "error": {"code": code::PARSE, "message": format!("not JSON: {e}")}}));
                continue;
            }
        };
        agent.clone().receive(message);
    }
    drop(agent);
    let _ = writer.join();
    Ok(())
}

impl Agent {
    fn send(&self, message: Value) {
        // The writer ends only with the process.
        let _ = self.out.send(message);
    }

    fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// A request to the editor; its answer (result or error).
    async fn ask(&self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.asked).insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await.unwrap_or_else(|_| Err(json!({"message": "the editor went away"})))
    }

    /// One message from the editor: a request (answered on a task of its own, so a long prompt blocks
    /// nothing), a notification, or the answer to one of our requests.
    fn receive(self: Arc<Self>, message: Value) {
        let Value::Object(mut message) = message else { return };
        let id = message.remove("id");
        let method = message.remove("method").and_then(|m| m.as_str().map(str::to_owned));
        let params = match message.remove("params") {
            Some(Value::Object(params)) => params,
            _ => Map::new(),
        };
        match (id, method) {
            (Some(id), Some(method)) => {
                tokio::spawn(async move {
                    let answer = match self.clone().request(&method, &params).await {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}}),
                    };
                    self.send(answer);
                });
            }
            (None, Some(method)) if method == "session/cancel" => {
                tokio::spawn(async move {
                    if let Some(session) = params.get("sessionId").and_then(Value::as_str) {
                        let _ = self.cancel(session).await;
                    }
                });
            }
            (Some(id), None) => {
                let waiting = id.as_u64().and_then(|id| lock(&self.asked).remove(&id));
                if let Some(tx) = waiting {
                    let answer = match message.remove("error") {
                        Some(error) => Err(error),
                        None => Ok(message.remove("result").unwrap_or(Value::Null)),
                    };
                    let _ = tx.send(answer);
                }
            }
            _ => {}
        }
    }

    async fn request(self: Arc<Self>, method: &str, params: &Map<String, Value>) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(json!({
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {
                    "loadSession": true,
                    "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                },
                "authMethods": [],
                "agentInfo": {"name": "turnstile", "version": env!("CARGO_PKG_VERSION")},
            })),
            "authenticate" => Ok(json!({})),
            "session/new" => self.new_session().await,
            "session/load" => self.load_session(params).await,
            "session/prompt" => self.prompt(params).await,
            other => Err(RpcError {
                code: code::METHOD_NOT_FOUND,
                message: format!(
                    "{other} is not supported: turnstile acp serves initialize, session/new, session/load, \
                     session/prompt and session/cancel"
                ),
            }),
        }
    }

    /// `session/new`: `--session` or a new session, running `--agent` when given.
    async fn new_session(self: Arc<Self>) -> Result<Value, RpcError> {
        let id = self.session.clone().unwrap_or_else(|| format!("acp-{}", uuid::Uuid::new_v4().simple()));
        let mut api = self.client.api.clone();
        let info = match api.get_session(pb::GetSessionRequest { session: Some(self.client.session(&id)) }).await {
            Ok(info) => Some(info.into_inner()),
            Err(status) if status.code() == tonic::Code::NotFound => None,
            Err(status) => return Err(status.into()),
        };
        if let Some(agent) = &self.agent
            && info.as_ref().is_none_or(|i| i.agent != *agent)
        {
            let inject_mode = info.as_ref().map_or(0, |i| i.inject_mode);
            let req = pb::ConfigureSessionRequest {
                session: Some(self.client.session(&id)),
                agent: agent.clone(),
                inject_mode,
                ..Default::default()
            };
            api.configure_session(req).await?;
        }
        let after = info.map_or(0, |i| i.last_seq);
        self.follow(&id, after).await;
        Ok(json!({"sessionId": id}))
    }

    /// `session/load`: the session's whole history as updates, answered once they are all sent; then live.
    async fn load_session(self: Arc<Self>, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let id = session_param(params)?;
        let mut api = self.client.api.clone();
        api.get_session(pb::GetSessionRequest { session: Some(self.client.session(&id)) }).await?;
        let caught_up = self.follow(&id, 0).await;
        let _ = caught_up.await;
        Ok(json!({}))
    }

    /// Starts following `session` after `after` (once per session); resolves when the follower caught up.
    async fn follow(self: &Arc<Self>, session: &str, after: u64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let followed = {
            let mut sessions = lock(&self.sessions);
            if sessions.contains_key(session) {
                let _ = tx.send(());
                return rx;
            }
            let followed = Arc::new(Followed::default());
            sessions.insert(session.to_owned(), followed.clone());
            followed
        };
        tokio::spawn(self.clone().follower(session.to_owned(), after, followed, tx));
        rx
    }

    /// The session's Watch, for as long as the process runs, as updates and signals; a cut stream resumes
    /// after the last seq seen.
    async fn follower(
        self: Arc<Self>,
        session: String,
        after: u64,
        followed: Arc<Followed>,
        caught_up: oneshot::Sender<()>,
    ) {
        let mut view = View::after(after);
        let mut caught_up = Some(caught_up);
        loop {
            let mut api = self.client.api.clone();
            let req = pb::WatchRequest {
                session: Some(self.client.session(&session)),
                after_seq: view.seq,
                live: true,
                resume: None,
            };
            let mut stream = match api.watch(req).await {
                Ok(stream) => stream.into_inner(),
                Err(e) => {
                    eprintln!("turnstile acp: watching {session}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            while let Some(item) = stream.next().await {
                let Ok(item) = item else { break };
                for id in lock(&followed.own).drain(..) {
                    view.own(&id);
                }
                let out = view.apply(&item);
                for update in out.updates {
                    self.notify("session/update", json!({"sessionId": session, "update": update}));
                }
                for signal in out.signals {
                    match signal {
                        Signal::CaughtUp => {
                            if let Some(tx) = caught_up.take() {
                                let _ = tx.send(());
                            }
                        }
                        Signal::Entered { message_id, turn } => {
                            if lock(&followed.prompts).contains_key(&message_id) {
                                lock(&followed.turns).insert(turn, message_id);
                            }
                        }
                        Signal::Ended { turn, stop } => {
                            let Some(message) = lock(&followed.turns).remove(&turn) else { continue };
                            match stop {
                                // The owner died mid-turn: the next turn answers the same prompt (SPEC §6).
                                None => drop(lock(&followed.turns).insert(turn + 1, message)),
                                Some(stop) => {
                                    if let Some(tx) = lock(&followed.prompts).remove(&message) {
                                        let _ = tx.send(stop);
                                    }
                                }
                            }
                        }
                        Signal::Ask(waiting) => {
                            tokio::spawn(self.clone().permission(session.clone(), waiting));
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks the editor about a call awaiting approval and decides it with the answer.
    async fn permission(self: Arc<Self>, session: String, waiting: Waiting) {
        let params = json!({
            "sessionId": session,
            "toolCall": {"toolCallId": waiting.call_id, "title": waiting.name, "kind": "other", "status": "pending",
                         "rawInput": serde_json::from_str::<Value>(&waiting.arguments).unwrap_or(Value::String(waiting.arguments.clone()))},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ],
        });
        let (approve, reason) = match self.ask("session/request_permission", params).await {
            Ok(answer) => match (answer["outcome"]["outcome"].as_str(), answer["outcome"]["optionId"].as_str()) {
                (Some("selected"), Some("allow")) => (true, String::new()),
                (Some("selected"), _) => (false, "the editor's user rejected the call".to_owned()),
                _ => (false, "the editor cancelled the permission request".to_owned()),
            },
            Err(error) => (false, format!("the editor answered the permission request with an error: {error}")),
        };
        let mut api = self.client.api.clone();
        let req = pb::DecideRequest {
            session: Some(self.client.session(&session)),
            call_id: waiting.call_id.clone(),
            approve,
            reason,
        };
        if let Err(e) = api.decide(req).await {
            // Decided already (by another client, or the approval timeout): the turn goes on either way.
            eprintln!("turnstile acp: deciding {} of {session}: {e}", waiting.call_id);
        }
    }

    /// `session/prompt`: a followup (while a turn runs too), answered with the stop reason of the turn that
    /// answers it.
    async fn prompt(self: Arc<Self>, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let session = session_param(params)?;
        let blocks = match params.get("prompt") {
            Some(Value::Array(blocks)) => blocks,
            _ => return Err(RpcError::invalid("prompt is required: a list of content blocks")),
        };
        let text = blocks
            .iter()
            .filter_map(|b| match b["type"].as_str() {
                Some("text") => b["text"].as_str().map(str::to_owned),
                Some("resource_link") => b["uri"].as_str().map(str::to_owned),
                Some("resource") => b["resource"]["text"].as_str().map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        if text.trim().is_empty() {
            return Err(RpcError::invalid(
                "prompt has no text: turnstile acp takes text, resource and resource_link blocks",
            ));
        }
        let caught_up = self.follow(&session, self.last_seq(&session).await?).await;
        let _ = caught_up.await;
        let followed =
            lock(&self.sessions).get(&session).cloned().ok_or_else(|| RpcError::invalid("session not open"))?;
        let id = client::mint_id();
        let (tx, rx) = oneshot::channel();
        lock(&followed.prompts).insert(id.clone(), tx);
        lock(&followed.own).push(id.clone());
        let message = client::text_message(&id, &text, None);
        let req = pb::DeliverRequest {
            session: Some(self.client.session(&session)),
            message: Some(message),
            output_schema: None,
        };
        let mut api = self.client.api.clone();
        if let Err(status) = api.followup(req).await {
            lock(&followed.prompts).remove(&id);
            return Err(status.into());
        }
        match rx.await {
            Ok(Stop::Reason(reason)) => Ok(json!({"stopReason": reason})),
            Ok(Stop::Failed(message)) => Err(RpcError { code: code::INTERNAL, message }),
            Err(_) => Err(RpcError { code: code::INTERNAL, message: "the session's follower stopped".into() }),
        }
    }

    /// The session's last seq (0 for one with no events), where a follower of a session not yet open starts.
    async fn last_seq(&self, session: &str) -> Result<u64, RpcError> {
        let mut api = self.client.api.clone();
        match api.get_session(pb::GetSessionRequest { session: Some(self.client.session(session)) }).await {
            Ok(info) => Ok(info.into_inner().last_seq),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(0),
            Err(status) => Err(status.into()),
        }
    }

    /// `session/cancel`: cancels the running turn, keeping the session's other pending messages.
    async fn cancel(&self, session: &str) -> Result<(), RpcError> {
        let mut api = self.client.api.clone();
        let req = pb::CancelRequest { session: Some(self.client.session(session)), cause: None, keep_inbox: true };
        api.cancel(req).await?;
        Ok(())
    }
}

fn session_param(params: &Map<String, Value>) -> Result<String, RpcError> {
    params
        .get("sessionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| RpcError::invalid("sessionId is required"))
}
