//! A step's tool calls (SPEC §4, §9): run in model order, each waiting for approval when its agent's rules
//! say so (`Decide`), or for its client when it is a client tool of the turn (SPEC §19,
//! `CompleteToolCall`), its result and context messages recorded, the calls an abort left unstarted closed
//! with an error result.

use turnstile_model::tool_key::idempotency_key;
use turnstile_model::{
    CommandError, CommandReply, EventPayload, MessageSource, Target, ToolCallSpec, UserMessage, turn_tools,
};

use super::turn::{NOT_RUN_ABORTED, Phase, StepResult};
use super::{Driver, Effect, GOAL_COMPLETE, OpId, ToolOutcome, ToolRequest};

impl Driver {
    /// Starts the next tool call in model order, or ends the step when none is left. After an abort the
    /// calls not yet started get a synthetic `tool/call` + error `tool/result`.
    pub(super) fn next_tool_call(&mut self) {
        loop {
            // The turn's own client tools, declared by the messages it entered (read from the fold, so a new
            // owner sees the same ones; a turn resumed after a failover has those of the turn it resumes).
            let Some(turn) = self.turn.as_ref().map(|t| t.turn) else { return };
            let client_tools = turn_tools::of_turn(self.state.transcript.entries(), turn, &[]);
            let Some(t) = self.turn.as_mut() else { return };
            let (turn, step, aborting, concluded) = (t.turn, t.step, t.cancel.is_some(), t.concluded);
            let needs_approval = |name: &str| {
                self.agents.turn_profile(&t.agent, &self.state.session.tenant, t.version).approval.requires(name)
            };
            let Phase::Tools { calls, next, awaiting, for_client, .. } = &mut t.phase else { return };
            let Some(call) = calls.get(*next).cloned() else {
                return self.end_step(if concluded { StepResult::Completed } else { StepResult::Continue });
            };
            if aborting {
                *next += 1;
                self.write_call(turn, step, call.clone());
                self.write(EventPayload::ToolResult {
                    turn,
                    step,
                    call_id: call.call_id,
                    output: String::new(),
                    error: Some(NOT_RUN_ABORTED.into()),
                });
                continue;
            }
            if call.name == GOAL_COMPLETE {
                // The goal system's own tool: the driver runs it, never the runner, and never asks for
                // approval (it only records that the model considers the goal reached).
                *next += 1;
                self.goal_complete_call(turn, step, call);
                continue;
            }
            if client_tools.iter().any(|tool| tool.name == call.name) {
                // The caller that declared the tool runs it: durable before anyone can answer it, then
                // the turn waits for `CompleteToolCall` (its client asks its own user if it must).
                *awaiting = Some(call.call_id.clone());
                *for_client = true;
                self.write(EventPayload::ToolCall {
                    turn,
                    step,
                    call,
                    awaiting_approval: false,
                    awaiting_client: true,
                });
                return;
            }
            if needs_approval(&call.name) {
                // Durable before anyone can decide it; watchers see the call waiting.
                *awaiting = Some(call.call_id.clone());
                self.write(EventPayload::ToolCall {
                    turn,
                    step,
                    call,
                    awaiting_approval: true,
                    awaiting_client: false,
                });
                return;
            }
            self.run_tool_call(call);
            return;
        }
    }

    /// Writes `tool/call` (unless it was written awaiting approval) and asks the runner to run it.
    fn run_tool_call(&mut self, call: ToolCallSpec) {
        let Some(t) = self.turn.as_mut() else { return };
        let (turn, step) = (t.turn, t.step);
        let Phase::Tools { awaiting, .. } = &mut t.phase else { return };
        if awaiting.take().is_none() {
            self.write_call(turn, step, call.clone());
        }
        self.request_tool(call);
    }

    /// Writes the `tool/call` of a call that waits for no one (no decision, no client).
    pub(super) fn write_call(&mut self, turn: u64, step: u32, call: ToolCallSpec) {
        self.write(EventPayload::ToolCall { turn, step, call, awaiting_approval: false, awaiting_client: false });
    }

