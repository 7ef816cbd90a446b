//! A response as a view of its session's log: [`ResponseFold`] folds the Watch items of one turn into the
//! Response object and, on the way, the Responses streaming events with their `sequence_number`s. What the
//! turn did (text, replies, calls, waits, the end, at their positions) is the shared [`TurnFold`]'s; this
//! module only renders it as OpenAI's output items and events.
//!
//! Sequence numbers come from the log, not from a counter, so that any gateway computes the same ones and
//! a stream resumed with `starting_after` (decision 0101) misses nothing and repeats nothing: an event
//! emitted at durable event `seq` is numbered `seq * SPAN + k` (k orders the events emitted there); the text
//! deltas of a step are numbered from the step's `step/start` seq as `S * SPAN + 2 + end`, where `end` is the
//! byte offset of the end of the delta within the step's reply (SPEC §14 offsets). A stream that resumes in
//! the middle of a reply therefore knows exactly which bytes the client has and sends the rest once, whether
//! the rest comes live, from the owner's partial output, or from the durable `assistant/message`.

use serde_json::{Value, json};
use turnstile_proto::v1 as pb;

use super::ids::{ResponseId, approval_id, function_call_id, item_id};
use super::input::INSTRUCTIONS_FORM;

pub use super::items::{Event, Input, Item, Meta, Outcome, render_item};
pub use crate::SPAN;
use crate::turn::{self, Call, Change, END, Step, TurnFold};

/// The fold of one response: its turn's [`TurnFold`], rendered as OpenAI's output items and events. Feed it
/// the session's Watch from the response's delivery on (`after_seq = id.seq - 1`); it returns the events
/// each item produces after `starting_after`.
#[derive(Debug)]
pub struct ResponseFold {
    id: ResponseId,
    meta: Meta,
    starting_after: u64,
    turn: TurnFold,
    output: Vec<Item>,
    /// The message item of the step streaming now: the step's `step/start` seq and the item's index.
    open: Option<(u64, usize)>,
    completed_ms: Option<u64>,
    /// Ahead of the turn's when the response ends at a call the turn waits on.
    outcome: Option<Outcome>,
}

