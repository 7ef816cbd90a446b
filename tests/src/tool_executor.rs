//! A client tool executor over `ServeTools` (SPEC §9), as a client application would write one with
//! tonic: it registers its tools, answers each `call` with what its `answer` function returns (or holds
//! the call when that is `None`), and records every task it receives for the test to inspect.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::v1::agent_client::AgentClient;
use crate::v1::{
    ClientToolSpec, RegisterTools, ToolCallResult, ToolCallTask, ToolTask, ToolWorkerMessage, tool_task,
    tool_worker_message,
};
use crate::{DEFAULT_WAIT, HarnessError};

/// What the executor answers a call with; `None` holds it (no result until the test sends one).
pub type Answer = Arc<dyn Fn(&ToolCallTask) -> Option<ToolCallResult> + Send + Sync>;

/// A tool spec with a JSON Schema object `schema`.
pub fn tool(name: &str, schema: &str) -> ClientToolSpec {
    ClientToolSpec { name: name.into(), description: format!("test tool {name}"), input_schema_json: schema.into() }
}

/// The schema of the test tool `lookup`.
pub const LOOKUP_SCHEMA: &str = r#"{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}"#;

/// An answer: `output` for every call, with `context` messages.
pub fn answer_with(output: &'static str, context: &'static [&'static str]) -> Answer {
    Arc::new(move |task: &ToolCallTask| {
        Some(ToolCallResult {
            call_id: task.call_id.clone(),
            output: format!("{output} {}", task.arguments_json),
            error: None,
            context: context.iter().map(|c| (*c).to_owned()).collect(),
        })
    })
}

/// An answer that holds every call.
pub fn hold() -> Answer {
    Arc::new(|_: &ToolCallTask| None)
}

/// `request` with a bearer token; without one, naming the harness's tenant ([`crate::msg::TEST_TENANT`])
/// in the `turnstile-tenant` header, as an executor does when auth is off.
pub fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    match token {
        Some(token) => {
            if let Ok(value) = format!("Bearer {token}").parse() {
                request.metadata_mut().insert("authorization", value);
            }
        }
        None => {
            if let Ok(value) = crate::msg::TEST_TENANT.parse() {
                request.metadata_mut().insert("turnstile-tenant", value);
            }
        }
    }
    request
}

/// A connected executor. Dropping it (or [`ToolExecutor::disconnect`]) closes its stream.
#[derive(Debug)]
pub struct ToolExecutor {
    tasks: mpsc::UnboundedReceiver<ToolTask>,
    out: mpsc::Sender<ToolWorkerMessage>,
    reader: JoinHandle<()>,
    /// The tool names the gateway confirmed.
    pub registered: Vec<String>,
}

impl Drop for ToolExecutor {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Opens `ServeTools` and sends `first` (normally `register`); the stream of tasks, or the gateway's
/// refusal.
pub async fn open(
    mut client: AgentClient<Channel>,
    token: Option<&str>,
    first: ToolWorkerMessage,
) -> Result<(mpsc::Sender<ToolWorkerMessage>, tonic::Streaming<ToolTask>), Status> {
    let (out, rx) = mpsc::channel(64);
    out.send(first).await.map_err(|_| Status::internal("the outbound channel closed"))?;
    let stream = client.serve_tools(with_token(ReceiverStream::new(rx), token)).await?.into_inner();
    Ok((out, stream))
}

/// The `register` message for `tools`.
pub fn register_message(tools: Vec<ClientToolSpec>) -> ToolWorkerMessage {
    ToolWorkerMessage { message: Some(tool_worker_message::Message::Register(RegisterTools { tools })) }
}

/// The `result` message.
pub fn result_message(result: ToolCallResult) -> ToolWorkerMessage {
    ToolWorkerMessage { message: Some(tool_worker_message::Message::Result(result)) }
}

impl ToolExecutor {
    /// Registers `tools` and serves them with `answer`; the gateway's refusal as the error.
    pub async fn connect(
        client: AgentClient<Channel>,
        token: Option<&str>,
        tools: Vec<ClientToolSpec>,
        answer: Answer,
    ) -> Result<Self, Status> {
        let (out, mut stream) = open(client, token, register_message(tools)).await?;
        let first = tokio::time::timeout(DEFAULT_WAIT, stream.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no `registered` from the gateway"))??;
        let registered = match first.and_then(|t| t.task) {
            Some(tool_task::Task::Registered(r)) => r.tools,
            other => return Err(Status::internal(format!("expected `registered` first, got {other:?}"))),
        };
        let (tasks_tx, tasks) = mpsc::unbounded_channel();
        let replies = out.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(task)) = stream.message().await {
                if let Some(tool_task::Task::Call(call)) = &task.task
                    && let Some(result) = answer(call)
                {
                    let _ = replies.send(result_message(result)).await;
                }
                if tasks_tx.send(task).is_err() {
                    break;
                }
            }
        });
        Ok(Self { tasks, out, reader, registered })
    }

    /// The next task the gateway sent, within [`DEFAULT_WAIT`].
    pub async fn next_task(&mut self) -> Result<tool_task::Task, HarnessError> {
        self.next_task_within(DEFAULT_WAIT).await?.ok_or_else(|| HarnessError::WaitTimeout {
            what: "a task on the executor's stream".into(),
            waited: DEFAULT_WAIT,
            recorded: String::new(),
        })
    }

    /// The next task within `wait`, `None` if none came.
    pub async fn next_task_within(&mut self, wait: Duration) -> Result<Option<tool_task::Task>, HarnessError> {
        match tokio::time::timeout(wait, self.tasks.recv()).await {
            Ok(Some(task)) => Ok(task.task),
            Ok(None) => Err(HarnessError::Inconsistent("the executor's stream ended".into())),
            Err(_) => Ok(None),
        }
    }

    /// The next `call`, skipping nothing: any other task first is an error.
    pub async fn next_call(&mut self) -> Result<ToolCallTask, HarnessError> {
        match self.next_task().await? {
            tool_task::Task::Call(call) => Ok(call),
            other => Err(HarnessError::Inconsistent(format!("expected a call, got {other:?}"))),
        }
    }

    /// Sends a result (for calls held, or ids the gateway does not know).
    pub async fn send_result(&self, result: ToolCallResult) -> Result<(), HarnessError> {
        self.out
            .send(result_message(result))
            .await
            .map_err(|_| HarnessError::Inconsistent("the executor's stream is closed".into()))
    }

    /// Closes the stream, as a crashed executor's would close.
    pub fn disconnect(self) {
        drop(self);
    }
}
