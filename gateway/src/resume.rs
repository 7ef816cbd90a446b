//! A watcher's place in the streaming step's output (SPEC §14), as a pure state machine.
//!
//! A `Watch` that joins while a step streams asks the session's owner for the step's output so far (a
//! [`StreamingStep`], taken *after* the watcher joined its feed, so every delta published later reaches the
//! feed) and sends it right after `caught_up`, from the client's `resume` offsets, as deltas with offsets;
//! then it follows the feed's live deltas, each sent once by offset. The rules:
//!
//! - The owner's output belongs after durable event `after_seq` (the latest delta followed it): it is held
//!   until the watcher has sent that event. Until it is released, the feed's deltas of the same step are
//!   dropped: a delta before that event was published before the owner answered, so the output holds it;
//!   one published after it follows that event in the feed and so comes after the release.
//! - For each step and kind (text, reasoning) the watcher keeps the next offset the client needs. A delta
//!   wholly before it is a duplicate (dropped); one that overlaps it is trimmed to the part after it; one
//!   at it is sent. One after it is a gap (the feed lost deltas, or this watcher joined between the
//!   owner's answer and a delta of a step that then ended): the watcher asks the owner again, and when
//!   the owner no longer streams that step, [`StepStream::close`] drops the rest of its deltas, since the
//!   step's durable `assistant/message` brings the whole text.

use turnstile_model::StreamingStep;

/// The client's position in one step's output: the next byte offset it needs of the reply text and of the
/// reasoning (the `resume` of a `WatchRequest`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepPosition {
    pub turn: u64,
    pub step: u32,
    pub text: u64,
    pub reasoning: u64,
}

impl StepPosition {
    fn of(&self, turn: u64, step: u32) -> bool {
        self.turn == turn && self.step == step
    }

    fn next(&mut self, reasoning: bool) -> &mut u64 {
        if reasoning { &mut self.reasoning } else { &mut self.text }
    }
}

/// A delta to send: `text` at byte `offset` of its step's reply (or reasoning).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    pub turn: u64,
    pub step: u32,
    pub reasoning: bool,
    pub offset: u64,
    pub text: String,
}

/// What to do with a live delta of the feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaAction {
    /// Send it as it is.
    Send,
    /// The client has it (or the held owner's output does): send nothing.
    Drop,
    /// The client has its first `n` bytes: send the rest, at offset + n.
    Trim(usize),
    /// Bytes before it are missing: ask the owner for its output (then [`StepStream::owner_output`] or
    /// [`StepStream::close`]); send nothing of this delta.
    Gap,
}

/// One watcher's place in the streaming step's output.
#[derive(Debug, Default)]
pub struct StepStream {
    position: Option<StepPosition>,
    held: Option<StreamingStep>,
    /// A step whose missing bytes only its `assistant/message` can bring: its deltas are dropped.
    closed: Option<(u64, u32)>,
}

impl StepStream {
    /// A watcher whose client has `resume` of a step (none: nothing of any step).
    pub fn new(resume: Option<StepPosition>) -> Self {
        Self { position: resume, held: None, closed: None }
    }

    /// The owner's output so far; `sent` is the last durable seq this watcher has sent (or that its client
    /// had). Returns the deltas to send now, or holds the output until [`StepStream::advanced`] passes its
    /// `after_seq`.
    pub fn owner_output(&mut self, output: StreamingStep, sent: u64) -> Vec<Delta> {
        if output.after_seq <= sent {
            return self.release(output);
        }
        self.held = Some(output);
        Vec::new()
    }

    /// The watcher has sent durable events up to `sent`: the held output, if it belongs there now.
    pub fn advanced(&mut self, sent: u64) -> Vec<Delta> {
        match self.held.take() {
            Some(output) if output.after_seq <= sent => self.release(output),
            held => {
                self.held = held;
                Vec::new()
            }
        }
    }

