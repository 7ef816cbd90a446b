//! The conversation as an application reads it (SPEC §21 `GetTranscript`): each event of a session's log
//! as at most one [`TranscriptItem`], with the seq it came from (decision 0105). Apart from
//! [`crate::transcript`], the bounded history the model is sent, so that the event types can name that
//! history without a cycle between the two modules.

use std::collections::HashMap;

use crate::event::{Envelope, EventPayload, SpliceOutcome, TurnEndReason, Usage};
use crate::message::{MessageId, Target, UserMessage};
use crate::schedule::Preset;
use crate::turn::ToolCallSpec;

/// One item of the transcript an application reads (SPEC §21 `GetTranscript`): an event of the log as the
/// conversation shows it, with the seq it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranscriptItem {
    pub seq: u64,
    pub time_ms: u64,
    /// 0 for a message entered between turns.
    pub turn: u64,
    pub step: u32,
    pub kind: ItemKind,
}

/// What a [`TranscriptItem`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// A message entered into the conversation and the preset that delivered it, when the log shows it
    /// (not for a message a fork copied, nor when the read began after its insert).
    User { message: UserMessage, delivery: Option<Preset> },
    /// An `assistant/message`, as its event holds it.
    Assistant(EventPayload),
    /// A `tool/call`, with its arguments.
    ToolCall { call: ToolCallSpec, awaiting_approval: bool, awaiting_client: bool },
    /// A `tool/decision` on a call awaiting approval.
    ToolDecision { call_id: String, approved: bool, reason: String, timed_out: bool },
    /// A `tool/result`, with the name of its call when the read saw the call.
    ToolResult { call_id: String, name: String, output: String, error: Option<String> },
    /// A `turn/end` with the usage of the turn's model requests the read saw.
    TurnEnd { reason: TurnEndReason, usage: Usage },
}

/// Reads a session's log as [`TranscriptItem`]s, one event at a time in seq order. Not a second history
/// fold (the [`crate::transcript::Transcript`] is the history; it is bounded and keeps no seqs): each item is one event, and
/// the reader only remembers what an event needs from earlier ones — how a pending message was delivered,
/// the names of open calls, the running turn's usage — all bounded by the inbox and one turn.
#[derive(Clone, Debug, Default)]
pub struct TranscriptReader {
    deliveries: HashMap<MessageId, Preset>,
    call_names: HashMap<String, String>,
    turn_usage: Usage,
}

impl TranscriptReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// The item `event` is, if it is one; every event must pass through, in seq order.
    pub fn read(&mut self, event: &Envelope) -> Option<TranscriptItem> {
        let item = |turn: u64, step: u32, kind: ItemKind| {
            Some(TranscriptItem { seq: event.seq, time_ms: event.time_ms, turn, step, kind })
        };
        match &event.payload {
            EventPayload::InboxSpliced(splice) => {
                // An insert by a delivery carries no outcome and removes nothing (as the fold tells them).
                if splice.outcome == SpliceOutcome::None && splice.removed_count == 0 {
                    let target = splice.requested_target.unwrap_or(splice.target);
                    let preset = match (target, splice.wake) {
                        (Target::NextTurn, true) => Preset::Followup,
                        (Target::NextTurn, false) => Preset::Queue,
                        (Target::NextStep, true) => Preset::Steer,
                        (Target::NextStep, false) => Preset::Inject,
                    };
                    for m in &splice.inserted {
                        self.deliveries.insert(m.id.clone(), preset);
                    }
                } else if splice.outcome == SpliceOutcome::Canceled && self.deliveries.len() > MAX_REMEMBERED {
                    // Canceled messages never enter; forget everything rather than track which were.
                    self.deliveries.clear();
                }
                None
            }
            EventPayload::UserMessage { message, turn, step } => {
                // A message between turns is an inject written directly (SPEC §11).
                let delivery = self.deliveries.remove(&message.id).or((*turn == 0).then_some(Preset::Inject));
                item(*turn, *step, ItemKind::User { message: message.clone(), delivery })
            }
            EventPayload::AssistantMessage { turn, step, usage, .. } => {
                if let Some(usage) = usage {
                    self.turn_usage.add(usage);
                }
                item(*turn, *step, ItemKind::Assistant(event.payload.clone()))
            }
            EventPayload::ToolCall { turn, step, call, awaiting_approval, awaiting_client } => {
                self.call_names.insert(call.call_id.clone(), call.name.clone());
                let kind = ItemKind::ToolCall {
                    call: call.clone(),
                    awaiting_approval: *awaiting_approval,
                    awaiting_client: *awaiting_client,
                };
                item(*turn, *step, kind)
            }
            EventPayload::ToolDecision { turn, step, call_id, approved, reason, timed_out } => {
                let kind = ItemKind::ToolDecision {
                    call_id: call_id.clone(),
                    approved: *approved,
                    reason: reason.clone(),
                    timed_out: *timed_out,
                };
                item(*turn, *step, kind)
            }
            EventPayload::ToolResult { turn, step, call_id, output, error } => {
                let name = self.call_names.remove(call_id).unwrap_or_default();
                let kind = ItemKind::ToolResult {
                    call_id: call_id.clone(),
                    name,
                    output: output.clone(),
                    error: error.clone(),
                };
                item(*turn, *step, kind)
            }
            EventPayload::TurnStart { .. } => {
                self.turn_usage = Usage::default();
                None
            }
            EventPayload::TurnEnd { turn, reason } => {
                self.call_names.clear();
                let usage = std::mem::take(&mut self.turn_usage);
                item(*turn, 0, ItemKind::TurnEnd { reason: reason.clone(), usage })
            }
            _ => None,
        }
    }
}

