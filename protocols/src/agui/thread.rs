//! A thread as its session's log has it: [`Thread`] folds the whole log into what a run needs to know
//! (which messages the session already has, which call waits for whom, whether a turn runs) and into the
//! messages of `MESSAGES_SNAPSHOT`.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::session_event::Payload;

use super::run::{message_id, tool_message_id};

/// A call that waits for an answer from outside the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub call_id: String,
    /// The seq of its `tool/call`: where the run that answers it starts.
    pub seq: u64,
    /// A client tool's call (answered by a tool message), not an approval (answered by `resume`).
    pub client: bool,
    pub name: String,
    pub arguments: String,
}

/// The thread so far.
#[derive(Debug, Default)]
pub struct Thread {
    /// Every MessageId the session accepted.
    pub known: HashSet<String>,
    /// The seq of the open turn's `turn/start`, while one is open.
    pub open_turn: Option<u64>,
    /// The call the open turn waits on, if any.
    pub waiting: Option<Waiting>,
    /// Messages for `MESSAGES_SNAPSHOT`, with the seq each starts at (user messages at 0: they are never
    /// streamed, so a join always gets them).
    messages: Vec<(u64, Value)>,
    /// Index in `messages` of the assistant message of each step, by its `step/start` seq.
    steps: HashMap<(u64, u32), u64>,
    assistant_at: HashMap<u64, usize>,
    calls: HashMap<String, Waiting>,
    pub last_seq: u64,
}

impl Thread {
    /// Folds one Watch item of a read from seq 0; `true` once the read caught up.
    pub fn apply(&mut self, item: &pb::WatchItem) -> bool {
        match &item.item {
            Some(pb::watch_item::Item::Event(event)) => {
                self.last_seq = event.seq;
                if let Some(payload) = &event.payload {
                    self.on_event(event.seq, payload);
                }
                false
            }
            Some(pb::watch_item::Item::CaughtUp(_)) => true,
            _ => false,
        }
    }

    fn on_event(&mut self, seq: u64, payload: &Payload) {
        match payload {
            Payload::InboxSpliced(s) => self.known.extend(s.inserted.iter().map(|m| m.id.clone())),
            Payload::TurnStart(_) => self.open_turn = Some(seq),
            Payload::TurnEnd(_) => {
                self.open_turn = None;
                self.waiting = None;
            }
            Payload::StepStart(s) => {
                self.steps.insert((s.turn, s.step), seq);
            }
            Payload::UserMessage(u) => {
                let Some(message) = &u.message else { return };
                self.known.insert(message.id.clone());
                let body = json!({"id": message.id, "role": role(message), "content": message.text()});
                self.messages.push((0, body));
            }
            Payload::AssistantMessage(a) => {
                let anchor = self.steps.get(&(a.turn, a.step)).copied().unwrap_or(seq);
                let mut body = json!({"id": message_id(anchor), "role": "assistant"});
                if !a.text.is_empty() {
                    body["content"] = json!(a.text);
                }
                if a.text.is_empty() && a.tool_calls.is_empty() {
                    return;
                }
                self.assistant_at.insert(anchor, self.messages.len());
                self.messages.push((anchor, body));
            }
            Payload::ToolCall(c) => {
                let waiting = Waiting {
                    call_id: c.call_id.clone(),
                    seq,
                    client: c.awaiting_client,
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                };
                if c.awaiting_client || c.awaiting_approval {
                    self.waiting = Some(waiting.clone());
                }
                self.calls.insert(c.call_id.clone(), waiting);
                let anchor = self.steps.get(&(c.turn, c.step)).copied().unwrap_or(seq);
                let index = match self.assistant_at.get(&anchor) {
                    Some(&i) => i,
                    None => {
                        self.assistant_at.insert(anchor, self.messages.len());
                        self.messages.push((anchor, json!({"id": message_id(anchor), "role": "assistant"})));
                        self.messages.len() - 1
                    }
                };
                let call = json!({"id": c.call_id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}});
                let message = &mut self.messages[index].1;
                match message["toolCalls"].as_array_mut() {
                    Some(calls) => calls.push(call),
                    None => message["toolCalls"] = json!([call]),
                }
            }
            Payload::ToolDecision(d) if self.waiting.as_ref().is_some_and(|w| w.call_id == d.call_id) => {
                self.waiting = None;
            }
            Payload::ToolResult(r) => {
                if self.waiting.as_ref().is_some_and(|w| w.call_id == r.call_id) {
                    self.waiting = None;
                }
                let mut body = json!({"id": tool_message_id(&r.call_id), "role": "tool", "toolCallId": r.call_id,
                                      "content": r.output});
                if let Some(error) = &r.error {
                    body["error"] = json!(error);
                }
                self.messages.push((seq, body));
            }
            _ => {}
        }
    }

    /// The call `call_id` of this thread, if it was ever made.
    pub fn call(&self, call_id: &str) -> Option<&Waiting> {
        self.calls.get(call_id)
    }

    /// The messages a join's `MESSAGES_SNAPSHOT` holds: every message, but the streamed ones (assistant and
    /// tool messages) only from before `before` (the seq the joined run's stream starts at).
    pub fn snapshot(&self, before: u64) -> Value {
        Value::Array(self.messages.iter().filter(|(seq, _)| *seq < before).map(|(_, m)| m.clone()).collect())
    }
}

/// The AG-UI role of a message the session entered.
fn role(message: &pb::UserMessage) -> &'static str {
    use pb::message_source::Kind;
    match message.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(Kind::Plugin(p)) if p.form == super::SYSTEM_FORM => "system",
        Some(Kind::Plugin(_)) => "developer",
        Some(Kind::Model(_)) => "assistant",
        _ => "user",
    }
}
