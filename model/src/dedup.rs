//! Idempotent delivery (SPEC §2): the [`Fingerprint`] of a delivery and the [`AcceptedIndex`] of the
//! MessageIds a session accepted, bounded by the dedup horizon, in the compact form snapshots store
//! (decision 0020). [`crate::state::SessionState`] keeps one and fills it from the splices it folds.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::message::{ContentBlock, MessageId, MessageSource, Target, UserMessage};

/// How many accepted MessageIds the idempotence index remembers at least (SPEC §2).
pub const DEFAULT_DEDUP_HORIZON: usize = 10_000;

/// A stable digest of a delivery: content, source and routing. Two deliveries with the same id and
/// fingerprint are the same delivery (a retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// Digest of a message's content and source plus the routing it was sent with. The encoding is
    /// written out field by field (length-prefixed) so it never depends on a serializer's choices.
    pub fn of(message: &UserMessage, target: Target, wakeup: bool) -> Self {
        let mut h = Sha256::new();
        let field = |h: &mut Sha256, bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        for block in message.content.iter() {
            match block {
                ContentBlock::Text { text } => {
                    h.update([1]);
                    field(&mut h, text.as_bytes());
                }
                ContentBlock::Data { mime, bytes } => {
                    h.update([2]);
                    field(&mut h, mime.as_bytes());
                    field(&mut h, bytes);
                }
            }
        }
        match &message.source {
            MessageSource::User => h.update([10]),
            MessageSource::Plugin { plugin, form } => {
                h.update([11]);
                field(&mut h, plugin.as_bytes());
                field(&mut h, form.as_deref().unwrap_or("").as_bytes());
            }
            MessageSource::Goal { goal_id, revision, round } => {
                h.update([12]);
                field(&mut h, goal_id.as_bytes());
                h.update(revision.to_le_bytes());
                h.update(round.to_le_bytes());
            }
            MessageSource::Tool { call_id } => {
                h.update([13]);
                field(&mut h, call_id.as_bytes());
            }
            MessageSource::Session { tenant, session, upto_seq } => {
                h.update([15]);
                field(&mut h, tenant.as_bytes());
                field(&mut h, session.as_bytes());
                h.update(upto_seq.to_le_bytes());
            }
            MessageSource::Schedule { schedule_id, fire_unix_ms } => {
                h.update([16]);
                field(&mut h, schedule_id.as_bytes());
                h.update(fire_unix_ms.to_le_bytes());
            }
            MessageSource::Model { provider, model } => {
                h.update([14]);
                field(&mut h, provider.as_bytes());
                field(&mut h, model.as_bytes());
            }
        }
        h.update([match target {
            Target::NextTurn => 20,
            Target::NextStep => 21,
        }]);
        h.update([u8::from(wakeup)]);
        let digest = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        Self(out)
    }
}

impl Fingerprint {
    /// 32 lowercase hex digits (the snapshot form).
    pub fn to_hex(&self) -> String {
        use std::fmt::Write as _;
        self.0.iter().fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    /// The inverse of [`Fingerprint::to_hex`]; `None` for anything but 32 hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }
}

/// How a MessageId was first accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acceptance {
    /// Seq of the splice that inserted it.
    pub seq: u64,
    /// Digest of the delivery; `None` when the id came from an edit that also removed (replace, or a
    /// splice with deletions), which no delivery can retry. An insert-only splice reads as a non-waking
    /// delivery into its list.
    pub fingerprint: Option<Fingerprint>,
    /// The turn that a waking delivery to an idle session opened.
    pub opened_turn: Option<u64>,
}

/// The index of accepted MessageIds, bounded by the dedup horizon (oldest forgotten first).
///
/// It is the largest part of an owner's snapshot (10,000 ids at the default horizon), so its serialized
/// form is compact: each id once, oldest first, with its fingerprint as 32 hex digits (see the `Serialize`
/// impl below and decision 0020).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptedIndex {
    by_id: HashMap<MessageId, Acceptance>,
    order: VecDeque<MessageId>,
    horizon: usize,
}

impl AcceptedIndex {
    pub fn new(horizon: usize) -> Self {
        Self { by_id: HashMap::new(), order: VecDeque::new(), horizon: horizon.max(1) }
    }

    pub fn get(&self, id: &MessageId) -> Option<&Acceptance> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub(crate) fn insert(&mut self, id: MessageId, acceptance: Acceptance) {
        if self.by_id.insert(id.clone(), acceptance).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.horizon {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

/// One accepted id as stored: `[id, seq, fingerprint (hex) or null, opened turn or null]`. The derived form
/// of the map plus the order list held every id twice and a fingerprint as 16 JSON numbers: about twice
/// the bytes.
type StoredAcceptance<Id> = (Id, u64, Option<String>, Option<u64>);

#[derive(Serialize)]
struct AcceptedIndexOut<'a> {
    horizon: usize,
    entries: Vec<StoredAcceptance<&'a MessageId>>,
}

#[derive(Deserialize)]
struct AcceptedIndexIn {
    horizon: usize,
    entries: Vec<StoredAcceptance<MessageId>>,
}

impl Serialize for AcceptedIndex {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entries = self
            .order
            .iter()
            .filter_map(|id| {
                let a = self.by_id.get(id)?;
                Some((id, a.seq, a.fingerprint.map(|f| f.to_hex()), a.opened_turn))
            })
            .collect();
        AcceptedIndexOut { horizon: self.horizon, entries }.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for AcceptedIndex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = AcceptedIndexIn::deserialize(deserializer)?;
        let mut index = Self::new(stored.horizon);
        for (id, seq, fingerprint, opened_turn) in stored.entries {
            let fingerprint = fingerprint
                .map(|hex| {
                    Fingerprint::from_hex(&hex)
                        .ok_or_else(|| serde::de::Error::custom("a fingerprint is not 32 hex digits"))
                })
                .transpose()?;
            index.insert(id, Acceptance { seq, fingerprint, opened_turn });
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accepted_index_round_trips_in_its_compact_form() {
        let mut index = AcceptedIndex::new(3);
        let m = UserMessage::user_text("m", "hi");
        for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            let fingerprint = (i % 2 == 0).then(|| Fingerprint::of(&m, Target::NextTurn, i == 0));
            index.insert(MessageId::from(id), Acceptance { seq: i as u64 + 1, fingerprint, opened_turn: Some(7) });
        }
        let json = serde_json::to_string(&index).unwrap();
        // Each id once, oldest (already forgotten "a") not at all.
        assert_eq!(json.matches("\"b\"").count(), 1);
        assert!(!json.contains("\"a\""));
        let back: AcceptedIndex = serde_json::from_str(&json).unwrap();
        assert_eq!(back, index);
        assert_eq!(
            back.get(&MessageId::from("c")).and_then(|a| a.fingerprint),
            index.get(&"c".into()).and_then(|a| a.fingerprint)
        );
        let fp = Fingerprint::of(&m, Target::NextStep, false);
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }
}
