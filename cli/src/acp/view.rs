//! A session's Watch as ACP `session/update`s (sans-IO): user messages, the reply's chunks (each byte once,
//! whether it came live or only in the durable message), tool calls and their results; and the signals the
//! editor's requests wait on (the turn a prompt's message started, a turn's end, a call awaiting approval).

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::watch_item::Item;

/// How a turn ended, as a prompt answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// An ACP stop reason: `end_turn`, `max_tokens`, `refusal`, `cancelled`.
    Reason(&'static str),
    /// The turn failed: the prompt answers an error with this message.
    Failed(String),
}

/// A call awaiting a decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) call_id: String,
    pub(crate) name: String,
    pub(crate) arguments: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// The message `message_id` entered turn `turn`.
    Entered { message_id: String, turn: u64 },
    /// Turn `turn` ended; an interrupted turn (a failover) goes on as `turn + 1`.
    Ended { turn: u64, stop: Option<Stop> },
    /// A call waits for the editor's permission.
    Ask(Waiting),
    /// The view caught up with the log: what follows is live.
    CaughtUp,
}

/// What one Watch item makes.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) updates: Vec<Value>,
    pub(crate) signals: Vec<Signal>,
}

#[derive(Debug, Default)]
pub(crate) struct View {
    /// The last durable seq seen (a reconnect resumes after it).
    pub(crate) seq: u64,
    live: bool,
    /// Bytes of each step's reply already sent.
    sent: HashMap<(u64, u32), u64>,
    /// MessageIds this process delivered: the editor shows them already, so they are not echoed.
    own: HashSet<String>,
    /// Calls awaiting a decision, in order (asked about once the view is live).
    waiting: Vec<Waiting>,
}

impl View {
    /// A view whose first items are the session's history after `seq`.
    pub(crate) fn after(seq: u64) -> Self {
        Self { seq, ..Self::default() }
    }

    /// A message this process delivers (not echoed back as a user chunk).
    pub(crate) fn own(&mut self, message_id: &str) {
        self.own.insert(message_id.to_owned());
    }

    pub(crate) fn apply(&mut self, item: &pb::WatchItem) -> Output {
        let mut out = Output::default();
        match &item.item {
            Some(Item::Event(event)) if event.seq > self.seq => {
                self.seq = event.seq;
                if let Some(payload) = &event.payload {
                    self.durable(payload, &mut out);
                }
            }
            Some(Item::Live(live)) => {
                if let Some(Live::AssistantDelta(d)) = &live.payload {
                    self.chunk((d.turn, d.step), d.offset, &d.text, d.reasoning, &mut out);
                }
            }
            Some(Item::CaughtUp(_)) if !self.live => {
                self.live = true;
                out.signals.push(Signal::CaughtUp);
                out.signals.extend(self.waiting.iter().cloned().map(Signal::Ask));
            }
            _ => {}
        }
        out
    }

    fn durable(&mut self, payload: &Durable, out: &mut Output) {
        match payload {
            Durable::UserMessage(u) => {
                let Some(message) = &u.message else { return };
                out.signals.push(Signal::Entered { message_id: message.id.clone(), turn: u.turn });
                if !self.own.contains(&message.id) {
                    let text = message.text();
                    out.updates.push(
                        json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": text}}),
                    );
                }
            }
            Durable::AssistantMessage(a) => self.chunk((a.turn, a.step), 0, &a.text, false, out),
            Durable::ToolCall(c) => {
                let status = if c.awaiting_approval { "pending" } else { "in_progress" };
                out.updates.push(json!({
                    "sessionUpdate": "tool_call", "toolCallId": c.call_id, "title": c.name, "kind": "other",
                    "status": status, "rawInput": raw(&c.arguments),
                }));
                if c.awaiting_approval {
                    let waiting =
                        Waiting { call_id: c.call_id.clone(), name: c.name.clone(), arguments: c.arguments.clone() };
                    if self.live {
                        out.signals.push(Signal::Ask(waiting.clone()));
                    }
                    self.waiting.push(waiting);
                }
            }
            Durable::ToolDecision(d) => {
                self.waiting.retain(|w| w.call_id != d.call_id);
                if d.approved {
                    out.updates.push(
                        json!({"sessionUpdate": "tool_call_update", "toolCallId": d.call_id, "status": "in_progress"}),
                    );
                }
            }
            Durable::ToolResult(r) => {
                let (status, text) = match &r.error {
                    Some(error) => ("failed", error.as_str()),
                    None => ("completed", r.output.as_str()),
                };
                out.updates.push(json!({
                    "sessionUpdate": "tool_call_update", "toolCallId": r.call_id, "status": status,
                    "content": [{"type": "content", "content": {"type": "text", "text": text}}],
                    "rawOutput": raw(&r.output),
                }));
            }
            Durable::TurnEnd(end) => {
                let reason = end.reason.as_ref().and_then(|r| r.reason.as_ref());
                let stop = match reason {
                    Some(Reason::Interrupted(_)) => None,
                    Some(Reason::Completed(_)) | None => Some(Stop::Reason("end_turn")),
                    Some(Reason::MaxTokens(_)) => Some(Stop::Reason("max_tokens")),
                    Some(Reason::Blocked(_)) => Some(Stop::Reason("refusal")),
                    Some(Reason::Aborted(_)) => Some(Stop::Reason("cancelled")),
                    Some(Reason::Error(e)) => {
                        Some(Stop::Failed(format!("turn {} failed: {} ({})", end.turn, e.message, e.code)))
                    }
                };
                self.waiting.clear();
                out.signals.push(Signal::Ended { turn: end.turn, stop });
            }
            _ => {}
        }
    }

