//! Recording a `Watch` stream and reducing it to comparable lines.
//!
//! A line per item: `D ...` a durable event, `L ...` a live event, `C ...` the caught-up marker, e.g.
//! `D spliced next-turn 0 0 [A] wake`, `L inserted A`, `D turn/start 1`, `L claimed A 1`,
//! `D assistant/message 1.1 "echo: hello"`, `D turn/end 1 aborted{user}`, `C caught_up 0`.
//! Tests compare exact sequences of these; an expected line ending in `*` matches any line that starts
//! with the rest (for payloads that the contract leaves open, such as a partial interrupted text).
//! `assistant/delta` lines are left out unless asked for: their split is timing, not contract.
//!
//! Lines are in *canonical* order: each live event right after the durable event whose seq it carries
//! (`after_seq`), live events keeping their arrival order among themselves. The stream itself only
//! promises that a live event comes *after* that durable event (the driver appends batches, e.g. splice +
//! status + turn/start, before it publishes), which [`check_stream`] enforces.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::cancel_cause::Cause;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{
    CancelCause, LiveEvent, SessionEvent, SessionRef, SessionStatus, SpliceOutcome, Target, WatchItem, WatchRequest,
};

use crate::sync::lock;
use crate::{DEFAULT_WAIT, HarnessError};

#[derive(Debug, Default)]
struct Recorded {
    items: Vec<WatchItem>,
    /// Why the stream ended, once it has.
    end: Option<String>,
}

/// A `Watch` running in the background, collecting every item.
#[derive(Debug)]
pub struct WatchRecorder {
    state: Arc<Mutex<Recorded>>,
    task: JoinHandle<()>,
    after_seq: u64,
    live: bool,
}

impl WatchRecorder {
    /// Opens the stream and returns once its `caught_up` marker has arrived.
    pub async fn start(
        client: AgentClient<Channel>,
        session: SessionRef,
        after_seq: u64,
        live: bool,
    ) -> Result<Self, HarnessError> {
        Self::start_request(client, WatchRequest { session: Some(session), after_seq, live, resume: None }).await
    }

