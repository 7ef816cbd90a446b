//! Fake model servers on loopback for the provider tests: one scripted HTTP server that answers each
//! request with the next [`Reply`] of its script (a status with a body, a server-sent-event stream played
//! step by step, or silence), records every request, and reports when a stream's connection closed.
//!
//! [`FakeServer::openai`] and [`FakeServer::anthropic`] differ only in the base URL they hand out
//! (`…/v1`, which both providers extend with their own path); the helpers below build each protocol's
//! events. The server binds `127.0.0.1:0` and reads its address back.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use turnstile_agent::llm::chat::{ChatOutput, ChatProvider, ChatRequest, DeltaSink, ProviderError, StreamDelta};
use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
use turnstile_agent::llm::retry::Backoff;

/// One step of a streamed reply.
#[derive(Clone, Debug)]
pub enum Step {
    /// Send these bytes as one chunk (and flush).
    Send(Vec<u8>),
    /// Wait before the next step.
    Pause(Duration),
    /// Break the connection (the body fails mid-stream).
    Cut,
    /// Send nothing more, ever.
    Hang,
}

/// How the server answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A complete non-streamed answer.
    Status { status: u16, headers: Vec<(&'static str, String)>, body: String },
    /// `200 text/event-stream`, played step by step.
    Stream(Vec<Step>),
    /// Never answers: no status line, no byte.
    Silent,
}

impl Reply {
    /// An error answer with a JSON body `{"error": {"message": …}}`.
    pub fn error(status: u16, message: &str) -> Self {
        Self::Status {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: json!({"error": {"message": message, "type": "test_error"}}).to_string(),
        }
    }

    /// A stream sending each of `events` as its own chunk, a short pause between them.
    pub fn events<S: AsRef<str>>(events: &[S]) -> Self {
        let mut steps = Vec::new();
        for event in events {
            steps.push(Step::Send(event.as_ref().as_bytes().to_vec()));
            steps.push(Step::Pause(Duration::from_millis(2)));
        }
        Self::Stream(steps)
    }

    /// A stream of `raw` cut into chunks at the byte offsets `at` (inside a UTF-8 character, a JSON
    /// string, …), each chunk flushed after a pause so that it travels on its own.
    pub fn split(raw: &str, at: &[usize]) -> Self {
        let bytes = raw.as_bytes();
        let mut steps = Vec::new();
        let mut from = 0;
        for &cut in at.iter().chain(std::iter::once(&bytes.len())) {
            assert!(cut > from && cut <= bytes.len(), "split points must increase");
            steps.push(Step::Send(bytes[from..cut].to_vec()));
            steps.push(Step::Pause(Duration::from_millis(15)));
            from = cut;
        }
        Self::Stream(steps)
    }
}

/// A request the server received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Default)]
struct Shared {
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// `Send` steps written so far, over all streams.
    chunks_sent: AtomicUsize,
    /// Streams whose body was dropped before it played to its end (the client went away).
    streams_abandoned: AtomicUsize,
    abandoned: Notify,
}

pub struct FakeServer {
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    /// A fake OpenAI-compatible server (`POST /v1/chat/completions`).
    pub async fn openai(script: Vec<Reply>) -> Self {
        Self::start(script).await
    }

    /// A fake Anthropic server (`POST /v1/messages`).
    pub async fn anthropic(script: Vec<Reply>) -> Self {
        Self::start(script).await
    }

    async fn start(script: Vec<Reply>) -> Self {
        let shared = Arc::new(Shared { script: Mutex::new(script.into()), ..Default::default() });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { base_url: format!("http://{addr}/v1"), shared, task }
    }

    /// An endpoint for this server: test-sized timeouts (generous: nothing here should hit them unless
    /// the test sets them lower), millisecond backoff so retries are quick.
    pub fn endpoint(&self, provider: ProviderKind) -> ModelEndpoint {
        let mut endpoint = ModelEndpoint::new(provider, "test-model");
        endpoint.base_url = self.base_url.clone();
        endpoint.timeout = Duration::from_secs(30);
        endpoint.first_byte_timeout = Duration::from_secs(10);
        endpoint.idle_timeout = Duration::from_secs(10);
        endpoint.retries = 3;
        endpoint.backoff = Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_millis(20),
            retry_after_max: Duration::from_secs(5),
        };
        endpoint
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Replies of the script not used yet.
    pub fn unused_replies(&self) -> usize {
        self.shared.script.lock().unwrap().len()
    }

    pub fn chunks_sent(&self) -> usize {
        self.shared.chunks_sent.load(Ordering::SeqCst)
    }

    /// Waits (up to 10 s, else panics) until a stream was abandoned by its client: the server saw the
    /// connection close before the stream's end.
    pub async fn wait_stream_abandoned(&self) {
        let wait = async {
            loop {
                let notified = self.shared.abandoned.notified();
                if self.shared.streams_abandoned.load(Ordering::SeqCst) > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the server never saw the client close the stream's connection");
    }
}

async fn handle(State(shared): State<Arc<Shared>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
    shared.requests.lock().unwrap().push(Recorded { path: uri.path().to_owned(), headers, body });
    let reply = shared.script.lock().unwrap().pop_front();
    match reply {
        None => Response::builder().status(StatusCode::GONE).body(Body::from("script exhausted")).unwrap(),
        Some(Reply::Silent) => std::future::pending().await,
        Some(Reply::Status { status, headers, body }) => {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response.body(Body::from(body)).unwrap()
        }
        Some(Reply::Stream(steps)) => {
            let player = Player { steps: steps.into(), shared, finished: false };
            let stream = futures::stream::unfold(player, |mut player| async move {
                let chunk = player.next().await?;
                Some((chunk, player))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .header("cache-control", "no-cache")
                .body(Body::from_stream(stream))
                .unwrap()
        }
    }
}

/// Plays a stream's steps; notices being dropped before the end (the connection closed under it).
struct Player {
    steps: VecDeque<Step>,
    shared: Arc<Shared>,
    finished: bool,
}

impl Player {
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            match self.steps.pop_front() {
                None => {
                    self.finished = true;
                    return None;
                }
                Some(Step::Send(bytes)) => {
                    self.shared.chunks_sent.fetch_add(1, Ordering::SeqCst);
                    return Some(Ok(Bytes::from(bytes)));
                }
                Some(Step::Pause(pause)) => tokio::time::sleep(pause).await,
                Some(Step::Cut) => {
                    self.finished = true;
                    return Some(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut by the test")));
                }
                Some(Step::Hang) => std::future::pending::<()>().await,
            }
        }
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.streams_abandoned.fetch_add(1, Ordering::SeqCst);
            self.shared.abandoned.notify_waiters();
        }
    }
}

/// A TCP server that accepts connections and closes them at once (a connection failure before the first
/// byte); counts the connections.
pub struct SlammingServer {
    pub base_url: String,
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SlammingServer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        Self { base_url: format!("http://{addr}/v1"), accepted, task }
    }
}

impl Drop for SlammingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// OpenAI events.

/// `data: <chunk>` of a `chat.completion.chunk` with one choice.
pub fn openai_chunk(delta: Value, finish_reason: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    });
    format!("data: {chunk}\n\n")
}

