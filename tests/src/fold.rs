//! An inbox projection written from SPEC §3 alone, independent of the journal crate, so that comparing it
//! with the server's `GetInbox` checks the server's fold rather than the same code twice.

use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{InboxSnapshot, SessionEvent, Target, UserMessage};

use crate::HarnessError;

/// The two pending lists after folding splices in seq order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Projection {
    pub seq: u64,
    pub next_turn: Vec<UserMessage>,
    pub next_step: Vec<UserMessage>,
}

impl Projection {
    /// Folds `events` (in seq order); refuses an invalid splice, naming its seq.
    pub fn fold(events: &[SessionEvent]) -> Result<Self, HarnessError> {
        let mut p = Self::default();
        for e in events {
            p.apply(e)?;
        }
        Ok(p)
    }

    /// Folds only the events with `seq <= upto`.
    pub fn fold_upto(events: &[SessionEvent], upto: u64) -> Result<Self, HarnessError> {
        let mut p = Self::default();
        for e in events.iter().filter(|e| e.seq <= upto) {
            p.apply(e)?;
        }
        Ok(p)
    }

    pub fn apply(&mut self, event: &SessionEvent) -> Result<(), HarnessError> {
        self.seq = event.seq;
        let Some(Payload::InboxSpliced(s)) = &event.payload else { return Ok(()) };
        let bad = |why: String| HarnessError::Inconsistent(format!("splice at seq {}: {why}", event.seq));
        let start = usize::try_from(s.start).map_err(|e| bad(e.to_string()))?;
        let removed = usize::try_from(s.removed_count).map_err(|e| bad(e.to_string()))?;
        for m in &s.inserted {
            let pending = self.next_turn.iter().chain(&self.next_step).any(|p| p.id == m.id);
            // An id may be re-inserted by the same splice that removes it (a same-id replace).
            let list = self.list(s.target).map_err(&bad)?;
            let removed_here =
                list.get(start..start.saturating_add(removed)).is_some_and(|r| r.iter().any(|p| p.id == m.id));
            if pending && !removed_here {
                return Err(bad(format!("inserts id {:?} that is already pending", m.id)));
            }
        }
        let list = self.list_mut(s.target).map_err(&bad)?;
        if start > list.len() || removed > list.len() - start {
            return Err(bad(format!("start {start} + removed {removed} out of range for length {}", list.len())));
        }
        list.splice(start..start + removed, s.inserted.iter().cloned());
        Ok(())
    }

    fn list(&self, target: i32) -> Result<&Vec<UserMessage>, String> {
        match Target::try_from(target) {
            Ok(Target::NextTurn) => Ok(&self.next_turn),
            Ok(Target::NextStep) => Ok(&self.next_step),
            _ => Err(format!("target {target} is not a list")),
        }
    }

    fn list_mut(&mut self, target: i32) -> Result<&mut Vec<UserMessage>, String> {
        match Target::try_from(target) {
            Ok(Target::NextTurn) => Ok(&mut self.next_turn),
            Ok(Target::NextStep) => Ok(&mut self.next_step),
            _ => Err(format!("target {target} is not a list")),
        }
    }

    /// The lists as the server's snapshot carries them.
    pub fn matches(&self, snapshot: &InboxSnapshot) -> bool {
        self.next_turn == snapshot.next_turn && self.next_step == snapshot.next_step
    }
}
