//! Worker metrics, read off what the runner appends (the driver stays free of IO and globals).
//!
//! Names are in [`turnstile_ops::names`]; docs/OPERATIONS.md lists them. Latencies between events come from
//! the events' own `time_ms`, so they measure what the log says happened, not when the runner got round
//! to noticing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tracing::Span;
use turnstile_driver::ModelOutcome;
use turnstile_journal::JournalError;
use turnstile_model::{Envelope, EventPayload, ModelRef, SessionRef, SpliceOutcome, Target, TurnEndReason};
use turnstile_ops::GaugeGuard;
use turnstile_ops::names;

use crate::agent::ModelIdentity;
use crate::sync::lock;

/// Per session: when the open step started and when the first claim since the last step/start landed.
#[derive(Debug, Default)]
struct Marks {
    step_started_ms: Option<u64>,
    first_claim_ms: Option<u64>,
}

/// One runner's view of its session's timeline, fed by every append it makes.
#[derive(Debug, Default)]
pub(crate) struct SessionClock {
    // The runner appends through `&self` (a shared borrow held across awaits), so the marks need interior
    // mutability that is `Sync`; only the runner's own task ever takes the lock.
    marks: Mutex<Marks>,
}

impl SessionClock {
    /// Records one append batch: its outcome and duration, and on success what its events say.
    pub(crate) fn appended(&self, batch: &[Envelope], took: Duration, result: &Result<u64, JournalError>) {
        let outcome = match result {
            Ok(_) => "ok",
            // A refused first group counts as a conflict: the log was not where the writer expected it.
            Err(e) if e.is_lost_ownership() || matches!(e, JournalError::FirstRefused { .. }) => "conflict",
            Err(_) => "error",
        };
        counter!(names::APPENDS, "outcome" => outcome).increment(1);
        histogram!(names::APPEND_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
        if result.is_err() {
            return;
        }
        counter!(names::APPENDED_EVENTS).increment(batch.len() as u64);
        let mut marks = lock(&self.marks);
        for event in batch {
            marks.observe(event);
        }
    }
}

impl Marks {
    fn observe(&mut self, event: &Envelope) {
        match &event.payload {
            // A removal with no outcome is a claim (edits remove with `canceled`, cancels restore).
            EventPayload::InboxSpliced(splice) if splice.outcome == SpliceOutcome::None && splice.removed_count > 0 => {
                let target = target_label(splice.target);
                counter!(names::CLAIMS, "target" => target).increment(1);
                counter!(names::CLAIMED_MESSAGES, "target" => target).increment(u64::from(splice.removed_count));
                self.first_claim_ms.get_or_insert(event.time_ms);
            }
            EventPayload::StepStart { .. } => {
                counter!(names::STEPS).increment(1);
                if let Some(claimed) = self.first_claim_ms.take() {
                    histogram!(names::CLAIM_TO_STEP_SECONDS).record(seconds_between(claimed, event.time_ms));
                }
                self.step_started_ms = Some(event.time_ms);
            }
            EventPayload::StepEnd { .. } => {
                // A step started before this runner loaded (repaired after a crash) has no start here.
                if let Some(started) = self.step_started_ms.take() {
                    histogram!(names::STEP_SECONDS).record(seconds_between(started, event.time_ms));
                }
            }
            EventPayload::TurnEnd { reason, .. } => {
                counter!(names::TURNS, "reason" => reason_label(reason)).increment(1);
                // Claims a turn ended on (cancelled before its step) feed no step.
                self.first_claim_ms = None;
            }
            _ => {}
        }
    }
}

fn seconds_between(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1000.0
}

fn target_label(target: Target) -> &'static str {
    match target {
        Target::NextTurn => "next_turn",
        Target::NextStep => "next_step",
    }
}

/// The reason without its details (error messages, hook reasons): labels must stay low-cardinality.
fn reason_label(reason: &TurnEndReason) -> &'static str {
    match reason {
        TurnEndReason::Completed => "completed",
        TurnEndReason::Blocked { .. } => "blocked",
        TurnEndReason::MaxTokens => "max_tokens",
        TurnEndReason::Aborted(_) => "aborted",
        TurnEndReason::Error { .. } => "error",
        TurnEndReason::Interrupted => "interrupted",
    }
}

