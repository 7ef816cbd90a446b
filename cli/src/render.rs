//! The human format of `turnstile watch` (`--json` prints the Watch items themselves, `json.rs`).
//!
//! Human: one line per event, durable lines prefixed by their seq (`#12`), live lines by `~`, indented by
//! depth (turn-level events 2 spaces inside a turn, step-level 4). `assistant/delta` text streams inline
//! and its line is ended before the next other event; reasoning deltas stream on lines of their own,
//! labelled `[reasoning]` (and dimmed on a terminal). `assistant/message` shows its reasoning and the
//! provider's token usage when it has them.

use std::io::IsTerminal as _;

use turnstile_model::message::{MessageSource, UserMessage};
use turnstile_model::{
    Envelope, EventPayload, Inbox, LiveEvent, LivePayload, RepairAction, Splice, SpliceOutcome, Status,
};

/// Longest text preview shown in a line, in characters.
const PREVIEW: usize = 60;
/// Width of the `#12` / `~` column.
const PREFIX: usize = 5;
/// ANSI faint on and off, around reasoning on a terminal.
const DIM: &str = "\x1b[2m";
const UNDIM: &str = "\x1b[22m";
/// The label of a line of reasoning deltas.
const REASONING: &str = "[reasoning] ";

/// Turns a Watch stream into human-readable text. Each call returns the text to print as is (deltas
/// have no trailing newline).
#[derive(Debug, Default)]
pub struct Renderer {
    in_turn: bool,
    in_step: bool,
    /// A delta line is open (printed without its newline yet): `Some(true)` for reasoning.
    in_delta: Option<bool>,
    /// Dim reasoning with ANSI codes.
    color: bool,
}

/// Whether stdout takes ANSI styling: a terminal, and `NO_COLOR` unset.
pub fn stdout_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `3f2a9c1e` for a UUID: enough to tell messages apart on screen (`inbox` shows full ids).
pub fn short_id(id: &str) -> &str {
    if id.len() > 12 { id.get(..8).unwrap_or(id) } else { id }
}

/// A quoted, escaped, shortened preview of some text.
pub fn preview(text: &str) -> String {
    if text.chars().count() > PREVIEW {
        let cut: String = text.chars().take(PREVIEW - 1).collect();
        format!("{:?}", format!("{cut}…"))
    } else {
        format!("{text:?}")
    }
}

fn source_suffix(source: &MessageSource) -> String {
    match source {
        MessageSource::User => String::new(),
        MessageSource::Plugin { plugin, form } => match form {
            Some(form) => format!(" <plugin:{plugin}:{form}>"),
            None if plugin.is_empty() => " <plugin>".into(),
            None => format!(" <plugin:{plugin}>"),
        },
        MessageSource::Goal { goal_id, revision, round } => {
            format!(" <goal:{}:{revision}:{round}>", short_id(goal_id))
        }
        MessageSource::Tool { call_id } => format!(" <tool:{call_id}>"),
        MessageSource::Model { provider, model } => format!(" <model:{provider}:{model}>"),
        MessageSource::Session { tenant, session, upto_seq } => format!(" <session:{tenant}/{session}@{upto_seq}>"),
        MessageSource::Schedule { schedule_id, fire_unix_ms } => format!(" <schedule:{schedule_id}@{fire_unix_ms}>"),
    }
}

fn schedule_line(change: &turnstile_model::ScheduleChange) -> String {
    use turnstile_model::{ScheduleChange, Timing};
    match change {
        ScheduleChange::Created(spec) => {
            let timing = match &spec.timing {
                Timing::At { at_ms } => format!("at {at_ms}"),
                Timing::Cron { expr, time_zone } => format!("cron {expr:?} {time_zone}"),
            };
            format!("schedule/changed created {} {} {timing}", spec.schedule_id, spec.preset)
        }
        ScheduleChange::Deleted { schedule_id } => format!("schedule/changed deleted {schedule_id}"),
        ScheduleChange::Fired { schedule_id, fire_ms } => format!("schedule/changed fired {schedule_id}@{fire_ms}"),
        ScheduleChange::Skipped { schedule_id, upto_fire_ms, count } => {
            format!("schedule/changed skipped {schedule_id} {count} firing(s) through {upto_fire_ms}")
        }
    }
}

/// `A1b2 "hello"` plus the source when it is not a human.
pub fn message_brief(m: &UserMessage) -> String {
    format!("{} {}{}", short_id(m.id.as_str()), preview(&m.text()), source_suffix(&m.source))
}

