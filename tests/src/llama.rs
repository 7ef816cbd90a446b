//! A real small model: llama.cpp's `llama-server` with SmolLM2-135M-Instruct, on loopback.
//!
//! The binary and the model come from `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF`, which
//! `scripts/setup-test-deps` installs and writes into `.ci/test-env.sh` (there are no fallbacks: the
//! build is too specific to guess). [`LlamaServer::start`] runs
//! `llama-server -m $SMOLLM2_GGUF --host 127.0.0.1 --port 0 -c 4096 -t 1 -np 1 --temp 0 --seed 42 --no-webui`,
//! reads the port it picked from its log line `llama_server: listening on http://127.0.0.1:PORT`, and
//! returns once `GET /health` answers 200 (the model is loaded). `--temp 0` makes every request that does
//! not set a temperature greedy, so the same request gives the same text; `-np 1` is one slot (requests
//! are served one at a time, which is all a test or the bench sends). One thread by default: llama.cpp's
//! threads meet at a barrier after every operation, and with other processes on the two cores (nextest runs
//! four tests at once) a descheduled thread stalls the others. Measured at load average 10, one thread
//! decoded SmolLM2 at 12–21 tokens/s and answered in 2–3 s where two threads did 2.5–7 tokens/s and took
//! 8–13 s (and a turn once went past the harness's 30 s wait). [`LlamaOptions::threads`] changes it.
//!
//! Beside it, two small tools that need no HTTP client crate (plain HTTP/1.1 on a `TcpStream`):
//! - [`stream_chat`] sends one streaming `POST /v1/chat/completions` and times each text delta as it
//!   arrives (the sanity test and `turnstile-bench model` use it);
//! - [`RecordingProxy`] sits between Turnstile and the server, forwards bytes both ways untouched, and keeps
//!   every request it forwarded, so a test can read the exact model requests Turnstile sent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::HarnessError;
use crate::process::ChildProcess;
use crate::sync::lock;

const INSTALL_HINT: &str = "run scripts/setup-test-deps (it builds llama.cpp's server and installs the \
     SmolLM2 model) and `source .ci/test-env.sh` (it sets LLAMA_SERVER_BIN and SMOLLM2_GGUF)";

/// Bound on the start: the log line with the port, then `/health` answering 200 (loading takes ~1-3 s).
const STARTUP: Duration = Duration::from_secs(60);

/// Bound on one whole streamed completion in [`stream_chat`].
pub const CHAT_TIMEOUT: Duration = Duration::from_secs(120);

/// The model name the server is asked for (llama-server serves the one model it loaded whatever the name).
pub const SMOLLM2_MODEL: &str = "SmolLM2-135M-Instruct";

/// `LLAMA_SERVER_BIN` and `SMOLLM2_GGUF`; panics with the install hint when either is unset or missing.
pub fn llama_paths() -> (PathBuf, PathBuf) {
    let var = |name: &str| -> PathBuf {
        let Some(value) = std::env::var_os(name).filter(|v| !v.is_empty()) else {
            panic!("{name} is not set; {INSTALL_HINT}");
        };
        let path = PathBuf::from(value);
        assert!(path.is_file(), "{name}={} is not a file; {INSTALL_HINT}", path.display());
        path
    };
    (var("LLAMA_SERVER_BIN"), var("SMOLLM2_GGUF"))
}

/// A running `llama-server` on a loopback port it picked itself. Dropping it kills the process.
#[derive(Debug)]
pub struct LlamaServer {
    process: ChildProcess,
    addr: SocketAddr,
    // Holds the log file; removed with the server.
    _scratch: TempDir,
}

/// How a [`LlamaServer`] is started.
#[derive(Clone, Debug)]
pub struct LlamaOptions {
    /// `-t`: threads for generation and prompt processing (1; see the module doc).
    pub threads: u32,
    /// Further arguments after the harness's own (a repeated flag: the last one wins).
    pub extra_args: Vec<String>,
}

impl Default for LlamaOptions {
    fn default() -> Self {
        Self { threads: 1, extra_args: Vec::new() }
    }
}

