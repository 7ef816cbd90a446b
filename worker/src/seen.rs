//! Which sessions a host has served, approximately and in constant memory (decision 0040).
//!
//! The host writes the first command of a session it has never served as a new session's first group
//! before reading anything: right for a new session (one round trip instead of two), one wasted round trip
//! for a session that has events. Sessions this host served before (passivated since) are therefore
//! loaded first, as they always were. This filter remembers them without growing with their number: a
//! Bloom filter of fixed size, whose only error is to take an unseen session for a seen one, which just
//! loads it first. It is emptied when so many sessions went in that nearly every answer would be "seen".

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use turnstile_model::SessionRef;

/// 2^20 bits: 128 KiB per host.
const BITS: usize = 1 << 20;
/// Probes per session.
const PROBES: u64 = 3;
/// Sessions inserted before the filter is emptied: at this fill about 1 in 30 unseen sessions is taken
/// for a seen one (k = 3, m/n ≈ 7.5).
const CAPACITY: usize = 140_000;

pub(crate) struct SeenSessions {
    words: Box<[AtomicU64]>,
    inserted: AtomicUsize,
    /// Keys drawn once: the same session always maps to the same bits in this host.
    hasher: std::hash::RandomState,
}

impl Default for SeenSessions {
    fn default() -> Self {
        Self {
            words: (0..BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            inserted: AtomicUsize::new(0),
            hasher: std::hash::RandomState::new(),
        }
    }
}

impl SeenSessions {
    /// Remembers `session` as served. Only a session not already (probably) in the filter counts towards
    /// emptying it: the host inserts at every runner start, and an idle session restarts often.
    pub(crate) fn insert(&self, session: &SessionRef) {
        if self.may_contain(session) {
            return;
        }
        if self.inserted.fetch_add(1, Ordering::Relaxed) >= CAPACITY {
            // Emptied rather than saturated: forgetting costs each forgotten session one wasted write.
            self.inserted.store(1, Ordering::Relaxed);
            for word in &self.words {
                word.store(0, Ordering::Relaxed);
            }
        }
        for bit in self.bits(session) {
            self.words[bit / 64].fetch_or(1 << (bit % 64), Ordering::Relaxed);
        }
    }

    /// False only for a session never inserted since the filter was last emptied.
    pub(crate) fn may_contain(&self, session: &SessionRef) -> bool {
        self.bits(session).all(|bit| self.words[bit / 64].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0)
    }

    /// The session's bits, by double hashing of one 64-bit hash.
    fn bits(&self, session: &SessionRef) -> impl Iterator<Item = usize> {
        let hash = self.hasher.hash_one(session);
        let (h1, h2) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        // `BITS` is a power of two below 2^32, so the mask keeps every index in range.
        (0..PROBES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) as usize) & (BITS - 1))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn session(i: usize) -> SessionRef {
        SessionRef::new("acme", format!("s{i}")).unwrap()
    }

    #[test]
    fn inserted_sessions_are_always_seen_and_few_others_are() {
        let seen = SeenSessions::default();
        for i in 0..100_000 {
            seen.insert(&session(i));
        }
        assert!((0..100_000).all(|i| seen.may_contain(&session(i))));
        let false_positives = (100_000..110_000).filter(|i| seen.may_contain(&session(*i))).count();
        // k = 3, m/n ≈ 10.5: about 1.7 % expected.
        assert!(false_positives < 400, "{false_positives} of 10,000 unseen sessions taken for seen");
    }

    #[test]
    fn inserting_a_seen_session_again_does_not_bring_the_emptying_closer() {
        let seen = SeenSessions::default();
        seen.insert(&session(1));
        for _ in 0..CAPACITY + 10 {
            seen.insert(&session(0));
        }
        assert!(seen.may_contain(&session(1)), "restarts of one session emptied the filter");
        assert!(seen.may_contain(&session(0)));
    }

    #[test]
    fn a_full_filter_is_emptied_and_keeps_the_newest_session() {
        let seen = SeenSessions::default();
        for i in 0..CAPACITY / 2 {
            seen.insert(&session(i));
        }
        assert!(seen.may_contain(&session(0)));
        // Sessions taken for seen ones (about 3 % near the end) are not counted: a tenth more is past the
        // emptying whatever they were.
        let last = CAPACITY + CAPACITY / 10;
        for i in CAPACITY / 2..=last {
            seen.insert(&session(i));
        }
        assert!(seen.may_contain(&session(last)));
        let still = (0..1_000).filter(|i| seen.may_contain(&session(*i))).count();
        assert!(still < 50, "{still} of 1,000 sessions from before the emptying still seen");
    }
}
