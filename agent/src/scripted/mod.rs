//! The deterministic parts of the scripted model and the built-in content guard (docs/API.md "The scripted
//! model"): directives in the text of the entered messages decide the reply, tool calls, failures and the
//! guard's verdict.
//!
//! Both are pure ([`plan`], [`judge`]), so the driver's scenario tests use them directly (this crate is their
//! dev-dependency) and every SPEC §7 scenario replays exactly. [`ScriptedModel`] streams a [`plan`] as the
//! worker's [`Model`] (pacing it for `[[delay:MS]]`) and the `ContentGuard` hook ([`crate::hooks`]) answers
//! with [`judge`].
//!
//! ```
//! use turnstile_agent::scripted;
//! use turnstile_driver::ModelRequest;
//! use turnstile_model::{ContentBlock, MessageSource, UserMessage};
//! let hello = UserMessage { id: "m1".into(), content: vec![ContentBlock::text("hello")].into(), source: MessageSource::User };
//! let request = ModelRequest {
//!     op: 1, turn: 1, step: 1, agent: "scripted".into(), agent_hash: String::new(), system: None, history: vec![],
//!     overrides: Default::default(),
//!     session: turnstile_model::SessionRef { tenant: "default".into(), id: "s".into() },
//!     messages: vec![hello], tool_results: vec![], interrupted_prompt: vec![], goal: None,
//!     summary: None, output: None, compaction: None,
//! };
//! assert_eq!(scripted::plan(&request).output.text, "echo: hello");
//! ```

pub mod directive;
mod plan;

use async_trait::async_trait;
use turnstile_driver::ModelOutput;
use turnstile_model::{ModelRef, Usage};
use turnstile_worker::agent::{Model, ModelError, ModelIdentity, ModelStep};

pub use plan::{CONTENT_GUARD, ScriptedPlan, judge, plan};

/// The scripted model as a [`Model`], answering as the `[models.NAME]` it was built for (`scripted` by
/// default): so a session that overrides its agent's model (SPEC §20) shows which one answered.
#[derive(Clone, Debug)]
pub struct ScriptedModel {
    name: String,
}

impl Default for ScriptedModel {
    fn default() -> Self {
        Self::named("scripted")
    }
}

impl ScriptedModel {
    /// The scripted model of `[models.NAME]`.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn identity(&self, _agent: &str) -> ModelIdentity {
        ModelIdentity::new("scripted", self.name.clone())
    }

    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
        let ModelStep { request, deltas, abort } = step;
        let mut plan = plan(&request);
        plan.output.model.get_or_insert_with(|| ModelRef::new("scripted", self.name.clone()));
        if let Some(message) = plan.fail {
            return Err(ModelError::Failed { message, code: "model_failed".into() });
        }
        if let Some(usage) = plan.output.usage {
            // Like Anthropic's `message_start`: the input is reported before any output streams, so a step
            // cancelled mid-stream is counted (decision 0086).
            deltas.report_usage(Usage { output_tokens: 0, ..usage }).await;
        }
        let pause = plan.delay / (plan.deltas.len().max(1) as u32);
        for (i, delta) in plan.deltas.into_iter().enumerate() {
            if i > 0 && !pause.is_zero() {
                tokio::select! {
                    () = abort.cancelled() => return Err(ModelError::Aborted),
                    () = tokio::time::sleep(pause) => {}
                }
            }
            if abort.is_cancelled() {
                return Err(ModelError::Aborted);
            }
            deltas.send(delta).await;
        }
        Ok(plan.output)
    }
}
