//! Client tools of a turn (SPEC §19): tools a protocol request declares for its caller to run (OpenAI
//! function tools, AG-UI frontend tools).
//!
//! A message carries the declaration as a data block of mime [`TURN_TOOLS_MIME`] (a JSON list of
//! [`TurnTool`]), so the declaration is as durable as the message: any owner, after any failover, reads the
//! same tools from the messages the turn entered. The model is offered them beside the agent's own tools
//! and never sees the block itself. A call of one is written `tool/call {awaiting_client}`; nothing runs it
//! server-side, and the turn waits for `CompleteToolCall` to give its result (decision 0113).
//!
//! ```
//! use turnstile_model::turn_tools::{self, TurnTool};
//! use turnstile_model::{ContentBlock, UserMessage};
//!
//! let tool = TurnTool { name: "get_weather".into(), description: "today's weather".into(), parameters: serde_json::json!({"type": "object"}) };
//! let mut message = UserMessage::user_text("m1", "weather in Paris?");
//! message.push_block(turn_tools::block(&[tool.clone()]));
//! assert_eq!(turn_tools::declared([&message]), vec![tool]);
//! assert_eq!(message.text(), "weather in Paris?");
//! ```

use serde::{Deserialize, Serialize};

use crate::message::{ContentBlock, UserMessage};
use crate::transcript::TranscriptEntry;

/// The mime of the data block that declares a message's client tools.
pub const TURN_TOOLS_MIME: &str = "application/vnd.turnstile.turn-tools+json";

/// One client tool of a turn, as the model is offered it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the arguments.
    #[serde(default = "any_object")]
    pub parameters: serde_json::Value,
}

fn any_object() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

/// The data block that declares `tools`.
pub fn block(tools: &[TurnTool]) -> ContentBlock {
    // A list of plain structs always serializes.
    let bytes = serde_json::to_vec(tools).unwrap_or_default();
    ContentBlock::Data { mime: TURN_TOOLS_MIME.to_owned(), bytes }
}

/// Whether `block` declares client tools (and so is not shown to the model as content).
pub fn is_declaration(block: &ContentBlock) -> bool {
    matches!(block, ContentBlock::Data { mime, .. } if mime == TURN_TOOLS_MIME)
}

/// The client tools `messages` declare, in order; a later declaration of a name replaces an earlier one.
/// A block that does not parse declares nothing (the gateway's adapters only write well-formed ones).
pub fn declared<'a>(messages: impl IntoIterator<Item = &'a UserMessage>) -> Vec<TurnTool> {
    let mut tools: Vec<TurnTool> = Vec::new();
    for message in messages {
        for block in message.content.iter() {
            let ContentBlock::Data { mime, bytes } = block else { continue };
            if mime != TURN_TOOLS_MIME {
                continue;
            }
            for tool in serde_json::from_slice::<Vec<TurnTool>>(bytes).unwrap_or_default() {
                match tools.iter_mut().find(|t| t.name == tool.name) {
                    Some(same) => *same = tool,
                    None => tools.push(tool),
                }
            }
        }
    }
    tools
}

/// The client tools of turn `turn`, from the session's transcript `entries` and the messages `entering` the
/// step being asked for: those the turn's messages declare ([`turn_messages`]).
pub fn of_turn<'a>(
    entries: impl IntoIterator<Item = &'a TranscriptEntry>,
    turn: u64,
    entering: &'a [UserMessage],
) -> Vec<TurnTool> {
    declared(turn_messages(entries, turn, entering))
}

/// The messages whose declarations hold for turn `turn` (its client tools, its output schema): those the
/// turn entered, from the session's transcript `entries`, then the messages `entering` the step being asked
/// for. A turn that entered no message of its own (one resumed after a failover, SPEC §6, which answers the
/// prompt of the turn it repairs) has those of the latest turn before it that did.
pub fn turn_messages<'a>(
    entries: impl IntoIterator<Item = &'a TranscriptEntry>,
    turn: u64,
    entering: &'a [UserMessage],
) -> Vec<&'a UserMessage> {
    let entered: Vec<(u64, &UserMessage)> = entries
        .into_iter()
        .filter_map(|e| match e {
            TranscriptEntry::User { turn: t, message, .. } if (1..=turn).contains(t) => Some((*t, message)),
            _ => None,
        })
        .collect();
    let own = if entering.is_empty() { entered.iter().map(|(t, _)| *t).max() } else { Some(turn) };
    entered.iter().filter(|(t, _)| Some(*t) == own).map(|(_, m)| *m).chain(entering).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_declarations_replace_earlier_ones_and_bad_blocks_declare_nothing() {
        let tool = |name: &str, description: &str| TurnTool {
            name: name.into(),
            description: description.into(),
            parameters: any_object(),
        };
        let mut a = UserMessage::user_text("a", "x");
        a.push_block(block(&[tool("t1", "old"), tool("t2", "")]));
        let mut b = UserMessage::user_text("b", "y");
        b.push_block(block(&[tool("t1", "new")]));
        b.push_block(ContentBlock::Data { mime: TURN_TOOLS_MIME.into(), bytes: b"not json".to_vec() });
        assert_eq!(declared([&a, &b]), vec![tool("t1", "new"), tool("t2", "")]);
        assert!(is_declaration(&b.content[1]));
        assert!(!is_declaration(&b.content[0]));
        let parsed: Vec<TurnTool> = serde_json::from_str(r#"[{"name": "n"}]"#).unwrap();
        assert_eq!(parsed, vec![tool("n", "")]);
    }

    #[test]
    fn a_turn_has_its_own_declarations_and_a_resumed_turn_those_of_the_turn_it_resumes() {
        let tool = |name: &str| TurnTool { name: name.into(), description: String::new(), parameters: any_object() };
        let declaring = |id: &str, name: &str| {
            let mut m = UserMessage::user_text(id, "x");
            m.push_block(block(&[tool(name)]));
            m
        };
        let user = |turn, message| TranscriptEntry::User { turn, step: 1, message };
        let entries =
            [user(0, declaring("o", "out_of_turn")), user(1, declaring("a", "one")), user(2, declaring("b", "two"))];
        assert_eq!(of_turn(&entries, 2, &[]), vec![tool("two")]);
        assert_eq!(of_turn(&entries, 1, &[]), vec![tool("one")]);
        // Turn 3 entered nothing yet: resumed after turn 2, it has turn 2's tools; entering a message, its own.
        assert_eq!(of_turn(&entries, 3, &[]), vec![tool("two")]);
        assert_eq!(of_turn(&entries, 3, &[declaring("c", "three")]), vec![tool("three")]);
        assert_eq!(of_turn(&entries[..1], 1, &[]), vec![]);
    }
}
