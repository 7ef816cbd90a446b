//! The deterministic scripted model (API.md): it answers a step by reading directives in the text of
//! the messages entered in that step.
//!
//! [`plan`] is pure (the same request always gives the same reply), so driver tests use it directly;
//! [`ScriptedModel`] streams that plan, pacing it for `[[delay:MS]]`.

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use turnstile_journal::{ToolCallSpec, UserMessage};

use super::directive::{self, Directive};
use super::{DeltaSink, Model, ModelError};
use crate::driver::{ModelOutput, ModelRequest};

/// The reply the scripted model gives to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptedPlan {
    /// The pieces streamed as `assistant/delta`; they concatenate to `output.text`.
    pub deltas: Vec<String>,
    pub output: ModelOutput,
    /// Total time to spread the deltas over.
    pub delay: Duration,
    /// `[[fail]]`: the request fails with this message.
    pub fail: Option<String>,
}

/// How many deltas a reply is split into at most (more with `[[delay]]`, so the stream is visibly slow).
const FAST_CHUNKS: usize = 3;
const SLOW_CHUNKS: usize = 10;

/// What the scripted model answers to `request`.
pub fn plan(request: &ModelRequest) -> ScriptedPlan {
    let prompt: &[UserMessage] =
        if request.messages.is_empty() { &request.interrupted_prompt } else { &request.messages };
    let mut directives = Vec::new();
    let mut texts = Vec::new();
    for message in prompt {
        let (d, text) = directive::parse(&message.text());
        directives.extend(d);
        if !text.is_empty() {
            texts.push(text);
        }
    }
    let text = if !prompt.is_empty() {
        format!("echo: {}", texts.join("\n"))
    } else if !request.tool_results.is_empty() {
        let results: Vec<String> = request
            .tool_results
            .iter()
            .map(|r| match &r.error {
                Some(e) => format!("{} failed: {e}", r.name),
                None => format!("{}: {}", r.name, r.output),
            })
            .collect();
        format!("tool results: {}", results.join("; "))
    } else {
        "nothing new to answer".to_owned()
    };
    let mut delay = Duration::ZERO;
    let mut tool_calls = Vec::new();
    let mut max_tokens = false;
    let mut fail = None;
    for d in directives {
        match d {
            Directive::Tool { name, arguments } => tool_calls.push(ToolCallSpec {
                call_id: format!("call-{}-{}-{}", request.turn, request.step, tool_calls.len() + 1),
                name,
                arguments,
            }),
            Directive::Delay { ms } => delay += Duration::from_millis(ms),
            Directive::MaxTokens => max_tokens = true,
            Directive::Fail => fail = Some("the scripted model was told to fail ([[fail]])".to_owned()),
            // Content-guard directives are for the pre-step hook, not the model.
            Directive::Reject | Directive::Drop | Directive::Rewrite { .. } | Directive::HookFail => {}
        }
    }
    let chunks = if delay.is_zero() { FAST_CHUNKS } else { SLOW_CHUNKS };
    ScriptedPlan { deltas: split(&text, chunks), output: ModelOutput { text, tool_calls, max_tokens }, delay, fail }
}

/// Splits `text` at word boundaries into at most `max` non-empty pieces that concatenate to it.
fn split(text: &str, max: usize) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let per = words.len().div_ceil(max.max(1)).max(1);
    words.chunks(per).map(|c| c.concat()).filter(|s| !s.is_empty()).collect()
}

/// The scripted model as a [`Model`].
#[derive(Clone, Debug, Default)]
pub struct ScriptedModel;

#[async_trait]
impl Model for ScriptedModel {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::ToolOutcome;

    fn request(messages: Vec<UserMessage>) -> ModelRequest {
        ModelRequest { op: 1, turn: 2, step: 1, messages, tool_results: vec![], interrupted_prompt: vec![] }
    }

    #[test]
    fn echoes_plain_text_in_deltas_that_concatenate() {
        let p = plan(&request(vec![UserMessage::user_text("a", "hello big world"), UserMessage::user_text("b", "x")]));
        assert_eq!(p.output.text, "echo: hello big world\nx");
        assert_eq!(p.deltas.concat(), p.output.text);
        assert!(p.deltas.len() > 1);
        assert!(p.output.tool_calls.is_empty());
    }

    #[test]
    fn tool_and_delay_directives_combine() {
        let p = plan(&request(vec![UserMessage::user_text("a", "[[delay:500]] [[tool:echo hi]] go")]));
        assert_eq!(p.delay, Duration::from_millis(500));
        assert_eq!(p.output.text, "echo: go");
        assert_eq!(
            p.output.tool_calls,
            vec![ToolCallSpec { call_id: "call-2-1-1".into(), name: "echo".into(), arguments: "hi".into() }]
        );
    }

    #[test]
    fn answers_tool_results_when_no_message_is_new() {
        let mut r = request(vec![]);
        r.tool_results = vec![ToolOutcome {
            call_id: "c".into(),
            name: "echo".into(),
            output: "hi".into(),
            error: None,
            concludes_turn: false,
        }];
        assert_eq!(plan(&r).output.text, "tool results: echo: hi");
    }

    #[test]
    fn answers_the_interrupted_prompt_on_resume() {
        let mut r = request(vec![]);
        r.interrupted_prompt = vec![UserMessage::user_text("a", "still there?")];
        assert_eq!(plan(&r).output.text, "echo: still there?");
    }

    #[test]
    fn fail_and_max_tokens() {
        assert!(plan(&request(vec![UserMessage::user_text("a", "[[fail]]")])).fail.is_some());
        assert!(plan(&request(vec![UserMessage::user_text("a", "[[max-tokens]]")])).output.max_tokens);
    }
}