    /// A piece of step `step`'s text at byte `offset`: sends the bytes not sent yet.
    fn chunk(&mut self, step: (u64, u32), offset: u64, text: &str, thought: bool, out: &mut Output) {
        let sent = self.sent.entry(step).or_default();
        let end = offset + text.len() as u64;
        if thought || end <= *sent {
            if thought && !text.is_empty() {
                out.updates
                    .push(json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}}));
            }
            return;
        }
        let skip = usize::try_from(sent.saturating_sub(offset)).unwrap_or(usize::MAX);
        let Some(piece) = text.get(skip..).filter(|p| !p.is_empty()) else { return };
        *sent = end;
        out.updates.push(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": piece}}));
    }
}

/// A call's arguments or output as ACP's `rawInput`/`rawOutput`: JSON when they are, else the string.
fn raw(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, payload: Durable) -> pb::WatchItem {
        pb::WatchItem {
            item: Some(Item::Event(pb::SessionEvent { seq, payload: Some(payload), ..Default::default() })),
        }
    }

    fn delta(offset: u64, text: &str) -> pb::WatchItem {
        let d = pb::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning: false, offset };
        pb::WatchItem {
            item: Some(Item::Live(pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), ..Default::default() })),
        }
    }

    fn user(id: &str, text: &str) -> Durable {
        let message = pb::UserMessage {
            id: id.into(),
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.into() })),
            }],
            source: None,
        };
        Durable::UserMessage(pb::UserMessageEvent { message: Some(message), turn: 1, step: 1 })
    }

    fn texts(out: &[Output]) -> String {
        out.iter()
            .flat_map(|o| &o.updates)
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .map(|u| u["content"]["text"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_reply_is_sent_once_whether_streamed_or_durable() {
        let mut view = View::after(0);
        view.own("m1");
        let items = [
            ev(1, user("m1", "hi")),
            delta(0, "hel"),
            delta(0, "hel"),
            delta(3, "lo"),
            ev(
                2,
                Durable::AssistantMessage(pb::AssistantMessage {
                    turn: 1,
                    step: 1,
                    text: "hello world".into(),
                    ..Default::default()
                }),
            ),
            ev(
                3,
                Durable::TurnEnd(pb::TurnEnd {
                    turn: 1,
                    reason: Some(pb::TurnEndReason { reason: Some(Reason::Completed(pb::Empty {})) }),
                }),
            ),
        ];
        let out: Vec<Output> = items.iter().map(|i| view.apply(i)).collect();
        assert_eq!(texts(&out), "hello world");
        assert!(out[0].updates.is_empty(), "the editor's own prompt is not echoed");
        assert_eq!(out[0].signals, [Signal::Entered { message_id: "m1".into(), turn: 1 }]);
        assert_eq!(out[5].signals, [Signal::Ended { turn: 1, stop: Some(Stop::Reason("end_turn")) }]);
    }

    #[test]
    fn a_replay_echoes_user_messages_and_asks_about_waiting_calls_once_live() {
        let mut view = View::after(0);
        let call = pb::ToolCall {
            turn: 1,
            step: 1,
            call_id: "c1".into(),
            name: "echo".into(),
            arguments: "x".into(),
            awaiting_approval: true,
            awaiting_client: false,
            idempotency_key: String::new(),
        };
        let first = view.apply(&ev(1, user("m1", "hi")));
        assert_eq!(first.updates[0]["sessionUpdate"], "user_message_chunk");
        let called = view.apply(&ev(2, Durable::ToolCall(call)));
        assert_eq!(called.updates[0]["status"], "pending");
        assert!(called.signals.is_empty(), "not asked while replaying");
        let caught = view.apply(&pb::WatchItem { item: Some(Item::CaughtUp(pb::CaughtUp::default())) });
        let ask = Waiting { call_id: "c1".into(), name: "echo".into(), arguments: "x".into() };
        assert_eq!(caught.signals, [Signal::CaughtUp, Signal::Ask(ask)]);
        // An event seen again (a reconnect) changes nothing.
        assert!(view.apply(&ev(2, Durable::ToolDecision(pb::ToolDecision::default()))).updates.is_empty());
    }
}
