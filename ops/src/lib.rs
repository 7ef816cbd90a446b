//! The operations surface every Turnstile server shares: Prometheus metrics ([`metrics`]), the HTTP
//! endpoints `/metrics`, `/healthz` and `/readyz` ([`http`]), the gRPC server every role serves its
//! services on, with health, reflection and one span per call ([`grpc`]), W3C trace context across
//! gRPC hops and NATS headers ([`trace`]), and the rustls configs of every TLS listener and dialer, read
//! and checked from PEM files ([`tls`]), and where a tenant's URL may point ([`egress`]).
//!
//! Instrumented code uses the `metrics` facade macros directly with the names in [`names`], so nothing is
//! threaded through constructors; a process that never installs the exporter ([`install_metrics`])
//! records nothing and pays almost nothing. Each scrape also carries `turnstile_build_info` and the
//! standard `process_*` series. docs/OPERATIONS.md lists every metric.

pub mod clock;
pub mod egress;
mod expiry;
pub mod grpc;
pub mod http;
mod process;
mod recorder;
pub mod tls;
pub mod trace;

pub use http::{AlwaysReady, HttpError, Readiness, serve_http, serve_http_with};
pub use process::{BuildInfo, build_info, set_build_info};
pub use recorder::{MetricsError, install_metrics, render_metrics};