impl LlamaServer {
    /// Starts the server on SmolLM2 (see the module doc for the flags) and waits until it serves.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(LlamaOptions::default()).await
    }

    pub async fn start_with(opts: LlamaOptions) -> Result<Self, HarnessError> {
        let (bin, model) = llama_paths();
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-llama-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a scratch dir", e))?;
        let log_path = scratch.path().join("llama-server.log");
        let mut command = Command::new(bin);
        command
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0", "-c", "4096", "-np", "1"])
            .args(["-t", &opts.threads.to_string()])
            .args(["--temp", "0", "--seed", "42", "--no-webui", "--log-colors", "off"])
            .args(&opts.extra_args);
        let mut process = ChildProcess::spawn("llama-server", command, &log_path)?;
        let started = Instant::now();
        let addr = process
            .wait_for("its `listening on` log line", STARTUP, |_| listening_addr(&log_path))
            .await
            .map_err(explain_death)?;
        process.set_name(format!("llama-server on {addr}"));
        let server = Self { process, addr, _scratch: scratch };
        server.wait_healthy(STARTUP.saturating_sub(started.elapsed())).await.map_err(explain_death)
    }

    /// Why the server stopped answering, if it has died: an error saying what its exit means and what to
    /// do. A caller whose request failed asks this first, so that a crash is never reported as a bare
    /// "connection refused".
    pub fn died(&mut self) -> Option<HarnessError> {
        self.process.exited_error().map(explain_death)
    }

    async fn wait_healthy(mut self, timeout: Duration) -> Result<Self, HarnessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.process.exited_error() {
                return Err(e);
            }
            if self.health().await == Some(200) {
                return Ok(self);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("{} (GET /health = 200)", self.process.name()),
                    waited: timeout,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The status of `GET /health` (503 while the model loads), `None` when the server does not answer.
    pub async fn health(&self) -> Option<u16> {
        http_request(self.addr, "GET", "/health", None).await.ok().map(|(status, _)| status)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1`: the `base_url` of an `openai` model in Turnstile's configuration.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

/// Turns the harness's "exited early" into what a llama-server death means and what to do about it.
fn explain_death(error: HarnessError) -> HarnessError {
    match error {
        HarnessError::Exited { what, status, log_tail } => {
            let hint = death_hint(&status);
            HarnessError::ModelServerDied { what, status, hint, log_tail }
        }
        other => other,
    }
}

/// What an exit status of llama-server means (`status` is std's `ExitStatus` display).
fn death_hint(status: &str) -> &'static str {
    if status.contains("SIGILL") {
        "it executed an instruction this CPU or virtual machine does not allow, so the binary was built for \
         another CPU (llama.cpp's default GGML_NATIVE=ON, or a build copied from another machine); build the \
         portable one with scripts/setup-test-deps (scripts/build-llama-server) and point LLAMA_SERVER_BIN at \
         the path it prints"
    } else if status.contains("SIGKILL") {
        "it was killed from outside (the kernel's OOM killer, or a stop of the test run); see dmesg"
    } else if status.contains("signal") {
        "it crashed; the log tail below shows how far it got loading the model"
    } else {
        "it refused to start; the log tail below says why (a wrong -m path, an unreadable GGUF, a port in \
         use or a flag this llama.cpp does not know)"
    }
}

/// The address in the server's `llama_server: listening on http://ADDR` log line, once it is there.
fn listening_addr(log: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(|line| {
        let rest = &line[line.find("listening on http://")? + "listening on http://".len()..];
        rest.split(|c: char| c.is_whitespace() || c == '/').next()?.parse().ok()
    })
}

fn http_error(what: impl Into<String>) -> HarnessError {
    HarnessError::io("talking HTTP to a model server", std::io::Error::other(what.into()))
}

/// One plain HTTP/1.1 request with `Connection: close`: the status and the (de-chunked) body, bounded by
/// 10 s. For the short JSON endpoints (`/health`, `/slots`, `/props`, non-streaming completions).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json_body: Option<&Value>,
) -> Result<(u16, String), HarnessError> {
    let attempt = async {
        let mut stream =
            TcpStream::connect(addr).await.map_err(|e| HarnessError::io(format!("connecting {addr}"), e))?;
        let body = json_body.map(|b| b.to_string()).unwrap_or_default();
        stream
            .write_all(request_head(method, path, json_body.map(|_| body.len())).as_bytes())
            .await
            .map_err(|e| HarnessError::io("sending a request", e))?;
        stream.write_all(body.as_bytes()).await.map_err(|e| HarnessError::io("sending a request body", e))?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.map_err(|e| HarnessError::io("reading a response", e))?;
        let (head, rest) = split_head(&raw).ok_or_else(|| http_error("response without a complete header"))?;
        let status = status_of(&head)?;
        let body = if is_chunked(&head) {
            let mut decoder = Chunked::default();
            let mut body = Vec::new();
            decoder.feed(rest, &mut body)?;
            body
        } else {
            rest.to_vec()
        };
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| http_error(format!("{method} {path} on {addr}: no answer within 10 s")))?
}

fn request_head(method: &str, path: &str, content_length: Option<usize>) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(len) = content_length {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {len}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The header block (as text) and the bytes after it, once the blank line has arrived.
fn split_head(raw: &[u8]) -> Option<(String, &[u8])> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((String::from_utf8_lossy(&raw[..end]).into_owned(), &raw[end + 4..]))
}

fn status_of(head: &str) -> Result<u16, HarnessError> {
    head.lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| http_error(format!("bad status line in {head:?}")))
}

