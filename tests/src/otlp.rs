//! A test OTLP trace collector: a tonic server of `opentelemetry.proto.collector.trace.v1.TraceService`
//! on a free loopback port that keeps every span it is sent, so a test can check what the processes it
//! started exported (no real collector can be installed here). Point a process at it with
//! `OTEL_EXPORTER_OTLP_ENDPOINT=<`[`OtlpCollector::endpoint`]`>`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::HarnessError;
use crate::sync::lock;

/// One received span, ids in lowercase hex as in a `traceparent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectedSpan {
    /// The exporting process's `service.name` resource attribute (empty when it had none).
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
}

/// A running collector; dropping it stops the server.
#[derive(Debug)]
pub struct OtlpCollector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    server: JoinHandle<()>,
}

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                received.push(CollectedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                });
            }
        }
        lock(&self.spans).extend(received);
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl OtlpCollector {
    /// Starts a collector on a free loopback port.
    pub async fn start() -> Result<Self, HarnessError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::io("binding the OTLP collector's port", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::io("reading the collector's address", e))?;
        let receiver = Receiver::default();
        let spans = receiver.spans.clone();
        let server = tokio::spawn(async move {
            // Ends only when the test drops the collector (the task is aborted) or the socket fails; the
            // test then sees missing spans, with this message in its output.
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(receiver))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
            {
                eprintln!("OTLP test collector stopped: {e}");
            }
        });
        Ok(Self { addr, spans, server })
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        lock(&self.spans).clone()
    }

    /// Waits up to `timeout` until the spans received satisfy `done`; returns them.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[CollectedSpan]) -> bool,
    ) -> Result<Vec<CollectedSpan>, HarnessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            if tokio::time::Instant::now() >= deadline {
                let recorded = spans.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join("\n");
                return Err(HarnessError::WaitTimeout { what: what.to_owned(), waited: timeout, recorded });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        self.server.abort();
    }
}