    fn release(&mut self, output: StreamingStep) -> Vec<Delta> {
        let mut position = match self.position {
            Some(p) if p.of(output.turn, output.step) => p,
            _ => StepPosition { turn: output.turn, step: output.step, text: 0, reasoning: 0 },
        };
        let mut out = Vec::new();
        // Reasoning first: a model reasons before it answers.
        for (reasoning, so_far) in [(true, &output.reasoning), (false, &output.text)] {
            let next = position.next(reasoning);
            let from = usize::try_from(*next).unwrap_or(usize::MAX);
            // A client position that is not a character boundary of this output (a client bug) gets
            // nothing more of it rather than broken UTF-8.
            if let Some(rest) = so_far.get(from..).filter(|r| !r.is_empty()) {
                out.push(Delta {
                    turn: output.turn,
                    step: output.step,
                    reasoning,
                    offset: *next,
                    text: rest.to_owned(),
                });
                *next = so_far.len() as u64;
            }
        }
        self.position = Some(position);
        out
    }

    /// A live delta of the feed: `len` bytes at `offset` of step `turn`.`step`'s reply or reasoning.
    pub fn delta(&mut self, turn: u64, step: u32, reasoning: bool, offset: u64, len: usize) -> DeltaAction {
        if self.held.as_ref().is_some_and(|h| h.turn == turn && h.step == step) || self.closed == Some((turn, step)) {
            return DeltaAction::Drop;
        }
        let position = match &mut self.position {
            Some(p) if p.of(turn, step) => p,
            other => other.insert(StepPosition { turn, step, text: 0, reasoning: 0 }),
        };
        let next = position.next(reasoning);
        let end = offset + len as u64;
        if end <= *next && len > 0 {
            return DeltaAction::Drop;
        }
        if offset > *next {
            return DeltaAction::Gap;
        }
        let action = if offset < *next { DeltaAction::Trim((*next - offset) as usize) } else { DeltaAction::Send };
        *next = end;
        action
    }

    /// The step's durable `assistant/message` (its whole `text` and `reasoning`) is about to be sent: the
    /// bytes of it this watcher has not sent yet as deltas, if the watcher streams that step; and the step
    /// is closed. On a cluster a live delta travels another path (a core NATS subject) than the durable
    /// events (the stream), so the step's last deltas can reach the gateway after its message; SPEC §14
    /// still owes a streaming client every byte, in order, before the message.
    pub fn complete(&mut self, turn: u64, step: u32, text: &str, reasoning: &str) -> Vec<Delta> {
        // The whole step as the owner would report it: `release` sends what the watcher lacks of it.
        let streams_it = self.position.is_some_and(|p| p.of(turn, step));
        let out = if streams_it {
            let whole =
                StreamingStep { turn, step, after_seq: 0, text: text.to_owned(), reasoning: reasoning.to_owned() };
            self.release(whole)
        } else {
            Vec::new()
        };
        self.close(turn, step);
        out
    }

