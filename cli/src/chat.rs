//! `turnstile chat SESSION`: a terminal conversation over the public API.
//!
//! Each line read from stdin is delivered as a followup, or as a steer while the agent runs (it joins the
//! running turn's next step). The reply streams to stdout as its live deltas arrive; tool calls and turns
//! that did not complete get a line of their own. Ctrl-C while the agent runs stops the turn keeping the
//! inbox (`Cancel {keep_inbox: true}`: the cancel half of `interrupt`, whose message is the next line typed);
//! Ctrl-C while idle, or end of input once the session is idle (`WhenIdle`), ends the chat. Nothing is
//! replayed: the chat starts at the session's last seq.

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use tokio::sync::mpsc;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;

use crate::client::{self, Client, Delivery, Preset};
use crate::transcript::turn_end_name;

/// What the chat knows of the session from its Watch.
#[derive(Debug, Default)]
struct View {
    running: bool,
    /// The last durable seq printed.
    seq: u64,
    /// A reply line is open (deltas printed, no newline yet).
    mid_line: bool,
    /// The step whose reply is being printed (turn, step), and how many bytes of its text are out.
    step: Option<(u64, u32)>,
    printed: usize,
    /// A delta of this step went missing (the live subscription started after it): the rest of the text
    /// waits for the step's durable `assistant/message`.
    gap: bool,
    /// Where the reply goes instead of stdout (the unit tests read it).
    captured: Option<String>,
}

