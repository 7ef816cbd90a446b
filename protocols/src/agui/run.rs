//! A run as a view of its session's log: [`RunFold`] folds the Watch items from the run's start into
//! AG-UI events, each numbered from the log as the OpenAI stream is (decision 0101): an event at durable
//! event `seq` is `seq · 2^24 + k`, a text delta `S · 2^24 + 2 + end` (S its step's `step/start`, `end` the
//! byte offset of its end in the reply). The SSE id of an event is `S0.N`, the run's start seq and the
//! number, so a reconnect's `Last-Event-ID` names both the run and what the client already has
//! (decision 0114). A resumed stream starts with `RUN_STARTED` again and re-opens the step and text message
//! the client had open, so the client's event checks pass and nothing is sent twice.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;

use crate::SPAN;
use crate::turn::{had_of_step, text_position, unsent};

/// One AG-UI event: its number (none for the events a resumed stream repeats to re-open what the client
/// had open) and its JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub number: Option<u64>,
    pub body: Value,
}

impl Event {
    pub fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap_or_default()
    }
}

/// The id of the assistant message of the step whose `step/start` is at `seq`.
pub fn message_id(seq: u64) -> String {
    format!("ts-msg-{seq}")
}

/// The id of the tool message holding the result of call `call_id`.
pub fn tool_message_id(call_id: &str) -> String {
    format!("ts-tool-{call_id}")
}

/// A step's name in `STEP_STARTED` / `STEP_FINISHED`.
pub fn step_name(step: u32) -> String {
    format!("step-{step}")
}

/// Number of `RUN_STARTED` within its start seq: above anything else numbered there.
const RUN_STARTED_K: u64 = SPAN - 2;

/// The fold of one run. Feed it the session's Watch from the run's start on (`after_seq = start - 1`).
#[derive(Debug)]
pub struct RunFold {
    thread: String,
    run: String,
    start: u64,
    starting_after: u64,
    /// Sent right after `RUN_STARTED` (a join).
    snapshot: Option<Value>,
    /// The MessageId whose `user/message` names the run's turn (a run started by a delivery).
    message_id: Option<String>,
    turn: Option<u64>,
    step_starts: HashMap<(u64, u32), u64>,
    open_text: Option<OpenText>,
    /// Calls of client tools: their result is the client's own tool message, not streamed back.
    client_calls: HashSet<String>,
    finished: bool,
    /// What the client has open, as the events numbered up to now left it (a resumed stream re-opens it).
    view_step: Option<String>,
    view_text: Option<String>,
    reopened: bool,
}

#[derive(Debug)]
struct OpenText {
    step: (u64, u32),
    anchor: u64,
    sent_end: u64,
}

impl RunFold {
    /// The run `run` of thread `thread` from `start`: a delivery's seq (its turn found from the message it
    /// inserted, or given), a `turn/start` (a join), or a `tool/call` awaiting an answer (a continuation).
    pub fn new(thread: &str, run: &str, start: u64, turn: Option<u64>, starting_after: Option<u64>) -> Self {
        Self {
            thread: thread.to_owned(),
            run: run.to_owned(),
            start,
            starting_after: starting_after.unwrap_or(0),
            snapshot: None,
            message_id: None,
            turn,
            step_starts: HashMap::new(),
            open_text: None,
            client_calls: HashSet::new(),
            finished: false,
            view_step: None,
            view_text: None,
            reopened: false,
        }
    }

    /// Sends `MESSAGES_SNAPSHOT` with `messages` right after `RUN_STARTED` (a join).
    pub fn with_snapshot(mut self, messages: Value) -> Self {
        self.snapshot = Some(messages);
        self
    }

