//! What one turn of a log was: its input, its reply, the tools it called, its tokens and its time, read
//! from the durable events alone (so the recorded turn and the scratch session's are read the same way).

use std::collections::BTreeMap;

use turnstile_model::message::UserMessage;
use turnstile_model::{Envelope, EventPayload};
use turnstile_proto::v1 as pb;

/// One ended turn, as its events tell it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TurnRecord {
    pub(crate) turn: u64,
    /// The messages that entered its first step: what a rerun delivers.
    pub(crate) input: Vec<UserMessage>,
    /// The text of its last reply (the final answer after any tool rounds).
    pub(crate) reply: String,
    /// The tools it called, in order.
    pub(crate) tools: Vec<String>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) duration_ms: u64,
    pub(crate) end_reason: String,
}

impl TurnRecord {
    /// The input as text: each message's text, one a line.
    pub(crate) fn input_text(&self) -> String {
        self.input.iter().map(UserMessage::text).collect::<Vec<_>>().join("\n")
    }

    /// The reply on the wire, with `score` (absent for a reference).
    pub(crate) fn encode(&self, score: Option<pb::EvalScore>) -> pb::EvalReply {
        pb::EvalReply {
            text: self.reply.clone(),
            tools: self.tools.clone(),
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            duration_ms: self.duration_ms,
            end_reason: self.end_reason.clone(),
            score,
        }
    }
}

/// Every turn of `events` that ended, by number. A turn whose start is not in `events` (a fork's copied
/// turns live in its `session/forked`) is not one.
pub(crate) fn ended_turns(events: &[Envelope]) -> BTreeMap<u64, TurnRecord> {
    let mut open: BTreeMap<u64, (u64, TurnRecord)> = BTreeMap::new();
    let mut ended = BTreeMap::new();
    for event in events {
        match &event.payload {
            EventPayload::TurnStart { turn } => {
                open.insert(*turn, (event.time_ms, TurnRecord { turn: *turn, ..TurnRecord::default() }));
            }
            EventPayload::UserMessage { message, turn, step: 1 } => {
                if let Some((_, record)) = open.get_mut(turn) {
                    record.input.push(message.clone());
                }
            }
            EventPayload::AssistantMessage { turn, text, usage, .. } => {
                if let Some((_, record)) = open.get_mut(turn) {
                    record.reply = text.clone();
                    if let Some(usage) = usage {
                        record.input_tokens += usage.input_tokens;
                        record.output_tokens += usage.output_tokens;
                    }
                }
            }
            EventPayload::ToolCall { turn, call, .. } => {
                if let Some((_, record)) = open.get_mut(turn) {
                    record.tools.push(call.name.clone());
                }
            }
            EventPayload::TurnEnd { turn, reason } => {
                if let Some((started, mut record)) = open.remove(turn) {
                    record.duration_ms = event.time_ms.saturating_sub(started);
                    record.end_reason = reason.to_string();
                    ended.insert(*turn, record);
                }
            }
            _ => {}
        }
    }
    ended
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use turnstile_model::message::SessionRef;
    use turnstile_model::turn::{ToolCallSpec, TurnEndReason};
    use turnstile_model::{ModelRef, Usage};

    use super::*;

    fn at(seq: u64, time_ms: u64, payload: EventPayload) -> Envelope {
        Envelope { session: SessionRef::new("t", "s").unwrap(), seq, time_ms, epoch: 1, payload }
    }

    fn reply(turn: u64, step: u32, text: &str, tokens: (u64, u64), calls: Vec<ToolCallSpec>) -> EventPayload {
        EventPayload::AssistantMessage {
            turn,
            step,
            text: text.into(),
            tool_calls: calls,
            interrupted: false,
            max_tokens: false,
            reasoning: None,
            usage: Some(Usage { input_tokens: tokens.0, output_tokens: tokens.1, ..Usage::default() }),
            model: None::<ModelRef>,
        }
    }

    #[test]
    fn a_turn_is_its_first_steps_input_its_last_reply_its_calls_tokens_and_time() {
        let call = ToolCallSpec { call_id: "c1".into(), name: "echo".into(), arguments: "hi".into() };
        let events = vec![
            at(1, 1000, EventPayload::TurnStart { turn: 1 }),
            at(2, 1001, EventPayload::UserMessage { message: UserMessage::user_text("m1", "q1"), turn: 1, step: 1 }),
            at(3, 1002, reply(1, 1, "", (10, 2), vec![call.clone()])),
            at(
                4,
                1003,
                EventPayload::ToolCall { turn: 1, step: 1, call, awaiting_approval: false, awaiting_client: false },
            ),
            at(5, 1004, EventPayload::UserMessage { message: UserMessage::user_text("m2", "steer"), turn: 1, step: 2 }),
            at(6, 1005, reply(1, 2, "the answer", (20, 3), vec![])),
            at(7, 1250, EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed }),
            // Turn 2 never ends in this log.
            at(8, 1300, EventPayload::TurnStart { turn: 2 }),
        ];
        let turns = ended_turns(&events);
        assert_eq!(turns.keys().copied().collect::<Vec<_>>(), [1]);
        let t = &turns[&1];
        assert_eq!(t.input_text(), "q1");
        assert_eq!(t.reply, "the answer");
        assert_eq!(t.tools, ["echo"]);
        assert_eq!((t.input_tokens, t.output_tokens, t.duration_ms), (30, 5, 250));
        assert_eq!(t.end_reason, "completed");
    }
}
