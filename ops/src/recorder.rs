//! The process-wide Prometheus recorder behind the `metrics` facade.

use std::sync::OnceLock;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::names;

/// Latency buckets in seconds: sub-millisecond appends up to multi-minute model steps.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The recorder could not be installed.
#[derive(Clone, Debug, thiserror::Error)]
#[error("cannot install the Prometheus metrics recorder: {0}")]
pub struct MetricsError(String);

static HANDLE: OnceLock<Result<PrometheusHandle, MetricsError>> = OnceLock::new();

/// Installs the Prometheus recorder as the global `metrics` recorder (once per process; later calls return
/// the same handle). Call it before serving so no early sample is lost.
pub fn install_metrics() -> Result<&'static PrometheusHandle, MetricsError> {
    HANDLE.get_or_init(build).as_ref().map_err(Clone::clone)
}

/// The Prometheus text exposition of every metric recorded so far.
pub fn render_metrics() -> Result<String, MetricsError> {
    let handle = install_metrics()?;
    // Drains histogram samples into their buckets; cheap, and a scrape is the moment it matters.
    handle.run_upkeep();
    let mut text = handle.render();
    crate::process::render(&mut text);
    Ok(text)
}

fn build() -> Result<PrometheusHandle, MetricsError> {
    let handle = PrometheusBuilder::new()
        // Histograms, not the exporter's default summaries: buckets aggregate across instances.
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .map_err(|e| MetricsError(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError(e.to_string()))?;
    describe();
    Ok(handle)
}

fn describe() {
    describe_counter!(names::DELIVERIES, "Commands routed by the gateway, by preset and outcome.");
    describe_counter!(names::TURNS, "Turns ended, by end reason.");
    describe_counter!(names::STEPS, "Steps started.");
    describe_counter!(names::CLAIMS, "Claim splices appended, by inbox target.");
    describe_counter!(names::CLAIMED_MESSAGES, "Messages taken from the inbox by claims, by target.");
    describe_counter!(names::APPENDS, "Conditional append batches, by outcome.");
    describe_counter!(names::APPENDED_EVENTS, "Durable events appended.");
    describe_histogram!(names::APPEND_SECONDS, Unit::Seconds, "Time of one conditional append batch.");
    describe_histogram!(names::STEP_SECONDS, Unit::Seconds, "Time from step/start to step/end.");
    describe_histogram!(names::CLAIM_TO_STEP_SECONDS, Unit::Seconds, "Time from a claim to the step/start it feeds.");
    describe_gauge!(names::WATCH_STREAMS_OPEN, "Watch streams open on this gateway.");
    describe_gauge!(names::WATCH_FEEDS_OPEN, "Shared Watch feeds (one per watched session) open on this gateway.");
    describe_gauge!(names::SESSIONS_LOADED, "Sessions with a live runner on this worker.");
    describe_gauge!(names::SESSIONS_QUARANTINED, "Sessions quarantined on this worker: their log cannot be folded.");
    describe_gauge!(names::SHARDS_OWNED, "Shard leases held by this worker.");
    describe_counter!(names::LEASE_RENEW_FAILURES, "Failed lease renewals, by reason.");
    describe_counter!(names::MODEL_REQUESTS, "Model requests ended, by tenant, agent, provider, model and outcome.");
    describe_counter!(names::MODEL_TOKENS, "Tokens providers reported, by tenant, agent, provider, model and kind.");
    describe_counter!(names::MODEL_ERRORS, "Failed model requests, by tenant, agent, provider, model and code.");
    describe_counter!(names::MODEL_RETRIES, "Model request retries before the first byte, by reason.");
    describe_counter!(names::MODEL_FALLBACKS, "Model requests that went on to the next fallback model, by code.");
    describe_counter!(names::BUDGET_REFUSALS, "Model requests not sent for the tenant's daily token budget.");
    describe_histogram!(
        names::MODEL_FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "Time from a model request's start to its first streamed piece."
    );
    describe_histogram!(names::MODEL_REQUEST_SECONDS, Unit::Seconds, "Time of one model request, end to end.");
    describe_gauge!(
        names::CERTIFICATE_EXPIRY,
        Unit::Seconds,
        "Expiry of the first certificate of a TLS file in force, Unix seconds."
    );
    describe_counter!(names::RELOADS, "Auth and TLS files read again while running, by what and outcome (ok, error).");
    describe_counter!(names::WEBHOOK_DELIVERIES, "Webhook POSTs, by outcome (delivered, failed).");
    describe_counter!(names::WEBHOOK_GIVEN_UP, "Webhook events given up on after max_age_ms.");
}
