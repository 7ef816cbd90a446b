//! The scripted model's answer to a request ([`plan`]) and the content guard's verdict ([`judge`]): pure
//! functions of the directives in the entered messages' text.

use std::time::Duration;

use turnstile_model::{ContentBlock, MessageSource, ToolCallSpec, TranscriptEntry, Usage, UserMessage};

use turnstile_driver::{CompactionTask, GOAL_COMPLETE, HookError, HookVerdict, ModelOutput, ModelRequest};

use super::directive::{self, Directive};

/// The name the content guard reports in its errors.
pub const CONTENT_GUARD: &str = "content-guard";

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
    if let Some(task) = &request.compaction {
        return compaction_plan(request, task);
    }
    let prompt: &[UserMessage] =
        if request.messages.is_empty() { &request.interrupted_prompt } else { &request.messages };
    let mut directives = Vec::new();
    let mut texts = Vec::new();
    for message in prompt {
        let (d, text) = directive::parse(&message.text());
        // `[[complete-goal-at:N]]` sits in the objective, so every continuation repeats it: only the one
        // whose source is round N acts, and only while the goal (and so the tool) is offered.
        let entered_round = match &message.source {
            MessageSource::Goal { round, .. } if request.goal.is_some() => Some(*round),
            _ => None,
        };
        directives.extend(d.into_iter().filter(|d| match d {
            Directive::CompleteGoalAt { round } => entered_round == Some(*round),
            _ => true,
        }));
        if !text.is_empty() {
            texts.push(text);
        }
    }
    let text = if directives.contains(&Directive::System) {
        format!("system: {}", request.system.as_deref().unwrap_or_default())
    } else if !prompt.is_empty() && request.output.is_some() {
        // A structured turn (SPEC §20) gets the entered text as it is, so a test chooses what is judged.
        texts.join("\n")
    } else if !prompt.is_empty() {
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
    let mut usage = None;
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
            Directive::Usage { input, output } => {
                usage = Some(Usage { input_tokens: input, output_tokens: output, ..Usage::default() })
            }
            Directive::CompleteGoalAt { round } => tool_calls.push(ToolCallSpec {
                call_id: format!("call-{}-{}-{}", request.turn, request.step, tool_calls.len() + 1),
                name: GOAL_COMPLETE.to_owned(),
                arguments: format!(r#"{{"summary":"done in round {round}"}}"#),
            }),
            // Content-guard directives are for the pre-step hook, not the model.
            Directive::Reject | Directive::Drop | Directive::Rewrite { .. } | Directive::HookFail => {}
            // Only compaction requests look at it; the reply's text is already chosen.
            Directive::CompactFail | Directive::System => {}
        }
    }
    let chunks = if delay.is_zero() { FAST_CHUNKS } else { SLOW_CHUNKS };
    ScriptedPlan {
        deltas: split(&text, chunks),
        output: ModelOutput { text, tool_calls, max_tokens, reasoning: None, usage, model: None, invalid_output: None },
        delay,
        fail,
    }
}

/// The scripted summary of a compaction request (SPEC §13): `summary of turns A..B`, or a failure when a
/// user message among the summarized turns carries `[[compact-fail]]`.
fn compaction_plan(request: &ModelRequest, task: &CompactionTask) -> ScriptedPlan {
    let told_to_fail = request.history.iter().any(|entry| match entry.as_ref() {
        TranscriptEntry::User { message, .. } => directive::parse(&message.text()).0.contains(&Directive::CompactFail),
        _ => false,
    });
    let text = format!("summary of turns {}..{}", task.from_turn, task.upto_turn);
    ScriptedPlan {
        deltas: vec![text.clone()],
        output: ModelOutput::text(text),
        delay: Duration::ZERO,
        fail: told_to_fail.then(|| "the scripted model was told to fail compaction ([[compact-fail]])".to_owned()),
    }
}

/// Splits `text` at word boundaries into at most `max` non-empty pieces that concatenate to it.
fn split(text: &str, max: usize) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let per = words.len().div_ceil(max.max(1)).max(1);
    words.chunks(per).map(|c| c.concat()).filter(|s| !s.is_empty()).collect()
}

/// The content guard's verdict on a claimed batch, driven by `[[reject]]`, `[[drop]]`, `[[rewrite:TEXT]]`
/// and `[[hook-fail]]`.
pub fn judge(batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
    let mut entered = Vec::with_capacity(batch.len());
    let mut reject = false;
    for mut message in batch {
        let (directives, _) = directive::parse(&message.text());
        let mut keep = true;
        for d in directives {
            match d {
                Directive::HookFail => {
                    return Err(HookError {
                        hook: CONTENT_GUARD.into(),
                        message: format!("failed on message {} ([[hook-fail]])", message.id),
                    });
                }
                Directive::Reject => reject = true,
                Directive::Drop => keep = false,
                Directive::Rewrite { text } => message.content = vec![ContentBlock::text(text)].into(),
                _ => {}
            }
        }
        if keep {
            entered.push(message);
        }
    }
    Ok(if reject { HookVerdict::Reject { reason: None } } else { HookVerdict::Pass(entered) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_driver::ToolOutcome;

    fn request(messages: Vec<UserMessage>) -> ModelRequest {
        crate::fixtures::model_request("scripted", messages)
    }

    #[test]
    fn echoes_plain_text_in_deltas_that_concatenate() {
        let p = plan(&request(vec![UserMessage::user_text("a", "hello big world"), UserMessage::user_text("b", "x")]));
        assert_eq!(p.output.text, "echo: hello big world\nx");
        assert_eq!(p.deltas.concat(), p.output.text);
        assert!(p.deltas.len() > 1);
        assert!(p.output.tool_calls.is_empty());
    }

    /// `[[system]]` answers with the request's system prompt (SPEC §20: which agent version answered).
    #[test]
    fn the_system_directive_answers_with_the_system_prompt() {
        let mut r = request(vec![UserMessage::user_text("a", "[[system]] who are you?")]);
        r.system = Some("You are v2.".into());
        assert_eq!(plan(&r).output.text, "system: You are v2.");
        r.system = None;
        assert_eq!(plan(&r).output.text, "system: ");
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
        r.tool_results = vec![ToolOutcome::new("c", "echo", "hi".into(), None)];
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
