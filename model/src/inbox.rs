//! The inbox of SPEC §3: two ordered pending lists, changed only by normalized splices.

use serde::{Deserialize, Serialize};

use crate::event::Splice;
use crate::message::{MessageId, Target, UserMessage};

/// Two ordered lists of pending messages. A MessageId occurs at most once across both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbox {
    pub next_turn: Vec<UserMessage>,
    pub next_step: Vec<UserMessage>,
}

/// Why a splice cannot apply to an inbox.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    #[error("splice start {start} is past the end of {target} (length {len})")]
    StartOutOfRange { target: Target, start: u32, len: usize },
    #[error("splice removes {removed_count} from {start} but {target} has only {len} messages")]
    RemoveOutOfRange { target: Target, start: u32, removed_count: u32, len: usize },
    #[error("message id {id} is already pending")]
    DuplicateId { id: MessageId },
    #[error("message id {id} is inserted twice by one splice")]
    DuplicateInsert { id: MessageId },
    #[error("splice removes nothing and inserts nothing")]
    Empty,
}

impl Inbox {
    pub fn list(&self, target: Target) -> &[UserMessage] {
        match target {
            Target::NextTurn => &self.next_turn,
            Target::NextStep => &self.next_step,
        }
    }

    fn list_mut(&mut self, target: Target) -> &mut Vec<UserMessage> {
        match target {
            Target::NextTurn => &mut self.next_turn,
            Target::NextStep => &mut self.next_step,
        }
    }

    /// Pending items across both lists.
    pub fn len(&self) -> usize {
        self.next_turn.len() + self.next_step.len()
    }

    /// The bytes the pending items across both lists count toward `limits.max_pending_bytes`
    /// ([`crate::size::message_bytes`]).
    pub fn counted_bytes(&self) -> usize {
        crate::size::messages_bytes(&self.next_turn).saturating_add(crate::size::messages_bytes(&self.next_step))
    }

    pub fn is_empty(&self) -> bool {
        self.next_turn.is_empty() && self.next_step.is_empty()
    }

    /// Finds a pending id, next-turn first (SPEC §3 lookup order): its list and index.
    pub fn find(&self, id: &MessageId) -> Option<(Target, usize)> {
        [Target::NextTurn, Target::NextStep]
            .into_iter()
            .find_map(|t| self.list(t).iter().position(|m| &m.id == id).map(|i| (t, i)))
    }

    pub fn contains(&self, id: &MessageId) -> bool {
        self.find(id).is_some()
    }

    /// Checks that `splice` applies: in range, not empty, and no inserted id pending after the removal.
    pub fn check(&self, splice: &Splice) -> Result<(), SpliceError> {
        let list = self.list(splice.target);
        let (start, removed) = (splice.start as usize, splice.removed_count as usize);
        if start > list.len() {
            return Err(SpliceError::StartOutOfRange { target: splice.target, start: splice.start, len: list.len() });
        }
        if removed > list.len() - start {
            return Err(SpliceError::RemoveOutOfRange {
                target: splice.target,
                start: splice.start,
                removed_count: splice.removed_count,
                len: list.len(),
            });
        }
        if removed == 0 && splice.inserted.is_empty() {
            return Err(SpliceError::Empty);
        }
        let removed_ids = &list[start..start + removed];
        for (i, m) in splice.inserted.iter().enumerate() {
            if splice.inserted[..i].iter().any(|o| o.id == m.id) {
                return Err(SpliceError::DuplicateInsert { id: m.id.clone() });
            }
            if self.contains(&m.id) && !removed_ids.iter().any(|r| r.id == m.id) {
                return Err(SpliceError::DuplicateId { id: m.id.clone() });
            }
        }
        Ok(())
    }

    /// Applies a checked splice and returns the removed messages, in order.
    pub fn apply(&mut self, splice: &Splice) -> Result<Vec<UserMessage>, SpliceError> {
        self.check(splice)?;
        let start = splice.start as usize;
        let end = start + splice.removed_count as usize;
        let removed = self.list_mut(splice.target).splice(start..end, splice.inserted.iter().cloned()).collect();
        Ok(removed)
    }
}
