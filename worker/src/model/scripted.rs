//! The scripted model as an async [`Model`]: it streams the deterministic [`plan`] of
//! `turnstile_driver::scripted`, pacing the deltas for `[[delay:MS]]`.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
pub use turnstile_driver::scripted::{ScriptedPlan, plan};
use turnstile_driver::{ModelOutput, ModelRequest};

use super::{DeltaSink, Model, ModelError, ModelIdentity};

/// The scripted model as a [`Model`].
#[derive(Clone, Debug, Default)]
pub struct ScriptedModel;

#[async_trait]
impl Model for ScriptedModel {
    fn identity(&self, _agent: &str) -> ModelIdentity {
        ModelIdentity::new("scripted", "scripted")
    }

    async fn step(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
        abort: CancellationToken,
    ) -> Result<ModelOutput, ModelError> {
        let plan = plan(&request);
        if let Some(message) = plan.fail {
            return Err(ModelError::Failed { message, code: "model_failed".into() });
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
