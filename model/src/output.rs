//! Structured output (SPEC §20): the JSON Schema a turn's final reply must match.
//!
//! A schema comes from the agent's profile (`[agents.NAME.output]`) or from the turn itself: the message
//! that opens it carries the schema as a data block of mime [`OUTPUT_SCHEMA_MIME`] (what the gateway writes
//! for a request's `output_schema`), so the schema is as durable as the message and every owner, after any
//! failover, reads the same one. The model never sees the block as content. A turn's own schema wins over
//! its agent's ([`of_turn`]).
//!
//! ```
//! use turnstile_model::output::{self, OutputSchema};
//! use turnstile_model::UserMessage;
//!
//! let schema = OutputSchema::new("answer", serde_json::json!({"type": "object", "required": ["city"]}));
//! let mut message = UserMessage::user_text("m1", "Where is the Louvre?");
//! message.push_block(output::block(&schema));
//! assert_eq!(output::declared([&message]), Some(schema));
//! assert_eq!(message.text(), "Where is the Louvre?");
//! ```

use serde::{Deserialize, Serialize};

use crate::message::{ContentBlock, UserMessage};
use crate::transcript::TranscriptEntry;

/// The mime of the data block that gives a turn its output schema.
pub const OUTPUT_SCHEMA_MIME: &str = "application/vnd.turnstile.output-schema+json";

/// The `turn/end` error code of a turn whose final reply did not match its schema, after one retry.
pub const INVALID_OUTPUT: &str = "invalid_output";

/// The JSON Schema a final reply must match, with the name providers show the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSchema {
    /// The schema's name (`[A-Za-z0-9_-]{1,64}`): OpenAI's `json_schema.name`, Anthropic's output tool.
    pub name: String,
    /// The JSON Schema (draft 2020-12 unless it names another with `$schema`).
    pub schema: serde_json::Value,
    /// Asks OpenAI-compatible providers for strict schema adherence (`json_schema.strict`), which allows
    /// only a subset of JSON Schema. The reply is validated either way.
    #[serde(default)]
    pub strict: bool,
}

impl OutputSchema {
    /// A schema named `name`, not strict.
    pub fn new(name: impl Into<String>, schema: serde_json::Value) -> Self {
        Self { name: name.into(), schema, strict: false }
    }
}

/// The data block that gives a turn `schema`.
pub fn block(schema: &OutputSchema) -> ContentBlock {
    // A struct of a string, a JSON value and a bool always serializes.
    let bytes = serde_json::to_vec(schema).unwrap_or_default();
    ContentBlock::Data { mime: OUTPUT_SCHEMA_MIME.to_owned(), bytes }
}

/// Whether `block` gives an output schema (and so is not shown to the model as content).
pub fn is_declaration(block: &ContentBlock) -> bool {
    matches!(block, ContentBlock::Data { mime, .. } if mime == OUTPUT_SCHEMA_MIME)
}

/// The schema `messages` give: the last well-formed declaration. A block that does not parse gives
/// nothing (the gateway checks the schemas it writes).
pub fn declared<'a>(messages: impl IntoIterator<Item = &'a UserMessage>) -> Option<OutputSchema> {
    messages
        .into_iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|block| match block {
            ContentBlock::Data { mime, bytes } if mime == OUTPUT_SCHEMA_MIME => serde_json::from_slice(bytes).ok(),
            _ => None,
        })
        .last()
}

/// The output schema of turn `turn`: the one its messages declare ([`crate::turn_tools::turn_messages`]),
/// else `agent`'s.
pub fn of_turn<'a>(
    entries: impl IntoIterator<Item = &'a TranscriptEntry>,
    turn: u64,
    entering: &'a [UserMessage],
    agent: Option<&OutputSchema>,
) -> Option<OutputSchema> {
    declared(crate::turn_tools::turn_messages(entries, turn, entering)).or_else(|| agent.cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_own_schema_wins_over_its_agents_and_holds_for_its_later_steps() {
        let own = OutputSchema::new("own", serde_json::json!({"type": "object"}));
        let agent = OutputSchema::new("agent", serde_json::json!({"type": "string"}));
        let mut declaring = UserMessage::user_text("a", "x");
        declaring.push_block(block(&own));
        let plain = UserMessage::user_text("b", "y");
        let user = |turn, step, message| TranscriptEntry::User { turn, step, message };
        let entries = [user(1, 1, declaring.clone()), user(2, 1, plain.clone())];
        assert_eq!(of_turn(&entries, 1, &[], Some(&agent)), Some(own.clone()));
        assert_eq!(of_turn(&entries, 2, &[], Some(&agent)), Some(agent.clone()));
        assert_eq!(of_turn(&entries, 2, &[], None), None);
        // A later step of turn 1 entering another message keeps the turn's schema.
        assert_eq!(of_turn(&entries[..1], 1, std::slice::from_ref(&plain), None), Some(own));
        let mut bad = UserMessage::user_text("c", "z");
        bad.push_block(ContentBlock::Data { mime: OUTPUT_SCHEMA_MIME.into(), bytes: b"not json".to_vec() });
        assert_eq!(declared([&bad]), None);
        assert!(is_declaration(&bad.content[1]) && !is_declaration(&bad.content[0]));
    }
}
