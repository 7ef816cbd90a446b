//! What every protocol reads of a turn from a session's log: [`TurnFold`], a turn as the changes a protocol
//! streams (text, each step's whole reply, tool calls, a wait for approval or for the client, the end), each
//! at a position any gateway computes alike (decision 0101's numbering), so streams resume through any
//! gateway.

use std::collections::HashMap;

use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;

/// Positions per durable event: room for the deltas of a 16 MiB reply, and seqs up to 2^29 stay below
/// 2^53, the largest integer JavaScript clients (and JSON numbers read as f64) hold exactly. The scheme is
/// decision 0101's: a change at durable event `seq` is at `seq * SPAN + k`; a text delta of a step whose
/// `step/start` is at `S` is at `S * SPAN + 2 + end`, `end` the delta's end offset in the step's reply.
pub const SPAN: u64 = 1 << 24;

/// The position of a text delta of the step whose `step/start` is at seq `anchor`, ending at byte `end` of
/// the step's reply (decision 0101): the same at every gateway, so a resumed stream knows the bytes it has.
pub fn text_position(anchor: u64, end: u64) -> u64 {
    anchor * SPAN + 2 + end.min(SPAN - 3)
}

/// How many bytes of the reply of the step at `anchor` a client has that resumed after position `after`
/// (a [`text_position`] of that step names its end; any other position, none).
pub fn had_of_step(after: u64, anchor: u64) -> u64 {
    match after {
        n if n / SPAN == anchor && n % SPAN >= 2 => n % SPAN - 2,
        _ => 0,
    }
}

/// The part of `text`, a delta at byte `offset` of its step's reply, past the first `known` bytes, with
/// the delta's end; `None` when nothing of it is new.
pub fn unsent(text: &str, offset: u64, known: u64) -> Option<(&str, u64)> {
    let end = offset + text.len() as u64;
    if end <= known {
        return None;
    }
    let skip = usize::try_from(known.saturating_sub(offset)).unwrap_or(usize::MAX);
    text.get(skip..).map(|piece| (piece, end))
}

/// How a turn ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// The model stopped at its output limit.
    MaxTokens,
    /// A pre-step hook blocked the turn, with its reason when it gave one.
    Blocked(Option<String>),
    /// Cancelled (by whom), or removed before it started.
    Cancelled(String),
    Failed {
        code: String,
        message: String,
    },
}

/// A tool call of the turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The seq of its `tool/call`.
    pub seq: u64,
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// What one Watch item changed in the turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The delivery that asked for the turn was read (it may still wait in the inbox).
    Accepted,
    /// The turn answering the delivery started.
    Started {
        turn: u64,
    },
    /// More of the reply: of the step whose `step/start` is at seq `step` (each step's text is a part of
    /// the reply of its own). Its position is its end: the piece ends at byte `position - step * SPAN - 2`
    /// of the step's reply.
    Text {
        step: u64,
        piece: String,
    },
    /// The step whose `step/start` is at seq `step` has said all it says: `text`, its whole reply (the
    /// durable message's; on a failover, what was streamed, `interrupted`). None for a step that only
    /// called tools.
    Replied {
        step: u64,
        text: String,
        interrupted: bool,
    },
    /// The agent called a tool (one it runs itself).
    ToolCall(Call),
    /// The turn waits for the client that declared the tool to run it and answer (SPEC §19).
    ClientCall(Call),
    ToolResult {
        call_id: String,
        output: String,
        error: Option<String>,
    },
    /// The turn waits for a person's decision on this call (SPEC §9).
    Waiting(Call),
    /// The call waiting for a decision was decided.
    Decided {
        call_id: String,
        approved: bool,
    },
    /// The turn ended; nothing of it follows.
    Ended(Outcome),
}

/// A change and its position: a number that rises through the turn, the same at every gateway, from
/// which a stream resumed misses nothing and repeats nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub position: u64,
    pub change: Change,
}

impl Step {
    /// What of this change a client lacks that has every change up to position `after`: nothing when it
    /// has it all. A text piece ends at its position byte for byte, so such a client lacks its last
    /// `position - after` bytes (fewer when `after` is in the same step: a resumed stream, decision 0101).
    pub fn past(self, after: u64) -> Option<Step> {
        let lacks = self.position.checked_sub(after).filter(|n| *n > 0)?;
        match self.change {
            Change::Text { step, piece } => {
                let skip = usize::try_from((piece.len() as u64).saturating_sub(lacks)).unwrap_or(usize::MAX);
                let rest = piece.get(skip..).filter(|r| !r.is_empty())?;
                let piece = if skip == 0 { piece } else { rest.to_owned() };
                Some(Step { position: self.position, change: Change::Text { step, piece } })
            }
            change => Some(Step { position: self.position, change }),
        }
    }
}

