//! Turns and steps: claim → pre-step → step (model, tools) → turn end and drain (SPEC §4).

use turnstile_model::output::{self, INVALID_OUTPUT};
use turnstile_model::overrides::SessionOverrides;
use turnstile_model::{
    CancelCause, EventPayload, LivePayload, MessageId, MessageSource, Splice, SpliceOutcome, Status, StreamingStep,
    Target, ToolCallSpec, TurnEndReason, UserMessage,
};

use super::{
    Driver, Effect, ModelOutcome, ModelRequest, OpId, PreStepDecision, PreStepOutcome, PreStepRequest,
    TENANT_BUDGET_EXHAUSTED, ToolOutcome,
};

/// The plugin name of the message that asks the model again for a reply matching the output schema.
pub const OUTPUT_PLUGIN: &str = "structured-output";

/// The error result of a call that never started because its turn was aborted (§4).
pub(super) const NOT_RUN_ABORTED: &str = "not run: the turn was aborted";

/// The runtime of the open turn: what the driver is waiting for.
#[derive(Debug)]
pub(super) struct ActiveTurn {
    pub turn: u64,
    /// Proposals made so far (k of SPEC §4).
    pub proposal: u32,
    /// Steps started so far.
    pub step: u32,
    pub phase: Phase,
    /// Set once an abort is signalled; the first cause wins.
    pub cancel: Option<CancelCause>,
    /// The result of the last finished step, if any.
    pub last_step: Option<StepResult>,
    /// A step reached the token limit (sticky for the turn).
    pub max_tokens: bool,
    /// Tool results of the last step, for the next model request.
    pub tool_results: Vec<ToolOutcome>,
    /// The prompt of the turn a crash interrupted mid-step, answered by this turn's first step.
    pub interrupted_prompt: Vec<UserMessage>,
    /// This turn continues one a crash or handoff cut (SPEC §6): its first step runs even with no new
    /// messages, and its one next-turn slot belongs to the interrupted work.
    pub resumed: bool,
    /// A tool of the current step concluded the turn.
    pub concluded: bool,
    /// The agent this turn runs, fixed at `turn/start` so a configuration applies from the next turn.
    pub agent: String,
    /// The version of `agent` this turn runs, fixed at `turn/start` like the agent (SPEC §20).
    pub version: u64,
    /// That version's content hash, carried in the turn's requests.
    pub agent_hash: String,
    /// The session's overrides as far as that version allows them (SPEC §20), fixed at `turn/start` too.
    pub overrides: SessionOverrides,
    /// A compaction was asked for in this turn (SPEC §13): at most one per turn, so a failing one does
    /// not cost a request before every step.
    pub compaction_tried: bool,
    /// A final reply of this turn did not match its output schema and the model was asked once more
    /// (SPEC §20): the next one that does not match ends the turn `error{invalid_output}`.
    pub output_retried: bool,
}

impl ActiveTurn {
    /// Turn `turn` of the agent version `(agent, version, agent_hash)` at `step` in `phase`: no proposal,
    /// cancel, result or retry yet.
    pub fn new(turn: u64, step: u32, phase: Phase, (agent, version, agent_hash): (String, u64, String)) -> Self {
        Self {
            turn,
            proposal: 0,
            step,
            phase,
            cancel: None,
            last_step: None,
            max_tokens: false,
            tool_results: Vec::new(),
            interrupted_prompt: Vec::new(),
            resumed: false,
            concluded: false,
            agent,
            version,
            agent_hash,
            overrides: SessionOverrides::default(),
            compaction_tried: false,
            output_retried: false,
        }
    }
}

/// What a resumed turn's first step must still answer.
#[derive(Debug, Default)]
pub(super) struct Resume {
    pub prompt: Vec<UserMessage>,
    pub tool_results: Vec<ToolOutcome>,
}

