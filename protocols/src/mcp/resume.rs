//! A `tools/call` stream cut before its answer, resumed with `Last-Event-ID` (decision 0156).
//!
//! Each progress notification of a call carries, in `_meta`, a [`Cursor`]: the call's session, the seq of
//! its delivery, the position of the change in the turn (decision 0101's numbering), the JSON-RPC request id
//! and the progress token. [`Cursors`], rmcp's event store, makes that cursor the SSE event's `id:` and keeps
//! nothing: the session's log is the store. A client that lost the stream sends `GET /mcp` with
//! `Last-Event-ID`, at any gateway, and [`resume`] follows the turn from that position on the Watch, sending
//! the rest of the progress and then the call's answer, exactly as the call would have.
//!
//! A cut is a cancellation only where the protocol says so: at 2026-07-28 closing the call's stream is the
//! cancellation (so the call's handler watches for the response body being dropped, [`watch_close`]); before
//! it, a disconnection is not a cancellation and the stream resumes.

use std::task::Poll;

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::ServerResult;
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use rmcp::transport::streamable_http_server::session::store::{EventId, EventStore, EventStoreError, EventStream};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::results::{ended, failure, waiting_result};
use super::{Fail, Server};
use crate::admit::CallerTenant;
use crate::api::{Api, next};
use crate::ids;
use crate::sse;
use crate::turn::{Change, TurnFold};

/// The `_meta` key of a progress notification's cursor.
pub(crate) const CURSOR_KEY: &str = "io.turnstile/cursor";
const PREFIX: &str = "mcpe_";
/// The id of an event that names no position (the answer itself): nothing follows it.
const END: &str = "mcpe-end";

/// Where a call's stream stands: enough for any gateway to go on with it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cursor {
    pub(crate) session: String,
    /// The seq of the call's delivery.
    pub(crate) seq: u64,
    /// The position of the last change sent.
    pub(crate) position: u64,
    /// The JSON-RPC id of the `tools/call`, which its answer carries.
    pub(crate) request: Value,
    /// The call's progress token.
    pub(crate) token: Value,
}

impl Cursor {
    pub(crate) fn encode(&self) -> String {
        let ids = json!([self.request, self.token]).to_string();
        ids::token(PREFIX, &[&self.session, &self.seq.to_string(), &self.position.to_string(), &ids])
    }

    pub(crate) fn decode(raw: &str) -> Option<Self> {
        let parts = ids::parts(PREFIX, raw, 4)?;
        let seq = parts[1].parse().ok().filter(|s| *s > 0)?;
        let position = parts[2].parse().ok()?;
        let Value::Array(pair) = serde_json::from_str(&parts[3]).ok()? else { return None };
        let [request, token] = <[Value; 2]>::try_from(pair).ok()?;
        ids::is_session_id(&parts[0]).then(|| Self { session: parts[0].clone(), seq, position, request, token })
    }

    /// The progress notification of `piece` at `position`, carrying its own cursor.
    pub(crate) fn progress(&self, position: u64, piece: &str) -> Value {
        let at = Self { position, ..self.clone() };
        json!({"progressToken": self.token, "progress": position, "message": piece, "_meta": {CURSOR_KEY: at.encode()}})
    }
}

/// rmcp's event store: an event's id is the cursor its message carries (or [`END`]); nothing is kept.
#[derive(Debug, Default)]
pub(crate) struct Cursors;

