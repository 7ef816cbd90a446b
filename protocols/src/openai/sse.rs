//! Server-sent events: each Responses streaming event as `event:`, `id:` (its sequence number, so an
//! EventSource reconnect's `Last-Event-ID` resumes it) and `data:`.

use bytes::Bytes;
use serde_json::json;

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

pub use crate::sse::channel;
