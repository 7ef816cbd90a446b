//! The built-in step budget: an agent's `max_steps_per_turn` as a pre-step hook.
//!
//! It sits in the waterfall rather than in the driver because the proposal is exactly where a step is
//! about to open: rejecting there ends the turn `blocked` with a reason the log keeps, before the model is
//! asked again, and no step is left half-run. A tool loop that never concludes is the case it stops.

use async_trait::async_trait;
use turnstile_driver::{HookError, HookVerdict, PreStepRequest};
use turnstile_model::UserMessage;

use super::{PreStepHook, Proposal};

/// Rejects a proposal that would open step N of a turn when N exceeds `max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepBudget {
    max: u32,
}

impl StepBudget {
    pub const NAME: &'static str = "step-budget";

    /// At most `max` steps per turn (the config refuses 0).
    pub fn new(max: u32) -> Self {
        Self { max }
    }

    /// The budget's verdict for the proposal `request`, without IO.
    pub fn judge(&self, request: &PreStepRequest, batch: Vec<UserMessage>) -> HookVerdict {
        if request.step > self.max {
            HookVerdict::Reject {
                reason: Some(format!(
                    "step budget: turn {} reached its limit of {} step{}",
                    request.turn,
                    self.max,
                    if self.max == 1 { "" } else { "s" }
                )),
            }
        } else {
            HookVerdict::Pass(batch)
        }
    }
}

#[async_trait]
impl PreStepHook for StepBudget {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn decide(&self, proposal: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        Ok(self.judge(proposal.request, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(turn: u64, step: u32) -> PreStepRequest {
        PreStepRequest {
            op: 1,
            agent: "a".into(),
            turn,
            step,
            proposal: step,
            messages: vec![],
            agent_hash: String::new(),
        }
    }

    #[test]
    fn passes_up_to_the_limit_and_rejects_beyond_it() {
        let budget = StepBudget::new(2);
        let batch = vec![UserMessage::user_text("m", "hi")];
        assert_eq!(budget.judge(&request(3, 1), batch.clone()), HookVerdict::Pass(batch.clone()));
        assert_eq!(budget.judge(&request(3, 2), batch.clone()), HookVerdict::Pass(batch.clone()));
        assert_eq!(
            budget.judge(&request(3, 3), batch),
            HookVerdict::Reject { reason: Some("step budget: turn 3 reached its limit of 2 steps".into()) }
        );
        assert_eq!(
            StepBudget::new(1).judge(&request(1, 2), vec![]),
            HookVerdict::Reject { reason: Some("step budget: turn 1 reached its limit of 1 step".into()) }
        );
    }
}