    /// The owner no longer streams step `turn`.`step` (it ended): drop its deltas from now on.
    pub fn close(&mut self, turn: u64, step: u32) {
        self.closed = Some((turn, step));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(after_seq: u64, text: &str, reasoning: &str) -> StreamingStep {
        StreamingStep { turn: 2, step: 1, after_seq, text: text.into(), reasoning: reasoning.into() }
    }

    fn delta(offset: u64, text: &str) -> Delta {
        Delta { turn: 2, step: 1, reasoning: false, offset, text: text.into() }
    }

    #[test]
    fn a_new_watcher_gets_the_whole_output_then_only_later_deltas() {
        let mut s = StepStream::new(None);
        assert_eq!(s.owner_output(output(7, "echo: hel", ""), 7), vec![delta(0, "echo: hel")]);
        // "hel" was published before the owner answered: the feed still carries it.
        assert_eq!(s.delta(2, 1, false, 6, 3), DeltaAction::Drop);
        assert_eq!(s.delta(2, 1, false, 9, 2), DeltaAction::Send);
        assert_eq!(s.delta(2, 1, false, 9, 2), DeltaAction::Drop, "a repeat is sent once");
    }

    #[test]
    fn a_resuming_client_gets_only_what_it_lacks_and_overlaps_are_trimmed() {
        let position = StepPosition { turn: 2, step: 1, text: 6, reasoning: 3 };
        let mut s = StepStream::new(Some(position));
        let out = s.owner_output(output(7, "echo: hel", "hmmm"), 9);
        assert_eq!(
            out,
            vec![Delta { turn: 2, step: 1, reasoning: true, offset: 3, text: "m".into() }, delta(6, "hel")]
        );
        assert_eq!(s.delta(2, 1, false, 8, 3), DeltaAction::Trim(1), "`llo` overlaps `l`");
        assert_eq!(s.delta(2, 1, false, 11, 1), DeltaAction::Send);
    }

    #[test]
    fn output_ahead_of_the_watcher_waits_for_its_event_and_hides_the_feed_until_then() {
        let mut s = StepStream::new(None);
        assert!(s.owner_output(output(9, "ab", ""), 7).is_empty());
        assert_eq!(s.delta(2, 1, false, 0, 1), DeltaAction::Drop, "in the held output");
        assert!(s.advanced(8).is_empty());
        assert_eq!(s.advanced(9), vec![delta(0, "ab")]);
        assert_eq!(s.delta(2, 1, false, 2, 1), DeltaAction::Send);
    }

    #[test]
    fn a_resume_of_an_older_step_or_past_the_end_sends_nothing_wrong() {
        let mut s = StepStream::new(Some(StepPosition { turn: 1, step: 3, text: 40, reasoning: 0 }));
        assert_eq!(s.owner_output(output(7, "new", ""), 7), vec![delta(0, "new")], "another step: from 0");
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 40, reasoning: 0 }));
        assert!(s.owner_output(output(7, "short", ""), 7).is_empty());
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 1, reasoning: 0 }));
        assert!(s.owner_output(output(7, "é", ""), 7).is_empty(), "not a character boundary");
    }

    #[test]
    fn without_owner_output_the_feed_is_deduplicated_by_offset() {
        let mut s = StepStream::new(None);
        assert_eq!(s.delta(3, 1, false, 0, 2), DeltaAction::Send);
        assert_eq!(s.delta(3, 1, true, 0, 2), DeltaAction::Send, "reasoning has its own offsets");
        assert_eq!(s.delta(3, 1, false, 4, 2), DeltaAction::Gap, "bytes 2..4 are missing");
        assert_eq!(s.delta(3, 2, false, 0, 1), DeltaAction::Send, "a new step starts at 0");
    }

    #[test]
    fn the_message_of_a_streaming_step_brings_the_bytes_its_late_deltas_did_not() {
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 6, reasoning: 0 }));
        assert_eq!(s.delta(2, 1, false, 6, 5), DeltaAction::Send);
        // The message arrives before the step's last delta (another path on a cluster).
        assert_eq!(s.complete(2, 1, "echo: hello world", ""), vec![delta(11, " world")]);
        assert_eq!(s.delta(2, 1, false, 11, 6), DeltaAction::Drop, "the late delta is not sent twice");
        // A watcher with all of it gets nothing more; one that never streamed the step gets the message only.
        let mut s = StepStream::new(None);
        assert_eq!(s.delta(2, 1, false, 0, 5), DeltaAction::Send);
        assert!(s.complete(2, 1, "hello", "").is_empty());
        let mut s = StepStream::new(None);
        assert!(s.complete(2, 1, "hello", "thoughts").is_empty());
        assert_eq!(s.delta(2, 2, false, 0, 1), DeltaAction::Send, "the next step streams as usual");
        // Reasoning is completed in its own offsets, before the text.
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 1, reasoning: 2 }));
        assert_eq!(
            s.complete(2, 1, "ab", "hmm"),
            vec![Delta { turn: 2, step: 1, reasoning: true, offset: 2, text: "m".into() }, delta(1, "b")]
        );
    }

    #[test]
    fn a_gap_is_filled_from_the_owner_or_closes_the_step() {
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 2, reasoning: 0 }));
        assert_eq!(s.delta(2, 1, false, 5, 3), DeltaAction::Gap);
        // The owner still streams it: its output (which holds the delta) fills the gap.
        assert_eq!(s.owner_output(output(7, "abcdefgh", ""), 7), vec![delta(2, "cdefgh")]);
        assert_eq!(s.delta(2, 1, false, 5, 3), DeltaAction::Drop);
        // The step ended: its message brings the rest; later deltas of it are dropped, others are not.
        let mut s = StepStream::new(Some(StepPosition { turn: 2, step: 1, text: 2, reasoning: 0 }));
        assert_eq!(s.delta(2, 1, false, 5, 3), DeltaAction::Gap);
        s.close(2, 1);
        assert_eq!(s.delta(2, 1, false, 8, 1), DeltaAction::Drop);
        assert_eq!(s.delta(2, 2, false, 0, 1), DeltaAction::Send);
    }
}