impl ResponseFold {
    pub fn new(id: ResponseId, meta: Meta, starting_after: Option<u64>) -> Self {
        let turn = TurnFold::new(id.seq, 0).in_turn((id.turn > 0).then_some(id.turn));
        Self {
            id,
            meta,
            starting_after: starting_after.unwrap_or(0),
            turn,
            output: Vec::new(),
            open: None,
            completed_ms: None,
            outcome: None,
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
        self.turn.missing()
    }

    /// The turn answering the response, once known.
    pub fn turn(&self) -> Option<u64> {
        self.turn.turn()
    }

    /// The MessageId of the delivery that asked for the response, once its event was read.
    pub fn message_id(&self) -> Option<&str> {
        self.turn.message_id()
    }

    /// The input messages the turn entered (not the response's own `instructions`).
    pub fn inputs(&self) -> Vec<Input> {
        let inputs = self.turn.inputs().iter();
        inputs
            .filter_map(|(seq, message)| {
                let role = role_of(message)?;
                Some(Input { id: item_id("msg", &self.id.session, *seq), role, text: message.text() })
            })
            .collect()
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Folds one Watch item; returns the events it produces, numbered above `starting_after`.
    pub fn apply(&mut self, item: &pb::WatchItem) -> Vec<Event> {
        let mut out = Vec::new();
        if self.finished() {
            return out;
        }
        let time = match &item.item {
            Some(pb::watch_item::Item::Event(event)) => Some(event.time_unix_ms),
            _ => None,
        };
        for Step { position, change } in self.turn.fold(item) {
            match change {
                Change::Accepted => {
                    let created = self.snapshot();
                    self.emit(&mut out, position, json!({"type": "response.created", "response": created}));
                    let progress = self.snapshot();
                    self.emit(&mut out, position + 1, json!({"type": "response.in_progress", "response": progress}));
                }
                Change::Text { step, piece } => self.on_text(position, step, piece, &mut out),
                Change::Replied { step, text, interrupted } => {
                    let index = self.open_message(step, &mut out);
                    self.open = None;
                    self.close_message(position, index, text, interrupted, &mut out);
                }
                // The function call this response continues after was the previous response's output.
                Change::ClientCall(call) if self.continues_after(call.seq) => {}
                Change::ClientCall(call) => {
                    self.on_client_call(&call, &mut out);
                    self.completed_ms = time;
                    self.finish(call.seq * SPAN + 4, Outcome::Completed, &mut out);
                }
                // The call this response was asked to continue after (its id's seq) is an ordinary call here.
                Change::Waiting(call) if !self.continues_after(call.seq) => {
                    self.on_approval(&call, &mut out);
                    self.completed_ms = time;
                    self.finish(call.seq * SPAN + 2, Outcome::Completed, &mut out);
                }
                Change::ToolCall(call) | Change::Waiting(call) => self.on_tool_call(&call, &mut out),
                Change::ToolResult { call_id, output, error } => {
                    self.on_tool_result(position, &call_id, output, error, &mut out)
                }
                Change::Ended(outcome) => {
                    // Without a durable event of its own, the end is a delivery removed before it ran.
                    let outcome = match position {
                        END => cancelled_before_start(),
                        _ => Outcome::from(outcome),
                    };
                    self.completed_ms = time.filter(|_| position != END);
                    self.finish(position, outcome, &mut out);
                }
                Change::Started { .. } | Change::Decided { .. } => {}
            }
            if self.finished() {
                break;
            }
        }
        out
    }

    /// `seq` is the call this response continues its turn after (decisions 0103, 0113).
    fn continues_after(&self, seq: u64) -> bool {
        self.id.after_approval && seq == self.id.seq
    }

    /// The turn waits for the client that declared the tool (SPEC §19): the response ends with the function
    /// call, as OpenAI's do; the next request's `function_call_output` answers it and continues the turn
    /// (decision 0113).
    fn on_client_call(&mut self, call: &Call, out: &mut Vec<Event>) {
        let Some(turn) = self.turn.turn() else { return };
        let seq = call.seq;
        let item = Item::FunctionCall {
            id: item_id("fc", &self.id.session, seq),
            call_id: function_call_id(&self.id.session, turn, seq, &call.call_id),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        };
        let (index, rendered) = self.push(item);
        let id = rendered["id"].clone();
        let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
        self.emit(out, seq * SPAN, added);
        let delta = json!({"type": "response.function_call_arguments.delta", "item_id": id,
                           "output_index": index, "delta": call.arguments});
        self.emit(out, seq * SPAN + 1, delta);
        let args = json!({"type": "response.function_call_arguments.done", "item_id": id,
                          "output_index": index, "name": call.name, "arguments": call.arguments});
        self.emit(out, seq * SPAN + 2, args);
        let done = json!({"type": "response.output_item.done", "output_index": index, "item": rendered});
        self.emit(out, seq * SPAN + 3, done);
    }

    /// The turn waits for a person (SPEC §9): the response ends with OpenAI's approval request; the next
    /// response's `mcp_approval_response` decides it and continues the turn.
    fn on_approval(&mut self, call: &Call, out: &mut Vec<Event>) {
        let Some(turn) = self.turn.turn() else { return };
        let seq = call.seq;
        let item = Item::Approval {
            id: approval_id(&self.id.session, turn, seq, &call.call_id),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        };
        let (index, rendered) = self.push(item);
        let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
        self.emit(out, seq * SPAN, added);
        let done = json!({"type": "response.output_item.done", "output_index": index, "item": rendered});
        self.emit(out, seq * SPAN + 1, done);
    }

    fn on_tool_call(&mut self, call: &Call, out: &mut Vec<Event>) {
        let item = Item::Tool {
            id: item_id("mcp", &self.id.session, call.seq),
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            output: None,
            error: None,
        };
        let (index, rendered) = self.push(item);
        // k = 2: after `response.created` and `in_progress` when the response starts at this call.
        let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
        self.emit(out, call.seq * SPAN + 2, added);
    }

    fn on_tool_result(
        &mut self,
        position: u64,
        id: &str,
        result: String,
        failed: Option<String>,
        out: &mut Vec<Event>,
    ) {
        let found = self
            .output
            .iter_mut()
            .position(|item| matches!(item, Item::Tool { call_id, output: None, .. } if call_id == id));
        let Some(index) = found else { return };
        if let Item::Tool { output, error, .. } = &mut self.output[index] {
            *output = Some(result);
            *error = failed;
        }
        let item = render_item(&self.output[index]);
        self.emit(out, position, json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }

    fn push(&mut self, item: Item) -> (usize, Value) {
        let rendered = render_item(&item);
        self.output.push(item);
        (self.output.len() - 1, rendered)
    }

    /// The index of the message item of the step whose `step/start` is at `anchor`: opened (with its
    /// events, numbered from `anchor`) when this is the step's first text.
    fn open_message(&mut self, anchor: u64, out: &mut Vec<Event>) -> usize {
        match self.open {
            Some((at, index)) if at == anchor => index,
            _ => {
                let id = item_id("msg", &self.id.session, anchor);
                let item = Item::Message { id: id.clone(), text: String::new(), done: false, interrupted: false };
                let (index, rendered) = self.push(item);
                let added = json!({"type": "response.output_item.added", "output_index": index, "item": rendered});
                self.emit(out, anchor * SPAN, added);
                let part = json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                                  "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}});
                self.emit(out, anchor * SPAN + 1, part);
                self.open = Some((anchor, index));
                index
            }
        }
    }

    /// More of step `anchor`'s reply: sends the bytes the client does not have yet.
    fn on_text(&mut self, position: u64, anchor: u64, piece: String, out: &mut Vec<Event>) {
        let index = self.open_message(anchor, out);
        if let Item::Message { text, .. } = &mut self.output[index] {
            text.push_str(&piece);
        }
        let Some(Step { change: Change::Text { piece, .. }, .. }) =
            (Step { position, change: Change::Text { step: anchor, piece } }).past(self.starting_after)
        else {
            return;
        };
        let id = item_id("msg", &self.id.session, anchor);
        self.emit(
            out,
            position,
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": []}),
        );
    }

    /// Ends the message item at `index` with its whole `text` and the done events at `position`.
    fn close_message(&mut self, position: u64, index: usize, text: String, interrupted: bool, out: &mut Vec<Event>) {
        if let Item::Message { text: so_far, done, interrupted: cut, .. } = &mut self.output[index] {
            *so_far = text;
            *done = true;
            *cut = interrupted;
        }
        let item = render_item(&self.output[index]);
        let id = item["id"].clone();
        let text = item["content"][0]["text"].clone();
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.emit(
            out,
            position,
            json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.emit(
            out,
            position + 1,
            json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.emit(out, position + 2, json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }

    /// Ends the response with `outcome`; the final event gets `number`.
    fn finish(&mut self, number: u64, outcome: Outcome, out: &mut Vec<Event>) {
        self.outcome = Some(outcome);
        self.open = None;
        let kind = match self.outcome {
            Some(Outcome::Completed) => "response.completed",
            Some(Outcome::Incomplete(_)) => "response.incomplete",
            _ => "response.failed",
        };
        let response = self.snapshot();
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
            None if self.turn.queued() => "queued",
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
        let usage = match (self.turn.usage(), &self.outcome) {
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
        let instructions: Vec<String> = (self.turn.inputs().iter())
            .filter(|(_, message)| role_of(message).is_none())
            .map(|(_, message)| message.text())
            .collect();
        let instructions = match instructions.as_slice() {
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
            "created_at": self.turn.times_ms().0.unwrap_or_default() / 1000,
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

/// OpenAI's names for how a turn ended.
impl From<turn::Outcome> for Outcome {
    fn from(outcome: turn::Outcome) -> Self {
        match outcome {
            turn::Outcome::Completed => Outcome::Completed,
            turn::Outcome::MaxTokens => Outcome::Incomplete("max_output_tokens"),
            turn::Outcome::Blocked(_) => Outcome::Incomplete("content_filter"),
            turn::Outcome::Cancelled(message) => Outcome::Cancelled { message },
            turn::Outcome::Failed { code, message } => Outcome::Failed { code, message },
        }
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

#[cfg(test)]
mod tests;
