//! The conversation history of a session (SPEC §8): what a model request is built from.
//!
//! The [`Transcript`] is part of the fold ([`crate::SessionState`]) so that every owner and every snapshot
//! hold the same history without reading the whole log again. It keeps whole turns only, and at most
//! [`Transcript::keep_turns`] turns before the newest one, so a snapshot of a long session stays bounded
//! (decision record 0009): a model request never needs more than its agent's `history_turns` whole turns
//! before the current one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::event::{Envelope, EventPayload, SpliceOutcome, ToolCallSpec, TurnEndReason, Usage};
use crate::message::{MessageId, Target, UserMessage};
use crate::schedule::Preset;

/// Turns kept before the newest one when nothing else is configured (the agents' default `history_turns`).
pub const DEFAULT_TRANSCRIPT_TURNS: u32 = 100;

/// Entries kept of one run of out-of-turn messages (turn 0, between two turns; SPEC §11), oldest dropped
/// first. Such a run is one group and would otherwise grow without bound on a session that only ever
/// receives idle injects, and with it every snapshot (decision 0020). A turn enters at most `max_pending`
/// messages (default 1,000) at once; a run between turns is held to the same size. Its entries are all
/// user messages, so dropping single entries never separates a tool call from its result.
pub const MAX_BETWEEN_TURN_ENTRIES: usize = 1_000;

/// Entries kept in all: older whole turns are dropped while the kept ones hold more (never the newest
/// turn). 101 turns of a busy session, each with up to 1,000 out-of-turn messages between them, would
/// otherwise make the owner's snapshot tens of MiB (decision 0020); 10,000 entries is far more history
/// than any model context holds.
pub const MAX_TRANSCRIPT_ENTRIES: usize = 10_000;

/// One entry of the history, in log order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TranscriptEntry {
    /// A `user/message`: a message entered into a step.
    User { turn: u64, step: u32, message: UserMessage },
    /// An `assistant/message`: text and tool calls; an interrupted one holds what was delivered.
    Assistant { turn: u64, step: u32, text: String, tool_calls: Vec<ToolCallSpec>, interrupted: bool },
    /// A `tool/result` answering the call `call_id` (named `name`) of the same turn.
    ToolResult { turn: u64, step: u32, call_id: String, name: String, output: String, error: Option<String> },
}

impl TranscriptEntry {
    pub fn turn(&self) -> u64 {
        match self {
            Self::User { turn, .. } | Self::Assistant { turn, .. } | Self::ToolResult { turn, .. } => *turn,
        }
    }

    pub fn step(&self) -> u32 {
        match self {
            Self::User { step, .. } | Self::Assistant { step, .. } | Self::ToolResult { step, .. } => *step,
        }
    }

    /// The entry asks for or answers the tool call `call_id`.
    pub fn mentions_call(&self, call_id: &str) -> bool {
        match self {
            Self::User { .. } => false,
            Self::Assistant { tool_calls, .. } => tool_calls.iter().any(|c| c.call_id == call_id),
            Self::ToolResult { call_id: id, .. } => id == call_id,
        }
    }
}

/// The entries of one turn (or of one run of between-turn entries, turn 0), in log order. Shared: every
/// model request carries the history before its step, and copying a long session's entries for each
/// step was the largest cost of a turn (docs/BENCHMARKS.md); serialized as the entries themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptTurn {
    pub turn: u64,
    pub entries: Vec<Arc<TranscriptEntry>>,
}

/// The bounded history: whole turns, the newest plus at most `keep_turns` before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transcript {
    turns: VecDeque<TranscriptTurn>,
    keep_turns: u32,
}

impl Default for Transcript {
    fn default() -> Self {
        Self::new(DEFAULT_TRANSCRIPT_TURNS)
    }
}

impl Transcript {
    pub fn new(keep_turns: u32) -> Self {
        Self { turns: VecDeque::new(), keep_turns }
    }

    /// How many whole turns are kept before the newest one.
    pub fn keep_turns(&self) -> u32 {
        self.keep_turns
    }

    /// Changes the bound; a smaller one drops the oldest whole turns at once. What was dropped cannot come
    /// back from the transcript (only from the log), so owners set the bound once, at load.
    pub fn set_keep_turns(&mut self, keep_turns: u32) {
        self.keep_turns = keep_turns;
        self.trim();
    }

