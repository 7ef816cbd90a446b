//! The scorers of an evaluation (SPEC §20): each gives a reply a value from 0 to 1 and says whether it
//! passed. `exact`, `contains` and `json_schema` are computed here; the judge and the hook ask someone
//! else (`judge.rs`, `hook.rs`) and only their answers are read here.

use std::sync::Arc;

use tonic::Status;
use turnstile_config::output::OutputValidator;
use turnstile_model::output::OutputSchema;
use turnstile_proto::v1 as pb;

use crate::status;

/// A score at or above this passes.
pub(crate) const PASS: f64 = 0.5;

/// The judge's scale: it answers 0 to this, and its score is the answer over it.
pub(crate) const JUDGE_SCALE: f64 = 10.0;

/// A checked scorer.
#[derive(Clone)]
pub(crate) enum Scorer {
    Exact,
    /// Empty `texts`: the recorded reply is the one text.
    Contains {
        texts: Vec<String>,
        ignore_case: bool,
    },
    JsonSchema(Arc<OutputValidator>),
    Judge {
        agent: String,
        version: Option<u64>,
        instructions: String,
    },
    Hook {
        url: String,
        timeout_ms: u64,
    },
}

impl std::fmt::Debug for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The longest `contains` text and the most of them.
pub(crate) const MAX_TEXT_BYTES: usize = 4096;
pub(crate) const MAX_TEXTS: usize = 32;
/// `hook.timeout_ms` when 0, and the longest.
pub(crate) const DEFAULT_HOOK_TIMEOUT_MS: u64 = 10_000;
pub(crate) const MAX_HOOK_TIMEOUT_MS: u64 = 60_000;

impl Scorer {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Contains { .. } => "contains",
            Self::JsonSchema(_) => "json_schema",
            Self::Judge { .. } => "judge",
            Self::Hook { .. } => "hook",
        }
    }

    /// Whether the recorded reply is the reference the new one is compared with, so it gets no score.
    pub(crate) fn is_reference_based(&self) -> bool {
        matches!(self, Self::Exact) || matches!(self, Self::Contains { texts, .. } if texts.is_empty())
    }

    /// The request's scorer, checked: INVALID_ARGUMENT naming the field. The judge's agent and the hook's
    /// URL are checked by the caller, which knows the tenant's agents and the egress rule.
    pub(crate) fn from_request(raw: Option<pb::EvalScorer>) -> Result<Self, Status> {
        use pb::eval_scorer::Kind;
        let Some(kind) = raw.and_then(|s| s.kind) else { return Ok(Self::Exact) };
        Ok(match kind {
            Kind::Exact(_) => Self::Exact,
            Kind::Contains(c) => {
                if c.texts.len() > MAX_TEXTS {
                    return Err(Status::invalid_argument(format!(
                        "scorer.contains.texts: {} texts is over the limit of {MAX_TEXTS}",
                        c.texts.len()
                    )));
                }
                if let Some((i, t)) = c.texts.iter().enumerate().find(|(_, t)| t.is_empty() || t.len() > MAX_TEXT_BYTES)
                {
                    return Err(Status::invalid_argument(format!(
                        "scorer.contains.texts[{i}]: is {} bytes; give 1 to {MAX_TEXT_BYTES} bytes",
                        t.len()
                    )));
                }
                Self::Contains { texts: c.texts, ignore_case: c.ignore_case }
            }
            Kind::JsonSchema(s) => {
                let schema = serde_json::from_str(&s.schema_json).map_err(|e| {
                    Status::invalid_argument(format!(
                        "scorer.json_schema.schema_json: not JSON ({e}); give the JSON Schema as JSON text"
                    ))
                })?;
                let validator = OutputValidator::new(&OutputSchema::new("eval", schema))
                    .map_err(|p| Status::invalid_argument(format!("scorer.json_schema.schema_json: {}", p.why)))?;
                Self::JsonSchema(Arc::new(validator))
            }
            Kind::Judge(j) => {
                if j.agent.is_empty() {
                    return Err(Status::invalid_argument(
                        "scorer.judge.agent: is empty; name the agent that judges (ListAgents lists yours)",
                    ));
                }
                Self::Judge {
                    agent: j.agent,
                    version: (j.version > 0).then_some(j.version),
                    instructions: j.instructions,
                }
            }
            Kind::Hook(h) => {
                let timeout_ms = status::bounded(
                    "scorer.hook.timeout_ms",
                    h.timeout_ms,
                    DEFAULT_HOOK_TIMEOUT_MS,
                    MAX_HOOK_TIMEOUT_MS,
                )?;
                Self::Hook { url: h.url, timeout_ms }
            }
        })
    }
}

pub(crate) fn score(value: f64, note: impl Into<String>) -> pb::EvalScore {
    let value = value.clamp(0.0, 1.0);
    pb::EvalScore { value, passed: value >= PASS, note: note.into() }
}

/// `exact`: the new reply equals the recorded one, white space at the ends aside.
pub(crate) fn exact(reply: &str, recorded: &str) -> pb::EvalScore {
    if reply.trim() == recorded.trim() { score(1.0, "") } else { score(0.0, "differs from the recorded reply") }
}

/// `contains`: the share of `texts` the reply holds (without texts: whether it holds the recorded reply).
pub(crate) fn contains(reply: &str, recorded: &str, texts: &[String], ignore_case: bool) -> pb::EvalScore {
    let fold = |s: &str| if ignore_case { s.to_lowercase() } else { s.to_owned() };
    let haystack = fold(reply);
    if texts.is_empty() {
        return if haystack.contains(&fold(recorded.trim())) {
            score(1.0, "")
        } else {
            score(0.0, "does not hold the recorded reply")
        };
    }
    let missing: Vec<String> =
        texts.iter().filter(|t| !haystack.contains(&fold(t))).map(|t| format!("{t:?}")).collect();
    let value = (texts.len() - missing.len()) as f64 / texts.len() as f64;
    let note = if missing.is_empty() { String::new() } else { format!("lacks {}", missing.join(", ")) };
    score(value, note)
}

