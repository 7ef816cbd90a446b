//! The operations a driver asks for that run as tasks — the pre-step waterfall, model requests, tool calls
//! — performed through the [`crate::agent`] seam, and their outcomes on their way back as driver inputs.
//!
//! [`Operations`] owns every running task's cancellation and the channel their outcomes come back on, so
//! the runner only starts them, aborts one when the driver says so, and hands what comes back to the driver
//! ([`Operations::deliver`]). Letting them all go (a reload or a shutdown) cancels `released` first, so a
//! tool learns that its result will not be recorded here before it sees the abort.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, Span};
use turnstile_driver::{
    Driver, ModelOutcome, ModelRequest, OpId, PreStepDecision, PreStepOutcome, PreStepRequest, ToolOutcome, ToolRequest,
};
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, UserMessage};
use turnstile_model::{ModelRef, SessionRef, Spent, Usage};

use crate::agent::{DeltaSink, HookVerdict, ModelError, ModelStep, Proposal, StreamDelta, ToolReturn, ToolRun};
use crate::deps::RunnerDeps;
use crate::metrics::ModelCall;
use crate::spans::model_span;

/// An outcome of a running operation, for the driver.
pub(crate) enum Outcome {
    PreStep { op: OpId, outcome: PreStepOutcome },
    ModelDelta { op: OpId, text: String, reasoning: bool },
    ModelDone { op: OpId, outcome: ModelOutcome },
    ToolDone { op: OpId, outcome: ToolOutcome },
}

/// Outcomes waiting for the runner. Bounded, so a runner that falls behind (a slow append) holds back its
/// operations' tasks: a model's deltas then wait in [`DELTA_QUEUE`], and the model's own sends wait in turn,
/// down to the provider's stream (the model-output path is bounded end to end).
const OUTCOME_QUEUE: usize = 256;

/// A model's deltas not yet forwarded to the runner.
const DELTA_QUEUE: usize = 64;

/// One runner's running operations.
pub(crate) struct Operations {
    running: HashMap<OpId, CancellationToken>,
    tx: mpsc::Sender<Outcome>,
    rx: mpsc::Receiver<Outcome>,
    /// Cancelled when the runner stops, so no operation outlives it.
    stopped: CancellationToken,
    /// Cancelled (then replaced) just before the operations' tokens when the runner lets them go without a
    /// cancel of the turn (reload, shutdown): tools see it as their `released` signal.
    released: CancellationToken,
}