    /// The kept turns, oldest first.
    pub fn turns(&self) -> impl Iterator<Item = &TranscriptTurn> {
        self.turns.iter()
    }

    /// Every kept entry, in log order.
    pub fn entries(&self) -> impl Iterator<Item = &TranscriptEntry> {
        self.turns.iter().flat_map(|t| t.entries.iter().map(Arc::as_ref))
    }

    /// Appends one entry (the fold calls this in log order).
    pub(crate) fn push(&mut self, entry: TranscriptEntry) {
        let entry = Arc::new(entry);
        match self.turns.back_mut() {
            Some(last) if last.turn == entry.turn() => {
                last.entries.push(entry);
                if last.turn == 0 && last.entries.len() > MAX_BETWEEN_TURN_ENTRIES {
                    let excess = last.entries.len() - MAX_BETWEEN_TURN_ENTRIES;
                    last.entries.drain(..excess);
                }
            }
            _ => {
                self.turns.push_back(TranscriptTurn { turn: entry.turn(), entries: vec![entry] });
                self.trim();
            }
        }
    }

    fn trim(&mut self) {
        let keep = usize::try_from(self.keep_turns).unwrap_or(usize::MAX).saturating_add(1);
        while self.turns.len() > keep {
            self.turns.pop_front();
        }
        let mut entries: usize = self.turns.iter().map(|t| t.entries.len()).sum();
        while entries > MAX_TRANSCRIPT_ENTRIES && self.turns.len() > 1 {
            entries -= self.turns.pop_front().map_or(0, |t| t.entries.len());
        }
    }

    /// How many leading groups end with the last group of a turn in `1..=upto_turn`: the part a compaction
    /// through `upto_turn` summarizes (out-of-turn runs before that turn included, later ones not).
    fn groups_through(&self, upto_turn: u64) -> usize {
        self.turns.iter().rposition(|g| g.turn != 0 && g.turn <= upto_turn).map_or(0, |i| i + 1)
    }

    /// The entries a compaction through `upto_turn` summarizes, in log order (SPEC §13).
    pub fn entries_through(&self, upto_turn: u64) -> Vec<Arc<TranscriptEntry>> {
        self.turns.iter().take(self.groups_through(upto_turn)).flat_map(|g| g.entries.iter().cloned()).collect()
    }

    /// The turn numbers (not 0) of the groups a compaction through `upto_turn` summarizes.
    pub fn turns_through(&self, upto_turn: u64) -> Vec<u64> {
        self.turns.iter().take(self.groups_through(upto_turn)).map(|g| g.turn).filter(|t| *t != 0).collect()
    }

    /// Drops what a compaction through `upto_turn` summarized: later requests carry its summary instead.
    pub(crate) fn compact(&mut self, upto_turn: u64) {
        let n = self.groups_through(upto_turn);
        self.turns.drain(..n);
    }

    /// The history a model request of step `step` of turn `turn` carries (SPEC §8): everything before that
    /// step, where the turns before `turn` are cut to the newest `history_turns` by dropping the oldest
    /// *whole* turns. The current turn is never cut, and a tool result stays in the turn of its call.
    pub fn history(&self, turn: u64, step: u32, history_turns: u32) -> Vec<Arc<TranscriptEntry>> {
        let budget = usize::try_from(history_turns).unwrap_or(usize::MAX);
        let earlier = self.turns.iter().filter(|t| t.turn != turn).count();
        let skip = earlier.saturating_sub(budget);
        let mut seen_earlier = 0;
        let mut out = Vec::new();
        for t in &self.turns {
            if t.turn == turn {
                out.extend(t.entries.iter().filter(|e| e.step() < step).cloned());
                continue;
            }
            seen_earlier += 1;
            if seen_earlier > skip {
                out.extend(t.entries.iter().cloned());
            }
        }
        out
    }
}

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
    ToolCall { call: ToolCallSpec, awaiting_approval: bool },
    /// A `tool/decision` on a call awaiting approval.
    ToolDecision { call_id: String, approved: bool, reason: String, timed_out: bool },
    /// A `tool/result`, with the name of its call when the read saw the call.
    ToolResult { call_id: String, name: String, output: String, error: Option<String> },
    /// A `turn/end` with the usage of the turn's model requests the read saw.
    TurnEnd { reason: TurnEndReason, usage: Usage },
}

