//! Repair and resume after the previous owner stopped (SPEC §6).

use std::mem;

use turnstile_journal::{EventPayload, LivePayload, Splice, SpliceOutcome, Status, Target, TurnEndReason, UserMessage};

use super::Driver;

impl Driver {
    /// Repairs an open turn left by a crash, restores what it claimed but never entered, and resumes
    /// iff the session was running. Call once, right after [`Driver::new`].
    pub fn recover(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        let mut interrupted_prompt = Vec::new();
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
                self.write(EventPayload::StepEnd { turn, step });
                // The model must still answer what the interrupted step was asked; a step that only
                // answered tool results was asked what the turn was asked.
                interrupted_prompt = if open.open_step_messages.is_empty() {
                    open.admitted.clone()
                } else {
                    open.open_step_messages.clone()
                };
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
        let resume = self.state.status == Status::Running || self.state.wake_since_idle;
        if !resume {
            return;
        }
        if interrupted_prompt.is_empty() && self.state.inbox.is_empty() {
            // Running with nothing left to do (a crash between `turn/end` and `status idle`).
            self.set_status(Status::Idle);
            return;
        }
        self.set_status(Status::Running);
        self.open_turn(mem::take(&mut interrupted_prompt));
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
        }));
        for message in messages {
            self.publish(LivePayload::Inserted { message });
        }
    }
}