impl Operations {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::channel(OUTCOME_QUEUE);
        Self { running: HashMap::new(), tx, rx, stopped: CancellationToken::new(), released: CancellationToken::new() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The next outcome of a running operation (pending while none runs).
    pub(crate) async fn next(&mut self) -> Option<Outcome> {
        self.rx.recv().await
    }

    /// Hands `outcome` to `driver` as its input at `now_ms`; a final outcome ends its operation here.
    pub(crate) fn deliver(&mut self, outcome: Outcome, driver: &mut Driver, now_ms: u64) {
        match outcome {
            Outcome::PreStep { op, outcome } => {
                self.running.remove(&op);
                driver.on_pre_step(op, outcome, now_ms);
            }
            Outcome::ModelDelta { op, text, reasoning } => driver.on_model_delta(op, &text, reasoning, now_ms),
            Outcome::ModelDone { op, outcome } => {
                self.running.remove(&op);
                driver.on_model_done(op, outcome, now_ms);
            }
            Outcome::ToolDone { op, outcome } => {
                self.running.remove(&op);
                driver.on_tool_done(op, outcome, now_ms);
            }
        }
    }

    /// Signals operation `op` to abort (the driver's [`turnstile_driver::Effect::Abort`]).
    pub(crate) fn abort(&self, op: OpId) {
        if let Some(token) = self.running.get(&op) {
            token.cancel();
        }
    }

    /// Lets every operation go for a new driver (a reload): their outcomes no longer come back.
    pub(crate) fn release(&mut self) {
        std::mem::take(&mut self.released).cancel();
        for (_, token) in self.running.drain() {
            token.cancel();
        }
        // Outcomes of the dropped operations must not reach the new driver (their sends now fail).
        let (tx, rx) = mpsc::channel(OUTCOME_QUEUE);
        self.tx = tx;
        self.rx = rx;
    }

    /// Lets every operation go for good: the runner is stopping.
    pub(crate) fn stop(&mut self) {
        self.released.cancel();
        self.stopped.cancel();
        for (_, token) in self.running.drain() {
            token.cancel();
        }
    }

    fn start(&mut self, op: OpId) -> CancellationToken {
        let token = self.stopped.child_token();
        self.running.insert(op, token.clone());
        token
    }

    /// Runs the pre-step waterfall of `request` in `span` (the open turn's: the hooks' spans belong to it).
    pub(crate) fn pre_step(&mut self, deps: &RunnerDeps, session: &SessionRef, request: PreStepRequest, span: Span) {
        let token = self.start(request.op);
        let (tx, session, hooks) = (self.tx.clone(), session.clone(), deps.agents.hooks.clone());
        let task = async move {
            let outcome = tokio::select! {
                // Checked first: a hook that sees the abort returns an error, which must not be mistaken
                // for a hook failure.
                biased;
                () = token.cancelled() => PreStepOutcome::Aborted,
                r = hooks.decide(Proposal::new(&session, &request, &token), request.messages.clone()) => match r {
                    Ok(HookVerdict::Pass(batch)) => PreStepOutcome::Decided(PreStepDecision::Enter(batch)),
                    Ok(HookVerdict::Reject { reason }) => PreStepOutcome::Decided(PreStepDecision::Reject { reason }),
                    Err(e) => PreStepOutcome::Failed { message: e.to_string() },
                },
            };
            let _ = tx.send(Outcome::PreStep { op: request.op, outcome }).await;
        };
        tokio::spawn(task.instrument(span));
    }

    /// Runs the model request `request` in a `model.request` span under `parent` (the open step's: its
    /// `step/start` was appended before the driver asked for the model), streaming its deltas back.
    pub(crate) fn model(&mut self, deps: &Arc<RunnerDeps>, session: &SessionRef, request: ModelRequest, parent: &Span) {
        let token = self.start(request.op);
        let (tx, deps, op) = (self.tx.clone(), deps.clone(), request.op);
        let identity = deps.agents.model.identity(&request.agent);
        let span = model_span(parent, session, &request.agent, &identity);
        let mut call = ModelCall::start(session, &request.agent, identity, span.clone());
        let prompt_bytes = request.prompt_bytes();
        let task = async move {
            let (delta_tx, mut delta_rx) = mpsc::channel::<StreamDelta>(DELTA_QUEUE);
            let forward = {
                let tx = tx.clone();
                let call = &mut call;
                async move {
                    let mut seen = Seen::default();
                    while let Some(delta) = delta_rx.recv().await {
                        let (text, reasoning) = match delta {
                            StreamDelta::Text(text) => (text, false),
                            StreamDelta::Reasoning(text) => (text, true),
                            StreamDelta::Usage(usage) => {
                                seen.reported = Some(usage);
                                continue;
                            }
                        };
                        call.streamed();
                        seen.streamed_bytes += text.len() as u64;
                        // Waits while the runner is behind, and the model's next send waits in turn. A
                        // runner that let the operation go fails the send; draining goes on regardless.
                        let _ = tx.send(Outcome::ModelDelta { op, text, reasoning }).await;
                    }
                    seen
                }
            };
            let tenant = request.session.tenant.clone();
            let agent = request.agent.clone();
            let step = async {
                // SPEC §17: a tenant over its daily budget does not reach the model. Checked here, where the
                // runner performs the effect, since the driver has no IO.
                if let Some(budgets) = &deps.budgets
                    && let Err(refused) = budgets.admit(&tenant, turnstile_ops::clock::now_ms()).await
                {
                    return Err(ModelError::Failed { message: refused.to_string(), code: refused.code().to_owned() });
                }
                deps.agents.model.step(ModelStep::new(request, DeltaSink::new(delta_tx), token.clone())).await
            };
            // The forwarder ends when the model drops its sink, so every delta precedes the outcome.
            let (result, seen) = tokio::join!(
                async {
                    tokio::select! {
                        () = token.cancelled() => Err(ModelError::Aborted),
                        r = step => r,
                    }
                },
                forward
            );
            let outcome = match result {
                Ok(mut output) => {
                    // The answer names its model; a model that does not (the scripted one, custom ones) is
                    // the agent's own (SPEC §17).
                    let answered = output.model.get_or_insert_with(|| {
                        let id = deps.agents.model.identity(&agent);
                        ModelRef::new(id.provider, id.model)
                    });
                    call.answered_by(answered);
                    ModelOutcome::Finished(output)
                }
                Err(ModelError::Failed { message, code }) => {
                    ModelOutcome::Failed { message, code, spent: seen.spent(prompt_bytes, &deps, &agent) }
                }
                Err(ModelError::Aborted) => ModelOutcome::Aborted { spent: seen.spent(prompt_bytes, &deps, &agent) },
            };
            call.finish(&outcome);
            let _ = tx.send(Outcome::ModelDone { op, outcome }).await;
        };
        tokio::spawn(task.instrument(span));
    }

    /// Runs the tool call `request` in a `tool.call` span under `parent`. A started call finishes even on
    /// abort: the tool sees the signal and may stop early.
    pub(crate) fn tool(&mut self, deps: &Arc<RunnerDeps>, session: &SessionRef, request: ToolRequest, parent: &Span) {
        let token = self.start(request.op);
        let released = self.released.clone();
        let (tx, deps, session) = (self.tx.clone(), deps.clone(), session.clone());
        let span = tracing::info_span!(
            parent: parent,
            "tool.call",
            %session,
            agent = %request.agent,
            tool = %request.call.name,
            call_id = %request.call.call_id,
            outcome = tracing::field::Empty,
        );
        let task = async move {
            let run = ToolRun { session: &session, request: &request, abort: &token, released: &released };
            let r = deps.agents.tools.call(run).await;
            let _ = tx.send(Outcome::ToolDone { op: request.op, outcome: tool_outcome(&request, r) }).await;
        };
        tokio::spawn(task.instrument(span));
    }
}

/// What the runner saw of a model request's stream: enough to count what a request cut before its end
/// spent (decision 0086).
#[derive(Default)]
struct Seen {
    /// Bytes of text and reasoning streamed.
    streamed_bytes: u64,
    /// The provider's latest [`StreamDelta::Usage`].
    reported: Option<Usage>,
}

impl Seen {
    /// What an unfinished request of `agent` with `prompt_bytes` of prompt spent: `None` when the provider
    /// reported nothing and nothing streamed (it may never have received the request).
    fn spent(&self, prompt_bytes: u64, deps: &RunnerDeps, agent: &str) -> Option<Spent> {
        if self.reported.is_none() && self.streamed_bytes == 0 {
            return None;
        }
        let id = deps.agents.model.identity(agent);
        Some(Spent {
            model: Some(ModelRef::new(id.provider, id.model)),
            ..Spent::estimate(prompt_bytes, self.streamed_bytes, self.reported)
        })
    }
}

/// What the driver is told of a finished call: its result, and its context messages with ids derived from
/// the call id (unique in the session like it).
fn tool_outcome(request: &ToolRequest, r: ToolReturn) -> ToolOutcome {
    let call = &request.call;
    let context = r
        .context
        .into_iter()
        .enumerate()
        .map(|(i, text)| UserMessage {
            id: MessageId(format!("{}.ctx{i}", call.call_id)),
            content: vec![ContentBlock::text(text)].into(),
            source: MessageSource::Tool { call_id: call.call_id.clone() },
        })
        .collect();
    ToolOutcome {
        concludes_turn: r.concludes_turn,
        context,
        memory: r.memory,
        ..ToolOutcome::new(call.call_id.clone(), call.name.clone(), r.output, r.error)
    }
}