    /// The thread and the seq the run's stream starts at.
    pub fn thread_and_start(&self) -> (String, u64) {
        (self.thread.clone(), self.start)
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The SSE id of an event numbered `number` in this run.
    pub fn sse_id(&self, number: u64) -> String {
        format!("{}.{number}", self.start)
    }

    /// Folds one Watch item; returns the events it produces after `starting_after`.
    pub fn apply(&mut self, item: &pb::WatchItem) -> Vec<Event> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        match &item.item {
            Some(pb::watch_item::Item::Event(event)) => self.on_event(event, &mut out),
            Some(pb::watch_item::Item::Live(live)) => {
                if let Some(Live::AssistantDelta(d)) = &live.payload
                    && !d.reasoning
                {
                    self.on_delta((d.turn, d.step), d.offset, &d.text, &mut out);
                }
            }
            Some(pb::watch_item::Item::CaughtUp(caught)) => self.on_caught_up(caught, &mut out),
            None => {}
        }
        out
    }

    fn ours(&self, turn: u64) -> bool {
        self.turn == Some(turn)
    }

    fn on_caught_up(&mut self, caught: &pb::CaughtUp, out: &mut Vec<Event>) {
        if self.turn.is_some() || caught.seq < self.start {
            return;
        }
        let Some(message) = self.message_id.clone() else { return };
        let inbox = caught.inbox.as_ref();
        let pending = inbox.is_some_and(|i| i.next_turn.iter().chain(&i.next_step).any(|m| m.id == message));
        if !pending && caught.status == pb::SessionStatus::Idle as i32 {
            // Neither pending nor entered by a turn, and nothing runs: it was removed before it ran.
            self.finish(None, json!({"type": "RUN_FINISHED", "outcome": {"type": "cancelled"}}), out);
        }
    }

    fn on_event(&mut self, event: &pb::SessionEvent, out: &mut Vec<Event>) {
        let seq = event.seq;
        if seq < self.start {
            return;
        }
        let Some(payload) = &event.payload else { return };
        if seq == self.start {
            self.on_start(seq, payload, out);
        }
        match payload {
            Payload::StepStart(s) => {
                self.step_starts.insert((s.turn, s.step), seq);
                if self.ours(s.turn) {
                    self.emit(out, seq * SPAN, json!({"type": "STEP_STARTED", "stepName": step_name(s.step)}));
                }
            }
            Payload::UserMessage(u) => {
                let Some(message) = &u.message else { return };
                if self.turn.is_none() && self.message_id.as_deref() == Some(message.id.as_str()) {
                    // The run's turn is known from here on; its step started right before this message.
                    self.turn = Some(u.turn);
                    if let Some(&at) = self.step_starts.get(&(u.turn, u.step)) {
                        self.emit(out, at * SPAN, json!({"type": "STEP_STARTED", "stepName": step_name(u.step)}));
                    }
                }
            }
            Payload::AssistantMessage(a) if self.ours(a.turn) => {
                let step = (a.turn, a.step);
                // Whatever the stream did not deliver comes as one delta, numbered as the live ones are.
                self.on_delta(step, 0, &a.text, out);
                if self.open_text.as_ref().is_some_and(|o| o.step == step) {
                    self.close_text(seq * SPAN, out);
                }
            }
            Payload::ToolCall(c) if self.ours(c.turn) && seq != self.start => self.on_call(seq, c, out),
            Payload::ToolResult(r) if self.ours(r.turn) && !self.client_calls.contains(&r.call_id) => {
                let content = match &r.error {
                    Some(error) => error.clone(),
                    None => r.output.clone(),
                };
                let body = json!({"type": "TOOL_CALL_RESULT", "messageId": tool_message_id(&r.call_id),
                                  "toolCallId": r.call_id, "content": content, "role": "tool"});
                self.emit(out, seq * SPAN, body);
            }
            Payload::StepEnd(s) if self.ours(s.turn) => {
                // A reply cut by a failover has no durable message: its text ends here.
                if self.open_text.is_some() {
                    self.close_text(seq * SPAN, out);
                }
                self.emit(out, seq * SPAN + 1, json!({"type": "STEP_FINISHED", "stepName": step_name(s.step)}));
            }
            Payload::TurnEnd(end) if self.ours(end.turn) => {
                let reason = end.reason.as_ref().and_then(|r| r.reason.as_ref());
                if matches!(reason, Some(Reason::Interrupted(_))) {
                    // The owner died mid-turn; the new owner's next turn answers the same input (SPEC §6).
                    self.turn = Some(end.turn + 1);
                    return;
                }
                let body = match reason {
                    Some(Reason::Error(e)) => {
                        let code = if e.code.is_empty() { "server_error" } else { e.code.as_str() };
                        json!({"type": "RUN_ERROR", "message": e.message, "code": code})
                    }
                    Some(Reason::Aborted(_)) => json!({"type": "RUN_FINISHED", "outcome": {"type": "cancelled"}}),
                    _ => json!({"type": "RUN_FINISHED", "outcome": {"type": "success"}}),
                };
                self.finish(Some(seq * SPAN), body, out);
            }
            _ => {}
        }
    }

