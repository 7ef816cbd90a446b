//! What every HTTP provider shares: the client, the retry loop, the three timeouts, cancellation, the
//! server-sent-event stream, the retry counter and the HTTP span (`model.http`, under the runner's
//! `model.request`, which records the request's outcome, tokens and timings for every kind of model). An API
//! ([`ChatApi`]: OpenAI's, Anthropic's) supplies its path, its headers, the JSON body, and a decoder that
//! turns its events into deltas and a [`ChatOutput`]; [`HttpProvider`] is the [`ChatProvider`] of any of them.
//!
//! One request, as SPEC §8 has it:
//! 1. POST the body; wait for the response head and the first body byte within `first_byte_timeout`.
//! 2. A connection failure, 429 or 5xx up to there is retried (at most `retries` times, [`Backoff`](super::retry::Backoff) or
//!    `Retry-After`); any other non-2xx answer is [`ProviderError::Refused`] with the provider's message.
//! 3. From the first byte on nothing is retried: a cut, malformed or erroring stream is
//!    [`ProviderError::StreamBroken`], silence longer than `idle_timeout` is a timeout.
//! 4. The whole of it, waits included, is bounded by `timeout`; `cancel` drops it at once (closing the
//!    connection) and returns [`ProviderError::Aborted`] with what was delivered.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use metrics::counter;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Client, StatusCode, Url};
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::field::Empty;

use async_trait::async_trait;
use serde_json::Value;

use super::chat::{
    ChatOutput, ChatProvider, ChatRequest, Delivered, DeltaSink, Partial, ProviderError, StreamDelta, TimeoutKind,
};
use super::endpoint::{EndpointError, ModelEndpoint};
use super::retry::parse_retry_after;
use turnstile_ops::names::MODEL_RETRIES;

/// Whether a provider's stream has more to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    More,
    Done,
}

/// One provider's reading of its event stream.
pub(crate) trait SseDecoder: Send {
    /// Handles one event: deltas go to `sink`. `Err` (a malformed event, an error event) breaks the stream
    /// with that message.
    fn event(&mut self, event: &Event, sink: &mut (dyn FnMut(StreamDelta) + Send)) -> Result<Flow, String>;
    /// The stream ended without its end marker: is what came enough (a finish reason was seen)?
    fn complete_at_eof(&self) -> bool;
    /// The text and reasoning delivered so far.
    fn delivered(&self) -> &Delivered;
    /// The finished reply.
    fn finish(&mut self) -> Result<ChatOutput, String>;
}

/// What tells one HTTP chat API from another. Implemented by this crate's APIs only (its decoder is the
/// crate's own business).
#[allow(private_bounds)] // `SseDecoder` stays crate-private: it seals the trait.
pub trait ChatApi: Send + Sync + 'static {
    /// The `provider` label of metrics and spans (`openai`, `anthropic`).
    const PROVIDER: &'static str;
    /// Appended to the endpoint's base URL.
    const PATH: &'static str;
    /// Reads the API's event stream.
    type Decoder: SseDecoder + Default;

    /// The headers every request carries (the key, a version); an error when the key is no header value.
    fn headers(endpoint: &ModelEndpoint) -> Result<HeaderMap, EndpointError>;

    /// The JSON body sent for `request`.
    fn body(endpoint: &ModelEndpoint, request: &ChatRequest) -> Value;
}

/// A model behind the HTTP chat API `A`.
pub struct HttpProvider<A> {
    engine: HttpEngine,
    api: std::marker::PhantomData<fn() -> A>,
}

impl<A: ChatApi> std::fmt::Debug for HttpProvider<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider").field("api", &A::PROVIDER).field("endpoint", self.engine.endpoint()).finish()
    }
}

impl<A: ChatApi> HttpProvider<A> {
    /// Checks the endpoint (base URL, key) and builds its client; sends nothing.
    pub fn new(endpoint: ModelEndpoint) -> Result<Self, EndpointError> {
        let headers = A::headers(&endpoint)?;
        Ok(Self { engine: HttpEngine::new(A::PROVIDER, endpoint, A::PATH, headers)?, api: std::marker::PhantomData })
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        A::body(self.engine.endpoint(), request)
    }
}

