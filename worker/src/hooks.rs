//! Pre-step hooks: the waterfall that decides each proposal (SPEC §4).
//!
//! Each hook sees the batch as the hooks before it left it and either passes a (possibly rewritten)
//! batch on or rejects. The last batch standing is entered.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
pub use turnstile_driver::{HookError, HookVerdict};
use turnstile_driver::{PreStepDecision, PreStepRequest};
use turnstile_model::UserMessage;

#[async_trait]
pub trait PreStepHook: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// Decides over `batch` for the proposal described by `request`. On `abort`, return promptly.
    async fn decide(
        &self,
        request: &PreStepRequest,
        batch: Vec<UserMessage>,
        abort: &CancellationToken,
    ) -> Result<HookVerdict, HookError>;
}

/// Runs `hooks` in order over the request's claimed batch.
pub async fn run_waterfall(
    hooks: &[Arc<dyn PreStepHook>],
    request: &PreStepRequest,
    abort: &CancellationToken,
) -> Result<PreStepDecision, HookError> {
    let mut batch = request.messages.clone();
    for hook in hooks {
        match hook.decide(request, batch, abort).await? {
            HookVerdict::Pass(next) => batch = next,
            HookVerdict::Reject { reason } => return Ok(PreStepDecision::Reject { reason }),
        }
    }
    Ok(PreStepDecision::Enter(batch))
}

/// The built-in content guard, driven by the scripted directives `[[reject]]`, `[[drop]]`,
/// `[[rewrite:TEXT]]` and `[[hook-fail]]`.
#[derive(Clone, Debug, Default)]
pub struct ContentGuard;

impl ContentGuard {
    pub const NAME: &'static str = turnstile_driver::scripted::CONTENT_GUARD;

    /// The guard's verdict, without IO.
    pub fn judge(batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        turnstile_driver::scripted::judge(batch)
    }
}

#[async_trait]
impl PreStepHook for ContentGuard {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn decide(
        &self,
        _request: &PreStepRequest,
        batch: Vec<UserMessage>,
        _abort: &CancellationToken,
    ) -> Result<HookVerdict, HookError> {
        Self::judge(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, text: &str) -> UserMessage {
        UserMessage::user_text(id, text)
    }

    #[test]
    fn passes_plain_messages() {
        let batch = vec![msg("a", "hi"), msg("b", "there")];
        assert_eq!(ContentGuard::judge(batch.clone()), Ok(HookVerdict::Pass(batch)));
    }

    #[test]
    fn rejects_drops_rewrites_and_fails() {
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "x"), msg("b", "[[reject]]")]),
            Ok(HookVerdict::Reject { reason: None })
        );
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "x"), msg("b", "[[drop]] y")]),
            Ok(HookVerdict::Pass(vec![msg("a", "x")]))
        );
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "[[rewrite:clean]] dirty")]),
            Ok(HookVerdict::Pass(vec![msg("a", "clean")]))
        );
        assert!(ContentGuard::judge(vec![msg("a", "[[hook-fail]]")]).is_err());
    }
}