impl View {
    /// Writes reply text to stdout (or to `captured`) at once, without a newline.
    fn out(&mut self, text: &str) {
        match &mut self.captured {
            Some(captured) => captured.push_str(text),
            None => {
                print!("{text}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
        }
    }

    fn end_line(&mut self) {
        if self.mid_line {
            self.out("\n");
            self.mid_line = false;
        }
    }

    /// Prints what `delta` adds to its step's text. Live deltas are best-effort (one can be missed when it
    /// streamed before the subscription began); their byte offsets say where each belongs.
    fn delta(&mut self, delta: &pb::AssistantDelta) {
        let key = (delta.turn, delta.step);
        if self.step != Some(key) {
            self.step = Some(key);
            self.printed = 0;
            self.gap = false;
        }
        let start = usize::try_from(delta.offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(delta.text.len());
        if self.gap || end <= self.printed {
            return;
        }
        match self.printed.checked_sub(start).and_then(|skip| delta.text.get(skip..)) {
            Some(new) => {
                let new = new.to_owned();
                self.out(&new);
                self.printed = end;
                self.mid_line = true;
            }
            None => self.gap = true,
        }
    }

    /// Prints what the live deltas did not of `message`'s text, then ends the line: the durable message is
    /// the whole reply, so the chat shows it even when it saw none of the step's deltas.
    fn message(&mut self, message: &pb::AssistantMessage) {
        let printed = if self.step == Some((message.turn, message.step)) { self.printed } else { 0 };
        if let Some(rest) = message.text.get(printed..).filter(|rest| !rest.is_empty()) {
            self.out(rest);
            self.mid_line = true;
        }
        self.step = None;
        self.end_line();
    }

    fn item(&mut self, item: pb::WatchItem) {
        match item.item {
            Some(Item::CaughtUp(c)) => {
                self.seq = self.seq.max(c.seq);
                self.running = c.status == pb::SessionStatus::Running as i32;
            }
            Some(Item::Live(l)) => match l.payload {
                Some(Live::AssistantDelta(d)) if !d.reasoning => self.delta(&d),
                Some(Live::Status(s)) => self.running = s.status == pb::SessionStatus::Running as i32,
                Some(Live::Error(e)) => {
                    self.end_line();
                    eprintln!("[error in turn {}] {}", e.turn, e.message);
                }
                _ => {}
            },
            Some(Item::Event(e)) => {
                self.seq = self.seq.max(e.seq);
                match e.payload {
                    Some(Durable::AssistantMessage(m)) => self.message(&m),
                    Some(Durable::ToolCall(call)) => {
                        self.end_line();
                        let waits = if call.awaiting_approval { " (awaiting approval: turnstile decide)" } else { "" };
                        println!("[tool {} {}]{waits}", call.name, call.arguments);
                    }
                    Some(Durable::TurnEnd(end)) => {
                        self.end_line();
                        match end.reason.as_ref().and_then(|r| r.reason.as_ref()) {
                            Some(pb::turn_end_reason::Reason::Completed(_)) => {}
                            Some(pb::turn_end_reason::Reason::Error(e)) => {
                                println!("[turn {} error: {}]", end.turn, e.message);
                            }
                            _ => println!("[turn {} {}]", end.turn, turn_end_name(end.reason.as_ref())),
                        }
                    }
                    Some(Durable::Status(s)) => self.running = s.status == pb::SessionStatus::Running as i32,
                    _ => {}
                }
            }
            None => {}
        }
    }
}

/// Lines of stdin, read on a thread of their own (tokio's stdin is a thread as well); `None` at the end.
pub(crate) fn stdin_lines() -> mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    rx
}

type IdleWait = futures::future::BoxFuture<'static, Result<tonic::Response<pb::SessionInfo>, tonic::Status>>;

/// `WhenIdle` with the server's default wait, as a future the chat loop holds.
fn when_idle(client: &Client, session: &pb::SessionRef) -> IdleWait {
    let mut api = client.api.clone();
    let request = pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms: 0 };
    Box::pin(async move { api.when_idle(request).await })
}

pub async fn run(client: &mut Client, id: &str) -> Result<()> {
    client::check_session(&client.tenant, id)?;
    let session = client.session(id);
    let after_seq = match client.api.get_session(pb::GetSessionRequest { session: Some(session.clone()) }).await {
        Ok(info) => info.into_inner().last_seq,
        Err(status) if status.code() == tonic::Code::NotFound => 0,
        Err(status) => return Err(status.into()),
    };
    let request = pb::WatchRequest { session: Some(session.clone()), after_seq, live: true, resume: None };
    let mut stream = client.api.watch(request).await?.into_inner();
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot listen for Ctrl-C")?;
    let mut lines = stdin_lines();
    let mut input_open = true;
    // Set at end of input: the seq WhenIdle answered; the chat ends once the Watch has printed it.
    let mut idle_at: Option<u64> = None;
    let mut idle_wait: Option<IdleWait> = None;
    let mut view = View::default();
    eprintln!(
        "chat with {id}: each line is a followup (a steer while the agent runs); Ctrl-C stops a running turn, \
         Ctrl-C when idle or end of input (Ctrl-D) ends the chat"
    );
    loop {
        if idle_at.is_some_and(|seq| view.seq >= seq) {
            view.end_line();
            return Ok(());
        }
        tokio::select! {
            item = stream.next() => match item {
                Some(item) => view.item(item?),
                None => bail!("the gateway ended the Watch; run `turnstile chat {id}` again"),
            },
            line = lines.recv(), if input_open => match line {
                Some(line) => {
                    let text = line.context("reading stdin")?;
                    if text.trim().is_empty() {
                        continue;
                    }
                    let preset = if view.running {
                        Preset::Steer { expected_turn: None, deadline_ms: None, on_deadline: None }
                    } else {
                        Preset::Followup
                    };
                    let delivery = Delivery { session: id.to_owned(), text, id: None, source: None };
                    let (_, reply) = client::deliver(client, preset, &delivery).await?;
                    // A waking delivery to an idle session opened a turn before it replied.
                    view.running |= reply.turn.is_some();
                }
                None => {
                    input_open = false;
                    idle_wait = Some(when_idle(client, &session));
                }
            },
            idle = async {
                match idle_wait.as_mut() {
                    Some(wait) => wait.await,
                    None => std::future::pending().await,
                }
            } => match idle {
                Ok(info) => {
                    idle_wait = None;
                    idle_at = Some(info.into_inner().last_seq);
                }
                // Still running after the server's default wait: keep streaming and ask again.
                Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                    idle_wait = Some(when_idle(client, &session));
                }
                // A session that was never written is as idle as it gets.
                Err(status) if status.code() == tonic::Code::NotFound => return Ok(()),
                Err(status) => return Err(status.into()),
            },
            _ = interrupts.recv() => {
                if !view.running {
                    view.end_line();
                    return Ok(());
                }
                view.end_line();
                let cancel = pb::CancelRequest {
                    session: Some(session.clone()),
                    cause: None,
                    keep_inbox: true,
                };
                let reply = client.api.cancel(cancel).await?.into_inner();
                eprintln!("[interrupted at seq {}; the inbox is kept, type the next message]", reply.seq);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str, offset: u64) -> pb::WatchItem {
        let d = pb::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning: false, offset };
        pb::WatchItem {
            item: Some(Item::Live(pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), ..Default::default() })),
        }
    }

    fn message(text: &str) -> pb::WatchItem {
        let m = pb::AssistantMessage { turn: 1, step: 1, text: text.into(), ..Default::default() };
        let event = pb::SessionEvent { seq: 7, payload: Some(Durable::AssistantMessage(m)), ..Default::default() };
        pb::WatchItem { item: Some(Item::Event(event)) }
    }

    fn shown(items: Vec<pb::WatchItem>) -> String {
        let mut view = View { captured: Some(String::new()), ..View::default() };
        for item in items {
            view.item(item);
        }
        view.captured.unwrap()
    }

    #[test]
    fn every_delta_seen_prints_the_reply_once() {
        assert_eq!(shown(vec![delta("echo: ", 0), delta("hello", 6), message("echo: hello")]), "echo: hello\n");
    }

    #[test]
    fn a_reply_whose_deltas_streamed_before_the_subscription_comes_from_its_message() {
        assert_eq!(shown(vec![message("echo: hello")]), "echo: hello\n");
    }

    #[test]
    fn a_missed_delta_leaves_the_rest_to_the_message_and_repeats_nothing() {
        // The first delta went missing: nothing is printed out of place, the message completes the line.
        assert_eq!(shown(vec![delta("hello", 6), message("echo: hello")]), "echo: hello\n");
        // A repeated delta prints nothing twice.
        assert_eq!(
            shown(vec![delta("echo: ", 0), delta("echo: ", 0), delta("hello", 6), message("echo: hello")]),
            "echo: hello\n"
        );
    }
}