/// The final usage chunk (`stream_options.include_usage`): no choices.
pub fn openai_usage(prompt: u64, completion: u64) -> String {
    let chunk = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    });
    format!("data: {chunk}\n\n")
}

/// The final usage chunk with `cached` of the prompt's tokens read from OpenAI's prompt cache.
pub fn openai_usage_cached(prompt: u64, completion: u64, cached: u64) -> String {
    let chunk = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0}},
    });
    format!("data: {chunk}\n\n")
}

/// A whole text reply of `text` reporting `input` and `output` tokens.
pub fn openai_text_reply(text: &str, input: u64, output: u64) -> Reply {
    Reply::events(&[
        openai_chunk(json!({"role": "assistant", "content": text}), None),
        openai_chunk(json!({}), Some("stop")),
        openai_usage(input, output),
        OPENAI_DONE.to_owned(),
    ])
}

pub const OPENAI_DONE: &str = "data: [DONE]\n\n";

// Anthropic events.

/// `event: <type>` + `data: <json>` (the data's `type` is the event's name).
pub fn anthropic_event(data: Value) -> String {
    let name = data["type"].as_str().unwrap_or("unknown").to_owned();
    format!("event: {name}\ndata: {data}\n\n")
}

pub fn anthropic_message_start(input_tokens: u64) -> String {
    anthropic_event(json!({
        "type": "message_start",
        "message": {
            "id": "msg_test", "type": "message", "role": "assistant", "model": "test-model",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        },
    }))
}

pub fn anthropic_text_start(index: u64) -> String {
    anthropic_event(
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    )
}

pub fn anthropic_text_delta(index: u64, text: &str) -> String {
    anthropic_event(
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
    )
}

pub fn anthropic_block_stop(index: u64) -> String {
    anthropic_event(json!({"type": "content_block_stop", "index": index}))
}

pub fn anthropic_message_delta(stop_reason: &str, output_tokens: u64) -> String {
    anthropic_event(json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": output_tokens},
    }))
}

pub fn anthropic_message_stop() -> String {
    anthropic_event(json!({"type": "message_stop"}))
}

/// Streams `request` on `provider` into a sink of one place (so the provider waits for every delta to be
/// taken), calling `on_delta` with each text or reasoning delta as it is taken: the reply, and those
/// deltas in order (the provider's usage reports are left out).
pub async fn stream_recorded(
    provider: &dyn ChatProvider,
    request: &ChatRequest,
    cancel: &CancellationToken,
    mut on_delta: impl FnMut(&StreamDelta),
) -> (Result<ChatOutput, ProviderError>, Vec<StreamDelta>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let take = async move {
        let mut seen = Vec::new();
        while let Some(delta) = rx.recv().await {
            if !matches!(delta, StreamDelta::Usage(_)) {
                on_delta(&delta);
                seen.push(delta);
            }
        }
        seen
    };
    // The sink drops with the request, which ends `take`.
    let ask = async move { provider.stream(request, &DeltaSink::new(tx), cancel).await };
    tokio::join!(ask, take)
}
