//! Server-sent events: each Responses streaming event as `event:`, `id:` (its sequence number, so an
//! EventSource reconnect's `Last-Event-ID` resumes it) and `data:`.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::fold::Event;

/// One event as its SSE frame.
pub fn frame(event: &Event) -> Bytes {
    Bytes::from(format!("event: {}\nid: {}\ndata: {}\n\n", event.kind(), event.number, event.body))
}

/// The `error` event that ends a stream which cannot go on; numbered after the last event sent.
pub fn error_frame(error: &ApiError, after: u64) -> Bytes {
    let body = json!({"type": "error", "code": error.code, "message": error.message, "param": error.param,
                      "sequence_number": after + 1});
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}

/// A sender of frames and the streaming HTTP response that carries them. The producer stops when `send`
/// fails: the client went away.
pub fn channel() -> (mpsc::Sender<Bytes>, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = tokio_stream::StreamExt::map(ReceiverStream::new(rx), Ok::<_, Infallible>);
    let mut res = Body::from_stream(stream).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (tx, res)
}