/// The value of header `name` (case-insensitive) in a header block.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn is_chunked(head: &str) -> bool {
    header(head, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

/// An incremental decoder of `Transfer-Encoding: chunked`: it takes whole chunks only (size line, data,
/// CRLF), leaving a partial one for the next [`Chunked::feed`].
#[derive(Debug, Default)]
struct Chunked {
    pending: Vec<u8>,
    done: bool,
}

impl Chunked {
    /// Adds `bytes`, appends the data of every complete chunk to `out`; true once the last chunk arrived.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, HarnessError> {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        while !self.done {
            let Some(line_len) = self.pending[at..].windows(2).position(|w| w == b"\r\n") else { break };
            let line = String::from_utf8_lossy(&self.pending[at..at + line_len]).into_owned();
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| http_error(format!("bad chunk size line {line:?}")))?;
            let data_start = at + line_len + 2;
            if size == 0 {
                // The last chunk; no trailers are sent by the servers here, so a CRLF ends the body.
                if self.pending.len() < data_start + 2 {
                    break;
                }
                self.done = true;
                at = data_start + 2;
                break;
            }
            if self.pending.len() < data_start + size + 2 {
                break;
            }
            out.extend_from_slice(&self.pending[data_start..data_start + size]);
            at = data_start + size + 2;
        }
        self.pending.drain(..at);
        Ok(self.done)
    }
}

/// Token usage as the server reported it in the last chunk (`stream_options.include_usage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One streamed completion as the client saw it.
#[derive(Clone, Debug)]
pub struct ChatStream {
    /// When the request was about to be sent (before connecting).
    pub sent: Instant,
    /// Each non-empty `delta.content`, with the time since `sent` when its chunk was decoded.
    pub deltas: Vec<(Duration, String)>,
    /// `finish_reason` of the last choice that had one (`stop`, `length`).
    pub finish_reason: Option<String>,
    pub usage: Option<ChatUsage>,
    /// The server's own decode figure (llama.cpp `timings.predicted_per_second`), when it sent timings.
    pub server_tokens_per_s: Option<f64>,
    /// Time since `sent` when `data: [DONE]` (or the end of the stream) arrived.
    pub elapsed: Duration,
}

impl ChatStream {
    /// The concatenated text deltas.
    pub fn text(&self) -> String {
        self.deltas.iter().map(|(_, t)| t.as_str()).collect()
    }

    /// Time to the first text delta.
    pub fn first_delta(&self) -> Option<Duration> {
        self.deltas.first().map(|(at, _)| *at)
    }
}

/// A streaming chat request body in the shape Turnstile's `openai` provider sends (system, then the
/// turns; `stream_options.include_usage`), for `model` with `max_tokens`.
pub fn chat_body(system: &str, user: &str, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": SMOLLM2_MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
    })
}

/// Sends `body` (with `"stream": true`) as `POST /v1/chat/completions` to `addr` and reads the SSE answer
/// to its end, timing each text delta. Bounded by [`CHAT_TIMEOUT`]; a non-200 answer is an error with
/// its body.
pub async fn stream_chat(addr: SocketAddr, body: &Value) -> Result<ChatStream, HarnessError> {
    tokio::time::timeout(CHAT_TIMEOUT, stream_chat_unbounded(addr, body))
        .await
        .map_err(|_| http_error(format!("a streamed completion on {addr} took over {CHAT_TIMEOUT:?}")))?
}

