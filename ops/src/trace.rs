//! W3C trace context across Turnstile's process boundaries: client → gateway (gRPC metadata), gateway →
//! worker (internal gRPC metadata), worker → NATS (the `traceparent` header of every event).
//!
//! The carrier everywhere is one `traceparent` string. The OpenTelemetry context of a `tracing` span
//! exists only when the process installed the `tracing-opentelemetry` layer (the binary does when an
//! OTLP endpoint is configured); without it these helpers do nothing and return `None`, so tracing costs
//! nothing when it is off. Encoding and decoding go through the global propagator (W3C trace context,
//! set by the binary), so the wire format is the standard one.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The metadata key and NATS header name of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of the current span, `None` when tracing is off or the span is not recorded.
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&tracing::Span::current())
}

/// The `traceparent` naming `span` as the parent, `None` when tracing is off or the span is disabled.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = Carrier::default();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.0.remove(TRACEPARENT)
}

/// Makes the remote context in `traceparent` the parent of `span`, which must not have been entered yet.
/// A missing or malformed value leaves `span` a root: a bad header from a client never fails a request.
pub fn set_parent_from(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|tp| !tp.is_empty()) else { return };
    let carrier = Carrier(HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]));
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    if cx.span().span_context().is_valid() {
        // Errors mean "no OpenTelemetry layer" or "already started": tracing is off for this span, which
        // is not the request's concern.
        let _ = span.set_parent(cx);
    }
}

/// The span of one incoming gRPC call (`path` is `/package.Service/Method`), child of the caller's
/// `traceparent` when it sent one. For tonic's `Server::trace_fn`, so every RPC of a server gets one.
pub fn grpc_request_span(path: &str, traceparent: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!("grpc", otel.name = path, otel.kind = "server", rpc = path);
    set_parent_from(&span, traceparent);
    span
}

/// The trace id (32 lowercase hex digits) of a `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace_id) = (parts.next()?, parts.next()?);
    (trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(trace_id)
}

#[derive(Default)]
struct Carrier(HashMap<String, String>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_are_read_from_well_formed_values_only() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(tp), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id_of("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of(""), None);
    }

    #[test]
    fn without_a_tracing_layer_nothing_is_propagated() {
        let span = tracing::info_span!("request");
        set_parent_from(&span, Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(traceparent_of(&span), None);
    }
}
