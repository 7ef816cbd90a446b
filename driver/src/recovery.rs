//! Repair and resume after the previous owner stopped (SPEC §6), and what the repair does with a tool
//! call it finds running (SPEC §20, decision 0143): run it again in place under the same idempotency key
//! when its agent says `retry_after_repair` for that tool, else end it interrupted, never to run again.

use turnstile_model::state::OpenTurn;
use turnstile_model::{
    EventPayload, LivePayload, RepairAction, Splice, SpliceOutcome, Status, Target, TurnEndReason, UserMessage,
};

use super::turn::{ActiveTurn, Phase, Resume};
use super::{Driver, ToolOutcome};

/// The error result of a call the repair found running and did not run again.
pub const INTERRUPTED_BY_REPAIR: &str = "interrupted: the worker running this call stopped before it finished";

impl Driver {
    /// Repairs an open turn left by a crash, restores what it claimed but never entered, and resumes
    /// iff the session was running. Call once, right after [`Driver::new`].
    pub fn recover(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        // Steer deadlines that passed while no owner ran the session fire first (SPEC §11); nothing runs
        // yet, so an `interrupt` only moves its steer to the head of next-turn. Its waking insert must not
        // open a turn here, or the repair below would take that turn for the crashed one; the insert makes
        // the session resume below instead.
        self.recovering = true;
        self.on_timer(now_ms);
        self.recovering = false;
        let mut resume = Resume::default();
        if self.resume_awaiting() || self.retry_running_call() {
            return;
        }
        if let Some(open) = self.state.open_turn.clone() {
            let (turn, step) = (open.turn, open.step);
            let waiting =
                |call_id: &str| open.awaiting.iter().chain(&open.awaiting_client).any(|c| c.call_id == call_id);
            for call in &open.open_calls {
                if !waiting(&call.call_id) {
                    // It was running: the repair ends it and says so (SPEC §20).
                    let call_id = call.call_id.clone();
                    self.write(EventPayload::ToolRepaired { turn, step, call_id, action: RepairAction::Interrupted });
                }
                self.write(EventPayload::ToolResult {
                    turn,
                    step,
                    call_id: call.call_id.clone(),
                    output: String::new(),
                    error: Some(INTERRUPTED_BY_REPAIR.into()),
                });
            }
            // The model answered the step with calls: it owes its answer to their results (calls it asked
            // for that never started get an error result in the request, `chat_model`). Asking it the step's
            // prompt again made it ask for the same calls again, under new ids: decision 0143.
            let answered_with_calls = open.step_open && !open.step_calls.is_empty();
            if open.step_open {
                self.write(EventPayload::StepEnd { turn, step, spent: None });
                if answered_with_calls {
                    resume.tool_results = self.step_results();
                } else {
                    // The model must still answer what the interrupted step was asked; a step that only
                    // answered tool results was asked what the turn was asked.
                    resume.prompt = if open.open_step_messages.is_empty() {
                        open.admitted.clone()
                    } else {
                        open.open_step_messages.clone()
                    };
                }
            } else if !open.last_step_results.is_empty() {
                // Cut after a tool step: the model still owes its answer to those results.
                resume.tool_results = results_of(&open);
            }
            self.write(EventPayload::TurnEnd { turn, reason: TurnEndReason::Interrupted });
            let (mut next_step, mut next_turn) = (Vec::new(), Vec::new());
            for (target, message) in open.undecided_claims {
                match target {
                    Target::NextStep => next_step.push(message),
                    Target::NextTurn => next_turn.push(message),
                }
            }
            self.restore(Target::NextStep, next_step);
            self.restore(Target::NextTurn, next_turn);
        }
        // A pause the last turn owed the goal comes right after its `turn/end`, as the old owner writes it.
        self.goal_recover_pause();
        let was_running = self.state.status == Status::Running || self.state.wake_since_idle;
        if !was_running {
            self.goal_recover_continue();
            return;
        }
        if resume.is_empty() && self.state.inbox.is_empty() {
            // Running with nothing left to do (a crash between `turn/end` and `status idle`).
            self.set_status(Status::Idle);
            self.goal_recover_continue();
            return;
        }
        self.set_status(Status::Running);
        self.open_turn(resume);
    }