/// Reads a session's log as [`TranscriptItem`]s, one event at a time in seq order. Not a second history
/// fold (the [`Transcript`] is the history; it is bounded and keeps no seqs): each item is one event, and
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
            EventPayload::ToolCall { turn, step, call, awaiting_approval } => {
                self.call_names.insert(call.call_id.clone(), call.name.clone());
                item(*turn, *step, ItemKind::ToolCall { call: call.clone(), awaiting_approval: *awaiting_approval })
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

    fn user(turn: u64, step: u32, id: &str) -> TranscriptEntry {
        TranscriptEntry::User { turn, step, message: UserMessage::user_text(id, id) }
    }

    fn ids(entries: &[Arc<TranscriptEntry>]) -> Vec<String> {
        entries
            .iter()
            .map(|e| match e.as_ref() {
                TranscriptEntry::User { message, .. } => message.id.0.clone(),
                other => format!("{}.{}", other.turn(), other.step()),
            })
            .collect()
    }

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

    #[test]
    fn keeps_whole_turns_up_to_the_bound() {
        let mut t = Transcript::new(1);
        for turn in 1..=3 {
            t.push(user(turn, 1, &format!("a{turn}")));
            t.push(user(turn, 2, &format!("b{turn}")));
        }
        let kept: Vec<u64> = t.turns().map(|t| t.turn).collect();
        assert_eq!(kept, vec![2, 3]);
        t.set_keep_turns(0);
        assert_eq!(t.turns().count(), 1);
    }

    #[test]
    fn a_run_of_out_of_turn_entries_keeps_its_newest() {
        let mut t = Transcript::default();
        t.push(user(1, 1, "a1"));
        for i in 0..MAX_BETWEEN_TURN_ENTRIES + 5 {
            t.push(user(0, 0, &format!("o{i}")));
        }
        let run = t.turns().find(|t| t.turn == 0).map(|t| t.entries.clone()).unwrap_or_default();
        assert_eq!(run.len(), MAX_BETWEEN_TURN_ENTRIES);
        assert_eq!(ids(&run[..1]), vec!["o5".to_owned()]);
        // The turns around the run are untouched.
        assert_eq!(t.turns().next().map(|t| t.turn), Some(1));
    }

    #[test]
    fn older_whole_turns_go_when_the_entries_exceed_the_cap() {
        let mut t = Transcript::default();
        for turn in 1..=12u64 {
            t.push(user(turn, 1, &format!("a{turn}")));
            for i in 0..MAX_BETWEEN_TURN_ENTRIES {
                t.push(user(0, 0, &format!("o{turn}-{i}")));
            }
        }
        let entries = t.entries().count();
        assert!(entries <= MAX_TRANSCRIPT_ENTRIES + MAX_BETWEEN_TURN_ENTRIES, "{entries} entries kept");
        // Whole turns: the oldest kept group starts with its turn's first entry or is a whole run.
        let first = t.turns().next().map(|g| (g.turn, g.entries.len()));
        assert!(
            matches!(first, Some((0, n)) if n == MAX_BETWEEN_TURN_ENTRIES)
                || matches!(first, Some((turn, 1)) if turn > 0)
        );
        assert_eq!(t.turns().last().map(|g| g.turn), Some(0), "the newest run is kept");
    }

    #[test]
    fn history_cuts_earlier_turns_whole_and_stops_before_the_step() {
        let mut t = Transcript::default();
        for turn in 1..=3 {
            t.push(user(turn, 1, &format!("a{turn}")));
            t.push(user(turn, 2, &format!("b{turn}")));
        }
        assert_eq!(ids(&t.history(3, 2, 1)), vec!["a2", "b2", "a3"]);
        assert_eq!(ids(&t.history(3, 1, 0)), Vec::<String>::new());
        assert_eq!(ids(&t.history(4, 1, 5)), vec!["a1", "b1", "a2", "b2", "a3", "b3"]);
    }
}