fn splice_line(s: &Splice) -> String {
    let inserted: Vec<String> = s.inserted.iter().map(message_brief).collect();
    let mut line = format!("spliced {} @{} -{} +[{}]", s.target, s.start, s.removed_count, inserted.join(", "));
    match s.outcome {
        SpliceOutcome::None if s.removed_count > 0 => line.push_str(" claim"),
        SpliceOutcome::None => {}
        SpliceOutcome::Canceled => line.push_str(" canceled"),
        SpliceOutcome::Restored => line.push_str(" restored"),
    }
    if s.wake {
        line.push_str(" wake");
    }
    if let Some(asked) = s.requested_target {
        line.push_str(&format!(" (asked for {asked})"));
    }
    line
}

impl Renderer {
    /// A renderer that dims reasoning with ANSI codes when `color` is set.
    pub fn with_color(color: bool) -> Self {
        Self { color, ..Self::default() }
    }

    /// Ends an open delta line.
    fn end_delta(&mut self) -> &'static str {
        if self.in_delta.take().is_some() { "\n" } else { "" }
    }

    /// Depth of an event that can happen anywhere (splices, status, live events).
    fn ambient_depth(&self) -> usize {
        usize::from(self.in_turn) + usize::from(self.in_step)
    }

    fn line(&mut self, prefix: &str, depth: usize, text: &str) -> String {
        let end = self.end_delta();
        format!("{end}{prefix:<PREFIX$}{:indent$}{text}\n", "", indent = depth * 2)
    }

    /// One durable event.
    pub fn event(&mut self, e: &Envelope) -> String {
        let prefix = format!("#{}", e.seq);
        let ambient = self.ambient_depth();
        let (depth, text) = match &e.payload {
            EventPayload::InboxSpliced(s) => (ambient, splice_line(s)),
            EventPayload::Status(s) => (ambient, format!("status {s}")),
            EventPayload::ScheduleChanged(change) => (ambient, schedule_line(change)),
            EventPayload::SessionLabeled(l) => {
                let set: Vec<String> = l.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let mut line = format!("session/labeled {}", set.join(","));
                if !l.removed.is_empty() {
                    line.push_str(&format!(" removed {}", l.removed.join(",")));
                }
                (ambient, line)
            }
            EventPayload::TurnStart { turn } => {
                self.in_turn = true;
                self.in_step = false;
                (0, format!("turn/start {turn}"))
            }
            EventPayload::TurnEnd { turn, reason } => {
                self.in_turn = false;
                self.in_step = false;
                (0, format!("turn/end {turn} {reason}"))
            }
            EventPayload::StepStart { turn, step } => {
                self.in_turn = true;
                self.in_step = true;
                (1, format!("step/start {turn}.{step}"))
            }
            EventPayload::StepEnd { turn, step, .. } => {
                self.in_step = false;
                (1, format!("step/end {turn}.{step}"))
            }
            // Turn 0 is history between turns (an out-of-turn inject, SPEC §11).
            EventPayload::UserMessage { message, turn: 0, .. } => {
                (ambient, format!("user/message {} (between turns)", message_brief(message)))
            }
            EventPayload::UserMessage { message, .. } => (2, format!("user/message {}", message_brief(message))),
            EventPayload::AssistantMessage { text, tool_calls, interrupted, max_tokens, reasoning, usage, .. } => {
                let mut line = format!("assistant/message {}", preview(text));
                if let Some(reasoning) = reasoning {
                    line.push_str(&format!(" reasoning {}", preview(reasoning)));
                }
                if let Some(usage) = usage {
                    line.push_str(&format!(" usage in={} out={}", usage.input_tokens, usage.output_tokens));
                }
                if !tool_calls.is_empty() {
                    let calls: Vec<String> = tool_calls.iter().map(|c| format!("{} {}", c.name, c.arguments)).collect();
                    line.push_str(&format!(" tools=[{}]", calls.join(", ")));
                }
                if *interrupted {
                    line.push_str(" interrupted");
                }
                if *max_tokens {
                    line.push_str(" max-tokens");
                }
                (2, line)
            }
            EventPayload::ToolCall { call, awaiting_approval, awaiting_client, .. } => {
                let mut line = format!("tool/call {} {} {}", call.call_id, call.name, call.arguments);
                if *awaiting_approval {
                    line.push_str(&format!(
                        " AWAITING APPROVAL (turnstile decide {} {} --approve|--deny)",
                        e.session.id, call.call_id
                    ));
                }
                if *awaiting_client {
                    line.push_str(" AWAITING ITS CLIENT (the caller that declared the tool answers it)");
                }
                (2, line)
            }
            EventPayload::ToolDecision { call_id, approved, reason, timed_out, .. } => {
                let verdict = match (*approved, *timed_out) {
                    (true, false) => "approved",
                    (false, false) => "denied",
                    (true, true) => "approved by its approval timeout",
                    (false, true) => "denied by its approval timeout",
                };
                let reason = if reason.is_empty() { String::new() } else { format!(": {}", preview(reason)) };
                (2, format!("tool/decision {call_id} {verdict}{reason}"))
            }
            EventPayload::ToolRepaired { call_id, action, .. } => {
                let what = match action {
                    RepairAction::Interrupted => "interrupted: it was running when its worker stopped; not run again",
                    RepairAction::Retried => "retried: it was running when its worker stopped; run again, same key",
                };
                (2, format!("tool/repaired {call_id} {what}"))
            }
            EventPayload::ToolResult { call_id, output, error, .. } => match error {
                Some(err) => (2, format!("tool/result {call_id} error {}", preview(err))),
                None => (2, format!("tool/result {call_id} {}", preview(output))),
            },
            EventPayload::GoalChange(g) => {
                let mut line = format!(
                    "goal/change {} rev {} {} round {}/{}: {}",
                    short_id(&g.goal_id),
                    g.revision,
                    g.state,
                    g.round,
                    g.max_rounds,
                    preview(&g.objective)
                );
                if let Some(summary) = &g.summary {
                    line.push_str(&format!(" summary {}", preview(summary)));
                }
                if let Some(reason) = &g.reason {
                    line.push_str(&format!(" ({})", preview(reason)));
                }
                (ambient, line)
            }
            EventPayload::SessionConfigured { agent, inject_mode, parent, version } => {
                let child = parent.as_ref().map(|p| format!(" child of {p}")).unwrap_or_default();
                let version = version.map(|v| format!(" version {v}")).unwrap_or_default();
                (ambient, format!("session/configured agent {agent}{version} inject_mode {inject_mode}{child}"))
            }
            EventPayload::ContextCompacted(c) => (
                ambient,
                format!(
                    "context/compacted turns {}..{} ({} new) summary {}",
                    c.from_turn,
                    c.upto_turn,
                    c.summarized_turns,
                    preview(&c.summary)
                ),
            ),
            EventPayload::SessionForked(f) => (
                ambient,
                format!(
                    "session/forked from {} at turn {} (seq {}), {} transcript entries{}",
                    f.from,
                    f.at_turn,
                    f.at_seq,
                    f.transcript.len(),
                    if f.compacted.is_some() { " after a summary" } else { "" }
                ),
            ),
            EventPayload::MemoryWritten(m) => (
                ambient,
                format!(
                    "memory/written {}/{:?} revision {} ({} bytes) by call {}",
                    m.namespace, m.key, m.revision, m.bytes, m.call_id
                ),
            ),
            EventPayload::SessionOverridden(o) => (ambient, format!("session/overridden {}", overrides_text(o))),
            EventPayload::Ignorable { event_type } => (ambient, format!("{event_type} (ignorable, not understood)")),
        };
        self.line(&prefix, depth, &text)
    }

    /// One live event; deltas continue the open delta line.
    pub fn live(&mut self, l: &LiveEvent) -> String {
        let depth = self.ambient_depth();
        let text = match &l.payload {
            LivePayload::AssistantDelta { text, reasoning, .. } => {
                let indent = " ".repeat(PREFIX + 2 * depth.max(2));
                let mut body = text.replace('\n', &format!("\n{indent}"));
                if *reasoning && self.color {
                    body = format!("{DIM}{body}{UNDIM}");
                }
                if self.in_delta == Some(*reasoning) {
                    return body;
                }
                // A new line: the first delta, or reasoning after text (or text after reasoning).
                let end = self.end_delta();
                self.in_delta = Some(*reasoning);
                let label = match (*reasoning, self.color) {
                    (false, _) => String::new(),
                    (true, false) => REASONING.to_owned(),
                    (true, true) => format!("{DIM}{REASONING}{UNDIM}"),
                };
                return format!("{end}{:<PREFIX$}{:indent$}{label}{body}", "~", "", indent = depth.max(2) * 2);
            }
            LivePayload::Inserted { message } => format!("inserted {}", message_brief(message)),
            LivePayload::Discarded { message } => format!("discarded {}", message_brief(message)),
            LivePayload::Claimed { message, turn } => format!("claimed {} by turn {turn}", message_brief(message)),
            LivePayload::Status { status } => format!("status {status}"),
            LivePayload::Error { turn, step, message } => format!("error in {turn}.{step}: {message}"),
        };
        self.line("~", depth, &text)
    }

    /// The `caught_up` marker: where history ends and the live tail begins.
    pub fn caught_up(&mut self, seq: u64, status: Status, inbox: &Inbox) -> String {
        let list = |ms: &[UserMessage]| ms.iter().map(message_brief).collect::<Vec<_>>().join(", ");
        let text = format!(
            "== caught up at #{seq}: status {status}, next-turn [{}], next-step [{}]",
            list(&inbox.next_turn),
            list(&inbox.next_step)
        );
        format!("{}{text}\n", self.end_delta())
    }

    /// Text that ends an open delta line, for the end of the stream.
    pub fn finish(&mut self) -> &'static str {
        self.end_delta()
    }
}