    /// The event the run starts at: `RUN_STARTED`, then the snapshot of a join, and for a continuation the
    /// step the waiting call belongs to (open again in this stream).
    fn on_start(&mut self, seq: u64, payload: &Payload, out: &mut Vec<Event>) {
        let started = json!({"type": "RUN_STARTED", "threadId": self.thread, "runId": self.run});
        self.emit(out, seq * SPAN + RUN_STARTED_K, started);
        match payload {
            Payload::InboxSpliced(s) if !s.inserted.is_empty() => {
                self.message_id = s.inserted.last().map(|m| m.id.clone());
            }
            Payload::TurnStart(t) => self.turn = Some(t.turn),
            Payload::ToolCall(c) if c.awaiting_client || c.awaiting_approval => {
                self.turn = Some(c.turn);
                if c.awaiting_client {
                    self.client_calls.insert(c.call_id.clone());
                }
            }
            // Only a `Last-Event-ID` this server did not send names anything else.
            _ => {
                let error = json!({"type": "RUN_ERROR", "code": "not_found",
                                   "message": format!("no run of this thread starts at seq {seq}: send the \
                                                       Last-Event-ID of an event this run streamed")});
                return self.finish(None, error, out);
            }
        }
        if let Some(messages) = self.snapshot.take() {
            out.push(Event { number: None, body: json!({"type": "MESSAGES_SNAPSHOT", "messages": messages}) });
        }
        if let Payload::ToolCall(c) = payload {
            let body = json!({"type": "STEP_STARTED", "stepName": step_name(c.step)});
            self.emit(out, seq * SPAN + RUN_STARTED_K + 1, body);
        }
    }

    fn on_call(&mut self, seq: u64, c: &pb::ToolCall, out: &mut Vec<Event>) {
        let mut start = json!({"type": "TOOL_CALL_START", "toolCallId": c.call_id, "toolCallName": c.name});
        if let Some(&anchor) = self.step_starts.get(&(c.turn, c.step)) {
            start["parentMessageId"] = json!(message_id(anchor));
        }
        self.emit(out, seq * SPAN, start);
        let args = json!({"type": "TOOL_CALL_ARGS", "toolCallId": c.call_id, "delta": c.arguments});
        self.emit(out, seq * SPAN + 1, args);
        self.emit(out, seq * SPAN + 2, json!({"type": "TOOL_CALL_END", "toolCallId": c.call_id}));
        let outcome = if c.awaiting_client {
            // A frontend tool (SPEC §19): the client runs it and answers in the next run's messages.
            json!({"type": "success", "pendingToolCallIds": [c.call_id]})
        } else if c.awaiting_approval {
            // An approval (SPEC §9): the next run's `resume` answers the interrupt.
            let interrupt = json!({"id": c.call_id, "reason": "tool_approval", "toolCallId": c.call_id,
                                   "message": format!("approve the call of {} with {}", c.name, c.arguments)});
            json!({"type": "interrupt", "interrupts": [interrupt]})
        } else {
            return;
        };
        // The step stays open in the log while the call waits; the run ends here, so its stream closes it.
        self.emit(out, seq * SPAN + 3, json!({"type": "STEP_FINISHED", "stepName": step_name(c.step)}));
        self.finish(Some(seq * SPAN + 4), json!({"type": "RUN_FINISHED", "outcome": outcome}), out);
    }

