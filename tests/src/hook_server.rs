//! A remote pre-step hook for tests: the gRPC service `turnstile.hooks.v1.PreStepHook` on 127.0.0.1:0,
//! in the test process, answering as the test says ([`Behaviour`]) and recording every request it got.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};
use turnstile_proto::hooks::v1::pre_step_decision::Decision;
use turnstile_proto::hooks::v1::pre_step_hook_server::{PreStepHook, PreStepHookServer};
use turnstile_proto::hooks::v1::{Enter, PreStepDecision, PreStepRequest, Reject};
use turnstile_proto::v1::UserMessage;

use crate::HarnessError;
use crate::msg::{source_msg, text_of};
use crate::sync::lock;

/// How the hook answers.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// `enter` with the batch as given.
    Pass,
    /// `enter` with every message's text prefixed by this (same ids).
    Prefix(String),
    /// `enter` without the messages whose text contains this.
    DropContaining(String),
    /// `enter([])`.
    EnterNothing,
    /// `reject {reason}`.
    Reject(String),
    /// Sleep this long, then pass (a deadline shorter than this makes the worker give up first).
    Sleep(Duration),
    /// `enter` with a message whose id the batch does not have.
    AddMessage(String),
    /// `enter` with the first message twice.
    Duplicate,
    /// An empty decision (neither reject nor enter).
    Empty,
    /// A gRPC error status (`INTERNAL`) with this message.
    Fail(String),
}

#[derive(Debug)]
struct State {
    behaviour: Mutex<Behaviour>,
    requests: Mutex<Vec<PreStepRequest>>,
}

struct Service(Arc<State>);

#[tonic::async_trait]
impl PreStepHook for Service {
    async fn decide(&self, request: Request<PreStepRequest>) -> Result<Response<PreStepDecision>, Status> {
        let request = request.into_inner();
        lock(&self.0.requests).push(request.clone());
        let behaviour = lock(&self.0.behaviour).clone();
        let enter = |messages: Vec<UserMessage>| Decision::Enter(Enter { messages });
        let decision = match behaviour {
            Behaviour::Pass => enter(request.messages),
            Behaviour::Prefix(prefix) => enter(
                request
                    .messages
                    .into_iter()
                    .map(|m| source_msg(&m.id, &format!("{prefix}{}", text_of(&m)), None))
                    .collect(),
            ),
            Behaviour::DropContaining(marker) => {
                enter(request.messages.into_iter().filter(|m| !text_of(m).contains(&marker)).collect())
            }
            Behaviour::EnterNothing => enter(vec![]),
            Behaviour::Reject(reason) => Decision::Reject(Reject { reason }),
            Behaviour::Sleep(pause) => {
                tokio::time::sleep(pause).await;
                enter(request.messages)
            }
            Behaviour::AddMessage(id) => {
                let mut messages = request.messages;
                messages.push(source_msg(&id, "smuggled", None));
                enter(messages)
            }
            Behaviour::Duplicate => {
                let mut messages = request.messages;
                if let Some(first) = messages.first().cloned() {
                    messages.push(first);
                }
                enter(messages)
            }
            Behaviour::Empty => return Ok(Response::new(PreStepDecision { decision: None })),
            Behaviour::Fail(message) => return Err(Status::internal(message)),
        };
        Ok(Response::new(PreStepDecision { decision: Some(decision) }))
    }
}

/// A running hook server; dropping it stops the server.
#[derive(Debug)]
pub struct HookServer {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
}

impl HookServer {
    /// Serves `behaviour` on a port of 127.0.0.1 the system picks.
    pub async fn start(behaviour: Behaviour) -> Result<Self, HarnessError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::io("binding the hook server", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::io("reading the hook server's address", e))?;
        let state = Arc::new(State { behaviour: Mutex::new(behaviour), requests: Mutex::new(Vec::new()) });
        let (stop, stopped) = oneshot::channel::<()>();
        let service = PreStepHookServer::new(Service(state.clone()));
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self { addr, state, stop: Some(stop) })
    }

    /// `http://127.0.0.1:PORT`, for an agent's `hooks = [{ url = ... }]`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next requests with `behaviour`.
    pub fn set(&self, behaviour: Behaviour) {
        *lock(&self.state.behaviour) = behaviour;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<PreStepRequest> {
        lock(&self.state.requests).clone()
    }

    /// The texts of each request's batch, in order.
    pub fn batches(&self) -> Vec<Vec<String>> {
        self.requests().iter().map(|r| r.messages.iter().map(text_of).collect()).collect()
    }
}

impl Drop for HookServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The Python hook server `tests/fixtures/hook_server.py` (grpcio), its stubs generated from `proto/` at
/// start into a temporary directory: it upper-cases the batch, or with `--tag TEXT` puts TEXT in front of
/// every text block. It binds 127.0.0.1:0 and prints `port N`, which [`PythonHookServer::start`] reads.
/// Dropping it kills and reaps the process.
pub struct PythonHookServer {
    child: std::process::Child,
    url: String,
    _stubs: tempfile::TempDir,
}

impl PythonHookServer {
    /// Starts it with `args` (`TURNSTILE_TEST_PYTHON` runs it, as `.ci/test-env.sh` sets).
    pub async fn start(args: &[&str]) -> Result<Self, HarnessError> {
        let python = std::env::var("TURNSTILE_TEST_PYTHON").map_err(|_| {
            HarnessError::Inconsistent(
                "TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`".into(),
            )
        })?;
        let root = crate::binary::workspace_root();
        let stubs = tempfile::tempdir().map_err(|e| HarnessError::Inconsistent(format!("temp dir: {e}")))?;
        let status = std::process::Command::new(&python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(root.join("proto/proto"))
            .arg(format!("--python_out={}", stubs.path().display()))
            .arg(format!("--grpc_python_out={}", stubs.path().display()))
            .args(["turnstile/v1/events.proto", "turnstile/hooks/v1/hooks.proto"])
            .status()
            .map_err(|e| HarnessError::Inconsistent(format!("running {python} -m grpc_tools.protoc: {e}")))?;
        if !status.success() {
            return Err(HarnessError::Inconsistent(format!("grpc_tools.protoc failed: {status}")));
        }
        let mut child = std::process::Command::new(&python)
            .arg(root.join("tests/fixtures/hook_server.py"))
            .args(args)
            .env("PYTHONPATH", stubs.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| HarnessError::Inconsistent(format!("starting the Python hook server: {e}")))?;
        let Some(stdout) = child.stdout.take() else {
            return Err(HarnessError::Inconsistent("the Python hook server has no stdout".into()));
        };
        let first_line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
        });
        let mut server = Self { child, url: String::new(), _stubs: stubs };
        let line = match tokio::time::timeout(crate::DEFAULT_WAIT, first_line).await {
            Ok(Ok(Ok(line))) => line,
            other => {
                return Err(HarnessError::Inconsistent(format!("the Python hook server printed no port: {other:?}")));
            }
        };
        let port = line
            .trim()
            .strip_prefix("port ")
            .ok_or_else(|| HarnessError::Inconsistent(format!("expected a `port N` line, got {line:?}")))?;
        server.url = format!("http://127.0.0.1:{port}");
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`, for an agent's `hooks = [{ url = ... }]`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for PythonHookServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