/// One turn, found from the delivery that asked for it, as a view of its session's log. Feed it the
/// session's Watch from the delivery on (`after_seq = seq - 1`).
#[derive(Debug)]
pub struct TurnFold {
    seq: u64,
    after: u64,
    message_id: Option<String>,
    prompt: String,
    turn: Option<u64>,
    accepted_ms: Option<u64>,
    ended_ms: Option<u64>,
    step_starts: HashMap<(u64, u32), u64>,
    open: Option<Open>,
    /// Each step's text so far, by the seq of its `step/start`.
    replies: Vec<(u64, String)>,
    /// The `step/start` seq of the last step whose reply ended: no delta of it or before it opens a reply.
    said: u64,
    /// The messages the turn entered, with their seqs.
    inputs: Vec<(u64, pb::UserMessage)>,
    usage: Option<pb::Usage>,
    waiting: Option<Call>,
    outcome: Option<Outcome>,
    queued: bool,
    missing: bool,
}

#[derive(Debug)]
struct Open {
    step: (u64, u32),
    anchor: u64,
    sent_end: u64,
}

impl TurnFold {
    /// The turn asked for by the delivery at `seq`; changes at or before position `after` are folded but
    /// not returned (a resumed stream).
    pub fn new(seq: u64, after: u64) -> Self {
        Self {
            seq,
            after,
            message_id: None,
            prompt: String::new(),
            turn: None,
            accepted_ms: None,
            ended_ms: None,
            step_starts: HashMap::new(),
            open: None,
            replies: Vec::new(),
            said: 0,
            inputs: Vec::new(),
            usage: None,
            waiting: None,
            outcome: None,
            queued: false,
            missing: false,
        }
    }

