//! Server-sent events: the streaming HTTP response every protocol's stream is carried by.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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

/// One event: `id:` (the position a reconnect's `Last-Event-ID` resumes after), `event:` when named, and
/// `data:`.
pub fn frame(id: Option<&str>, event: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 64);
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(id);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
    Bytes::from(out)
}

/// A reconnect's `Last-Event-ID`, when it sent one.
pub fn last_event_id(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("last-event-id").and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty())
}
