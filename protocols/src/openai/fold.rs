//! A response as a view of its session's log: [`ResponseFold`] folds the Watch items of one turn into the
//! Response object and, on the way, the Responses streaming events with their `sequence_number`s.
//!
//! Sequence numbers come from the log, not from a counter, so that any gateway computes the same ones and
//! a stream resumed with `starting_after` (decision 0101) misses nothing and repeats nothing: an event
//! emitted at durable event `seq` is numbered `seq * SPAN + k` (k orders the events emitted there); the text
//! deltas of a step are numbered from the step's `step/start` seq as `S * SPAN + 2 + end`, where `end` is the
//! byte offset of the end of the delta within the step's reply (SPEC §14 offsets). A stream that resumes in
//! the middle of a reply therefore knows exactly which bytes the client has and sends the rest once, whether
//! the rest comes live, from the owner's partial output, or from the durable `assistant/message`.

use std::collections::HashMap;

use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;

use super::ids::{ResponseId, approval_id, function_call_id, item_id};
use super::input::INSTRUCTIONS_FORM;

pub use super::items::{Event, Input, Item, Meta, Outcome, render_item};
pub use crate::SPAN;
use crate::turn::{had_of_step, text_position, unsent};

/// The fold of one response. Feed it the session's Watch from the response's delivery on
/// (`after_seq = id.seq - 1`); it returns the events each item produces after `starting_after`.
#[derive(Debug)]
pub struct ResponseFold {
    id: ResponseId,
    meta: Meta,
    starting_after: u64,
    message_id: Option<String>,
    turn: Option<u64>,
    created_ms: Option<u64>,
    completed_ms: Option<u64>,
    step_starts: HashMap<(u64, u32), u64>,
    output: Vec<Item>,
    /// The message item of the step streaming now, with the reply bytes already sent.
    open: Option<Open>,
    inputs: Vec<Input>,
    instructions: Vec<String>,
    usage: Option<pb::Usage>,
    outcome: Option<Outcome>,
    /// From `caught_up`: the response's message still waits in the inbox.
    queued: bool,
    /// `caught_up` came before the delivery's event: the response does not exist (any more).
    missing: bool,
}

#[derive(Debug)]
struct Open {
    step: (u64, u32),
    index: usize,
    anchor: u64,
    sent_end: u64,
}

impl ResponseFold {
    pub fn new(id: ResponseId, meta: Meta, starting_after: Option<u64>) -> Self {
        let turn = (id.turn > 0).then_some(id.turn);
        Self {
            id,
            meta,
            starting_after: starting_after.unwrap_or(0),
            message_id: None,
            turn,
            created_ms: None,
            completed_ms: None,
            step_starts: HashMap::new(),
            output: Vec::new(),
            open: None,
            inputs: Vec::new(),
            instructions: Vec::new(),
            usage: None,
            outcome: None,
            queued: false,
            missing: false,
        }
    }

    pub fn id(&self) -> &ResponseId {
        &self.id
    }

    /// The response has ended: nothing of its turn follows.
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// The read caught up before the response's seq: the response is not there (deleted, never there, or
    /// not yet visible to a lagging read).
    pub fn missing(&self) -> bool {
        self.missing
    }

    /// The turn answering the response, once known.
    pub fn turn(&self) -> Option<u64> {
        self.turn
    }