    /// The turn answering the delivery, when it is known before the delivery is read: the delivery started
    /// it, or the fold continues a turn after the call at `seq` (decisions 0103, 0113).
    pub fn in_turn(mut self, turn: Option<u64>) -> Self {
        self.turn = turn;
        self
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The turn has ended.
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// The read caught up before the delivery's seq: there is no such delivery (or a lagging read).
    pub fn missing(&self) -> bool {
        self.missing
    }

    pub fn turn(&self) -> Option<u64> {
        self.turn
    }

    /// The delivery's MessageId, once its event was read.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// The delivered message's text.
    pub fn prompt(&self) -> &str {
        &self.prompt
    }

    /// The reply so far: every step's text, in order, separated by a blank line.
    pub fn reply(&self) -> String {
        self.replies.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>().join("\n\n")
    }

    /// Each step's text so far, with the seq of its `step/start`.
    pub fn replies(&self) -> &[(u64, String)] {
        &self.replies
    }

    /// The messages the turn entered (the delivery's and any steered in), with the seqs of their events.
    pub fn inputs(&self) -> &[(u64, pb::UserMessage)] {
        &self.inputs
    }

    /// The model's usage over the turn's steps so far, once a step reported one.
    pub fn usage(&self) -> Option<&pb::Usage> {
        self.usage.as_ref()
    }

    /// The call the turn waits on for a decision, if it does now.
    pub fn waiting(&self) -> Option<&Call> {
        self.waiting.as_ref()
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The delivery still waits in the inbox (from the last `caught_up`).
    pub fn queued(&self) -> bool {
        self.queued && self.turn.is_none()
    }

    /// The time of the delivery and of the turn's end, Unix ms.
    pub fn times_ms(&self) -> (Option<u64>, Option<u64>) {
        (self.accepted_ms, self.ended_ms)
    }

    /// Folds one Watch item; returns the changes it makes after position `after`.
    pub fn apply(&mut self, item: &pb::WatchItem) -> Vec<Step> {
        let after = self.after;
        self.fold(item).into_iter().filter_map(|step| step.past(after)).collect()
    }

    /// Folds one Watch item; returns every change it makes, those at or before `after` too (for a protocol
    /// that builds more than the changes from them, and filters with [`Step::past`] itself).
    pub fn fold(&mut self, item: &pb::WatchItem) -> Vec<Step> {
        let mut out = Vec::new();
        match &item.item {
            Some(pb::watch_item::Item::Event(event)) => self.on_event(event, &mut out),
            Some(pb::watch_item::Item::Live(live)) => match &live.payload {
                Some(Live::AssistantDelta(d)) if !d.reasoning => {
                    self.on_delta((d.turn, d.step), d.offset, &d.text, &mut out)
                }
                Some(Live::Discarded(d))
                    if self.turn.is_none()
                        && self.message_id.is_some()
                        && d.message.as_ref().map(|m| m.id.as_str()) == self.message_id.as_deref() =>
                {
                    self.finish(None, removed(), &mut out);
                }
                _ => {}
            },
            Some(pb::watch_item::Item::CaughtUp(caught)) => self.on_caught_up(caught, &mut out),
            None => {}
        }
        out
    }

    fn on_caught_up(&mut self, caught: &pb::CaughtUp, out: &mut Vec<Step>) {
        if self.accepted_ms.is_none() {
            self.missing = caught.seq < self.seq;
            return;
        }
        if self.turn.is_some() || self.outcome.is_some() {
            return;
        }
        let Some(message) = self.message_id.clone() else { return };
        let inbox = caught.inbox.as_ref();
        self.queued = inbox.is_some_and(|i| i.next_turn.iter().chain(&i.next_step).any(|m| m.id == message));
        if !self.queued && caught.status == pb::SessionStatus::Idle as i32 {
            // Neither pending nor entered by any turn, and nothing runs: it was removed before it ran.
            self.finish(None, removed(), out);
        }
    }

    fn ours(&self, turn: u64) -> bool {
        self.turn == Some(turn)
    }

    fn emit(&self, out: &mut Vec<Step>, position: u64, change: Change) {
        out.push(Step { position, change });
    }

    fn on_event(&mut self, event: &pb::SessionEvent, out: &mut Vec<Step>) {
        let seq = event.seq;
        if seq < self.seq || self.outcome.is_some() {
            return;
        }
        let Some(payload) = &event.payload else { return };
        if seq == self.seq {
            self.missing = false;
            self.accepted_ms = Some(event.time_unix_ms);
            let message = match payload {
                Payload::InboxSpliced(s) => s.inserted.last(),
                Payload::UserMessage(u) => u.message.as_ref(),
                _ => None,
            };
            self.message_id = message.map(|m| m.id.clone());
            self.prompt = message.map(pb::UserMessage::text).unwrap_or_default();
            self.emit(out, seq * SPAN, Change::Accepted);
        }
        match payload {
            Payload::StepStart(s) => {
                self.step_starts.insert((s.turn, s.step), seq);
            }
            Payload::UserMessage(u) => {
                let Some(message) = &u.message else { return };
                if self.turn.is_none() && self.message_id.as_deref() == Some(message.id.as_str()) {
                    self.turn = Some(u.turn);
                    self.queued = false;
                    // At its step's `step/start` (+1), so before the step's deltas (+2 and up).
                    let anchor = self.step_starts.get(&(u.turn, u.step)).copied().unwrap_or(seq);
                    self.emit(out, anchor.max(self.seq) * SPAN + 1, Change::Started { turn: u.turn });
                }
                if self.ours(u.turn) {
                    self.inputs.push((seq, message.clone()));
                }
            }
            Payload::AssistantMessage(a) if self.ours(a.turn) => self.on_assistant(seq, a, out),
            Payload::ToolCall(c) if self.ours(c.turn) => {
                let call =
                    Call { seq, call_id: c.call_id.clone(), name: c.name.clone(), arguments: c.arguments.clone() };
                if c.awaiting_client {
                    self.emit(out, seq * SPAN + 2, Change::ClientCall(call));
                } else if c.awaiting_approval {
                    self.waiting = Some(call.clone());
                    self.emit(out, seq * SPAN + 2, Change::Waiting(call));
                } else {
                    self.emit(out, seq * SPAN + 2, Change::ToolCall(call));
                }
            }
            Payload::ToolDecision(d) if self.ours(d.turn) => {
                if self.waiting.as_ref().is_some_and(|w| w.call_id == d.call_id) {
                    self.waiting = None;
                }
                self.emit(out, seq * SPAN, Change::Decided { call_id: d.call_id.clone(), approved: d.approved });
            }
            Payload::ToolResult(r) if self.ours(r.turn) => {
                let change =
                    Change::ToolResult { call_id: r.call_id.clone(), output: r.output.clone(), error: r.error.clone() };
                self.emit(out, seq * SPAN, change);
            }
            Payload::TurnEnd(end) if self.ours(end.turn) => {
                let reason = end.reason.as_ref().and_then(|r| r.reason.as_ref());
                if matches!(reason, Some(Reason::Interrupted(_))) {
                    // The owner died mid-turn; the new owner's next turn answers the same input (SPEC §6). A
                    // reply cut short has no durable message: it ends here with what was streamed.
                    if let Some(open) = self.open.take() {
                        self.said = open.anchor;
                        let text = self.replies.iter().find(|(at, _)| *at == open.anchor).map(|(_, t)| t.clone());
                        let change =
                            Change::Replied { step: open.anchor, text: text.unwrap_or_default(), interrupted: true };
                        self.emit(out, seq * SPAN, change);
                    }
                    self.turn = Some(end.turn + 1);
                    return;
                }
                self.ended_ms = Some(event.time_unix_ms);
                self.finish(Some(seq * SPAN), outcome_of(end.turn, reason), out);
            }
            _ => {}
        }
    }

    /// A step's durable message: the rest of its reply, then the reply's end.
    fn on_assistant(&mut self, seq: u64, a: &pb::AssistantMessage, out: &mut Vec<Step>) {
        if let Some(usage) = &a.usage {
            let total = self.usage.get_or_insert_with(pb::Usage::default);
            total.input_tokens += usage.input_tokens;
            total.output_tokens += usage.output_tokens;
            total.cached_input_tokens += usage.cached_input_tokens;
            total.cache_write_tokens += usage.cache_write_tokens;
        }
        let step = (a.turn, a.step);
        // Whatever the stream did not deliver comes as one delta, numbered as the live ones are.
        self.on_delta(step, 0, &a.text, out);
        if self.open.as_ref().is_some_and(|o| o.step == step) {
            self.open = None;
        }
        let Some(&anchor) = self.step_starts.get(&step) else { return };
        let only_calls = a.text.is_empty() && !a.tool_calls.is_empty();
        if anchor > self.said && !only_calls {
            self.said = anchor;
            let change = Change::Replied { step: anchor, text: a.text.clone(), interrupted: a.interrupted };
            self.emit(out, seq * SPAN, change);
        }
    }

    /// A piece of step `step`'s reply at byte `offset`: folds and returns the bytes not folded yet.
    fn on_delta(&mut self, step: (u64, u32), offset: u64, text: &str, out: &mut Vec<Step>) {
        if !self.ours(step.0) || text.is_empty() {
            return;
        }
        let Some(&anchor) = self.step_starts.get(&step) else { return };
        if anchor <= self.said {
            return;
        }
        let open = match &mut self.open {
            Some(open) if open.step == step => open,
            Some(open) if open.anchor > anchor => return,
            _ => self.open.insert(Open { step, anchor, sent_end: 0 }),
        };
        let Some((piece, end)) = unsent(text, offset, open.sent_end) else { return };
        open.sent_end = end;
        match self.replies.last_mut() {
            Some((at, text)) if *at == anchor => text.push_str(piece),
            _ => self.replies.push((anchor, piece.to_owned())),
        }
        self.emit(out, text_position(anchor, end), Change::Text { step: anchor, piece: piece.to_owned() });
    }

    /// Ends the turn with `outcome`; the final change gets `position` (none: after anything else).
    fn finish(&mut self, position: Option<u64>, outcome: Outcome, out: &mut Vec<Step>) {
        self.outcome = Some(outcome.clone());
        self.open = None;
        self.waiting = None;
        self.emit(out, position.unwrap_or(END), Change::Ended(outcome));
    }
}

/// The position of an end that has no durable event of its own (a delivery removed before it ran): after
/// anything else the turn could have produced, and below 2^53.
pub const END: u64 = u64::MAX >> 11;

fn removed() -> Outcome {
    Outcome::Cancelled("the message was removed before its turn started".into())
}

/// How the turn ended, from its `turn/end` reason.
pub fn outcome_of(turn: u64, reason: Option<&Reason>) -> Outcome {
    match reason {
        Some(Reason::Completed(_)) | None => Outcome::Completed,
        Some(Reason::MaxTokens(_)) => Outcome::MaxTokens,
        Some(Reason::Blocked(b)) => Outcome::Blocked(b.reason.clone()),
        Some(Reason::Aborted(cause)) => {
            let cause = match cause.cause.as_ref() {
                Some(pb::cancel_cause::Cause::Parent(_)) => "parent".to_owned(),
                Some(pb::cancel_cause::Cause::Hook(h)) => format!("hook: {}", h.reason),
                Some(pb::cancel_cause::Cause::Disposed(_)) => "disposed".to_owned(),
                Some(pb::cancel_cause::Cause::SteerDeadline(_)) => "steer-deadline".to_owned(),
                Some(pb::cancel_cause::Cause::User(_)) | None => "user".to_owned(),
            };
            Outcome::Cancelled(format!("turn {turn} was cancelled ({cause})"))
        }
        Some(Reason::Error(e)) => {
            let code = if e.code.is_empty() { "server_error".to_owned() } else { e.code.clone() };
            Outcome::Failed { code, message: e.message.clone() }
        }
        Some(Reason::Interrupted(_)) => Outcome::Failed {
            code: "interrupted".into(),
            message: format!("turn {turn} was interrupted by a failover"),
        },
    }
}

#[cfg(test)]
mod tests;
