//! The conversation history of a session (SPEC §8): what a model request is built from.
//!
//! The [`Transcript`] is part of the fold ([`crate::SessionState`]) so that every owner and every snapshot
//! hold the same history without reading the whole log again. It keeps whole turns only, and at most
//! [`Transcript::keep_turns`] turns before the newest one, so a snapshot of a long session stays bounded
//! (decision record 0009): a model request never needs more than its agent's `history_turns` whole turns
//! before the current one.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::event::ToolCallSpec;
use crate::message::UserMessage;

/// Turns kept before the newest one when nothing else is configured (the agents' default `history_turns`).
pub const DEFAULT_TRANSCRIPT_TURNS: u32 = 100;

/// One entry of the history, in log order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// The entries of one turn (or of one run of between-turn entries, turn 0), in log order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptTurn {
    pub turn: u64,
    pub entries: Vec<TranscriptEntry>,
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
        self.turns.iter().flat_map(|t| t.entries.iter())
    }

    /// Appends one entry (the fold calls this in log order).
    pub(crate) fn push(&mut self, entry: TranscriptEntry) {
        match self.turns.back_mut() {
            Some(last) if last.turn == entry.turn() => last.entries.push(entry),
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
    }

    /// The history a model request of step `step` of turn `turn` carries (SPEC §8): everything before that
    /// step, where the turns before `turn` are cut to the newest `history_turns` by dropping the oldest
    /// *whole* turns. The current turn is never cut, and a tool result stays in the turn of its call.
    pub fn history(&self, turn: u64, step: u32, history_turns: u32) -> Vec<TranscriptEntry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn user(turn: u64, step: u32, id: &str) -> TranscriptEntry {
        TranscriptEntry::User { turn, step, message: UserMessage::user_text(id, id) }
    }

    fn ids(entries: &[TranscriptEntry]) -> Vec<String> {
        entries
            .iter()
            .map(|e| match e {
                TranscriptEntry::User { message, .. } => message.id.0.clone(),
                other => format!("{}.{}", other.turn(), other.step()),
            })
            .collect()
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