/// `error` and its causes, joined by `: `: a library's own message often names only the outermost failure
/// (reqwest's only the request, a TLS file's error only the file).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Metric names. Counters end in `_total`, histograms in `_seconds` (base units); labels are low
/// cardinality (command presets, outcomes, reasons), never session ids. The model counters carry the
/// tenant (tokens are accounted per tenant); histograms never do.
pub mod names {
    /// Gauge `{version, commit}`, always 1: what the binary was built from ([`crate::BuildInfo`]). Rendered
    /// beside the standard `process_*` series (CPU, resident memory, open descriptors, start time) at each
    /// scrape, not through the `metrics` facade.
    pub const BUILD_INFO: &str = "turnstile_build_info";
    /// Counter `{preset, outcome}`: commands the gateway routed, by `Command::name()` and `accepted` or
    /// the error kind (`invalid_argument`, `already_exists`, `failed_precondition`, `unavailable`, ...).
    pub const DELIVERIES: &str = "turnstile_deliveries_total";
    /// Counter `{reason}`: turns ended (`completed`, `blocked`, `max_tokens`, `aborted`, `error`,
    /// `interrupted`).
    pub const TURNS: &str = "turnstile_turns_total";
    /// Counter: steps started (`step/start` appended).
    pub const STEPS: &str = "turnstile_steps_total";
    /// Counter `{target}`: claim splices appended (`next_turn`, `next_step`).
    pub const CLAIMS: &str = "turnstile_claims_total";
    /// Counter `{target}`: messages those claims took from the inbox.
    pub const CLAIMED_MESSAGES: &str = "turnstile_claimed_messages_total";
    /// Counter `{outcome}`: conditional append batches (`ok`, `conflict`, `error`).
    pub const APPENDS: &str = "turnstile_appends_total";
    /// Counter: durable events appended by successful batches.
    pub const APPENDED_EVENTS: &str = "turnstile_appended_events_total";
    /// Histogram `{outcome}`: time of one append batch.
    pub const APPEND_SECONDS: &str = "turnstile_append_duration_seconds";
    /// Histogram: `step/start` → `step/end`, from the events' `time_ms`.
    pub const STEP_SECONDS: &str = "turnstile_step_duration_seconds";
    /// Histogram: first claim splice since the previous step → the `step/start` it feeds.
    pub const CLAIM_TO_STEP_SECONDS: &str = "turnstile_claim_to_step_seconds";
    /// Gauge: Watch streams open on this gateway.
    pub const WATCH_STREAMS_OPEN: &str = "turnstile_watch_streams_open";
    /// Gauge: shared Watch feeds open on this gateway (one per watched session: one log reader and one
    /// live subscription each, decision 0039).
    pub const WATCH_FEEDS_OPEN: &str = "turnstile_watch_feeds_open";
    /// Gauge: bytes this gateway's Watch streams hold for their clients, each shared item counted once
    /// (bounded by `limits.watch_buffer_total_bytes`, decision 0088).
    pub const WATCH_BUFFERED_BYTES: &str = "turnstile_watch_buffered_bytes";
    /// Counter `{reason}`: Watch streams cut because they fell behind (`behind`: past
    /// `limits.watch_buffer_bytes`; `gateway_full`: holding bytes while the gateway was past
    /// `limits.watch_buffer_total_bytes`); their clients resume with `after_seq`.
    pub const WATCH_CUTS: &str = "turnstile_watch_cuts_total";
    /// Gauge: session index writes waiting for the NATS KV bucket on this worker, at most one per session
    /// (the latest; decision 0090). Grows while NATS is away, drains when it is back.
    pub const INDEX_WRITES_PENDING: &str = "turnstile_index_writes_pending";
    /// Gauge: sessions with a live runner on this worker.
    pub const SESSIONS_LOADED: &str = "turnstile_sessions_loaded";
    /// Gauge: sessions this worker holds quarantined (their log cannot be folded, decision 0084).
    pub const SESSIONS_QUARANTINED: &str = "turnstile_sessions_quarantined";
    /// Gauge: shard leases this worker holds.
    pub const SHARDS_OWNED: &str = "turnstile_shards_owned";
    /// Counter `{reason}`: lease renewals that failed (`lost`: another worker holds it; `error`: the KV
    /// store did not answer).
    pub const LEASE_RENEW_FAILURES: &str = "turnstile_lease_renew_failures_total";
    /// Counter `{tenant, agent, provider, model, outcome}`: model requests ended, by `ok`, `aborted` or
    /// the error code (`model_unavailable`, `model_rate_limited`, `model_timeout`, `model_refused`,
    /// `model_stream_broken`, `model_failed`).
    pub const MODEL_REQUESTS: &str = "turnstile_model_requests_total";
    /// Counter `{tenant, agent, provider, model, kind}`: tokens the providers reported (`input`, `output`,
    /// `cached`: input read from the prompt cache, `cache_write`: input written to it), under the model that
    /// answered (a fallback's, SPEC §17).
    pub const MODEL_TOKENS: &str = "turnstile_model_tokens_total";
    /// Counter `{provider, model, code}`: requests that failed before their first byte on `model` and went on
    /// to the next model of its `fallback` list (SPEC §17).
    pub const MODEL_FALLBACKS: &str = "turnstile_model_fallbacks_total";
    /// Counter `{tenant}`: model requests not sent because the tenant had used its daily `token_budget`.
    pub const BUDGET_REFUSALS: &str = "turnstile_tenant_budget_refusals_total";
    /// Counter `{tenant, agent, provider, model, code}`: failed model requests by error code (aborts are
    /// not errors).
    pub const MODEL_ERRORS: &str = "turnstile_model_errors_total";
    /// Counter `{provider, model, reason}`: retries before the first byte (`connection`, `rate_limited`,
    /// `server_error`).
    pub const MODEL_RETRIES: &str = "turnstile_model_retries_total";
    /// Histogram `{agent, provider, model}`: seconds from the start of a model request (retries included)
    /// to its first streamed text or reasoning, or to its end when it streamed none (tool calls only).
    pub const MODEL_FIRST_TOKEN_SECONDS: &str = "turnstile_model_time_to_first_token_seconds";
    /// Histogram `{agent, provider, model, outcome}`: seconds a model request took, end to end.
    pub const MODEL_REQUEST_SECONDS: &str = "turnstile_model_request_duration_seconds";
    /// Counter `{kind, server, tool, outcome}`: tool calls ended. `kind` is `builtin`, `mcp` or `client`;
    /// `server` the MCP server (empty otherwise); `outcome` `ok`, `error`, `tool_timeout`, `aborted`,
    /// `no_executor` or `unavailable` (the agent does not list the tool).
    pub const TOOL_CALLS: &str = "turnstile_tool_calls_total";
    /// Histogram `{kind, server, tool, outcome}`: seconds a tool call took, as the runner waited for it.
    pub const TOOL_CALL_SECONDS: &str = "turnstile_tool_call_duration_seconds";
    /// Gauge: client tool executors (`ServeTools` streams) registered on this gateway.
    pub const TOOL_EXECUTORS: &str = "turnstile_tool_executors";
    /// Counter: results executors sent for a call id the gateway was not waiting for (answered `rejected`).
    pub const TOOL_RESULTS_REJECTED: &str = "turnstile_tool_results_rejected_total";
    /// Counter `{hook, outcome, action}`: calls of remote pre-step hooks, by the hook's URL; `outcome` is
    /// `enter`, `reject`, `timeout`, `unavailable`, `status`, `invalid` or `aborted`, `action` what the
    /// waterfall did with it (`pass`, `reject`, `error`, `skip`; a failure's is the hook's `on_failure`).
    pub const PRE_STEP_HOOK_CALLS: &str = "turnstile_pre_step_hook_calls_total";
    /// Histogram `{hook, outcome}`: seconds one remote pre-step hook call took, as the worker waited for it.
    pub const PRE_STEP_HOOK_SECONDS: &str = "turnstile_pre_step_hook_duration_seconds";
    /// Gauge `{file}`: when the first certificate of a TLS file this process read expires, in Unix
    /// seconds (`--tls-cert`, `--tls-client-ca`, `--cluster-tls-ca`, `--cluster-tls-cert`; read at start and
    /// again when the file changes).
    pub const CERTIFICATE_EXPIRY: &str = "turnstile_certificate_expiry_timestamp_seconds";
    /// Counter `{what, outcome}`: files read again while the process runs (decision 0159). `what` is `auth`
    /// (`--auth-tokens`/`--jwt-key`), `tls` (`--tls-*`) or `cluster_tls` (`--cluster-tls-*`); `outcome` is
    /// `ok` (now in force) or `error` (unusable: the previous material stays in force, the log says why).
    pub const RELOADS: &str = "turnstile_reloads_total";
    /// Counter `{outcome}`: webhook POSTs (SPEC §15), `delivered` (2xx) or `failed` (retried).
    pub const WEBHOOK_DELIVERIES: &str = "turnstile_webhook_deliveries_total";
    /// Counter: events a webhook gave up on after `max_age_ms` of failed POSTs.
    pub const WEBHOOK_GIVEN_UP: &str = "turnstile_webhook_given_up_total";
}