/// Deliveries remembered before canceled ones are forgotten wholesale: well above the pending limit of a
/// session (1,000 by default), so only a log of many canceled messages ever reaches it.
const MAX_REMEMBERED: usize = 10_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::SessionRef;

    #[test]
    fn the_reader_names_deliveries_calls_and_sums_a_turns_usage() {
        use crate::event::{Splice, Usage};
        let session = SessionRef::new("t", "s").unwrap_or_else(|e| panic!("{e}"));
        let events = [
            EventPayload::InboxSpliced(Splice {
                target: Target::NextStep,
                start: 0,
                removed_count: 0,
                inserted: vec![UserMessage::user_text("s1", "steer")],
                outcome: SpliceOutcome::None,
                wake: true,
                requested_target: None,
                deadline: None,
            }),
            EventPayload::TurnStart { turn: 1 },
            EventPayload::UserMessage { message: UserMessage::user_text("s1", "steer"), turn: 1, step: 1 },
            EventPayload::ToolCall {
                turn: 1,
                step: 1,
                call: ToolCallSpec { call_id: "c".into(), name: "echo".into(), arguments: "{}".into() },
                awaiting_approval: false,
                awaiting_client: false,
            },
            EventPayload::ToolResult { turn: 1, step: 1, call_id: "c".into(), output: "ok".into(), error: None },
            EventPayload::AssistantMessage {
                turn: 1,
                step: 2,
                text: "done".into(),
                tool_calls: vec![],
                interrupted: false,
                max_tokens: false,
                reasoning: None,
                usage: Some(Usage { input_tokens: 3, output_tokens: 2, ..Usage::default() }),
                model: None,
            },
            EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed },
        ];
        let mut reader = TranscriptReader::new();
        let items: Vec<TranscriptItem> = events
            .into_iter()
            .enumerate()
            .filter_map(|(i, payload)| {
                let seq = i as u64 + 1;
                reader.read(&Envelope { session: session.clone(), seq, time_ms: seq, epoch: 1, payload })
            })
            .collect();
        assert_eq!(items.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![3, 4, 5, 6, 7]);
        assert!(matches!(&items[0].kind, ItemKind::User { delivery: Some(Preset::Steer), .. }));
        assert!(matches!(&items[2].kind, ItemKind::ToolResult { name, .. } if name == "echo"));
        assert!(
            matches!(&items[4].kind, ItemKind::TurnEnd { usage, .. } if usage.input_tokens == 3 && usage.output_tokens == 2)
        );
    }
}
