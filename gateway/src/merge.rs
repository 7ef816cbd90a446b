//! The ordering rule of a Watch stream's live tail, as a pure state machine.
//!
//! After `caught_up {seq: C}` the stream merges two sources: the log tail (durable events after C, in
//! seq order) and the live bus (best effort, each event carrying the seq of the durable event it
//! follows). The rule: a live event whose predecessor is older than C is stale (its effect is already in
//! the caught-up projection) and is dropped; a live event whose predecessor has not been sent yet is held
//! back until it has, so every live event comes after the durable event it follows. Durable events are
//! never duplicated.
//!
//! The merge runs once per watched session, in its shared feed ([`crate::feed`]); what stays per watcher
//! is [`Join`]: where that watcher is in the feed's durable sequence and which live events are stale for it.

use std::collections::VecDeque;

use turnstile_model::{Envelope, LiveEvent};

/// Live events held back at most; beyond this the oldest are dropped (live events are best effort, and
/// a tail that far behind must not grow memory without bound).
pub const MAX_HELD: usize = 4096;

/// One item to send, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Merged {
    Durable(Envelope),
    Live(LiveEvent),
}

/// Merge state of one Watch after its `caught_up`.
#[derive(Debug)]
pub struct TailMerge {
    caught_up_seq: u64,
    /// The last durable seq sent or already held by the client.
    last_sent: u64,
    /// The client asked for nothing at or below this seq.
    after_seq: u64,
    held: VecDeque<LiveEvent>,
    max_held: usize,
}

impl TailMerge {
    /// `caught_up_seq` is the seq of the `caught_up` marker already sent; `after_seq` is the client's.
    pub fn new(caught_up_seq: u64, after_seq: u64) -> Self {
        Self::with_capacity(caught_up_seq, after_seq, MAX_HELD)
    }

    pub fn with_capacity(caught_up_seq: u64, after_seq: u64, max_held: usize) -> Self {
        Self { caught_up_seq, last_sent: caught_up_seq, after_seq, held: VecDeque::new(), max_held: max_held.max(1) }
    }

    /// The last durable seq the client has.
    pub fn last_sent(&self) -> u64 {
        self.last_sent
    }

    /// A durable event from the tail: sent unless already sent, then any live events it releases.
    pub fn durable(&mut self, event: Envelope) -> Vec<Merged> {
        if event.seq <= self.last_sent {
            return Vec::new();
        }
        self.last_sent = event.seq;
        let mut out = Vec::new();
        if event.seq > self.after_seq {
            out.push(Merged::Durable(event));
        }
        while self.held.front().is_some_and(|l| l.after_seq <= self.last_sent) {
            if let Some(l) = self.held.pop_front() {
                out.push(Merged::Live(l));
            }
        }
        out
    }

    /// A live event from the bus: dropped when stale, held when ahead, else sent now.
    pub fn live(&mut self, event: LiveEvent) -> Vec<Merged> {
        if event.after_seq < self.caught_up_seq {
            return Vec::new();
        }
        if event.after_seq > self.last_sent || !self.held.is_empty() {
            // Behind a held event it must wait too, or it would overtake it.
            if self.held.len() == self.max_held {
                self.held.pop_front();
            }
            self.held.push_back(event);
            return Vec::new();
        }
        vec![Merged::Live(event)]
    }

    /// Live events waiting for their durable predecessor.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// What a watcher does with a durable event of the shared feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Already sent (or in the caught-up projection): skip it.
    Skip,
    /// The next one: send it.
    Send,
    /// The next one, but the client already has it (it resumed past the log's end then): send nothing.
    Pass,
    /// Events between the watcher's position and this one are missing: read them from the log first.
    Gap,
}

/// One watcher's side of the merge, after its `caught_up {seq: C}`: the feed's items are already in
/// [`TailMerge`] order; the watcher sends each durable event once, contiguously from C, and drops the live
/// events that are stale for it (predecessor older than C, as [`TailMerge::live`]) or whose predecessor it
/// has not sent (it lost them while lagging; live events are best effort).
#[derive(Debug)]
pub struct Join {
    caught_up_seq: u64,
    /// The last durable seq sent or already held by the client.
    position: u64,
    /// The client asked for nothing at or below this seq.
    after_seq: u64,
}

impl Join {
    pub fn new(caught_up_seq: u64, after_seq: u64) -> Self {
        Self { caught_up_seq, position: caught_up_seq, after_seq }
    }

    /// The last durable seq the client has.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Durable event `seq` from the feed or from the log; advances the position unless it is a gap.
    pub fn durable(&mut self, seq: u64) -> Step {
        if seq <= self.position {
            return Step::Skip;
        }
        if seq > self.position + 1 {
            return Step::Gap;
        }
        self.position = seq;
        if seq > self.after_seq { Step::Send } else { Step::Pass }
    }

    /// Whether a live event following durable `after_seq` is sent.
    pub fn live(&self, after_seq: u64) -> bool {
        after_seq >= self.caught_up_seq && after_seq <= self.position
    }
}

#[cfg(test)]
mod tests {
    use turnstile_model::{EventPayload, LivePayload, SessionRef, Status};