#[async_trait::async_trait]
impl EventStore for Cursors {
    async fn store_event(&self, _stream_id: &str, event: &ServerSseMessage) -> Result<EventId, EventStoreError> {
        let cursor = event
            .message
            .as_ref()
            .and_then(|m| serde_json::to_value(m.as_ref()).ok())
            .and_then(|v| v.get("params")?.get("_meta")?.get(CURSOR_KEY)?.as_str().map(str::to_owned));
        Ok(cursor.unwrap_or_else(|| END.to_owned()))
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<EventStream, EventStoreError> {
        // `GET /mcp` with `Last-Event-ID` is answered by [`resume`], before rmcp, with the caller's token.
        Err(format!("{last_event_id:?} is resumed by Turnstile's own handler, not rmcp's").into())
    }
}

/// Whether the call's HTTP response was dropped before its end (the client closed the stream).
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamClosed(pub(crate) CancellationToken);

/// Marks each request with a [`StreamClosed`] that is cancelled if its response body is dropped before it
/// ended: rmcp with an event store no longer tells its handler of a disconnection, and at 2026-07-28 that is
/// the call's cancellation.
pub(crate) async fn watch_close(mut request: Request, next: Next) -> Response {
    let closed = CancellationToken::new();
    request.extensions_mut().insert(StreamClosed(closed.clone()));
    let (parts, body) = next.run(request).await.into_parts();
    let mut guard = Some(closed.drop_guard());
    let end = futures::stream::poll_fn(move |_| {
        // The body ended: the client had all of it.
        if let Some(guard) = guard.take() {
            guard.disarm();
        }
        Poll::Ready(None::<Result<bytes::Bytes, axum::Error>>)
    });
    let body = futures::StreamExt::chain(body.into_data_stream(), end);
    Response::from_parts(parts, Body::from_stream(body))
}

/// `GET /mcp` with `Last-Event-ID`: the rest of a call's stream from the cursor on, through any gateway.
pub(crate) async fn resume(
    State(server): State<Server>,
    Extension(_tenant): Extension<CallerTenant>,
    headers: HeaderMap,
) -> Response {
    let Some(last) = sse::last_event_id(&headers) else {
        let mut res =
            (StatusCode::METHOD_NOT_ALLOWED, "GET /mcp resumes a call's stream: send Last-Event-ID").into_response();
        res.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        return res;
    };
    let Some(cursor) = Cursor::decode(last) else {
        let message = format!(
            "Last-Event-ID {last:?} is no event this server can resume after: only the progress events of a \
             tools/call carry one (call again with the session to read the reply)"
        );
        return (StatusCode::NOT_FOUND, message).into_response();
    };
    let api: Api<Fail> = Api::new(&server.gateway, &headers);
    let refused = |status: tonic::Status| {
        let code = match status.code() {
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        (code, status.message().to_owned()).into_response()
    };
    // The session must be the caller's tenant's and hold the call's delivery: a live Watch of a session that
    // does not exist (another tenant's, to this one) would wait for it instead of answering.
    match api.find_session(&cursor.session).await {
        Ok(Some(info)) if info.last_seq >= cursor.seq => {}
        Ok(_) => {
            let message = format!("Last-Event-ID names no call of a session of yours ({:?})", cursor.session);
            return (StatusCode::NOT_FOUND, message).into_response();
        }
        Err(Fail(status)) => return refused(status),
    }
    let watch = match api.watch(&cursor.session, cursor.seq - 1, true).await {
        Ok(watch) => watch,
        Err(Fail(status)) => return refused(status),
    };
    let (tx, res) = sse::channel();
    tokio::spawn(async move {
        let mut watch = watch;
        let mut fold = TurnFold::new(cursor.seq, cursor.position);
        let result = loop {
            let item = match next(&mut watch).await {
                Ok(item) => item,
                Err(status) => break failure(&cursor.session, &status),
            };
            let mut answer = None;
            for step in fold.apply(&item) {
                match step.change {
                    Change::Text { piece, .. } => {
                        let note = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": cursor.progress(step.position, &piece)});
                        let id = Cursor { position: step.position, ..cursor.clone() }.encode();
                        if tx.send(sse::frame(Some(&id), None, &note.to_string())).await.is_err() {
                            return;
                        }
                    }
                    Change::Waiting(call) => answer = Some(waiting_result(&cursor.session, &fold, &call)),
                    Change::Ended(outcome) => answer = Some(ended(&cursor.session, &fold, &outcome)),
                    _ => {}
                }
            }
            if let Some(answer) = answer {
                break answer;
            }
        };
        let result = serde_json::to_value(ServerResult::CallToolResult(result)).unwrap_or(Value::Null);
        let body = json!({"jsonrpc": "2.0", "id": cursor.request, "result": result});
        let _ = tx.send(sse::frame(Some(END), None, &body.to_string())).await;
    });
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_anything_else_is_none() {
        let c = Cursor { session: "mcp-1".into(), seq: 4, position: 99, request: json!("r.1"), token: json!(7) };
        assert_eq!(Cursor::decode(&c.encode()), Some(c.clone()));
        let progress = c.progress(120, "hi");
        assert_eq!(Cursor::decode(progress["_meta"][CURSOR_KEY].as_str().unwrap()).map(|c| c.position), Some(120));
        for bad in ["", END, "mcpe_", "0", &ids::token(PREFIX, &["a b", "1", "2", "[1,2]"])] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