#[async_trait]
impl<A: ChatApi> ChatProvider for HttpProvider<A> {
    fn provider(&self) -> &'static str {
        A::PROVIDER
    }

    fn model(&self) -> &str {
        &self.engine.endpoint().model
    }

    async fn stream(
        &self,
        request: &ChatRequest,
        sink: &DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ChatOutput, ProviderError> {
        let body = serde_json::to_vec(&self.request_body(request))
            .map_err(|e| ProviderError::Refused { status: None, message: format!("request body: {e}") })?;
        self.engine.run(body, &mut A::Decoder::default(), sink, cancel).await
    }
}

/// A provider's HTTP endpoint: one URL, fixed headers, one client with its connection pool.
pub(crate) struct HttpEngine {
    /// The `provider` label of metrics and spans.
    provider: &'static str,
    client: Client,
    endpoint: ModelEndpoint,
    url: Url,
    headers: HeaderMap,
}

impl HttpEngine {
    /// `path` is appended to the endpoint's base URL; `headers` (keys included) go on every request.
    pub(crate) fn new(
        provider: &'static str,
        endpoint: ModelEndpoint,
        path: &str,
        mut headers: HeaderMap,
    ) -> Result<Self, EndpointError> {
        let raw = format!("{}/{}", endpoint.base_url.trim_end_matches('/'), path.trim_start_matches('/'));
        let url = Url::parse(&raw)
            .map_err(|e| EndpointError::BaseUrl { url: endpoint.base_url.clone(), reason: e.to_string() })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EndpointError::BaseUrl {
                url: endpoint.base_url.clone(),
                reason: format!("scheme {:?}", url.scheme()),
            });
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        Ok(Self { provider, client: client()?, endpoint, url, headers })
    }

    pub(crate) fn endpoint(&self) -> &ModelEndpoint {
        &self.endpoint
    }

    /// Runs one model request end to end (see the module docs).
    pub(crate) async fn run<D: SseDecoder>(
        &self,
        body: Vec<u8>,
        decoder: &mut D,
        sink: &DeltaSink,
        cancel: &CancellationToken,
    ) -> Result<ChatOutput, ProviderError> {
        let provider = self.provider;
        let span = tracing::info_span!(
            "model.http",
            provider,
            model = %self.endpoint.model,
            attempts = Empty,
            outcome = Empty,
        );
        async {
            let started = Instant::now();
            let deadline = started + self.endpoint.timeout;
            let mut attempts = 0;
            let outcome = {
                let work = self.attempts(&body, deadline, decoder, sink, &mut attempts);
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => None,
                    finished = timeout_at(deadline, work) => Some(finished),
                }
            };
            // The request future is dropped here: on cancel or timeout its connection is closed.
            let result = match outcome {
                None => Err(ProviderError::Aborted { partial: decoder.delivered().partial() }),
                Some(Err(_elapsed)) => Err(ProviderError::Timeout {
                    kind: TimeoutKind::Request,
                    after: self.endpoint.timeout,
                    partial: decoder.delivered().partial(),
                }),
                Some(Ok(result)) => result,
            };
            self.record(&result, attempts, started);
            result
        }
        .instrument(span)
        .await
    }

    /// Attempts until one streams or the failure is not retryable.
    async fn attempts<D: SseDecoder>(
        &self,
        body: &[u8],
        deadline: Instant,
        decoder: &mut D,
        sink: &DeltaSink,
        attempts: &mut u32,
    ) -> Result<ChatOutput, ProviderError> {
        let mut rng = fastrand::Rng::new();
        loop {
            *attempts += 1;
            let failure = match self.open(body).await {
                Ok((first, rest)) => {
                    let bytes = futures::stream::once(futures::future::ready(Ok(first))).chain(rest);
                    return decode_stream(bytes, self.endpoint.idle_timeout, decoder, sink).await;
                }
                Err(Attempt::Fatal(error)) => return Err(error),
                Err(Attempt::Retry(failure)) => failure,
            };
            let retry = *attempts - 1;
            if retry >= self.endpoint.retries {
                return Err(failure.into_error(*attempts));
            }
            let wait = self.endpoint.backoff.wait(retry, failure.retry_after, &mut rng);
            if Instant::now() + wait >= deadline {
                tracing::warn!(?wait, "model request: the retry wait would outlast the request's timeout");
                return Err(failure.into_error(*attempts));
            }
            counter!(MODEL_RETRIES, "provider" => self.provider,
                "model" => self.endpoint.model.clone(), "reason" => failure.reason)
            .increment(1);
            tracing::warn!(
                attempt = *attempts,
                ?wait,
                reason = failure.message,
                "model request failed before its first byte; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Sends the request and waits for the first byte of a successful body.
    async fn open(&self, body: &[u8]) -> Result<(Bytes, BoxStream<'static, reqwest::Result<Bytes>>), Attempt> {
        let first_byte = self.endpoint.first_byte_timeout;
        let by = Instant::now() + first_byte;
        let no_first_byte = || {
            Attempt::Fatal(ProviderError::Timeout {
                kind: TimeoutKind::FirstByte,
                after: first_byte,
                partial: Partial::default(),
            })
        };
        let request = self.client.post(self.url.clone()).headers(self.headers.clone()).body(body.to_vec());
        let response = match timeout_at(by, request.send()).await {
            Err(_) => return Err(no_first_byte()),
            Ok(Err(e)) if e.is_builder() => {
                return Err(Attempt::Fatal(ProviderError::Refused { status: None, message: describe(&e) }));
            }
            Ok(Err(e)) => return Err(Attempt::Retry(Retryable::connection(describe(&e)))),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            let message = match timeout_at(by, error_body(response)).await {
                Ok(body) => provider_message(&body),
                Err(_) => None,
            }
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("no message").to_owned());
            return Err(if status == StatusCode::TOO_MANY_REQUESTS {
                Attempt::Retry(Retryable {
                    reason: "rate_limited",
                    rate_limited: true,
                    message: format!("HTTP 429: {message}"),
                    retry_after,
                })
            } else if status.is_server_error() {
                Attempt::Retry(Retryable {
                    reason: "server_error",
                    rate_limited: false,
                    message: format!("HTTP {}: {message}", status.as_u16()),
                    retry_after,
                })
            } else {
                Attempt::Fatal(ProviderError::Refused { status: Some(status.as_u16()), message })
            });
        }
        let mut stream = response.bytes_stream().boxed();
        loop {
            match timeout_at(by, stream.next()).await {
                Err(_) => return Err(no_first_byte()),
                Ok(None) => {
                    return Err(Attempt::Fatal(ProviderError::StreamBroken {
                        message: "the response body was empty".into(),
                        partial: Partial::default(),
                    }));
                }
                Ok(Some(Err(e))) => {
                    return Err(Attempt::Retry(Retryable::connection(format!(
                        "the connection failed before the first byte: {}",
                        describe(&e)
                    ))));
                }
                Ok(Some(Ok(chunk))) if chunk.is_empty() => {}
                Ok(Some(Ok(chunk))) => return Ok((chunk, stream)),
            }
        }
    }

    /// Logs the end of a request and records its attempts and outcome on the span. Requests, tokens and
    /// timings are counted by the runner (`crate::metrics::ModelCall`), for every kind of model.
    fn record(&self, result: &Result<ChatOutput, ProviderError>, attempts: u32, started: Instant) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        let span = tracing::Span::current();
        span.record("attempts", attempts);
        span.record("outcome", outcome);
        let took = started.elapsed();
        match result {
            Ok(output) => {
                tracing::debug!(finish = ?output.finish, tool_calls = output.tool_calls.len(), ?took, "model request done");
            }
            Err(ProviderError::Aborted { .. }) => tracing::debug!(?took, "model request aborted"),
            Err(error) => tracing::warn!(%error, code = error.code(), ?took, "model request failed"),
        }
    }
}