    /// The MessageId of the delivery that asked for the response, once its event was read.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    pub fn inputs(&self) -> &[Input] {
        &self.inputs
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Folds one Watch item; returns the events it produces, numbered above `starting_after`.
    pub fn apply(&mut self, item: &pb::WatchItem) -> Vec<Event> {
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
                    self.finish(None, cancelled_before_start(), &mut out);
                }
                _ => {}
            },
            Some(pb::watch_item::Item::CaughtUp(caught)) => self.on_caught_up(caught, &mut out),
            None => {}
        }
        out
    }

    fn on_caught_up(&mut self, caught: &pb::CaughtUp, out: &mut Vec<Event>) {
        if self.created_ms.is_none() {
            self.missing = caught.seq < self.id.seq;
            return;
        }
        if self.turn.is_some() || self.outcome.is_some() {
            return;
        }
        let Some(message) = self.message_id.clone() else { return };
        let inbox = caught.inbox.as_ref();
        let pending = inbox.is_some_and(|i| i.next_turn.iter().chain(&i.next_step).any(|m| m.id == message));
        self.queued = pending;
        let idle = caught.status == pb::SessionStatus::Idle as i32;
        if !pending && idle {
            // Neither pending nor entered by any turn, and nothing runs: it was removed before it ran.
            self.finish(None, cancelled_before_start(), out);
        }
    }

    fn ours(&self, turn: u64) -> bool {
        self.turn == Some(turn)
    }

    /// `seq` is the call this response continues its turn after (decisions 0103, 0113).
    fn continues_after(&self, seq: u64) -> bool {
        self.id.after_approval && seq == self.id.seq
    }

    fn on_event(&mut self, event: &pb::SessionEvent, out: &mut Vec<Event>) {
        let seq = event.seq;
        if seq < self.id.seq || self.outcome.is_some() {
            return;
        }
        let Some(payload) = &event.payload else { return };
        if seq == self.id.seq {
            self.missing = false;
            self.created_ms = Some(event.time_unix_ms);
            self.message_id = match payload {
                Payload::InboxSpliced(s) => s.inserted.last().map(|m| m.id.clone()),
                Payload::UserMessage(u) => u.message.as_ref().map(|m| m.id.clone()),
                _ => None,
            };
            let created = self.snapshot();
            self.emit(out, seq * SPAN, json!({"type": "response.created", "response": created}));
            let progress = self.snapshot();
            self.emit(out, seq * SPAN + 1, json!({"type": "response.in_progress", "response": progress}));
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
                }
                if self.ours(u.turn) {
                    let text = text_of(message);
                    match role_of(message) {
                        Some(role) => self.inputs.push(Input { id: item_id("msg", &self.id.session, seq), role, text }),
                        None => self.instructions.push(text),
                    }
                }
            }
            Payload::AssistantMessage(a) if self.ours(a.turn) => self.on_assistant(seq, a, out),
            // The function call this response continues after was the previous response's output.
            Payload::ToolCall(c) if self.ours(c.turn) && c.awaiting_client && self.continues_after(seq) => {}
            Payload::ToolCall(c) if self.ours(c.turn) && c.awaiting_client => {
                // The turn waits for the client that declared the tool (SPEC §19): the response ends here
                // with the function call, as OpenAI's do; the next request's `function_call_output`
                // answers it and continues the turn (decision 0113).
                let item = Item::FunctionCall {
                    id: item_id("fc", &self.id.session, seq),
                    call_id: function_call_id(&self.id.session, c.turn, seq, &c.call_id),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                };
                let index = self.output.len();
                let rendered = render_item(&item);
                let id = rendered["id"].clone();
                self.output.push(item);
                let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
                self.emit(out, seq * SPAN, added);
                let delta = json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                   "output_index": index, "delta": c.arguments});
                self.emit(out, seq * SPAN + 1, delta);
                let args = json!({"type": "response.function_call_arguments.done", "item_id": id,
                                  "output_index": index, "name": c.name, "arguments": c.arguments});
                self.emit(out, seq * SPAN + 2, args);
                let done = json!({"type": "response.output_item.done", "output_index": index, "item": rendered});
                self.emit(out, seq * SPAN + 3, done);
                self.completed_ms = Some(event.time_unix_ms);
                self.finish(Some(seq * SPAN + 4), Outcome::Completed, out);
            }
            // The call this response was asked to continue after (its id's seq) is an ordinary call here.
            Payload::ToolCall(c) if self.ours(c.turn) && c.awaiting_approval && !self.continues_after(seq) => {
                // The turn waits for a person (SPEC §9): the response ends here with OpenAI's approval
                // request; the next response's `mcp_approval_response` decides it and continues the turn.
                let item = Item::Approval {
                    id: approval_id(&self.id.session, c.turn, seq, &c.call_id),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                };
                let index = self.output.len();
                let rendered = render_item(&item);
                self.output.push(item);
                let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
                self.emit(out, seq * SPAN, added);
                let done = json!({"type": "response.output_item.done", "output_index": index, "item": rendered});
                self.emit(out, seq * SPAN + 1, done);
                self.completed_ms = Some(event.time_unix_ms);
                self.finish(Some(seq * SPAN + 2), Outcome::Completed, out);
            }
            Payload::ToolCall(c) if self.ours(c.turn) => {
                let item = Item::Tool {
                    id: item_id("mcp", &self.id.session, seq),
                    call_id: c.call_id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                    output: None,
                    error: None,
                };
                let index = self.output.len();
                let body =
                    json!({"type": "response.output_item.added", "output_index": index, "item": render_item(&item)});
                self.output.push(item);
                // k = 2: after `response.created` and `in_progress` when the response starts at this call.
                self.emit(out, seq * SPAN + 2, body);
            }
            Payload::ToolResult(r) if self.ours(r.turn) => {
                let found = self.output.iter_mut().enumerate().find_map(|(index, item)| match item {
                    Item::Tool { call_id, output, error, .. } if *call_id == r.call_id && output.is_none() => {
                        *output = Some(r.output.clone());
                        error.clone_from(&r.error);
                        Some(index)
                    }
                    _ => None,
                });
                if let Some(index) = found {
                    let body = json!({"type": "response.output_item.done", "output_index": index, "item": render_item(&self.output[index])});
                    self.emit(out, seq * SPAN, body);
                }
            }
            Payload::TurnEnd(end) if self.ours(end.turn) => {
                let reason = end.reason.as_ref().and_then(|r| r.reason.as_ref());
                if matches!(reason, Some(Reason::Interrupted(_))) {
                    // The owner died mid-turn; the new owner's next turn answers the same input (SPEC §6). A
                    // reply cut short has no durable message: its item ends incomplete here.
                    if let Some(open) = self.open.take() {
                        self.close_message(seq, open.index, None, true, out);
                    }
                    self.turn = Some(end.turn + 1);
                    return;
                }
                self.completed_ms = Some(event.time_unix_ms);
                self.finish(Some(seq * SPAN), outcome_of(end.turn, reason), out);
            }
            _ => {}
        }
    }

    fn on_assistant(&mut self, seq: u64, a: &pb::AssistantMessage, out: &mut Vec<Event>) {
        if let Some(usage) = &a.usage {
            let total = self.usage.get_or_insert_with(pb::Usage::default);
            total.input_tokens += usage.input_tokens;
            total.output_tokens += usage.output_tokens;
            total.cached_input_tokens += usage.cached_input_tokens;
            total.cache_write_tokens += usage.cache_write_tokens;
        }
        if a.text.is_empty() && !a.tool_calls.is_empty() {
            return;
        }
        let step = (a.turn, a.step);
        // Whatever the stream did not deliver comes as one delta, numbered as the live ones are.
        self.on_delta(step, 0, &a.text, out);
        let Some(open) = self.open.take().filter(|o| o.step == step) else { return };
        self.close_message(seq, open.index, Some(&a.text), a.interrupted, out);
    }

    /// Ends the message item at `index` with the done events at durable event `seq`: with `text` (the
    /// durable message's), or with what was streamed when the step ended without one (a failover).
    fn close_message(&mut self, seq: u64, index: usize, text: Option<&str>, interrupted: bool, out: &mut Vec<Event>) {
        if let Item::Message { text: so_far, done, interrupted: cut, .. } = &mut self.output[index] {
            if let Some(text) = text {
                so_far.clear();
                so_far.push_str(text);
            }
            *done = true;
            *cut = interrupted;
        }
        let item = render_item(&self.output[index]);
        let id = item["id"].clone();
        let text = item["content"][0]["text"].clone();
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.emit(
            out,
            seq * SPAN,
            json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.emit(
            out,
            seq * SPAN + 1,
            json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.emit(
            out,
            seq * SPAN + 2,
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
    }

    /// A piece of step `step`'s reply at byte `offset`: opens the step's message item if needed and sends the
    /// bytes the client does not have yet.
    fn on_delta(&mut self, step: (u64, u32), offset: u64, text: &str, out: &mut Vec<Event>) {
        if !self.ours(step.0) {
            return;
        }
        let done_already =
            self.output.iter().any(|i| matches!(i, Item::Message { step: s, done: true, .. } if *s == step));
        if done_already {
            return;
        }
        let Some(&anchor) = self.step_starts.get(&step) else { return };
        if self.open.as_ref().is_none_or(|o| o.step != step) {
            let index = self.output.len();
            let id = item_id("msg", &self.id.session, anchor);
            let item = Item::Message { id: id.clone(), step, text: String::new(), done: false, interrupted: false };
            self.emit(
                out,
                anchor * SPAN,
                json!({"type": "response.output_item.added", "output_index": index, "item": render_item(&item)}),
            );
            self.emit(
                out,
                anchor * SPAN + 1,
                json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            self.output.push(item);
            self.open = Some(Open { step, index, anchor, sent_end: 0 });
        }
        let Some(open) = self.open.as_mut() else { return };
        // What was sent, or a resumed client already has of this step (its `starting_after` names a delta of it).
        let known = open.sent_end.max(had_of_step(self.starting_after, open.anchor));
        let Some((piece, end)) = unsent(text, offset, known) else { return };
        open.sent_end = end;
        let (anchor, index) = (open.anchor, open.index);
        let id = item_id("msg", &self.id.session, anchor);
        if let Item::Message { text: so_far, .. } = &mut self.output[index] {
            so_far.push_str(piece);
        }
        self.emit(
            out,
            text_position(anchor, end),
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": []}),
        );
    }

    /// Ends the response with `outcome`; the final event gets `number` (none: after anything else).
    fn finish(&mut self, number: Option<u64>, outcome: Outcome, out: &mut Vec<Event>) {
        self.outcome = Some(outcome);
        self.open = None;
        let kind = match self.outcome {
            Some(Outcome::Completed) => "response.completed",
            Some(Outcome::Incomplete(_)) => "response.incomplete",
            _ => "response.failed",
        };
        let response = self.snapshot();
        // Without a durable event of its own (a response removed before it ran), the end is numbered after
        // everything else the response could have produced.
        let number = number.unwrap_or(u64::MAX >> 11);
        self.emit(out, number, json!({"type": kind, "response": response}));
    }

    fn emit(&self, out: &mut Vec<Event>, number: u64, mut body: Value) {
        if number <= self.starting_after {
            return;
        }
        body["sequence_number"] = json!(number);
        out.push(Event { number, body });
    }

    /// The status OpenAI's clients read.
    pub fn status(&self) -> &'static str {
        match &self.outcome {
            None if self.queued => "queued",
            None => "in_progress",
            Some(Outcome::Completed) => "completed",
            Some(Outcome::Incomplete(_)) => "incomplete",
            Some(Outcome::Failed { .. }) => "failed",
            Some(Outcome::Cancelled { .. }) => "cancelled",
        }
    }

    /// The Response object as the log has it so far.
    pub fn snapshot(&self) -> Value {
        let (error, incomplete) = match &self.outcome {
            Some(Outcome::Failed { code, message }) => (json!({"code": code, "message": message}), Value::Null),
            Some(Outcome::Cancelled { message }) => (json!({"code": "cancelled", "message": message}), Value::Null),
            Some(Outcome::Incomplete(reason)) => (Value::Null, json!({"reason": reason})),
            _ => (Value::Null, Value::Null),
        };
        // Once ended, a response always has a usage (zero when the model reported none).
        let usage = match (&self.usage, &self.outcome) {
            (Some(u), _) => Some(*u),
            (None, Some(_)) => Some(pb::Usage::default()),
            (None, None) => None,
        };
        let usage = usage.as_ref().map_or(Value::Null, |u| {
            json!({
                "input_tokens": u.input_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_input_tokens, "cache_write_tokens": u.cache_write_tokens},
                "output_tokens": u.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.input_tokens + u.output_tokens,
            })
        });
        let instructions = match self.instructions.as_slice() {
            [] => Value::Null,
            parts => json!(parts.join("\n")),
        };
        let conversation = match self.id.conversation {
            true => json!({"id": super::ids::conversation_id(&self.id.session)}),
            false => Value::Null,
        };
        json!({
            "id": self.id.encode(),
            "object": "response",
            "created_at": self.created_ms.unwrap_or_default() / 1000,
            "status": self.status(),
            "background": self.meta.background,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": instructions,
            "metadata": self.meta.metadata,
            "model": self.meta.model,
            "output": self.output.iter().map(render_item).collect::<Vec<_>>(),
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "temperature": null,
            "top_p": null,
            "usage": usage,
            "conversation": conversation,
            "previous_response_id": null,
            "completed_at": self.completed_ms.map(|ms| ms / 1000),
            "store": true,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
        })
    }
}

fn cancelled_before_start() -> Outcome {
    Outcome::Cancelled { message: "the response was cancelled before its turn started".into() }
}

fn outcome_of(turn: u64, reason: Option<&Reason>) -> Outcome {
    match reason {
        Some(Reason::Completed(_)) | None => Outcome::Completed,
        Some(Reason::MaxTokens(_)) => Outcome::Incomplete("max_output_tokens"),
        Some(Reason::Blocked(_)) => Outcome::Incomplete("content_filter"),
        Some(Reason::Aborted(cause)) => {
            let cause = match cause.cause.as_ref() {
                Some(pb::cancel_cause::Cause::Parent(_)) => "parent".to_owned(),
                Some(pb::cancel_cause::Cause::Hook(h)) => format!("hook: {}", h.reason),
                Some(pb::cancel_cause::Cause::Disposed(_)) => "disposed".to_owned(),
                Some(pb::cancel_cause::Cause::SteerDeadline(_)) => "steer-deadline".to_owned(),
                Some(pb::cancel_cause::Cause::User(_)) | None => "user".to_owned(),
            };
            Outcome::Cancelled { message: format!("turn {turn} was cancelled ({cause})") }
        }
        Some(Reason::Error(e)) => {
            let code = if e.code.is_empty() { "server_error".to_owned() } else { e.code.clone() };
            Outcome::Failed { code, message: e.message.clone() }
        }
        // Handled by the caller (the response continues in the next turn); never an outcome.
        Some(Reason::Interrupted(_)) => Outcome::Failed {
            code: "interrupted".into(),
            message: format!("turn {turn} was interrupted by a failover"),
        },
    }
}

/// The role an input message had: `user` for prompts, `developer` for the context of plugins, `assistant`
/// for model-sourced ones; `None` for the response's own `instructions`.
fn role_of(message: &pb::UserMessage) -> Option<&'static str> {
    use pb::message_source::Kind;
    match message.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(Kind::Plugin(p)) if p.plugin == super::input::PLUGIN && p.form == INSTRUCTIONS_FORM => None,
        Some(Kind::Plugin(_)) => Some("developer"),
        Some(Kind::Model(_)) => Some("assistant"),
        _ => Some("user"),
    }
}

pub use crate::turn::text_of;

#[cfg(test)]
mod tests;