async fn stream_chat_unbounded(addr: SocketAddr, body: &Value) -> Result<ChatStream, HarnessError> {
    let payload = body.to_string();
    let sent = Instant::now();
    let mut stream = TcpStream::connect(addr).await.map_err(|e| HarnessError::io(format!("connecting {addr}"), e))?;
    stream.set_nodelay(true).map_err(|e| HarnessError::io("setting TCP_NODELAY", e))?;
    let mut request = request_head("POST", "/v1/chat/completions", Some(payload.len())).into_bytes();
    request.extend_from_slice(payload.as_bytes());
    stream.write_all(&request).await.map_err(|e| HarnessError::io("sending the chat request", e))?;

    let mut out = ChatStream {
        sent,
        deltas: Vec::new(),
        finish_reason: None,
        usage: None,
        server_tokens_per_s: None,
        elapsed: Duration::ZERO,
    };
    let mut raw = Vec::new();
    let mut head: Option<(String, bool)> = None;
    let mut chunked = Chunked::default();
    let mut body_bytes = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|e| HarnessError::io("reading the chat stream", e))?;
        let mut finished = n == 0;
        if head.is_none() {
            raw.extend_from_slice(&buf[..n]);
            if let Some((h, rest)) = split_head(&raw) {
                let status = status_of(&h)?;
                let chunked_body = is_chunked(&h);
                let rest = rest.to_vec();
                if status != 200 {
                    let mut all = rest;
                    stream.read_to_end(&mut all).await.map_err(|e| HarnessError::io("reading an error", e))?;
                    return Err(http_error(format!(
                        "POST /v1/chat/completions answered {status}: {}",
                        String::from_utf8_lossy(&all)
                    )));
                }
                head = Some((h, chunked_body));
                finished |= take_body(chunked_body, &mut chunked, &rest, &mut body_bytes)?;
            }
        } else if let Some((_, chunked_body)) = &head {
            finished |= take_body(*chunked_body, &mut chunked, &buf[..n], &mut body_bytes)?;
        }
        let at = sent.elapsed();
        for data in sse_data(&mut body_bytes) {
            if data == "[DONE]" {
                finished = true;
                continue;
            }
            apply_chunk(&mut out, &data, at)?;
        }
        if finished {
            out.elapsed = sent.elapsed();
            if head.is_none() {
                return Err(http_error("the chat stream closed before its header"));
            }
            return Ok(out);
        }
    }
}

/// Moves the body bytes of `bytes` into `out` (de-chunking); true once a chunked body has ended.
fn take_body(chunked_body: bool, chunked: &mut Chunked, bytes: &[u8], out: &mut Vec<u8>) -> Result<bool, HarnessError> {
    if chunked_body {
        chunked.feed(bytes, out)
    } else {
        out.extend_from_slice(bytes);
        Ok(false)
    }
}

/// Takes the complete lines off the front of an SSE body and returns the payloads of its `data:` lines
/// (a partial last line stays for the next read).
fn sse_data(body: &mut Vec<u8>) -> Vec<String> {
    let mut found = Vec::new();
    while let Some(end) = body.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = body.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line);
        if let Some(data) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") {
            found.push(data.trim_start().to_owned());
        }
    }
    found
}

/// Takes one `chat.completion.chunk` into `out`.
fn apply_chunk(out: &mut ChatStream, data: &str, at: Duration) -> Result<(), HarnessError> {
    let chunk: Value = serde_json::from_str(data).map_err(|e| http_error(format!("bad SSE data {data:?}: {e}")))?;
    if let Some(error) = chunk.get("error") {
        return Err(http_error(format!("the stream carried an error: {error}")));
    }
    if let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) {
        if let Some(text) = choice["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            out.deltas.push((at, text.to_owned()));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.finish_reason = Some(reason.to_owned());
        }
    }
    if let (Some(prompt), Some(completion)) =
        (chunk["usage"]["prompt_tokens"].as_u64(), chunk["usage"]["completion_tokens"].as_u64())
    {
        out.usage = Some(ChatUsage { prompt_tokens: prompt, completion_tokens: completion });
    }
    if let Some(per_s) = chunk["timings"]["predicted_per_second"].as_f64() {
        out.server_tokens_per_s = Some(per_s);
    }
    Ok(())
}