/// One model request as the runner sees it, from its start to its outcome: counted in the `turnstile_model_*`
/// metrics by tenant, agent, provider and model, and recorded on its `model.request` span.
pub(crate) struct ModelCall {
    tenant: String,
    agent: String,
    identity: ModelIdentity,
    started: Instant,
    first_piece: Option<Instant>,
    span: Span,
}

impl ModelCall {
    /// A request of `agent` in `session`, answered by `identity`, starting now; `span` is its
    /// `model.request` span ([`crate::spans::model_span`]).
    pub(crate) fn start(session: &SessionRef, agent: &str, identity: ModelIdentity, span: Span) -> Self {
        Self {
            tenant: session.tenant.clone(),
            agent: agent.to_owned(),
            identity,
            started: Instant::now(),
            first_piece: None,
            span,
        }
    }

    /// The request was answered by `model` (a fallback's, SPEC §17): its metrics are counted under it.
    pub(crate) fn answered_by(&mut self, model: &ModelRef) {
        self.identity = ModelIdentity::new(model.provider.clone(), model.model.clone());
    }

    /// A piece of text or reasoning arrived.
    pub(crate) fn streamed(&mut self) {
        self.first_piece.get_or_insert_with(Instant::now);
    }

    /// The request ended with `outcome`.
    pub(crate) fn finish(self, outcome: &ModelOutcome) {
        let took = self.started.elapsed();
        let (tenant, agent) = (self.tenant, self.agent);
        let (provider, model) = (self.identity.provider, self.identity.model);
        let label = match outcome {
            ModelOutcome::Finished(_) => "ok",
            ModelOutcome::Aborted { .. } => "aborted",
            ModelOutcome::Failed { code, .. } => code.as_str(),
        }
        .to_owned();
        counter!(names::MODEL_REQUESTS, "tenant" => tenant.clone(), "agent" => agent.clone(),
            "provider" => provider.clone(), "model" => model.clone(), "outcome" => label.clone())
        .increment(1);
        histogram!(names::MODEL_REQUEST_SECONDS, "agent" => agent.clone(), "provider" => provider.clone(),
            "model" => model.clone(), "outcome" => label.clone())
        .record(took.as_secs_f64());
        // A reply that streamed nothing (tool calls only) had its first token when it ended.
        let first = match (self.first_piece, outcome) {
            (Some(at), _) => Some(at.duration_since(self.started)),
            (None, ModelOutcome::Finished(_)) => Some(took),
            (None, _) => None,
        };
        if let Some(first) = first {
            histogram!(names::MODEL_FIRST_TOKEN_SECONDS, "agent" => agent.clone(), "provider" => provider.clone(),
                "model" => model.clone())
            .record(first.as_secs_f64());
            self.span.record("first_token_ms", first.as_millis() as u64);
        }
        self.span.record("outcome", label.as_str());
        match outcome {
            ModelOutcome::Finished(output) => {
                if let Some(usage) = output.usage {
                    self.span.record("input_tokens", usage.input_tokens);
                    self.span.record("output_tokens", usage.output_tokens);
                    let kinds = [
                        ("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                        ("cached", usage.cached_input_tokens),
                        ("cache_write", usage.cache_write_tokens),
                    ];
                    for (kind, tokens) in
                        kinds.into_iter().filter(|(kind, tokens)| *tokens > 0 || !kind.starts_with("cache"))
                    {
                        counter!(names::MODEL_TOKENS, "tenant" => tenant.clone(), "agent" => agent.clone(),
                            "provider" => provider.clone(), "model" => model.clone(), "kind" => kind)
                        .increment(tokens);
                    }
                }
            }
            ModelOutcome::Failed { code, .. } => {
                counter!(names::MODEL_ERRORS, "tenant" => tenant, "agent" => agent, "provider" => provider,
                    "model" => model, "code" => code.clone())
                .increment(1);
            }
            ModelOutcome::Aborted { .. } => {}
        }
    }
}

/// Counts a loaded session in `turnstile_sessions_loaded` while the guard lives (its runner's, then its
/// parked driver's).
pub(crate) fn loaded() -> GaugeGuard {
    GaugeGuard::inc(gauge!(names::SESSIONS_LOADED))
}

/// Counts a quarantined session in `turnstile_sessions_quarantined` while the host holds it so.
pub(crate) fn quarantined() -> GaugeGuard {
    GaugeGuard::inc(gauge!(names::SESSIONS_QUARANTINED))
}