/// `json_schema`: the reply is JSON that matches.
pub(crate) fn json_schema(reply: &str, validator: &OutputValidator) -> pb::EvalScore {
    match validator.check(reply) {
        Ok(()) => score(1.0, ""),
        Err(why) => score(0.0, why),
    }
}

/// The output schema the judge's turn asks for: `{"score": 0..10}`.
pub(crate) fn judge_schema() -> OutputSchema {
    OutputSchema::new(
        "score",
        serde_json::json!({
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 0, "maximum": JUDGE_SCALE as u64}},
            "required": ["score"]
        }),
    )
}

/// What the judge is asked.
pub(crate) fn judge_prompt(instructions: &str, input: &str, reply: &str) -> String {
    let instructions =
        if instructions.is_empty() { "a good reply is helpful, correct and on topic" } else { instructions };
    format!(
        "Score the assistant's reply to the user's message from 0 (useless) to {scale} (perfect); {instructions}.\n\
         Answer only with JSON: {{\"score\": N}}.\n\nUser's message:\n{input}\n\nAssistant's reply:\n{reply}\n",
        scale = JUDGE_SCALE as u64
    )
}

/// The judge's answer read: `{"score": N}`, else the first number in its text; N over the scale.
pub(crate) fn judge_answer(answer: &str) -> pb::EvalScore {
    let from_json = serde_json::from_str::<serde_json::Value>(answer.trim())
        .ok()
        .and_then(|v| v.get("score").and_then(serde_json::Value::as_f64));
    let number = from_json.or_else(|| first_number(answer));
    match number {
        Some(n) => score(n / JUDGE_SCALE, format!("judge: {}", answer.trim())),
        None => score(0.0, format!("the judge gave no score: {:?}", answer.trim())),
    }
}

fn first_number(text: &str) -> Option<f64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].trim_end_matches('.').parse().ok()
}

/// The hook's answer read: `{"score": 0..1, "note"?}`.
pub(crate) fn hook_answer(body: &[u8]) -> Result<pb::EvalScore, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the hook's answer is not JSON ({e})"))?;
    let value_of = value.get("score").and_then(serde_json::Value::as_f64);
    let Some(v) = value_of.filter(|v| (0.0..=1.0).contains(v)) else {
        return Err("the hook's answer has no \"score\" from 0 to 1".into());
    };
    let note = value.get("note").and_then(serde_json::Value::as_str).unwrap_or_default();
    Ok(score(v, note))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn exact_ignores_the_ends_only() {
        assert_eq!(exact(" echo: hi\n", "echo: hi").value, 1.0);
        let differs = exact("echo: Hi", "echo: hi");
        assert_eq!((differs.value, differs.passed), (0.0, false));
    }

    #[test]
    fn contains_counts_the_share_of_texts_held() {
        let texts = vec!["Paris".to_owned(), "France".to_owned()];
        let half = contains("Paris is nice", "", &texts, false);
        assert_eq!((half.value, half.passed, half.note.as_str()), (0.5, true, "lacks \"France\""));
        assert_eq!(contains("paris, france", "", &texts, true).value, 1.0);
        assert_eq!(contains("paris, france", "", &texts, false).value, 0.0);
        // Without texts the recorded reply is the text.
        assert_eq!(contains("well: echo: hi!", "echo: hi", &[], false).value, 1.0);
        assert_eq!(contains("no", "echo: hi", &[], false).note, "does not hold the recorded reply");
    }

    #[test]
    fn a_schema_scores_json_that_matches() {
        let raw = pb::EvalScorer {
            kind: Some(pb::eval_scorer::Kind::JsonSchema(pb::JsonSchemaScorer {
                schema_json: r#"{"type": "object", "required": ["city"]}"#.into(),
            })),
        };
        let Scorer::JsonSchema(v) = Scorer::from_request(Some(raw)).unwrap() else { panic!("not a schema") };
        assert_eq!(json_schema(r#"{"city": "Paris"}"#, &v).value, 1.0);
        let prose = json_schema("Paris", &v);
        assert_eq!(prose.value, 0.0);
        assert!(prose.note.starts_with("the reply is not JSON"), "{}", prose.note);
        let bad = pb::EvalScorer {
            kind: Some(pb::eval_scorer::Kind::JsonSchema(pb::JsonSchemaScorer { schema_json: "{".into() })),
        };
        let e = Scorer::from_request(Some(bad)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("scorer.json_schema.schema_json: not JSON"), "{}", e.message());
    }

    #[test]
    fn the_judges_answer_is_read_as_json_else_its_first_number() {
        assert_eq!(judge_answer(r#"{"score": 8}"#).value, 0.8);
        assert_eq!(judge_answer("I'd give it 3/10.").value, 0.3);
        assert_eq!(judge_answer("I'd give it 30.").value, 1.0);
        let none = judge_answer("great");
        assert_eq!((none.value, none.passed), (0.0, false));
    }

    #[test]
    fn the_hooks_answer_needs_a_score_from_0_to_1() {
        let s = hook_answer(br#"{"score": 0.75, "note": "close"}"#).unwrap();
        assert_eq!((s.value, s.passed, s.note.as_str()), (0.75, true, "close"));
        assert!(hook_answer(br#"{"score": 7}"#).is_err());
        assert!(hook_answer(b"ok").is_err());
    }
}