/// The outcome of an attempt that did not reach its first byte.
enum Attempt {
    Retry(Retryable),
    Fatal(ProviderError),
}

/// A failure before the first byte that SPEC §8 retries.
struct Retryable {
    /// The `reason` label of [`MODEL_RETRIES`].
    reason: &'static str,
    rate_limited: bool,
    message: String,
    retry_after: Option<Duration>,
}

impl Retryable {
    fn connection(message: String) -> Self {
        Self { reason: "connection", rate_limited: false, message, retry_after: None }
    }

    fn into_error(self, attempts: u32) -> ProviderError {
        if self.rate_limited {
            ProviderError::RateLimited { message: self.message, attempts }
        } else {
            ProviderError::Unavailable { message: self.message, attempts }
        }
    }
}

/// Reads a stream of response bytes as server-sent events through `decoder` until it is done.
pub(crate) async fn decode_stream<S, E, D>(
    bytes: S,
    idle: Duration,
    decoder: &mut D,
    sink: &DeltaSink,
) -> Result<ChatOutput, ProviderError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: StdError,
    D: SseDecoder,
{
    let broken =
        |message: String, decoder: &D| ProviderError::StreamBroken { message, partial: decoder.delivered().partial() };
    let events = bytes.eventsource();
    tokio::pin!(events);
    loop {
        let Ok(next) = timeout(idle, events.next()).await else {
            return Err(ProviderError::Timeout {
                kind: TimeoutKind::Idle,
                after: idle,
                partial: decoder.delivered().partial(),
            });
        };
        let flow = match next {
            None if decoder.complete_at_eof() => Flow::Done,
            None => return Err(broken("the stream ended before its end marker".into(), decoder)),
            Some(Err(EventStreamError::Transport(e))) => {
                return Err(broken(format!("the connection failed mid-stream: {}", describe(&e)), decoder));
            }
            Some(Err(e)) => return Err(broken(format!("malformed event stream: {e}"), decoder)),
            Some(Ok(event)) => {
                let mut decoded = Vec::new();
                let flow = decoder.event(&event, &mut |delta| decoded.push(delta));
                // The next event is read only once the sink took these: backpressure reaches the socket.
                for delta in decoded {
                    sink.send_delta(delta).await;
                }
                match flow {
                    Ok(flow) => flow,
                    Err(message) => return Err(broken(message, decoder)),
                }
            }
        };
        if flow == Flow::Done {
            return decoder.finish().map_err(|message| broken(message, decoder));
        }
    }
}