    /// A piece of step `step`'s reply at byte `offset`: opens the step's text message if needed and sends
    /// the bytes the client does not have yet.
    fn on_delta(&mut self, step: (u64, u32), offset: u64, text: &str, out: &mut Vec<Event>) {
        if !self.ours(step.0) || text.is_empty() {
            return;
        }
        let Some(&anchor) = self.step_starts.get(&step) else { return };
        if self.open_text.as_ref().is_none_or(|o| o.step != step) {
            let body = json!({"type": "TEXT_MESSAGE_START", "messageId": message_id(anchor), "role": "assistant"});
            self.emit(out, anchor * SPAN + 1, body);
            self.open_text = Some(OpenText { step, anchor, sent_end: 0 });
        }
        let Some(open) = self.open_text.as_mut() else { return };
        // What was sent, or a resumed client already has of this step (its `Last-Event-ID` names a delta of it).
        let known = open.sent_end.max(had_of_step(self.starting_after, open.anchor));
        let Some((piece, end)) = unsent(text, offset, known) else { return };
        open.sent_end = end;
        let anchor = open.anchor;
        let body = json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id(anchor), "delta": piece});
        self.emit(out, text_position(anchor, end), body);
    }

    fn close_text(&mut self, number: u64, out: &mut Vec<Event>) {
        if let Some(open) = self.open_text.take() {
            self.emit(out, number, json!({"type": "TEXT_MESSAGE_END", "messageId": message_id(open.anchor)}));
        }
    }

    /// Ends the run with `body`; without a durable event of its own it is numbered after anything else.
    fn finish(&mut self, number: Option<u64>, mut body: Value, out: &mut Vec<Event>) {
        self.close_text(number.unwrap_or(u64::MAX >> 11).saturating_sub(1), out);
        if body["type"] == "RUN_FINISHED" {
            // RUN_ERROR has no thread or run of its own (AG-UI's events are closed objects).
            body["threadId"] = json!(self.thread);
            body["runId"] = json!(self.run);
        }
        self.emit(out, number.unwrap_or(u64::MAX >> 11), body);
        self.finished = true;
    }

    /// Sends `body` numbered `number` unless the client has it; a resumed stream first re-opens what the
    /// client had open. `RUN_STARTED` always goes out: every stream starts with it.
    fn emit(&mut self, out: &mut Vec<Event>, number: u64, body: Value) {
        let kind = body["type"].as_str().unwrap_or_default().to_owned();
        if number <= self.starting_after {
            self.view(&kind, &body);
            if kind == "RUN_STARTED" {
                out.push(Event { number: None, body });
            }
            return;
        }
        if !self.reopened {
            self.reopened = true;
            if let Some(step) = self.view_step.clone() {
                out.push(Event { number: None, body: json!({"type": "STEP_STARTED", "stepName": step}) });
            }
            if let Some(id) = self.view_text.clone() {
                let start = json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"});
                out.push(Event { number: None, body: start });
            }
        }
        self.view(&kind, &body);
        out.push(Event { number: Some(number), body });
    }

    fn view(&mut self, kind: &str, body: &Value) {
        let text = |field: &str| body[field].as_str().map(str::to_owned);
        match kind {
            "STEP_STARTED" => self.view_step = text("stepName"),
            "STEP_FINISHED" => self.view_step = None,
            "TEXT_MESSAGE_START" => self.view_text = text("messageId"),
            "TEXT_MESSAGE_END" => self.view_text = None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
