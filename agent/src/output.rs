//! [`StructuredOutput`]: judges each final reply against the request's output schema (SPEC §20).
//!
//! Every model of a worker answers through it (it wraps the whole agent seam's model), so the scripted
//! model's replies are judged like a provider's. It only reports: a final reply that is not JSON matching
//! [`ModelRequest::output`](turnstile_driver::ModelRequest::output) comes back with
//! [`ModelOutput::invalid_output`] saying why, and the driver decides what follows (one retry showing the
//! model that text, then `error{invalid_output}`).

use std::sync::Arc;

use async_trait::async_trait;
use turnstile_config::output::OutputValidator;
use turnstile_driver::ModelOutput;
use turnstile_worker::agent::{Model, ModelError, ModelIdentity, ModelStep};

/// A [`Model`] whose final replies are checked against their request's output schema.
pub struct StructuredOutput {
    base: Arc<dyn Model>,
}

impl StructuredOutput {
    pub fn new(base: Arc<dyn Model>) -> Self {
        Self { base }
    }
}

#[async_trait]
impl Model for StructuredOutput {
    fn identity(&self, agent: &str) -> ModelIdentity {
        self.base.identity(agent)
    }

    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
        let schema = step.request.output.clone();
        let mut output = self.base.step(step).await?;
        // Only a final reply answers: one that calls tools goes on, one cut at the token limit ends max-tokens.
        if let Some(schema) = schema
            && output.tool_calls.is_empty()
            && !output.max_tokens
        {
            output.invalid_output = match OutputValidator::new(&schema) {
                Ok(validator) => validator.check(&output.text).err(),
                // Checked when the agent or the turn was accepted; a schema that no longer compiles (a
                // definition stored by another version) fails the turn rather than passing unchecked.
                Err(problem) => Some(format!("the output schema {:?} cannot be used: {problem}", schema.name)),
            };
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::router::tests::{request, run};
    use crate::scripted::ScriptedModel;
    use turnstile_model::output::OutputSchema;

    #[tokio::test]
    async fn final_replies_are_judged_against_the_requests_schema_and_others_are_not() {
        let model = StructuredOutput::new(Arc::new(ScriptedModel::default()));
        let schema = OutputSchema::new("answer", serde_json::json!({"type": "object", "required": ["city"]}));
        let asked = |text: &str| {
            let mut r = request("a", text);
            r.output = Some(schema.clone());
            r
        };
        let judged = run(&model, asked(r#"{"city": "Paris"}"#)).await.unwrap();
        assert_eq!(judged.invalid_output, None, "the scripted model echoes JSON that matches");
        let judged = run(&model, asked(r#"{"town": "Paris"}"#)).await.unwrap();
        assert_eq!(judged.invalid_output.as_deref(), Some(r#""city" is a required property"#));
        let unjudged = run(&model, request("a", "no schema asked")).await.unwrap();
        assert_eq!(unjudged.invalid_output, None);
        let calls_a_tool = run(&model, asked("[[tool:clock]]")).await.unwrap();
        assert!(!calls_a_tool.tool_calls.is_empty());
        assert_eq!(calls_a_tool.invalid_output, None, "a reply that calls tools is not the final one");
    }
}