/// One HTTP request a [`RecordingProxy`] forwarded.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// The body, de-chunked if it was sent chunked.
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The body as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What the client of one forwarded connection has sent so far.
type Upload = Arc<Mutex<Vec<u8>>>;

/// A TCP proxy on a loopback port it binds itself (port 0), forwarding every connection to `upstream`
/// byte for byte (so streaming answers pass through as they come) and keeping a copy of what each client
/// sent. [`RecordingProxy::requests`] parses those copies into HTTP/1.1 requests. Dropping it closes the
/// listener and every forwarded connection.
#[derive(Debug)]
pub struct RecordingProxy {
    addr: SocketAddr,
    /// Per accepted connection, in accept order: every byte the client sent.
    connections: Arc<Mutex<Vec<Upload>>>,
    task: JoinHandle<()>,
}

impl RecordingProxy {
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.map_err(|e| HarnessError::io("binding the recording proxy", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::io("reading the proxy's address", e))?;
        let connections: Arc<Mutex<Vec<Upload>>> = Arc::default();
        let sink = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            // Owned here: aborting the accept task drops the set, which aborts every forwarding task.
            let mut forwarding = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let record = Arc::new(Mutex::new(Vec::new()));
                lock(&sink).push(Arc::clone(&record));
                forwarding.spawn(forward(client, upstream, record));
                while forwarding.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, connections, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://PROXY/v1`, for an `openai` model's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every complete request forwarded so far, in order (connections in accept order, requests in the
    /// order sent on each; the model requests of one session never overlap, so this is time order).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        let connections: Vec<Vec<u8>> = lock(&self.connections).iter().map(|c| lock(c).clone()).collect();
        connections.iter().flat_map(|bytes| parse_requests(bytes)).collect()
    }

    /// The JSON bodies of the `POST …/chat/completions` requests forwarded so far.
    pub fn chat_requests(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/chat/completions"))
            .map(|r| r.json())
            .collect()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, record: Upload) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upload = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    lock(&record).extend_from_slice(&buf[..n]);
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = server_write.shutdown().await;
    };
    let download = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upload, download);
}