impl Resume {
    pub fn is_empty(&self) -> bool {
        self.prompt.is_empty() && self.tool_results.is_empty()
    }
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Draining for a handoff: stopped at a boundary, claiming nothing more.
    Parked,
    PreStep {
        op: OpId,
    },
    /// A compaction runs before the step that will enter `messages` (SPEC §13).
    Compacting {
        op: OpId,
        task: crate::effect::CompactionTask,
        messages: Vec<UserMessage>,
    },
    Model {
        op: OpId,
        /// Text and reasoning delivered so far (published as deltas).
        text: String,
        reasoning: String,
    },
    Tools {
        calls: Vec<ToolCallSpec>,
        next: usize,
        running: Option<OpId>,
        /// The call at `next` waits for `Decide` (SPEC §9), or with `for_client` for `CompleteToolCall`
        /// (SPEC §19); nothing runs meanwhile.
        awaiting: Option<String>,
        /// The call `awaiting` names is a client tool of the turn: its client answers it, not a person.
        for_client: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StepResult {
    Continue,
    Completed,
    MaxTokens,
}

impl Driver {
    /// Opens turn n = last + 1 and makes its first proposal. The status must already be running.
    pub(super) fn open_turn(&mut self, resume: Resume) {
        if self.draining {
            // Leave the session running: its next owner opens the turn.
            return;
        }
        let turn = self.state.last_turn + 1;
        let version = self.record_version();
        let overrides = self.applied_overrides(&version.0, version.1);
        self.write(EventPayload::TurnStart { turn });
        self.turn = Some(ActiveTurn {
            resumed: !resume.is_empty(),
            tool_results: resume.tool_results,
            interrupted_prompt: resume.prompt,
            overrides,
            ..ActiveTurn::new(turn, 0, Phase::PreStep { op: 0 }, version)
        });
        self.propose();
    }

    /// The agent and version the next turn runs (SPEC §20). A session that recorded another version than
    /// it resolves to now (its version does not pin, and the agent changed), or that runs a pinning version
    /// without having recorded one, records it first: `session/configured {version}`, before `turn/start`,
    /// so every later owner runs the same version. A session whose configured agent is gone records nothing
    /// (it runs the default agent without being moved to it).
    pub(super) fn record_version(&mut self) -> (String, u64, String) {
        let tenant = &self.state.session.tenant;
        let (name, profile) =
            self.agents.resolve_version(self.state.agent.as_deref(), self.state.agent_version, tenant);
        let (name, version, hash, pin) = (name.to_owned(), profile.version, profile.hash.clone(), profile.pin);
        let configured = self.state.agent.as_deref().unwrap_or(self.agents.default_agent()) == name;
        let changed = match self.state.agent_version {
            Some(recorded) => recorded != version,
            None => pin,
        };
        if configured && !hash.is_empty() && changed {
            self.write(EventPayload::SessionConfigured {
                agent: name.clone(),
                inject_mode: self.state.inject_mode,
                parent: None,
                version: Some(version),
            });
        }
        (name, version, hash)
    }

    /// The session's overrides as far as version `version` of `agent` allows them (SPEC §20): what a turn
    /// running that version applies.
    pub(super) fn applied_overrides(&self, agent: &str, version: u64) -> SessionOverrides {
        let profile = self.agents.turn_profile(agent, &self.state.session.tenant, version);
        profile.overrides.allowed(&self.state.overrides)
    }

    /// Claims input and asks for the pre-step decision.
    fn propose(&mut self) {
        let draining = self.draining;
        let Some(t) = self.turn.as_mut() else { return };
        if draining {
            // Stop at the boundary: no claim, so nothing is lost; the next owner repairs and resumes.
            t.phase = Phase::Parked;
            return;
        }
        t.proposal += 1;
        let (turn, proposal, step, agent, agent_hash) =
            (t.turn, t.proposal, t.step + 1, t.agent.clone(), t.agent_hash.clone());
        // A resumed turn's one next-turn slot belongs to the prompt a crash interrupted.
        let claim_next_turn = proposal == 1 && !t.resumed;
        let mut claimed = self.claim(Target::NextStep, self.state.inbox.next_step.len());
        if claim_next_turn {
            claimed.extend(self.claim(Target::NextTurn, 1.min(self.state.inbox.next_turn.len())));
        }
        for message in &claimed {
            self.publish(LivePayload::Claimed { message: message.clone(), turn });
        }
        let op = self.new_op();
        if let Some(t) = self.turn.as_mut() {
            t.phase = Phase::PreStep { op };
        }
        self.effects.push_back(Effect::PreStep(PreStepRequest {
            op,
            agent,
            agent_hash,
            turn,
            step,
            proposal,
            messages: claimed,
        }));
    }

    /// A pure-deletion splice of the first `count` messages of `target` (nothing when 0).
    fn claim(&mut self, target: Target, count: usize) -> Vec<UserMessage> {
        if count == 0 {
            return Vec::new();
        }
        let claimed = self.state.inbox.list(target)[..count].to_vec();
        self.write(EventPayload::InboxSpliced(Splice {
            target,
            start: 0,
            removed_count: count as u32,
            inserted: Vec::new(),
            outcome: SpliceOutcome::None,
            wake: false,
            requested_target: None,
            deadline: None,
        }));
        claimed
    }

    pub(super) fn turn_pre_step(&mut self, op: OpId, outcome: PreStepOutcome) {
        let Some(t) = self.turn.as_ref() else { return };
        if !matches!(t.phase, Phase::PreStep { op: current } if current == op) {
            return;
        }
        if let Some(cause) = t.cancel.clone() {
            // Before `step/start`: a no-step turn ending aborted; the claimed batch is gone.
            return self.end_turn(TurnEndReason::Aborted(cause));
        }
        let (proposal, step, last_step, resumed) = (t.proposal, t.step, t.last_step, t.resumed);
        match outcome {
            PreStepOutcome::Aborted => {
                // An abort the driver did not signal (the runner is stopping): treat as a hook failure.
                self.fail_turn(step + 1, "the pre-step decision was aborted".into(), "aborted".into());
            }
            PreStepOutcome::Failed { message } => {
                self.fail_turn(step + 1, format!("pre-step hook failed: {message}"), "hook_failed".into());
            }
            PreStepOutcome::Decided(PreStepDecision::Reject { reason }) => {
                self.end_turn(TurnEndReason::Blocked { reason })
            }
            PreStepOutcome::Decided(PreStepDecision::Enter(messages)) => {
                if !messages.is_empty() || resumed && proposal == 1 {
                    return self.start_step(messages);
                }
                match (proposal, last_step) {
                    // An empty first batch: the turn ends with no step and the driver idles.
                    (1, _) | (_, None) => self.end_turn(TurnEndReason::Completed),
                    // After a tool step: run the step with no new messages.
                    (_, Some(StepResult::Continue)) => self.start_step(Vec::new()),
                    // After a step that would have ended the turn: end it.
                    (_, Some(_)) => self.end_turn(self.completion_reason()),
                }
            }
        }
    }

    /// live `agent/error`, then `turn/end error`.
    fn fail_turn(&mut self, step: u32, message: String, code: String) {
        let turn = self.turn.as_ref().map_or(0, |t| t.turn);
        self.publish(LivePayload::Error { turn, step, message: message.clone() });
        self.end_turn(TurnEndReason::Error { message, code });
    }

    fn start_step(&mut self, messages: Vec<UserMessage>) {
        if !self.compact_before_step(&messages) {
            self.run_step(messages);
        }
    }

    /// `step/start`, the step's `user/message`s and its model request.
    pub(super) fn run_step(&mut self, messages: Vec<UserMessage>) {
        let Some(t) = self.turn.as_mut() else { return };
        t.step += 1;
        t.concluded = false;
        let (turn, step) = (t.turn, t.step);
        let tool_results = std::mem::take(&mut t.tool_results);
        let interrupted_prompt = std::mem::take(&mut t.interrupted_prompt);
        let profile = self.agents.turn_profile(&t.agent, &self.state.session.tenant, t.version);
        let (agent, agent_hash, overrides) = (t.agent.clone(), t.agent_hash.clone(), t.overrides.clone());
        let (system, history_turns, agent_output) =
            (overrides.system_after(profile.system.as_deref()), profile.history_turns, profile.output.clone());
        // Read before this step's messages are written: the history is what came before the step.
        let history = self.state.transcript.history(turn, step, history_turns);
        let output = output::of_turn(self.state.transcript.entries(), turn, &messages, agent_output.as_ref());
        self.write(EventPayload::StepStart { turn, step });
        // Offered from the state at step start: a goal paused or completed meanwhile is not offered.
        for message in &messages {
            self.write(EventPayload::UserMessage { message: message.clone(), turn, step });
        }
        let goal = self.active_goal();
        let op = self.new_op();
        if let Some(t) = self.turn.as_mut() {
            t.phase = Phase::Model { op, text: String::new(), reasoning: String::new() };
        }
        self.effects.push_back(Effect::Model(Box::new(ModelRequest {
            op,
            session: self.state.session.clone(),
            turn,
            step,
            agent,
            agent_hash,
            system,
            overrides,
            history,
            messages,
            tool_results,
            interrupted_prompt,
            goal,
            summary: self.state.compaction.as_ref().map(|c| c.summary.clone()),
            output,
            compaction: None,
        })));
    }

    pub(super) fn turn_model_delta(&mut self, op: OpId, delta: &str, is_reasoning: bool) {
        let Some(t) = self.turn.as_mut() else { return };
        // Deltas after an abort are not "delivered": the interrupted message holds what was published.
        if t.cancel.is_some() || delta.is_empty() {
            return;
        }
        let (turn, step) = (t.turn, t.step);
        let Phase::Model { op: current, text, reasoning } = &mut t.phase else { return };
        if *current != op {
            return;
        }
        let so_far = if is_reasoning { reasoning } else { text };
        let offset = so_far.len() as u64;
        so_far.push_str(delta);
        self.publish(LivePayload::AssistantDelta {
            turn,
            step,
            text: delta.to_owned(),
            reasoning: is_reasoning,
            offset,
        });
    }

    /// The output so far of the model step streaming now (SPEC §14), for a `Watch` that joins mid-step:
    /// none outside a model phase or once the turn is canceled (no delta is published after that; the
    /// interrupted `assistant/message` holds the output).
    pub fn streaming_step(&self) -> Option<StreamingStep> {
        let t = self.turn.as_ref().filter(|t| t.cancel.is_none())?;
        let Phase::Model { text, reasoning, .. } = &t.phase else { return None };
        Some(StreamingStep {
            turn: t.turn,
            step: t.step,
            after_seq: self.state.last_seq,
            text: text.clone(),
            reasoning: reasoning.clone(),
        })
    }

    pub(super) fn turn_model_done(&mut self, op: OpId, outcome: ModelOutcome) {
        if self.compaction_done(op, &outcome) {
            return;
        }
        let Some(t) = self.turn.as_mut() else { return };
        let Phase::Model { op: current, text, reasoning } = &mut t.phase else { return };
        if *current != op {
            return;
        }
        let delivered = std::mem::take(text);
        let delivered_reasoning = std::mem::take(reasoning);
        let (turn, step) = (t.turn, t.step);
        if let Some(cause) = t.cancel.clone() {
            // Mid-stream abort: keep what was delivered (text, reasoning or both), close the step and the
            // turn. What the request spent (even a reply that finished as the cancel landed) goes on the
            // `step/end`, so a cancel just before the end is not free (decision 0086).
            let spent = outcome.spent();
            if !delivered.is_empty() || !delivered_reasoning.is_empty() {
                self.write(EventPayload::AssistantMessage {
                    turn,
                    step,
                    text: delivered,
                    tool_calls: Vec::new(),
                    interrupted: true,
                    max_tokens: false,
                    reasoning: (!delivered_reasoning.is_empty()).then_some(delivered_reasoning),
                    usage: None,
                    model: None,
                });
            }
            self.write(EventPayload::StepEnd { turn, step, spent });
            return self.end_turn(TurnEndReason::Aborted(cause));
        }
        match outcome {
            ModelOutcome::Finished(output) => {
                let max_tokens = output.max_tokens;
                let invalid = output.invalid_output.filter(|_| !max_tokens && output.tool_calls.is_empty());
                // Truncated tool calls are never run, so they are not recorded as calls either.
                let tool_calls = if max_tokens { Vec::new() } else { output.tool_calls };
                self.write(EventPayload::AssistantMessage {
                    turn,
                    step,
                    text: output.text,
                    tool_calls: tool_calls.clone(),
                    interrupted: false,
                    max_tokens,
                    reasoning: output.reasoning,
                    usage: output.usage,
                    model: output.model,
                });
                if let Some(problem) = invalid {
                    self.invalid_output(turn, step, problem);
                } else if max_tokens {
                    if let Some(t) = self.turn.as_mut() {
                        t.max_tokens = true;
                    }
                    self.end_step(StepResult::MaxTokens);
                } else if tool_calls.is_empty() {
                    self.end_step(StepResult::Completed);
                } else {
                    if let Some(t) = self.turn.as_mut() {
                        t.phase = Phase::Tools {
                            calls: tool_calls,
                            next: 0,
                            running: None,
                            awaiting: None,
                            for_client: false,
                        };
                    }
                    self.next_tool_call();
                }
            }
            ModelOutcome::Failed { message, code, spent } => {
                self.write(EventPayload::StepEnd { turn, step, spent });
                // A request refused for the tenant's budget was never sent: its message says so itself.
                let message =
                    if code == TENANT_BUDGET_EXHAUSTED { message } else { format!("model request failed: {message}") };
                self.fail_turn(step, message, code);
            }
            ModelOutcome::Aborted { spent } => {
                self.write(EventPayload::StepEnd { turn, step, spent });
                self.fail_turn(step, "the model request was aborted".into(), "aborted".into());
            }
        }
    }

    /// A final reply (already recorded) that does not match the turn's output schema (SPEC §20). The first
    /// time in a turn: a message telling the model what is wrong joins next-step (one durable splice, so a
    /// later owner resumes with it) and the step ends `continue`, so the next proposal claims it. The
    /// second time: `step/end`, then `turn/end error{invalid_output}`.
    fn invalid_output(&mut self, turn: u64, step: u32, problem: String) {
        let Some(t) = self.turn.as_mut() else { return };
        if std::mem::replace(&mut t.output_retried, true) {
            self.write(EventPayload::StepEnd { turn, step, spent: None });
            let message = format!("the reply does not match the output schema after one retry: {problem}");
            return self.fail_turn(step, message, INVALID_OUTPUT.to_owned());
        }
        let retry = turnstile_model::UserMessage {
            id: self.output_retry_id(turn, step),
            content: vec![turnstile_model::ContentBlock::text(format!(
                "Your reply does not match the required JSON schema: {problem}. Reply again with only the JSON \
                 value, matching the schema."
            ))]
            .into(),
            source: MessageSource::Plugin { plugin: OUTPUT_PLUGIN.to_owned(), form: Some("notice".to_owned()) },
        };
        self.write_edit(Target::NextStep, self.state.inbox.next_step.len() as u32, 0, vec![retry]);
        self.end_step(StepResult::Continue);
    }

    /// `output-retry-<turn>-<step>`, made unique like a goal's continuation (`.2`, …) if a client used it.
    /// Derived from the fold alone, so every owner mints the same id.
    fn output_retry_id(&self, turn: u64, step: u32) -> MessageId {
        let base = format!("output-retry-{turn}-{step}");
        let used = |id: &MessageId| self.state.accepted.get(id).is_some() || self.state.inbox.contains(id);
        std::iter::once(MessageId(base.clone()))
            .chain((2u64..).map(|n| MessageId(format!("{base}.{n}"))))
            .find(|id| !used(id))
            .unwrap_or(MessageId(base))
    }

    /// `step/end`, then the next proposal or the end of the turn.
    pub(super) fn end_step(&mut self, result: StepResult) {
        let Some(t) = self.turn.as_mut() else { return };
        let (turn, step) = (t.turn, t.step);
        t.last_step = Some(result);
        let cancel = t.cancel.clone();
        self.write(EventPayload::StepEnd { turn, step, spent: None });
        if let Some(cause) = cancel {
            return self.end_turn(TurnEndReason::Aborted(cause));
        }
        if result == StepResult::Continue || !self.state.inbox.next_step.is_empty() {
            // Pending next-step input makes one more proposal in the same turn.
            return self.propose();
        }
        self.end_turn(self.completion_reason());
    }

    /// How a turn that ran out of work ends: max-tokens is sticky for the turn.
    fn completion_reason(&self) -> TurnEndReason {
        match self.turn.as_ref() {
            Some(t) if t.max_tokens => TurnEndReason::MaxTokens,
            _ => TurnEndReason::Completed,
        }
    }

    /// `turn/end`, then drain (start turn n+1) or go idle.
    pub(super) fn end_turn(&mut self, reason: TurnEndReason) {
        let Some(t) = self.turn.take() else { return };
        let drains = matches!(reason, TurnEndReason::Completed | TurnEndReason::MaxTokens) && t.step > 0;
        // SPEC §10: only a turn that completed a step goes on with the goal. An empty first batch (a
        // dropped continuation) parks like §4 says, so a hook that drops every round cannot spin.
        let continues_goal = reason == TurnEndReason::Completed && t.step > 0;
        self.write(EventPayload::TurnEnd { turn: t.turn, reason: reason.clone() });
        self.goal_after_turn(t.turn, &reason);
        if drains && !self.state.inbox.is_empty() {
            return self.open_turn(Resume::default());
        }
        self.set_status(Status::Idle);
        if std::mem::take(&mut self.latched_wake) && !self.state.inbox.is_empty() {
            self.set_status(Status::Running);
            return self.open_turn(Resume::default());
        }
        if continues_goal {
            self.goal_continue();
        }
        self.resolve_idle_waiters();
    }

    /// Signals an abort to whatever the turn waits for. The first cause wins.
    pub(super) fn abort_turn(&mut self, cause: CancelCause) {
        let Some(t) = self.turn.as_mut() else { return };
        if t.cancel.is_some() {
            return;
        }
        t.cancel = Some(cause);
        let op = match &mut t.phase {
            Phase::PreStep { op } | Phase::Compacting { op, .. } | Phase::Model { op, .. } => Some(*op),
            Phase::Tools { running, awaiting, next, calls, for_client } => {
                if let Some(call_id) = awaiting.take() {
                    // A call waiting for approval or for its client never started: it ends like an
                    // unstarted call.
                    *for_client = false;
                    let name = calls.get(*next).map(|c| c.name.clone()).unwrap_or_default();
                    *next += 1;
                    let (turn, step) = (t.turn, t.step);
                    let error = Some(NOT_RUN_ABORTED.to_owned());
                    self.record_tool_result(turn, step, ToolOutcome::new(call_id, name, String::new(), error));
                    return self.next_tool_call();
                }
                *running
            }
            Phase::Parked => None,
        };
        if let Some(op) = op {
            self.effects.push_back(Effect::Abort { op });
        }
    }
}