/// Increments a gauge now and decrements it when dropped, so a gauge of "things open" stays right however
/// the holder ends (return, error, panic, task abort).
#[derive(Debug)]
pub struct GaugeGuard(metrics::Gauge);

impl GaugeGuard {
    pub fn inc(gauge: metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A function that sets the gauge `name` to the count it is given: how a crate without metrics of its own
/// (the journal) reports a level, e.g. `KvIndex::observe_pending(gauge_setter(names::INDEX_WRITES_PENDING))`.
pub fn gauge_setter(name: &'static str) -> impl Fn(usize) + Send + Sync + 'static {
    let gauge = metrics::gauge!(name);
    move |count| gauge.set(count as f64)
}

#[cfg(test)]
mod dashboard {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use serde_json::Value;

    /// The metric names of [`super::names`], read from this file's source so the list cannot drift.
    fn exported() -> BTreeSet<&'static str> {
        let source = include_str!("lib.rs");
        let start = source.find("pub mod names {").unwrap();
        let end = start + source[start..].find("\n}\n").unwrap();
        source[start..end].split('"').filter(|s| s.starts_with("turnstile_")).collect()
    }

    /// Every `turnstile_*` series named in the dashboard's queries.
    fn queried(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                        if token.starts_with("turnstile_") {
                            out.insert(token.to_owned());
                        }
                    }
                }
                map.values().for_each(|v| queried(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| queried(v, out)),
            _ => {}
        }
    }

    /// `deploy/grafana/turnstile.json` queries only metrics the servers export (a histogram by its
    /// `_bucket` series, only for histograms; `rate` only over counters and histograms), and every
    /// exported metric has a panel.
    #[test]
    fn the_grafana_dashboard_queries_exactly_the_exported_metrics() {
        let dashboard: Value = serde_json::from_str(include_str!("../../deploy/grafana/turnstile.json")).unwrap();
        let mut series = BTreeSet::new();
        queried(&dashboard, &mut series);
        let exported = exported();
        assert!(exported.len() >= 20, "the names block was not found: {exported:?}");
        let mut used = BTreeSet::new();
        for s in &series {
            let (base, histogram) = match s.strip_suffix("_bucket") {
                Some(base) => (base, true),
                None => (s.as_str(), false),
            };
            assert!(exported.contains(base), "the dashboard queries {s}, which no server exports");
            assert_eq!(
                histogram,
                base.ends_with("_seconds") && !base.ends_with("_timestamp_seconds"),
                "{s}: only histograms (`_seconds`) have `_bucket` series"
            );
            used.insert(base);
        }
        let missing: Vec<_> = exported.difference(&used).collect();
        assert!(missing.is_empty(), "exported metrics without a panel: {missing:?}");
    }

    /// The alert rules (`deploy/k8s/components/alerts`) read only metrics the servers export, and every
    /// alert has its runbook line in docs/OPERATIONS.md ("Alerts and runbooks": a table row naming it).
    #[test]
    fn the_alert_rules_query_exported_metrics_and_each_has_a_runbook_line() {
        let rules = include_str!("../../deploy/k8s/components/alerts/prometheusrule.yaml");
        let operations = include_str!("../../docs/OPERATIONS.md");
        let exported = exported();
        let mut alerts = Vec::new();
        for line in rules.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix("- alert: ") {
                alerts.push(name);
            } else if let Some(expr) = line.strip_prefix("expr: ") {
                for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if token.starts_with("turnstile_") {
                        let base = token.strip_suffix("_bucket").unwrap_or(token);
                        assert!(exported.contains(base), "an alert reads {token}, which no server exports");
                    }
                }
            }
        }
        assert!(alerts.len() >= 10, "the alerts were not found: {alerts:?}");
        let runbook = &operations[operations.find("## Alerts and runbooks").unwrap()..];
        for alert in alerts {
            assert!(runbook.contains(&format!("| `{alert}` |")), "{alert} has no runbook line in docs/OPERATIONS.md");
        }
    }
}