/// The complete HTTP/1.1 requests in what one client sent on one connection (bodies by `Content-Length`
/// or chunked); an incomplete last request is left out.
fn parse_requests(mut bytes: &[u8]) -> Vec<RecordedRequest> {
    let mut found = Vec::new();
    while let Some((head, rest)) = split_head(bytes) {
        let mut words = head.lines().next().unwrap_or_default().split(' ');
        let (method, path) = (words.next().unwrap_or_default().to_owned(), words.next().unwrap_or_default().to_owned());
        let (body, consumed) = if is_chunked(&head) {
            let mut decoder = Chunked::default();
            let mut body = Vec::new();
            // Feed byte ranges until the last chunk: what is left pending then belongs to the next request.
            match decoder.feed(rest, &mut body) {
                Ok(true) => (body, rest.len() - decoder.pending.len()),
                _ => break,
            }
        } else {
            let len = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
            if rest.len() < len {
                break;
            }
            (rest[..len].to_vec(), len)
        };
        found.push(RecordedRequest { method, path, body });
        bytes = &rest[consumed..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_across_feeds() {
        let mut decoder = Chunked::default();
        let mut out = Vec::new();
        assert!(!decoder.feed(b"5\r\nhel", &mut out).unwrap());
        assert!(out.is_empty(), "a partial chunk is kept back");
        assert!(!decoder.feed(b"lo\r\n3;ext=1\r\n wo\r\n", &mut out).unwrap());
        assert_eq!(out, b"hello wo");
        assert!(!decoder.feed(b"0\r\n", &mut out).unwrap(), "the last chunk ends with its CRLF");
        assert!(decoder.feed(b"\r\nNEXT", &mut out).unwrap());
        assert_eq!(decoder.pending, b"NEXT", "what follows the body is left");
        assert!(Chunked::default().feed(b"xyz\r\n", &mut out).is_err());
    }

    #[test]
    fn sse_lines_split_on_newlines() {
        let mut body = b"data: {\"a\":1}\n\ndata: [DO".to_vec();
        assert_eq!(sse_data(&mut body), vec!["{\"a\":1}".to_owned()]);
        body.extend_from_slice(b"NE]\r\n\r\n");
        assert_eq!(sse_data(&mut body), vec!["[DONE]".to_owned()]);
        assert!(body.is_empty());
    }

    #[test]
    fn chunks_fill_the_stream() {
        let mut out = ChatStream {
            sent: Instant::now(),
            deltas: Vec::new(),
            finish_reason: None,
            usage: None,
            server_tokens_per_s: None,
            elapsed: Duration::ZERO,
        };
        let at = Duration::from_millis(5);
        apply_chunk(&mut out, r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#, at).unwrap();
        apply_chunk(&mut out, r#"{"choices":[{"delta":{"content":"Hi"}}]}"#, at).unwrap();
        apply_chunk(&mut out, r#"{"choices":[{"delta":{"content":" there"},"finish_reason":"stop"}]}"#, at).unwrap();
        apply_chunk(
            &mut out,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2},"timings":{"predicted_per_second":40.5}}"#,
            at,
        )
        .unwrap();
        assert_eq!(out.text(), "Hi there");
        assert_eq!(out.first_delta(), Some(at));
        assert_eq!(out.finish_reason.as_deref(), Some("stop"));
        assert_eq!(out.usage, Some(ChatUsage { prompt_tokens: 9, completion_tokens: 2 }));
        assert_eq!(out.server_tokens_per_s, Some(40.5));
        assert!(apply_chunk(&mut out, r#"{"error":{"message":"boom"}}"#, at).is_err());
    }

    #[test]
    fn recorded_bytes_parse_into_requests() {
        let mut bytes = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"a\":1}".to_vec();
        bytes.extend_from_slice(b"POST /v1/x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
        bytes.extend_from_slice(b"GET /health HTTP/1.1\r\n\r\n");
        bytes.extend_from_slice(b"POST /v1/y HTTP/1.1\r\ncontent-length: 10\r\n\r\n{\"b\"");
        let requests = parse_requests(&bytes);
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert_eq!((requests[0].method.as_str(), requests[0].path.as_str()), ("POST", "/v1/chat/completions"));
        assert_eq!(requests[0].json(), serde_json::json!({"a": 1}));
        assert_eq!(requests[1].body, b"{}");
        assert_eq!((requests[2].method.as_str(), requests[2].body.len()), ("GET", 0));
    }

    #[test]
    fn a_death_by_sigill_says_the_build_is_for_another_cpu() {
        let died = explain_death(HarnessError::Exited {
            what: "llama-server".into(),
            status: "signal: 4 (SIGILL)".into(),
            log_tail: "load_tensors: CPU_REPACK model buffer size".into(),
        });
        let text = died.to_string();
        assert!(text.starts_with("llama-server died (signal: 4 (SIGILL)): it executed an instruction"), "{text}");
        assert!(text.contains("scripts/build-llama-server") && text.contains("CPU_REPACK"), "{text}");
        let refused = explain_death(HarnessError::Exited {
            what: "llama-server".into(),
            status: "exit status: 1".into(),
            log_tail: String::new(),
        });
        assert!(refused.to_string().contains("refused to start"), "{refused}");
    }

    /// A real llama-server process that dies at start is reported with its signal, the meaning and the
    /// log tail, not as a timeout or a refused connection. `sh -c 'kill -ILL $$'` stands in for the
    /// binary: it dies exactly as the AMX build did.
    #[tokio::test]
    async fn a_server_killed_by_sigill_at_start_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo 'load_tensors: loading model'; kill -ILL $$"]);
        let mut process = ChildProcess::spawn("llama-server", command, &log).unwrap();
        let err = process
            .wait_for("its `listening on` log line", Duration::from_secs(20), |_| listening_addr(&log))
            .await
            .map_err(explain_death)
            .unwrap_err();
        let HarnessError::ModelServerDied { status, log_tail, .. } = &err else { panic!("{err}") };
        assert!(status.contains("SIGILL"), "{status}");
        assert!(log_tail.contains("loading model"), "{log_tail}");
    }

    #[test]
    fn the_listening_line_gives_the_address() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::write(&log, "0.00.011 I srv load_model: loading\n").unwrap();
        assert_eq!(listening_addr(&log), None);
        std::fs::write(&log, "0.01.03 I srv  llama_server: listening on http://127.0.0.1:34639\n").unwrap();
        assert_eq!(listening_addr(&log), Some("127.0.0.1:34639".parse().unwrap()));
    }
}
