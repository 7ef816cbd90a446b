//! The runner's tracing spans: one per command, per turn and per step (opened and closed by the events
//! the runner appends: `turn/start` … `turn/end`, `step/start` … `step/end`), and one per journal append.
//!
//! A turn outlives the command that started it, so a turn span is not a `tracing` child of the command
//! span (that would keep the command span open until the turn ends) but an OpenTelemetry child: it joins
//! the command's trace, and so does every event of the turn, through the `traceparent` each append
//! carries. With tracing off the spans are plain `tracing` spans and no `traceparent` is written.

use tracing::Span;
use turnstile_model::{Envelope, EventPayload, SessionRef};
use turnstile_ops::trace;

use crate::agent::ModelIdentity;

/// The span of one command in the runner, in the caller's trace when it sent a `traceparent`.
pub(crate) fn command_span(session: &SessionRef, command: &'static str, traceparent: Option<&str>) -> Span {
    let span = tracing::info_span!(parent: None, "runner.command", %session, command);
    trace::set_parent_from(&span, traceparent);
    span
}

/// The span of one model request (`model.request`) of `agent` in `session`, a child of `parent` (the step's
/// span). Its outcome, token counts and time to first token are recorded when it ends
/// (`crate::metrics::ModelCall`); a provider's HTTP work is a `model.http` span inside it.
pub(crate) fn model_span(parent: &Span, session: &SessionRef, agent: &str, identity: &ModelIdentity) -> Span {
    tracing::info_span!(
        parent: parent,
        "model.request",
        %session,
        agent,
        provider = %identity.provider,
        model = %identity.model,
        outcome = tracing::field::Empty,
        input_tokens = tracing::field::Empty,
        output_tokens = tracing::field::Empty,
        first_token_ms = tracing::field::Empty,
    )
}

/// The open turn and step of one session.
#[derive(Default)]
pub(crate) struct TurnSpans {
    turn: Option<Span>,
    step: Option<Span>,
}

impl TurnSpans {
    /// The span work of the session belongs to when no command is being handled: the open step, else
    /// the open turn, else none.
    pub(crate) fn active(&self) -> Span {
        self.step.as_ref().or(self.turn.as_ref()).cloned().unwrap_or_else(Span::none)
    }

    /// Opens the spans that `batch` starts (before it is appended, so its events carry them) and returns
    /// the span of its append, a child of the innermost open span.
    pub(crate) fn begin_append(&mut self, session: &SessionRef, batch: &[Envelope]) -> Span {
        for event in batch {
            match &event.payload {
                EventPayload::TurnStart { turn } => {
                    // Child of the current span's trace (the command that started the turn, or the turn
                    // before it), without holding that span open.
                    let span = tracing::info_span!(parent: None, "turn", %session, turn);
                    trace::set_parent_from(&span, trace::current_traceparent().as_deref());
                    self.step = None;
                    self.turn = Some(span);
                }
                EventPayload::StepStart { turn, step } => {
                    let parent = self.turn.clone().unwrap_or_else(Span::current);
                    self.step = Some(tracing::info_span!(parent: &parent, "step", %session, turn, step));
                }
                _ => {}
            }
        }
        let parent = self.step.as_ref().or(self.turn.as_ref()).cloned().unwrap_or_else(Span::current);
        let seq = batch.first().map_or(0, |e| e.seq);
        tracing::info_span!(parent: &parent, "journal.append", %session, seq, events = batch.len())
    }

    /// Closes the spans that `batch` ended, once it is durable (or failed: the driver is reloaded then).
    pub(crate) fn end_append(&mut self, batch: &[Envelope]) {
        for event in batch {
            match &event.payload {
                EventPayload::StepEnd { .. } => self.step = None,
                EventPayload::TurnEnd { .. } => {
                    self.step = None;
                    self.turn = None;
                }
                _ => {}
            }
        }
    }
}