    /// A turn cut while a call waited for approval (SPEC §9) or for its client (SPEC §19) is not
    /// interrupted: nothing of it was running, so the new owner takes the turn over in place and waits for
    /// the same answer.
    fn resume_awaiting(&mut self) -> bool {
        let Some(open) = self.state.open_turn.clone() else { return false };
        let (waiting, for_client) = match (open.awaiting.clone(), open.awaiting_client.clone()) {
            (Some(call), _) => (call, false),
            (None, Some(call)) => (call, true),
            (None, None) => return false,
        };
        if !open.step_open || open.open_calls.len() != 1 {
            return false;
        }
        let (calls, next) = match open.step_calls.iter().position(|c| c.call_id == waiting.call_id) {
            Some(next) => (open.step_calls.clone(), next),
            None => (vec![waiting.clone()], 0),
        };
        self.take_over(&open, Phase::Tools { calls, next, running: None, awaiting: Some(waiting.call_id), for_client });
        true
    }

    /// SPEC §20: the one call that was running when the owner stopped, of a tool its agent runs again after
    /// a repair (`retry_after_repair`), runs again in place: `tool/repaired {retried}`, then the same call
    /// under the same idempotency key, and the turn goes on where it was cut. False when there is no such
    /// call (the repair then ends the turn interrupted).
    fn retry_running_call(&mut self) -> bool {
        let Some(open) = self.state.open_turn.clone() else { return false };
        if !open.step_open || open.awaiting.is_some() || open.awaiting_client.is_some() {
            return false;
        }
        let [call] = open.open_calls.as_slice() else { return false };
        let (_, profile) = self.agents.resolve_version(
            self.state.agent.as_deref(),
            self.state.agent_version,
            &self.state.session.tenant,
        );
        if !profile.retry_after_repair.requires(&call.name) {
            return false;
        }
        let call = call.clone();
        let (calls, next) = match open.step_calls.iter().position(|c| c.call_id == call.call_id) {
            Some(next) => (open.step_calls.clone(), next),
            None => (vec![call.clone()], 0),
        };
        self.take_over(&open, Phase::Tools { calls, next, running: None, awaiting: None, for_client: false });
        let (turn, step, call_id) = (open.turn, open.step, call.call_id.clone());
        self.write(EventPayload::ToolRepaired { turn, step, call_id, action: RepairAction::Retried });
        self.request_tool(call);
        true
    }

    /// Takes the open turn over in place, in `phase` (its step's calls), running: the new owner goes on
    /// where the old one stopped, with the step's results so far for the model's next request.
    fn take_over(&mut self, open: &OpenTurn, phase: Phase) {
        let (agent, profile) = self.agents.resolve_version(
            self.state.agent.as_deref(),
            self.state.agent_version,
            &self.state.session.tenant,
        );
        let version = (agent.to_owned(), profile.version, profile.hash.clone());
        let overrides = self.applied_overrides(&version.0, version.1);
        self.turn = Some(ActiveTurn {
            proposal: 1,
            max_tokens: open.max_tokens,
            tool_results: results_of(open),
            overrides,
            ..ActiveTurn::new(open.turn, open.step, phase, version)
        });
        self.set_status(Status::Running);
    }

    /// The results of the open turn's latest step, as the fold has them now.
    fn step_results(&self) -> Vec<ToolOutcome> {
        self.state.open_turn.as_ref().map(results_of).unwrap_or_default()
    }

    /// Re-inserts claimed-but-never-entered messages at the head of their list.
    fn restore(&mut self, target: Target, messages: Vec<UserMessage>) {
        if messages.is_empty() {
            return;
        }
        self.write(EventPayload::InboxSpliced(Splice {
            target,
            start: 0,
            removed_count: 0,
            inserted: messages.clone(),
            outcome: SpliceOutcome::Restored,
            wake: false,
            requested_target: None,
            deadline: None,
        }));
        for message in messages {
            self.publish(LivePayload::Inserted { message });
        }
    }
}

/// The results of `open`'s latest step, for the model's next request.
fn results_of(open: &OpenTurn) -> Vec<ToolOutcome> {
    open.last_step_results
        .iter()
        .map(|r| ToolOutcome::new(&r.call_id, &r.name, r.output.clone(), r.error.clone()))
        .collect()
}