/// A session's overrides in one line (SPEC §20): `none`, or `model large tools [echo] system "…"`.
pub(crate) fn overrides_text(o: &turnstile_model::overrides::SessionOverrides) -> String {
    let mut parts = Vec::new();
    if let Some(model) = &o.model {
        parts.push(format!("model {model}"));
    }
    if let Some(tools) = &o.tools {
        parts.push(format!("tools [{}]", tools.join(", ")));
    }
    if let Some(prompt) = &o.system_prompt {
        parts.push(format!("system {}", preview(prompt)));
    }
    if parts.is_empty() { "none".to_owned() } else { parts.join(" ") }
}

#[cfg(test)]
mod tests {
    use turnstile_model::message::{SessionRef, Target};
    use turnstile_model::{CancelCause, TurnEndReason};

    use super::*;

    fn session() -> SessionRef {
        SessionRef { tenant: "default".into(), id: "s1".into() }
    }

    fn ev(seq: u64, payload: EventPayload) -> Envelope {
        Envelope { session: session(), seq, time_ms: 100 + seq, epoch: 1, payload }
    }

    fn live(after_seq: u64, payload: LivePayload) -> LiveEvent {
        LiveEvent { session: session(), after_seq, payload }
    }

    fn insert(m: UserMessage) -> EventPayload {
        EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: vec![m],
            outcome: SpliceOutcome::None,
            wake: true,
            requested_target: None,
            deadline: None,
        })
    }

    #[test]
    fn a_turn_is_indented_by_depth_with_deltas_inline() {
        let a = UserMessage::user_text("A1b2", "hello");
        let mut r = Renderer::default();
        let mut out = String::new();
        out += &r.event(&ev(1, insert(a.clone())));
        out += &r.live(&live(1, LivePayload::Inserted { message: a.clone() }));
        out += &r.event(&ev(2, EventPayload::Status(Status::Running)));
        out += &r.event(&ev(3, EventPayload::TurnStart { turn: 1 }));
        out += &r.event(&ev(
            4,
            EventPayload::InboxSpliced(Splice {
                target: Target::NextTurn,
                start: 0,
                removed_count: 1,
                inserted: vec![],
                outcome: SpliceOutcome::None,
                wake: false,
                requested_target: None,
                deadline: None,
            }),
        ));
        out += &r.live(&live(4, LivePayload::Claimed { message: a.clone(), turn: 1 }));
        out += &r.event(&ev(5, EventPayload::StepStart { turn: 1, step: 1 }));
        out += &r.event(&ev(6, EventPayload::UserMessage { message: a, turn: 1, step: 1 }));
        out += &r.live(&live(
            6,
            LivePayload::AssistantDelta { turn: 1, step: 1, text: "echo: ".into(), reasoning: false, offset: 0 },
        ));
        out += &r.live(&live(
            6,
            LivePayload::AssistantDelta { turn: 1, step: 1, text: "hello".into(), reasoning: false, offset: 0 },
        ));
        out += &r.event(&ev(7, EventPayload::reply(1, 1, "echo: hello")));
        out += &r.event(&ev(8, EventPayload::StepEnd { turn: 1, step: 1, spent: None }));
        out += &r.event(&ev(9, EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed }));
        out += &r.event(&ev(10, EventPayload::Status(Status::Idle)));
        let expected = "\
#1   spliced next-turn @0 -0 +[A1b2 \"hello\"] wake
~    inserted A1b2 \"hello\"
#2   status running
#3   turn/start 1
#4     spliced next-turn @0 -1 +[] claim
~      claimed A1b2 \"hello\" by turn 1
#5     step/start 1.1
#6       user/message A1b2 \"hello\"
~        echo: hello
#7       assistant/message \"echo: hello\"
#8     step/end 1.1
#9   turn/end 1 completed
#10  status idle
";
        assert_eq!(out, expected);
    }

    #[test]
    fn splices_show_their_outcome_source_and_forced_target() {
        let mut r = Renderer::default();
        let plugin = UserMessage {
            source: MessageSource::Plugin { plugin: String::new(), form: None },
            ..UserMessage::user_text("3f2a9c1e-5b6d-4e8f-9a0b-1c2d3e4f5a6b", "context")
        };
        let line = r.event(&ev(
            3,
            EventPayload::InboxSpliced(Splice {
                target: Target::NextTurn,
                start: 1,
                removed_count: 2,
                inserted: vec![plugin],
                outcome: SpliceOutcome::Canceled,
                wake: true,
                requested_target: Some(Target::NextStep),
                deadline: None,
            }),
        ));
        assert_eq!(
            line,
            "#3   spliced next-turn @1 -2 +[3f2a9c1e \"context\" <plugin>] canceled wake (asked for next-step)\n"
        );
        let restored = EventPayload::InboxSpliced(Splice {
            target: Target::NextStep,
            start: 0,
            removed_count: 0,
            inserted: vec![UserMessage::user_text("x", "y")],
            outcome: SpliceOutcome::Restored,
            wake: false,
            requested_target: None,
            deadline: None,
        });
        assert!(r.event(&ev(4, restored)).ends_with("restored\n"));
    }

    #[test]
    fn a_delta_line_is_ended_before_the_next_event_and_at_the_end() {
        let mut r = Renderer::default();
        r.event(&ev(1, EventPayload::StepStart { turn: 1, step: 1 }));
        let d = r.live(&live(
            1,
            LivePayload::AssistantDelta { turn: 1, step: 1, text: "par".into(), reasoning: false, offset: 0 },
        ));
        assert!(!d.ends_with('\n'));
        let aborted =
            r.event(&ev(2, EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Aborted(CancelCause::User) }));
        assert_eq!(aborted, "\n#2   turn/end 1 aborted{user}\n");
        assert_eq!(r.finish(), "");
        r.live(&live(
            2,
            LivePayload::AssistantDelta { turn: 2, step: 1, text: "x".into(), reasoning: false, offset: 0 },
        ));
        assert_eq!(r.finish(), "\n");
    }

    fn delta(text: &str, reasoning: bool) -> LiveEvent {
        live(6, LivePayload::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning, offset: 0 })
    }

    fn answer() -> EventPayload {
        EventPayload::AssistantMessage {
            turn: 1,
            step: 1,
            text: "It is noon.".into(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: Some("The user wants the time.".into()),
            usage: Some(turnstile_model::Usage { input_tokens: 120, output_tokens: 9, ..Default::default() }),
            model: None,
        }
    }

    #[test]
    fn reasoning_streams_on_labelled_lines_and_the_message_shows_reasoning_and_usage() {
        let mut r = Renderer::default();
        let mut out = r.event(&ev(5, EventPayload::StepStart { turn: 1, step: 1 }));
        for (text, reasoning) in [("The user ", true), ("wants the time.", true), ("It is ", false), ("noon.", false)] {
            out += &r.live(&delta(text, reasoning));
        }
        out += &r.event(&ev(7, answer()));
        let expected = "\
#5     step/start 1.1
~        [reasoning] The user wants the time.
~        It is noon.
#7       assistant/message \"It is noon.\" reasoning \"The user wants the time.\" usage in=120 out=9
";
        assert_eq!(out, expected);
        // Reasoning after text starts a line of its own again.
        r.live(&delta("a", false));
        assert_eq!(r.live(&delta("b", true)), "\n~        [reasoning] b");
    }

    #[test]
    fn on_a_terminal_reasoning_is_dimmed() {
        let mut r = Renderer::with_color(true);
        r.event(&ev(5, EventPayload::StepStart { turn: 1, step: 1 }));
        assert_eq!(r.live(&delta("hmm", true)), "~        \x1b[2m[reasoning] \x1b[22m\x1b[2mhmm\x1b[22m");
        assert_eq!(r.live(&delta(" ok", true)), "\x1b[2m ok\x1b[22m");
        assert_eq!(r.live(&delta("Yes.", false)), "\n~        Yes.");
    }

    #[test]
    fn long_text_is_shortened_and_escaped() {
        let p = preview(&format!("line1\n{}", "x".repeat(100)));
        assert!(p.starts_with("\"line1\\n"), "{p}");
        assert!(p.ends_with("…\""), "{p}");
        assert_eq!(short_id("A1b2"), "A1b2");
        assert_eq!(short_id("3f2a9c1e-5b6d-4e8f-9a0b-1c2d3e4f5a6b"), "3f2a9c1e");
    }
}