    /// Opens the stream `request` asks for (a `resume` of a streaming step, say) and returns once its
    /// `caught_up` marker has arrived.
    pub async fn start_request(mut client: AgentClient<Channel>, request: WatchRequest) -> Result<Self, HarnessError> {
        let (after_seq, live) = (request.after_seq, request.live);
        let mut stream = client.watch(request).await?.into_inner();
        let state = Arc::new(Mutex::new(Recorded::default()));
        let sink = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let end = loop {
                match stream.message().await {
                    Ok(Some(item)) => lock(&sink).items.push(item),
                    Ok(None) => break "stream ended".to_owned(),
                    Err(status) => break format!("stream failed: {status}"),
                }
            };
            lock(&sink).end = Some(end);
        });
        let recorder = Self { state, task, after_seq, live };
        recorder.wait_for("caught_up", |items| items.iter().any(is_caught_up)).await?;
        Ok(recorder)
    }

    pub fn items(&self) -> Vec<WatchItem> {
        lock(&self.state).items.clone()
    }

    /// The durable events recorded so far.
    pub fn events(&self) -> Vec<SessionEvent> {
        durable_events(&lock(&self.state).items)
    }

    /// The live events recorded so far.
    pub fn live_events(&self) -> Vec<LiveEvent> {
        lock(&self.state)
            .items
            .iter()
            .filter_map(|i| match &i.item {
                Some(Item::Live(l)) => Some(l.clone()),
                _ => None,
            })
            .collect()
    }

    /// Lines without `assistant/delta`.
    pub fn lines(&self) -> Vec<String> {
        lines_of(&lock(&self.state).items, false)
    }

    pub fn lines_with_deltas(&self) -> Vec<String> {
        lines_of(&lock(&self.state).items, true)
    }

    /// Why the stream ended, if it has.
    pub fn ended(&self) -> Option<String> {
        lock(&self.state).end.clone()
    }

    /// The concatenated text `assistant/delta`s of one step (reasoning deltas left out).
    pub fn delta_text(&self, turn: u64, step: u32) -> String {
        self.deltas_of(turn, step, false)
    }

    /// The concatenated reasoning `assistant/delta`s of one step.
    pub fn delta_reasoning(&self, turn: u64, step: u32) -> String {
        self.deltas_of(turn, step, true)
    }

    fn deltas_of(&self, turn: u64, step: u32, reasoning: bool) -> String {
        self.live_events()
            .into_iter()
            .filter_map(|l| match l.payload {
                Some(Live::AssistantDelta(d)) if d.turn == turn && d.step == step && d.reasoning == reasoning => {
                    Some(d.text)
                }
                _ => None,
            })
            .collect()
    }

    /// One step's text (or reasoning) deltas as `(offset of the first, their concatenation)`; the
    /// offsets are checked to follow each other by [`check_stream`].
    pub fn step_output(&self, turn: u64, step: u32, reasoning: bool) -> Option<(u64, String)> {
        step_output(&lock(&self.state).items, turn, step, reasoning)
    }

    /// The durable `assistant/message` of one step, if recorded.
    pub fn assistant_message(&self, turn: u64, step: u32) -> Option<turnstile_proto::v1::AssistantMessage> {
        self.events().into_iter().find_map(|e| match e.payload {
            Some(Durable::AssistantMessage(m)) if m.turn == turn && m.step == step => Some(m),
            _ => None,
        })
    }

    /// Waits (bounded by [`DEFAULT_WAIT`]) until `pred` holds over the recorded items.
    pub async fn wait_for<F>(&self, what: &str, mut pred: F) -> Result<Vec<WatchItem>, HarnessError>
    where
        F: FnMut(&[WatchItem]) -> bool,
    {
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        loop {
            {
                let state = lock(&self.state);
                if pred(&state.items) {
                    return Ok(state.items.clone());
                }
                if let Some(end) = &state.end {
                    return Err(HarnessError::WaitTimeout {
                        what: format!("{what} ({end})"),
                        waited: Duration::ZERO,
                        recorded: lines_of(&state.items, true).join("\n"),
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::WaitTimeout {
                    what: what.to_owned(),
                    waited: DEFAULT_WAIT,
                    recorded: self.lines_with_deltas().join("\n"),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until some line (deltas included) matches `pattern` (see the module doc for `*`).
    pub async fn wait_line(&self, pattern: &str) -> Result<Vec<String>, HarnessError> {
        self.wait_count(pattern, 1).await
    }

    /// Waits until at least `n` lines (deltas included) match `pattern`.
    pub async fn wait_count(&self, pattern: &str, n: usize) -> Result<Vec<String>, HarnessError> {
        let what = format!("{n} x {pattern:?}");
        let items = self
            .wait_for(&what, |items| items.iter().filter(|i| line_matches(&line_of(i), pattern)).count() >= n)
            .await?;
        Ok(lines_of(&items, false))
    }

    /// Waits until the session is idle (`WhenIdle`) and this stream has everything the log holds up to
    /// `GetSession.last_seq` plus the live events that follow the last durable one; checks the envelopes
    /// and the live/durable interleaving; returns the lines without deltas.
    pub async fn settle(&self, session: &impl IdleSeq) -> Result<Vec<String>, HarnessError> {
        let last_seq = session.idle_last_seq().await?;
        let items = self
            .wait_for(&format!("durable seq {last_seq} and its live followers"), |items| {
                settled(items, last_seq, self.live)
            })
            .await?;
        check_stream(&items, self.after_seq)?;
        Ok(lines_of(&items, false))
    }

    /// The `after_seq` this stream was opened with.
    pub fn after_seq(&self) -> u64 {
        self.after_seq
    }

    /// Drops the stream (the client goes away, as a disconnect does) and returns everything it had
    /// received by then.
    pub async fn disconnect(mut self) -> Vec<WatchItem> {
        self.task.abort();
        // Wait for the task to end so nothing is pushed after the snapshot below.
        let _ = (&mut self.task).await;
        lock(&self.state).items.clone()
    }
}

/// What [`WatchRecorder::settle`] asks of the session it records (implemented by [`crate::Session`], which
/// depends on this module, not the other way round).
pub trait IdleSeq {
    /// Waits until the session is idle and returns its last durable seq (0 if it does not exist).
    fn idle_last_seq(&self) -> impl std::future::Future<Output = Result<u64, HarnessError>> + Send;
}

impl Drop for WatchRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_caught_up(item: &WatchItem) -> bool {
    matches!(item.item, Some(Item::CaughtUp(_)))
}

/// The trailer a gateway puts on a Watch it cut: the last durable seq that stream sent (decision 0088).
pub const RESUME_AFTER_SEQ: &str = "resume-after-seq";

/// A client's `Watch` read in the foreground that resumes a stream the gateway cut (UNAVAILABLE) with
/// `after_seq` as every client does, checking on the way that the cut's status names exactly the last
/// durable seq received (in its message and its [`RESUME_AFTER_SEQ`] trailer).
#[derive(Debug)]
pub struct ResumingWatch {
    client: AgentClient<Channel>,
    session: SessionRef,
    stream: tonic::Streaming<WatchItem>,
    /// Streams the gateway cut so far.
    pub cuts: usize,
    /// Every item received, across the streams (each resumed stream brings its own `caught_up`).
    pub items: Vec<WatchItem>,
    /// The current stream was cut: the next read resumes.
    cut: bool,
}

impl ResumingWatch {
    /// Opens a live Watch of `session` after `after_seq`.
    pub async fn open(
        mut client: AgentClient<Channel>,
        session: SessionRef,
        after_seq: u64,
    ) -> Result<Self, HarnessError> {
        let request = WatchRequest { session: Some(session.clone()), after_seq, live: true, resume: None };
        let stream = client.watch(request).await?.into_inner();
        Ok(Self { client, session, stream, cuts: 0, items: Vec::new(), cut: false })
    }

    /// Goes on with a Watch `stream` of `session` that was opened with `client` and has brought `received`.
    pub fn from_stream(
        client: AgentClient<Channel>,
        session: SessionRef,
        stream: tonic::Streaming<WatchItem>,
        received: Vec<WatchItem>,
    ) -> Self {
        Self { client, session, stream, cuts: 0, items: received, cut: false }
    }

    /// The last durable seq received.
    pub fn position(&self) -> u64 {
        position(&self.items)
    }

    /// Reads until the durable event `last` has arrived, resuming cut streams; bounded by
    /// [`DEFAULT_WAIT`] without an item.
    pub async fn until_seq(&mut self, last: u64) -> Result<(), HarnessError> {
        while !self.items.iter().any(|i| matches!(&i.item, Some(Item::Event(e)) if e.seq == last)) {
            let next =
                tokio::time::timeout(DEFAULT_WAIT, self.next()).await.map_err(|_| HarnessError::WaitTimeout {
                    what: format!("seq {last} on a resuming watch"),
                    waited: DEFAULT_WAIT,
                    recorded: lines_of(&self.items, false).join("\n"),
                })?;
            next?;
        }
        Ok(())
    }

    /// The next item (also kept in [`ResumingWatch::items`]), resuming a cut stream first.
    pub async fn next(&mut self) -> Result<WatchItem, HarnessError> {
        loop {
            if self.cut {
                let request = WatchRequest {
                    session: Some(self.session.clone()),
                    after_seq: self.position(),
                    live: true,
                    resume: None,
                };
                self.stream = self.client.watch(request).await?.into_inner();
                self.cut = false;
            }
            match self.stream.message().await {
                Ok(Some(item)) => {
                    self.items.push(item.clone());
                    return Ok(item);
                }
                Ok(None) => return Err(HarnessError::Inconsistent("the watch ended without a status".into())),
                Err(status) if status.code() == Code::Unavailable => self.was_cut(&status)?,
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Reads what the stream brings until the gateway cuts it (its status checked), without resuming.
    pub async fn until_cut(&mut self) -> Result<(), HarnessError> {
        let read = async {
            loop {
                match self.stream.message().await {
                    Ok(Some(item)) => self.items.push(item),
                    Ok(None) => return Err(HarnessError::Inconsistent("the watch ended without a status".into())),
                    Err(status) if status.code() == Code::Unavailable => return self.was_cut(&status),
                    Err(status) => return Err(status.into()),
                }
            }
        };
        tokio::time::timeout(DEFAULT_WAIT, read).await.map_err(|_| HarnessError::WaitTimeout {
            what: "the gateway to cut a watch".into(),
            waited: DEFAULT_WAIT,
            recorded: String::new(),
        })?
    }

    /// Checks that a cut's `status` names the last durable seq received; the next read resumes from it.
    fn was_cut(&mut self, status: &tonic::Status) -> Result<(), HarnessError> {
        let position = self.position();
        let trailer = status.metadata().get(RESUME_AFTER_SEQ).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if trailer != Some(position) || !status.message().contains(&format!("after_seq = {position}")) {
            return Err(HarnessError::Inconsistent(format!(
                "a cut stream must name the last seq it sent ({position}); it said {trailer:?} (after {} cuts): {status:?}",
                self.cuts
            )));
        }
        self.cuts += 1;
        self.cut = true;
        Ok(())
    }
}

/// The durable events among `items`.
pub fn durable_events(items: &[WatchItem]) -> Vec<SessionEvent> {
    items
        .iter()
        .filter_map(|i| match &i.item {
            Some(Item::Event(e)) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// How many live events a durable event is followed by (SPEC §3 micro-order, §4 status flips).
fn live_followers(event: &SessionEvent) -> usize {
    match &event.payload {
        Some(Durable::InboxSpliced(s)) => {
            let discarded = if s.outcome == SpliceOutcome::Canceled as i32 {
                usize::try_from(s.removed_count).unwrap_or(0)
            } else {
                0
            };
            discarded + s.inserted.len()
        }
        Some(Durable::Status(_)) => 1,
        _ => 0,
    }
}

fn settled(items: &[WatchItem], last_seq: u64, live: bool) -> bool {
    let Some(last) = items.iter().rev().find_map(|i| match &i.item {
        Some(Item::Event(e)) => Some(e),
        _ => None,
    }) else {
        // No durable event: a stream that resumed at the log's end has everything once it is caught up.
        return last_seq == 0 || position(items) >= last_seq;
    };
    if last.seq < last_seq {
        return false;
    }
    // Live events are not replayed with history: an event read before `caught_up` has no live followers.
    let caught_up_at = items.iter().position(is_caught_up);
    let last_at = items.iter().rposition(|i| matches!(&i.item, Some(Item::Event(e)) if e.seq == last.seq));
    if !live || last_at < caught_up_at {
        return true;
    }
    let followers = items
        .iter()
        .filter(|i| matches!(&i.item, Some(Item::Live(l)) if l.after_seq == last.seq && !is_delta(l)))
        .count();
    followers >= live_followers(last)
}

fn is_delta(live: &LiveEvent) -> bool {
    matches!(live.payload, Some(Live::AssistantDelta(_)))
}

/// One step's text (or reasoning) deltas among `items` as `(offset of the first, their concatenation)`.
pub fn step_output(items: &[WatchItem], turn: u64, step: u32, reasoning: bool) -> Option<(u64, String)> {
    let mut out: Option<(u64, String)> = None;
    for item in items {
        if let Some(Item::Live(LiveEvent { payload: Some(Live::AssistantDelta(d)), .. })) = &item.item
            && d.turn == turn
            && d.step == step
            && d.reasoning == reasoning
        {
            out.get_or_insert_with(|| (d.offset, String::new())).1.push_str(&d.text);
        }
    }
    out
}

/// The last durable seq a client holds after receiving `items`: the last event's, or `caught_up`'s.
pub fn position(items: &[WatchItem]) -> u64 {
    items
        .iter()
        .filter_map(|i| match &i.item {
            Some(Item::Event(e)) => Some(e.seq),
            Some(Item::CaughtUp(c)) => Some(c.seq),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Checks what every Watch stream must satisfy: durable seqs contiguous from `after_seq + 1` (nothing
/// missed, nothing twice), epoch ≥ 1 and never decreasing, time never decreasing, the `type` string
/// agreeing with the payload, and every live event arriving after the durable event it follows.
pub fn check_stream(items: &[WatchItem], after_seq: u64) -> Result<(), HarnessError> {
    // Per (turn, step, reasoning): the offset the next delta must carry (SPEC §14). A stream's first delta
    // of a step may start anywhere (it resumed); each later one continues exactly where the last ended.
    let mut next_offset: std::collections::HashMap<(u64, u32, bool), u64> = Default::default();
    let mut expect_seq = after_seq + 1;
    let mut last_seen = None::<u64>;
    let (mut epoch, mut time) = (0u64, 0u64);
    for (n, item) in items.iter().enumerate() {
        match &item.item {
            Some(Item::Event(e)) => {
                if e.seq != expect_seq {
                    return Err(HarnessError::Inconsistent(format!(
                        "item {n}: seq {} where {expect_seq} was due",
                        e.seq
                    )));
                }
                if e.epoch == 0 || e.epoch < epoch {
                    return Err(HarnessError::Inconsistent(format!("seq {}: epoch {} after {epoch}", e.seq, e.epoch)));
                }
                if e.time_unix_ms < time {
                    return Err(HarnessError::Inconsistent(format!("seq {}: time went backwards", e.seq)));
                }
                let payload_type = e.payload.as_ref().map(durable_type);
                if payload_type.is_some_and(|t| t != e.r#type) {
                    return Err(HarnessError::Inconsistent(format!(
                        "seq {}: type {:?} but payload {payload_type:?}",
                        e.seq, e.r#type
                    )));
                }
                (epoch, time, expect_seq) = (e.epoch, e.time_unix_ms, e.seq + 1);
                last_seen = Some(e.seq);
            }
            Some(Item::CaughtUp(c)) => {
                if c.seq + 1 != expect_seq {
                    return Err(HarnessError::Inconsistent(format!(
                        "caught_up seq {} after durable seq {}",
                        c.seq,
                        expect_seq - 1
                    )));
                }
                last_seen = Some(c.seq);
            }
            Some(Item::Live(l)) => {
                if let Some(Live::AssistantDelta(d)) = &l.payload {
                    let next = next_offset.entry((d.turn, d.step, d.reasoning)).or_insert(d.offset);
                    if d.offset != *next {
                        return Err(HarnessError::Inconsistent(format!(
                            "item {n}: delta {:?} of {}.{} at offset {} where {} was due",
                            d.text, d.turn, d.step, d.offset, next
                        )));
                    }
                    *next += d.text.len() as u64;
                }
                if last_seen.is_none_or(|s| s < l.after_seq) {
                    return Err(HarnessError::Inconsistent(format!(
                        "item {n}: live {} carries after_seq {} but arrived before that event (last seq {last_seen:?})",
                        l.r#type, l.after_seq
                    )));
                }
            }
            None => return Err(HarnessError::Inconsistent(format!("item {n} is empty"))),
        }
    }
    Ok(())
}

/// The SPEC §5 type name of a durable payload.
pub fn durable_type(payload: &Durable) -> &'static str {
    match payload {
        Durable::InboxSpliced(_) => "agent/inbox/spliced",
        Durable::Status(_) => "agent/status",
        Durable::TurnStart(_) => "turn/start",
        Durable::TurnEnd(_) => "turn/end",
        Durable::StepStart(_) => "step/start",
        Durable::StepEnd(_) => "step/end",
        Durable::UserMessage(_) => "user/message",
        Durable::AssistantMessage(_) => "assistant/message",
        Durable::ToolCall(_) => "tool/call",
        Durable::ToolResult(_) => "tool/result",
        Durable::GoalChange(_) => "goal/change",
        Durable::SessionConfigured(_) => "session/configured",
        Durable::ToolDecision(_) => "tool/decision",
        Durable::ContextCompacted(_) => "context/compacted",
        Durable::SessionForked(_) => "session/forked",
        Durable::ScheduleChanged(_) => "schedule/changed",
        Durable::SessionLabeled(_) => "session/labeled",
        Durable::ToolRepaired(_) => "tool/repaired",
        Durable::MemoryWritten(_) => "memory/written",
        Durable::SessionOverridden(_) => "session/overridden",
    }
}

/// The canonical order of `items` (see the module doc): each live event placed right after the durable
/// event (or `caught_up` marker) with the largest seq not above its `after_seq`.
pub fn canonical(items: &[WatchItem]) -> Vec<WatchItem> {
    // (anchor seq, items placed after it); index 0 holds live events older than every anchor.
    let mut groups: Vec<(Option<u64>, Vec<WatchItem>)> = vec![(None, Vec::new())];
    let mut lives = Vec::new();
    for item in items {
        match &item.item {
            Some(Item::Event(e)) => groups.push((Some(e.seq), vec![item.clone()])),
            Some(Item::CaughtUp(c)) => groups.push((Some(c.seq), vec![item.clone()])),
            Some(Item::Live(l)) => lives.push((l.after_seq, item.clone())),
            None => {}
        }
    }
    for (after_seq, item) in lives {
        let at = groups.iter().rposition(|(seq, _)| seq.is_some_and(|s| s <= after_seq)).unwrap_or(0);
        groups[at].1.push(item);
    }
    groups.into_iter().flat_map(|(_, g)| g).collect()
}

/// Reduces items to lines in canonical order; `deltas` keeps `assistant/delta` lines.
pub fn lines_of(items: &[WatchItem], deltas: bool) -> Vec<String> {
    canonical(items)
        .iter()
        .filter(|i| deltas || !matches!(&i.item, Some(Item::Live(l)) if is_delta(l)))
        .map(line_of)
        .collect()
}

/// `true` when `line` is `pattern`, or starts with `pattern` minus a trailing `*`.
pub fn line_matches(line: &str, pattern: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => line.starts_with(prefix),
        None => line == pattern,
    }
}

/// Asserts that `actual` matches `expected` line by line (see [`line_matches`]); on a mismatch, panics
/// with both sequences side by side and the first differing index.
pub fn assert_lines(actual: &[String], expected: &[&str]) {
    let first_diff = (0..actual.len().max(expected.len())).find(|&i| match (actual.get(i), expected.get(i)) {
        (Some(a), Some(e)) => !line_matches(a, e),
        _ => true,
    });
    if let Some(at) = first_diff {
        let mut report = format!("event sequences differ at line {at}\n");
        for i in 0..actual.len().max(expected.len()) {
            let a = actual.get(i).map_or("<none>", String::as_str);
            let e = expected.get(i).copied().unwrap_or("<none>");
            let mark = if i == at {
                ">>"
            } else if line_matches(a, e) {
                "  "
            } else {
                "!="
            };
            report.push_str(&format!("{mark} {i:>3}  got {a:<50}  want {e}\n"));
        }
        panic!("{report}");
    }
}

fn target(t: i32) -> String {
    match Target::try_from(t) {
        Ok(Target::NextTurn) => "next-turn".into(),
        Ok(Target::NextStep) => "next-step".into(),
        _ => format!("target?{t}"),
    }
}

fn status(s: i32) -> String {
    match SessionStatus::try_from(s) {
        Ok(SessionStatus::Idle) => "idle".into(),
        Ok(SessionStatus::Running) => "running".into(),
        _ => format!("status?{s}"),
    }
}

fn cause(c: &Option<CancelCause>) -> String {
    match c.as_ref().and_then(|c| c.cause.as_ref()) {
        Some(Cause::User(_)) => "user".into(),
        Some(Cause::Parent(_)) => "parent".into(),
        Some(Cause::Hook(h)) => format!("hook:{}", h.reason),
        Some(Cause::Disposed(_)) => "disposed".into(),
        Some(Cause::SteerDeadline(_)) => "steer-deadline".into(),
        None => "cause?".into(),
    }
}

/// One item as a line.
pub fn line_of(item: &WatchItem) -> String {
    match &item.item {
        Some(Item::Event(e)) => format!("D {}", durable_line(e)),
        Some(Item::Live(l)) => format!("L {}", live_line(l)),
        Some(Item::CaughtUp(c)) => format!("C caught_up {}", c.seq),
        None => "? empty item".into(),
    }
}

fn durable_line(e: &SessionEvent) -> String {
    let Some(payload) = &e.payload else { return format!("{} <no payload>", e.r#type) };
    match payload {
        Durable::InboxSpliced(s) => {
            let ids: Vec<&str> = s.inserted.iter().map(|m| m.id.as_str()).collect();
            let mut line = format!("spliced {} {} {} [{}]", target(s.target), s.start, s.removed_count, ids.join(","));
            if s.wake {
                line.push_str(" wake");
            }
            match SpliceOutcome::try_from(s.outcome) {
                Ok(SpliceOutcome::None) => {}
                Ok(SpliceOutcome::Canceled) => line.push_str(" canceled"),
                Ok(SpliceOutcome::Restored) => line.push_str(" restored"),
                Err(_) => line.push_str(&format!(" outcome?{}", s.outcome)),
            }
            line
        }
        Durable::Status(s) => format!("status {}", status(s.status)),
        Durable::TurnStart(t) => format!("turn/start {}", t.turn),
        Durable::TurnEnd(t) => {
            let reason = match t.reason.as_ref().and_then(|r| r.reason.as_ref()) {
                Some(Reason::Completed(_)) => "completed".to_owned(),
                Some(Reason::Blocked(b)) => match &b.reason {
                    Some(reason) => format!("blocked{{{reason}}}"),
                    None => "blocked".to_owned(),
                },
                Some(Reason::MaxTokens(_)) => "max-tokens".to_owned(),
                Some(Reason::Aborted(c)) => format!("aborted{{{}}}", cause(&Some(c.clone()))),
                Some(Reason::Error(_)) => "error".to_owned(),
                Some(Reason::Interrupted(_)) => "interrupted".to_owned(),
                None => "reason?".to_owned(),
            };
            format!("turn/end {} {reason}", t.turn)
        }
        Durable::StepStart(s) => format!("step/start {}.{}", s.turn, s.step),
        Durable::StepEnd(s) => format!("step/end {}.{}", s.turn, s.step),
        Durable::UserMessage(m) => {
            format!("user/message {}", m.message.as_ref().map_or("<none>", |m| m.id.as_str()))
        }
        Durable::AssistantMessage(m) => {
            let mut line = format!("assistant/message {}.{}", m.turn, m.step);
            if m.interrupted {
                line.push_str(" interrupted");
            }
            if m.max_tokens {
                line.push_str(" max-tokens");
            }
            line.push_str(&format!(" {:?}", m.text));
            for call in &m.tool_calls {
                line.push_str(&format!(" call {} {}", call.name, call.arguments));
            }
            if let Some(reasoning) = &m.reasoning {
                line.push_str(&format!(" reasoning {reasoning:?}"));
            }
            if let Some(u) = &m.usage {
                line.push_str(&format!(" usage {}/{}", u.input_tokens, u.output_tokens));
            }
            line
        }
        Durable::ToolCall(c) => {
            let waits = if c.awaiting_approval { " awaiting-approval" } else { "" };
            format!("tool/call {}.{} {} {}{waits}", c.turn, c.step, c.name, c.arguments)
        }
        Durable::ToolDecision(d) => {
            let verdict = if d.approved { "approved" } else { "denied" };
            format!("tool/decision {}.{} {} {verdict} {:?}", d.turn, d.step, d.call_id, d.reason)
        }
        Durable::ContextCompacted(c) => format!("context/compacted {} {:?}", c.upto_turn, c.summary),
        Durable::SessionForked(f) => format!("session/forked {} {}", f.at_turn, f.transcript.len()),
        Durable::ScheduleChanged(c) => {
            use turnstile_proto::v1::schedule_changed::Change;
            match &c.change {
                Some(Change::Created(s)) => format!("schedule/changed created {}", s.schedule_id),
                Some(Change::Deleted(id)) => format!("schedule/changed deleted {id}"),
                Some(Change::Fired(f)) => format!("schedule/changed fired {} {}", f.schedule_id, f.fire_unix_ms),
                Some(Change::Skipped(s)) => {
                    format!("schedule/changed skipped {} {} x{}", s.schedule_id, s.upto_fire_unix_ms, s.count)
                }
                None => "schedule/changed ?".into(),
            }
        }
        Durable::SessionLabeled(l) => {
            let mut set: Vec<String> = l.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            set.sort();
            format!("session/labeled {} -{}", set.join(","), l.removed.join(","))
        }
        Durable::ToolRepaired(r) => {
            let action = match turnstile_proto::v1::RepairAction::try_from(r.action) {
                Ok(turnstile_proto::v1::RepairAction::Interrupted) => "interrupted",
                Ok(turnstile_proto::v1::RepairAction::Retried) => "retried",
                _ => "?",
            };
            format!("tool/repaired {}.{} {} {action}", r.turn, r.step, r.call_id)
        }
        Durable::MemoryWritten(m) => {
            format!("memory/written {}.{} {} {}/{:?} {}B", m.turn, m.step, m.call_id, m.namespace, m.key, m.bytes)
        }
        Durable::SessionOverridden(o) => {
            let tools = o.tools.as_ref().map(|t| t.tools.join(","));
            format!("session/overridden system={:?} model={:?} tools={tools:?}", o.system_prompt, o.model)
        }
        Durable::ToolResult(r) => match &r.error {
            Some(err) => format!("tool/result {}.{} error {:?}", r.turn, r.step, err),
            None => format!("tool/result {}.{} {:?}", r.turn, r.step, r.output),
        },
        // The goal id is a server-minted uuid; a session has one goal at a time, so the line leaves it out.
        Durable::GoalChange(g) => {
            let mut line = format!("goal/change {} {} {}/{}", g.revision, g.state, g.round, g.max_rounds);
            if let Some(summary) = &g.summary {
                line.push_str(&format!(" summary:{summary:?}"));
            }
            if let Some(reason) = &g.reason {
                line.push_str(&format!(" reason:{reason:?}"));
            }
            line
        }
        Durable::SessionConfigured(c) => format!("session/configured {} {}", c.agent, c.inject_mode),
    }
}

fn live_line(l: &LiveEvent) -> String {
    let id = |m: &Option<turnstile_proto::v1::UserMessage>| m.as_ref().map_or("<none>", |m| m.id.as_str()).to_owned();
    match &l.payload {
        Some(Live::Inserted(i)) => format!("inserted {}", id(&i.message)),
        Some(Live::Discarded(d)) => format!("discarded {}", id(&d.message)),
        Some(Live::Claimed(c)) => format!("claimed {} {}", id(&c.message), c.turn),
        Some(Live::Status(s)) => format!("status {}", status(s.status)),
        Some(Live::AssistantDelta(d)) if d.reasoning => format!("reasoning {}.{} {:?}", d.turn, d.step, d.text),
        Some(Live::AssistantDelta(d)) => format!("delta {}.{} {:?}", d.turn, d.step, d.text),
        Some(Live::Error(e)) => format!("error {}.{} {:?}", e.turn, e.step, e.message),
        None => format!("{} <no payload>", l.r#type),
    }
}