    /// Asks the runner to run `call` of the current step, whose `tool/call` is durable, under its
    /// idempotency key (SPEC §20): the same key whenever the same call runs again after a repair.
    pub(super) fn request_tool(&mut self, call: ToolCallSpec) {
        let Some(t) = self.turn.as_mut() else { return };
        let (turn, step, agent, agent_hash) = (t.turn, t.step, t.agent.clone(), t.agent_hash.clone());
        let tools = t.overrides.tools.clone();
        let Phase::Tools { running, .. } = &mut t.phase else { return };
        let op = self.next_op;
        self.next_op += 1;
        *running = Some(op);
        let idempotency_key = idempotency_key(&self.state.session, turn, step, &call.call_id);
        self.effects.push_back(Effect::Tool(ToolRequest {
            op,
            agent,
            agent_hash,
            turn,
            step,
            call,
            tools,
            idempotency_key,
        }));
    }

    /// `Decide` (SPEC §9): answers the call awaiting approval. Approved runs it; denied gives the
    /// error result `denied: <reason>` and goes on with the next call.
    pub(super) fn decide(
        &mut self,
        call_id: &str,
        approve: bool,
        reason: String,
        timed_out: bool,
    ) -> Result<CommandReply, CommandError> {
        let Some((turn, step, call)) = self.waiting_call(call_id, false) else {
            return Err(self.undecidable(call_id));
        };
        self.write(EventPayload::ToolDecision {
            turn,
            step,
            call_id: call_id.to_owned(),
            approved: approve,
            reason: reason.clone(),
            timed_out,
        });
        if approve {
            self.run_tool_call(call);
        } else {
            let reason = if reason.trim().is_empty() { "no reason given".to_owned() } else { reason };
            self.pass_waiting_call();
            let outcome = ToolOutcome::new(call.call_id, call.name, String::new(), Some(format!("denied: {reason}")));
            self.record_tool_result(turn, step, outcome);
            self.next_tool_call();
        }
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    /// `CompleteToolCall` (SPEC §19): the result of the call of a client tool of the turn that waits for its
    /// client; the turn goes on with the next call.
    pub(super) fn complete_tool_call(
        &mut self,
        call_id: &str,
        output: String,
        error: Option<String>,
    ) -> Result<CommandReply, CommandError> {
        let Some((turn, step, call)) = self.waiting_call(call_id, true) else {
            return Err(self.uncompletable(call_id));
        };
        self.pass_waiting_call();
        self.record_tool_result(turn, step, ToolOutcome::new(call.call_id, call.name, output, error));
        self.next_tool_call();
        Ok(CommandReply::Written { seq: self.state.last_seq })
    }

    /// The call `call_id` when the turn (not being cancelled) waits on it: for its client (`for_client`) or
    /// for a person's decision; with the turn and step it belongs to.
    fn waiting_call(&self, call_id: &str, for_client: bool) -> Option<(u64, u32, ToolCallSpec)> {
        let t = self.turn.as_ref().filter(|t| t.cancel.is_none())?;
        match &t.phase {
            Phase::Tools { calls, next, awaiting: Some(id), for_client: waits_for_client, .. }
                if id == call_id && *waits_for_client == for_client =>
            {
                calls.get(*next).cloned().map(|call| (t.turn, t.step, call))
            }
            _ => None,
        }
    }

    /// The waiting call is answered: the turn goes past it, waiting on nothing.
    fn pass_waiting_call(&mut self) {
        if let Some(Phase::Tools { next, awaiting, for_client, .. }) = self.turn.as_mut().map(|t| &mut t.phase) {
            *next += 1;
            *awaiting = None;
            *for_client = false;
        }
    }

    /// Why `call_id` cannot be completed: a known call that does not wait for its client is a failed
    /// precondition; any other id is unknown.
    fn uncompletable(&self, call_id: &str) -> CommandError {
        let session = &self.state.session;
        if self.call_known(call_id) {
            CommandError::FailedPrecondition(format!(
                "tool call {call_id} of session {session} does not wait for its client: it was answered already, or \
                 it is not a client tool of its turn"
            ))
        } else {
            CommandError::NotFound(format!(
                "session {session} has no tool call {call_id}; take the id from the `tool/call` event with awaiting_client"
            ))
        }
    }

    fn call_known(&self, call_id: &str) -> bool {
        self.state.transcript.entries().any(|e| e.mentions_call(call_id))
            || self.state.open_turn.as_ref().is_some_and(|o| o.step_calls.iter().any(|c| c.call_id == call_id))
    }

    /// Why `call_id` cannot be decided: a call of this session that is not waiting (already decided, or
    /// never asked for approval) is a failed precondition; any other id is unknown.
    fn undecidable(&self, call_id: &str) -> CommandError {
        let session = &self.state.session;
        if self.call_known(call_id) {
            CommandError::FailedPrecondition(format!(
                "tool call {call_id} of session {session} is not awaiting approval: it was already decided, or it never needed approval"
            ))
        } else {
            CommandError::NotFound(format!(
                "session {session} has no tool call {call_id}; take the id from the `tool/call` event with awaiting_approval"
            ))
        }
    }

    pub(super) fn turn_tool_done(&mut self, op: OpId, outcome: ToolOutcome) {
        let Some(t) = self.turn.as_mut() else { return };
        let (turn, step) = (t.turn, t.step);
        let Phase::Tools { next, running, .. } = &mut t.phase else { return };
        if *running != Some(op) {
            return;
        }
        *running = None;
        *next += 1;
        self.record_tool_result(turn, step, outcome);
        self.next_tool_call();
    }

    /// `tool/result`, then the tool's context messages (one splice at the end of next-step, source
    /// `tool{call_id}`), so the next proposal claims them.
    pub(super) fn record_tool_result(&mut self, turn: u64, step: u32, mut outcome: ToolOutcome) {
        let concludes = outcome.concludes_turn;
        // The call's memory writes first (provenance, SPEC §20): the result that reports them follows.
        for write in std::mem::take(&mut outcome.memory) {
            self.write(EventPayload::MemoryWritten(turnstile_model::memory::MemoryWritten {
                turn,
                step,
                call_id: outcome.call_id.clone(),
                namespace: write.namespace,
                key: write.key,
                revision: write.revision,
                bytes: write.bytes,
            }));
        }
        self.write(EventPayload::ToolResult {
            turn,
            step,
            call_id: outcome.call_id.clone(),
            output: outcome.output.clone(),
            error: outcome.error.clone(),
        });
        let context: Vec<UserMessage> = std::mem::take(&mut outcome.context)
            .into_iter()
            .map(|mut m| {
                m.source = MessageSource::Tool { call_id: outcome.call_id.clone() };
                m
            })
            .filter(|m| self.accepted_as_context(m))
            .collect();
        if !context.is_empty() {
            // Appended to next-step like an edit that removes nothing: one splice, then `inserted`s.
            self.write_edit(Target::NextStep, self.state.inbox.next_step.len() as u32, 0, context);
        }
        if let Some(t) = self.turn.as_mut() {
            t.tool_results.push(outcome);
            // A tool that concludes the turn makes the step result `completed`; later calls still run.
            t.concluded |= concludes;
        }
    }

    /// A context message the tool returned can be inserted: well-formed, within the size limit and with
    /// an id never used in this session. Anything else is dropped with a warning rather than failing the
    /// turn: the result itself is already durable and the model sees it.
    fn accepted_as_context(&self, message: &UserMessage) -> bool {
        // The same checks a delivery gets: well-formed, within the size limit, an id never used.
        let checked = self.check_message(message).and_then(|()| self.check_new_id(&message.id, &[]));
        if let Err(problem) = &checked {
            tracing::warn!(session = %self.state.session, id = %message.id, %problem, "dropped a tool context message");
        }
        checked.is_ok()
    }
}