    use super::*;

    fn session() -> SessionRef {
        SessionRef { tenant: "acme".into(), id: "s1".into() }
    }

    fn durable(seq: u64) -> Envelope {
        Envelope { session: session(), seq, time_ms: seq, epoch: 1, payload: EventPayload::TurnStart { turn: seq } }
    }

    fn live(after_seq: u64, text: &str) -> LiveEvent {
        LiveEvent {
            session: session(),
            after_seq,
            payload: LivePayload::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning: false, offset: 0 },
        }
    }

    fn seqs(items: &[Merged]) -> Vec<String> {
        items
            .iter()
            .map(|m| match m {
                Merged::Durable(e) => format!("D{}", e.seq),
                Merged::Live(LiveEvent { after_seq, payload: LivePayload::AssistantDelta { text, .. }, .. }) => {
                    format!("L{after_seq}{text}")
                }
                Merged::Live(l) => format!("L{}", l.after_seq),
            })
            .collect()
    }

    #[test]
    fn stale_live_events_are_dropped() {
        let mut m = TailMerge::new(5, 0);
        assert!(m.live(live(4, "a")).is_empty());
        assert_eq!(m.held(), 0);
        assert_eq!(seqs(&m.live(live(5, "b"))), ["L5b"]);
    }

    #[test]
    fn live_events_ahead_of_the_log_wait_for_their_durable_event() {
        let mut m = TailMerge::new(5, 0);
        assert!(m.live(live(6, "a")).is_empty());
        assert!(m.live(live(7, "b")).is_empty());
        assert_eq!(m.held(), 2);
        assert_eq!(seqs(&m.durable(durable(6))), ["D6", "L6a"]);
        assert_eq!(seqs(&m.durable(durable(7))), ["D7", "L7b"]);
        assert_eq!(m.held(), 0);
    }

    #[test]
    fn a_live_event_never_overtakes_a_held_one() {
        let mut m = TailMerge::new(5, 0);
        assert!(m.live(live(6, "a")).is_empty());
        // Its predecessor was sent, but it published after the held one.
        assert!(m.live(live(5, "late")).is_empty());
        assert_eq!(seqs(&m.durable(durable(6))), ["D6", "L6a", "L5late"]);
    }

    #[test]
    fn durable_events_are_never_duplicated() {
        let mut m = TailMerge::new(5, 0);
        assert!(m.durable(durable(5)).is_empty());
        assert_eq!(seqs(&m.durable(durable(6))), ["D6"]);
        assert!(m.durable(durable(6)).is_empty());
        assert_eq!(m.last_sent(), 6);
    }

    #[test]
    fn durable_events_the_client_already_has_are_skipped_but_release_live_ones() {
        // A client that claims seq 8 while the log was at 5 at catch-up.
        let mut m = TailMerge::new(5, 8);
        assert!(m.live(live(6, "a")).is_empty());
        assert_eq!(seqs(&m.durable(durable(6))), ["L6a"]);
        assert_eq!(seqs(&m.durable(durable(9))), ["D9"]);
    }

    #[test]
    fn held_events_are_bounded() {
        let mut m = TailMerge::with_capacity(0, 0, 2);
        for t in ["a", "b", "c"] {
            m.live(live(1, t));
        }
        assert_eq!(m.held(), 2);
        assert_eq!(seqs(&m.durable(durable(1))), ["D1", "L1b", "L1c"]);
        let status =
            LiveEvent { session: session(), after_seq: 1, payload: LivePayload::Status { status: Status::Idle } };
        assert_eq!(seqs(&m.live(status)), ["L1"]);
    }

    #[test]
    fn a_join_sends_each_durable_event_once_and_in_order() {
        let mut j = Join::new(5, 0);
        assert_eq!(j.durable(4), Step::Skip);
        assert_eq!(j.durable(5), Step::Skip);
        assert_eq!(j.durable(7), Step::Gap);
        assert_eq!(j.position(), 5, "a gap does not move the position");
        assert_eq!(j.durable(6), Step::Send);
        assert_eq!(j.durable(7), Step::Send);
        assert_eq!(j.durable(7), Step::Skip);
        assert_eq!(j.position(), 7);
    }

    #[test]
    fn a_join_passes_durable_events_the_client_already_has() {
        // A client that claims seq 8 while the log was at 5 at catch-up.
        let mut j = Join::new(5, 8);
        assert_eq!(j.durable(6), Step::Pass);
        assert!(j.live(6), "the live events after them are still sent");
        assert_eq!(j.durable(7), Step::Pass);
        assert_eq!(j.durable(8), Step::Pass);
        assert_eq!(j.durable(9), Step::Send);
    }

    #[test]
    fn a_join_drops_stale_live_events_and_those_ahead_of_it() {
        let mut j = Join::new(5, 0);
        assert!(!j.live(4), "its effect is in the caught-up projection");
        assert!(j.live(5));
        assert!(!j.live(6), "its durable predecessor was not sent to this watcher");
        assert_eq!(j.durable(6), Step::Send);
        assert!(j.live(6));
    }
}
