//! Logs and traces of a Turnstile process: a `tracing` fmt layer on stderr (filtered by `RUST_LOG`) and, iff an
//! OTLP endpoint is configured, a `tracing-opentelemetry` layer exporting spans over OTLP/gRPC.
//!
//! Configuration is the standard OpenTelemetry environment: `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turns export on (the exporter reads them, and `..._TIMEOUT`,
//! `..._HEADERS`, itself); `OTEL_SERVICE_NAME` names the process (default `turnstile-<role>`);
//! `OTEL_BSP_SCHEDULE_DELAY` and the other `OTEL_BSP_*` variables tune the batch span processor. Without
//! an endpoint no OpenTelemetry layer is installed, so spans cost what plain `tracing` spans cost.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The variables that turn OTLP export on.
const ENDPOINT_VARS: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// How long exiting waits for the last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The installed telemetry; [`Telemetry::shutdown`] flushes the spans still queued.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber (unless one is installed already) and propagator. `role` names the process in the default service name.
/// Must run inside the tokio runtime: the gRPC exporter's channel lives on it.
pub fn init(role: &str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(
            "warn,turnstile=info,turnstile_node=info,turnstile_gateway=info,turnstile_worker=info,turnstile_journal=info",
        )
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    // W3C trace context is the wire format of every hop (gRPC metadata, NATS headers); set even when
    // export is off, so the format never depends on it.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let (provider, failure) = if otlp_configured() {
        match provider(role) {
            Ok(provider) => (Some(provider), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let otel = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("turnstile")));
    // The filter applies to both layers: the exporter's own tonic/hyper spans stay below it, so exporting
    // never traces itself.
    // A process that already installed a subscriber (a test that starts roles in-process) keeps its own.
    if tracing_subscriber::registry().with(filter).with(fmt).with(otel).try_init().is_err() {
        tracing::debug!("a tracing subscriber is already installed; keeping it");
    }
    if let Some(e) = failure {
        tracing::warn!(error = %e, "OTLP trace export is configured but could not start; traces are off");
    }
    Telemetry { provider }
}

impl Telemetry {
    /// Exports the spans still queued (bounded by a timeout) and stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        // `shutdown` blocks until the batch processor's thread has exported, and that export runs on this
        // runtime's IO: block a blocking-pool thread, not a worker.
        let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)).await;
        if let Ok(Err(e)) = done {
            eprintln!("turnstile: flushing traces on exit failed: {e}");
        }
    }
}

fn otlp_configured() -> bool {
    ENDPOINT_VARS.iter().any(|v| std::env::var_os(v).is_some_and(|value| !value.is_empty()))
}

fn provider(role: &str) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
    // The builder's resource already reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; name the
    // process only when the operator did not.
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none_or(|v| v.is_empty()) {
        resource = resource.with_service_name(format!("turnstile-{role}"));
    }
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build())
}