/// The shared client: HTTP/1.1 over rustls with ring (the workspace's one crypto provider), no redirects
/// (a POST must not silently become a GET elsewhere), no proxy from the environment.
fn client() -> Result<Client, EndpointError> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // `Err` means another thread installed one meanwhile; either way there is one now, so reqwest
        // never reaches its "no provider" panic.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| EndpointError::Client(describe(&e)))
}

/// Reads at most 64 KiB of an error response's body.
async fn error_body(response: reqwest::Response) -> String {
    const LIMIT: usize = 64 * 1024;
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= LIMIT {
            body.truncate(LIMIT);
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// The provider's own words from an error body: `error.message` (OpenAI, Anthropic and most
/// compatible servers), `error` as a string, or `message`; else the body's text, shortened.
pub(crate) fn provider_message(body: &str) -> Option<String> {
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(body) {
        let error = &json["error"];
        let found = error["message"].as_str().or_else(|| error.as_str()).or_else(|| json["message"].as_str());
        if let Some(message) = found {
            return Some(message.to_owned());
        }
    }
    let text = body.trim();
    if text.is_empty() {
        return None;
    }
    const SHOWN: usize = 500;
    Some(match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    })
}

/// An error with its chain of causes, `a: b: c` (reqwest's own message names only the outermost).
fn describe(error: &dyn StdError) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each event's data is text; `END` ends the stream.
    #[derive(Default)]
    struct Echo {
        delivered: Delivered,
    }

    impl SseDecoder for Echo {
        fn event(&mut self, event: &Event, sink: &mut (dyn FnMut(StreamDelta) + Send)) -> Result<Flow, String> {
            match event.data.as_str() {
                "END" => Ok(Flow::Done),
                "BAD" => Err("bad event".into()),
                text => {
                    self.delivered.text(text, sink);
                    Ok(Flow::More)
                }
            }
        }
        fn complete_at_eof(&self) -> bool {
            false
        }
        fn delivered(&self) -> &Delivered {
            &self.delivered
        }
        fn finish(&mut self) -> Result<ChatOutput, String> {
            Ok(ChatOutput {
                text: std::mem::take(&mut self.delivered.text),
                reasoning: None,
                tool_calls: vec![],
                finish: super::super::chat::Finish::Stop,
                usage: None,
            })
        }
    }

    type Chunk = Result<Bytes, std::io::Error>;

    async fn decode(
        chunks: Vec<Chunk>,
        tail: impl Stream<Item = Chunk>,
    ) -> (Result<ChatOutput, ProviderError>, Vec<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let collect = async move {
            let mut seen = Vec::new();
            while let Some(d) = rx.recv().await {
                if let StreamDelta::Text(t) = d {
                    seen.push(t);
                }
            }
            seen
        };
        let decode = async move {
            let bytes = futures::stream::iter(chunks).chain(tail);
            decode_stream(bytes, Duration::from_secs(5), &mut Echo::default(), &DeltaSink::new(tx)).await
        };
        tokio::join!(decode, collect)
    }

    #[tokio::test]
    async fn a_consumer_that_takes_nothing_stops_the_reading_of_the_response() {
        // 100 events all ready to read, a sink of one place that nobody empties: the decoder reads one
        // event per delta taken, never ahead (with a queue in between it would read all 100 at once).
        let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = read.clone();
        let events = (0..100).map(|i| Ok::<_, std::io::Error>(Bytes::from(format!("data: d{i}\n\n"))));
        let bytes = futures::stream::iter(events).inspect(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let sink = DeltaSink::new(tx);
        let mut echo = Echo::default();
        let decoding = decode_stream(bytes, Duration::from_secs(5), &mut echo, &sink);
        tokio::pin!(decoding);
        let reads = || read.load(std::sync::atomic::Ordering::SeqCst);
        assert!(futures::poll!(&mut decoding).is_pending(), "the decoder waits for the sink");
        // One delta in the sink, the second waiting to be sent: two events read.
        assert_eq!(reads(), 2);
        for taken in 1..=3 {
            assert_eq!(rx.recv().await, Some(StreamDelta::Text(format!("d{}", taken - 1))));
            assert!(futures::poll!(&mut decoding).is_pending());
            assert_eq!(reads(), 2 + taken, "one more event read per delta taken");
        }
    }

    #[tokio::test]
    async fn characters_and_events_split_at_every_byte_arrive_whole() {
        let text = "héllo 👍 wörld";
        let raw = format!("data: {text}\n\ndata: END\n\n").into_bytes();
        let chunks = raw.iter().map(|b| Ok(Bytes::copy_from_slice(&[*b]))).collect();
        let (result, seen) = decode(chunks, futures::stream::empty()).await;
        assert_eq!(result.unwrap().text, text);
        assert_eq!(seen, [text]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_times_out_with_what_it_delivered() {
        let (result, _) = decode(vec![Ok(Bytes::from_static(b"data: so far\n\n"))], futures::stream::pending()).await;
        match result {
            Err(ProviderError::Timeout { kind: TimeoutKind::Idle, partial, .. }) => assert_eq!(partial.text, "so far"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn cuts_bad_events_and_early_ends_break_the_stream() {
        let cut = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let (result, _) =
            decode(vec![Ok(Bytes::from_static(b"data: a\n\n")), Err(cut)], futures::stream::empty()).await;
        let Err(ProviderError::StreamBroken { message, partial }) = result else { panic!("{result:?}") };
        assert!(message.contains("reset by peer"), "{message}");
        assert_eq!(partial.text, "a");

        let (result, _) = decode(vec![Ok(Bytes::from_static(b"data: BAD\n\n"))], futures::stream::empty()).await;
        assert!(matches!(result, Err(ProviderError::StreamBroken { message, .. }) if message == "bad event"));

        let (result, _) = decode(vec![Ok(Bytes::from_static(b"data: a\n\n"))], futures::stream::empty()).await;
        assert_eq!(result.unwrap_err().code(), "model_stream_broken");
    }

    #[test]
    fn provider_messages() {
        assert_eq!(provider_message(r#"{"error":{"message":"bad key","type":"x"}}"#).as_deref(), Some("bad key"));
        assert_eq!(provider_message(r#"{"error":"model not loaded"}"#).as_deref(), Some("model not loaded"));
        assert_eq!(provider_message(r#"{"message":"nope"}"#).as_deref(), Some("nope"));
        assert_eq!(provider_message("  upstream down\n").as_deref(), Some("upstream down"));
        assert_eq!(provider_message(" "), None);
        let long = "é".repeat(600);
        let shown = provider_message(&long).unwrap_or_default();
        assert_eq!(shown.chars().count(), 501);
    }
}
