//! Repair and resume after the previous owner stopped (SPEC §6).

use turnstile_model::{EventPayload, LivePayload, Splice, SpliceOutcome, Status, Target, TurnEndReason, UserMessage};

use super::turn::{ActiveTurn, Phase, Resume};
use super::{Driver, ToolOutcome};

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
        if self.resume_awaiting() {
            return;
        }
        if let Some(open) = self.state.open_turn.clone() {
            let (turn, step) = (open.turn, open.step);
            for call in &open.open_calls {
                self.write(EventPayload::ToolResult {
                    turn,
                    step,
                    call_id: call.call_id.clone(),
                    output: String::new(),
                    error: Some("interrupted: the worker running this call stopped before it finished".into()),
                });
            }
            if open.step_open {
                self.write(EventPayload::StepEnd { turn, step, spent: None });
                // The model must still answer what the interrupted step was asked; a step that only
                // answered tool results was asked what the turn was asked.
                resume.prompt = if open.open_step_messages.is_empty() {
                    open.admitted.clone()
                } else {
                    open.open_step_messages.clone()
                };
            } else if !open.last_step_results.is_empty() {
                // Cut after a tool step: the model still owes its answer to those results.
                resume.tool_results = open
                    .last_step_results
                    .iter()
                    .map(|r| ToolOutcome::new(&r.call_id, &r.name, r.output.clone(), r.error.clone()))
                    .collect();
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
        let (agent, profile) = self.agents.resolve_version(
            self.state.agent.as_deref(),
            self.state.agent_version,
            &self.state.session.tenant,
        );
        let (agent, version, agent_hash) = (agent.to_owned(), profile.version, profile.hash.clone());
        self.turn = Some(ActiveTurn {
            turn: open.turn,
            proposal: 1,
            step: open.step,
            phase: Phase::Tools { calls, next, running: None, awaiting: Some(waiting.call_id), for_client },
            cancel: None,
            last_step: None,
            max_tokens: open.max_tokens,
            tool_results: open
                .last_step_results
                .iter()
                .map(|r| ToolOutcome::new(&r.call_id, &r.name, r.output.clone(), r.error.clone()))
                .collect(),
            interrupted_prompt: Vec::new(),
            resumed: false,
            concluded: false,
            agent,
            version,
            agent_hash,
            compaction_tried: false,
            output_retried: false,
        });
        self.set_status(Status::Running);
        true
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
