use super::*;

fn ev(seq: u64, payload: Payload) -> pb::WatchItem {
    let event = pb::SessionEvent { seq, time_unix_ms: 1_000_000 + seq, payload: Some(payload), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(event)) }
}

fn delta(after_seq: u64, offset: u64, text: &str) -> pb::WatchItem {
    let d = pb::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning: false, offset };
    let live = pb::LiveEvent { after_seq, payload: Some(Live::AssistantDelta(d)), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Live(live)) }
}

fn user(id: &str) -> pb::UserMessage {
    pb::UserMessage { id: id.into(), ..Default::default() }
}

const TEXT: &str = "hello there";

/// One turn (SPEC §5) started by the delivery of `m1` at seq 1, its reply streamed in three pieces, then a
/// call of `echo` and its result, and a second step.
fn turn() -> Vec<pb::WatchItem> {
    let reason = |r| Some(pb::TurnEndReason { reason: Some(r) });
    vec![
        ev(1, Payload::InboxSpliced(pb::InboxSpliced { inserted: vec![user("m1")], wake: true, ..Default::default() })),
        ev(2, Payload::TurnStart(pb::TurnStart { turn: 1 })),
        ev(3, Payload::StepStart(pb::StepStart { turn: 1, step: 1 })),
        ev(4, Payload::UserMessage(pb::UserMessageEvent { message: Some(user("m1")), turn: 1, step: 1 })),
        delta(4, 0, "hel"),
        delta(4, 3, "lo th"),
        delta(4, 8, "ere"),
        ev(
            5,
            Payload::AssistantMessage(pb::AssistantMessage {
                turn: 1,
                step: 1,
                text: TEXT.into(),
                ..Default::default()
            }),
        ),
        ev(
            6,
            Payload::ToolCall(pb::ToolCall {
                turn: 1,
                step: 1,
                call_id: "c1".into(),
                name: "echo".into(),
                arguments: "{}".into(),
                ..Default::default()
            }),
        ),
        ev(
            7,
            Payload::ToolResult(pb::ToolResult {
                turn: 1,
                step: 1,
                call_id: "c1".into(),
                output: "ok".into(),
                error: None,
            }),
        ),
        ev(8, Payload::StepEnd(pb::StepEnd { turn: 1, step: 1, ..Default::default() })),
        ev(9, Payload::StepStart(pb::StepStart { turn: 1, step: 2 })),
        ev(10, Payload::StepEnd(pb::StepEnd { turn: 1, step: 2, ..Default::default() })),
        ev(11, Payload::TurnEnd(pb::TurnEnd { turn: 1, reason: reason(Reason::Completed(pb::Empty {})) })),
    ]
}

fn fold(after: Option<u64>) -> Vec<Event> {
    let mut fold = RunFold::new("t1", "r1", 1, None, after);
    let mut out = Vec::new();
    for item in turn() {
        out.extend(fold.apply(&item));
    }
    assert!(fold.finished());
    out
}

fn kinds(events: &[Event]) -> Vec<&str> {
    events.iter().map(Event::kind).collect()
}

fn text(events: &[Event]) -> String {
    events.iter().filter(|e| e.kind() == "TEXT_MESSAGE_CONTENT").map(|e| e.body["delta"].as_str().unwrap()).collect()
}

#[test]
fn a_run_streams_its_steps_text_and_tools_in_order_with_rising_numbers() {
    let events = fold(None);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "STEP_FINISHED",
            "STEP_STARTED",
            "STEP_FINISHED",
            "RUN_FINISHED",
        ]
    );
    assert_eq!(text(&events), TEXT);
    let numbers: Vec<u64> = events.iter().map(|e| e.number.unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    assert_eq!(events[7].body["parentMessageId"], message_id(3));
    assert_eq!(events.last().unwrap().body["runId"], "r1");
}

#[test]
fn a_stream_resumed_after_any_event_reopens_what_was_open_and_sends_the_rest_once() {
    let all = fold(None);
    for (i, event) in all.iter().enumerate() {
        let n = event.number.unwrap();
        let rest = fold(Some(n));
        assert_eq!(rest[0].kind(), "RUN_STARTED", "after {n}");
        let numbered: Vec<&Event> = rest.iter().filter(|e| e.number.is_some()).collect();
        assert_eq!(numbered.len(), all.len() - i - 1, "after {n}");
        assert_eq!(format!("{}{}", text(&all[..=i]), text(&rest)), TEXT, "after {n}");
        // Every STEP_FINISHED and TEXT_MESSAGE_END of the resumed stream closes something it opened.
        let (mut step, mut message) = (false, false);
        for e in &rest {
            match e.kind() {
                "STEP_STARTED" => step = true,
                "STEP_FINISHED" => assert!(std::mem::take(&mut step), "after {n}: {:?}", kinds(&rest)),
                "TEXT_MESSAGE_START" => message = true,
                "TEXT_MESSAGE_CONTENT" => assert!(message, "after {n}"),
                "TEXT_MESSAGE_END" => assert!(std::mem::take(&mut message), "after {n}"),
                _ => {}
            }
        }
    }
}

#[test]
fn a_waiting_call_ends_the_run_and_the_continuation_starts_at_it() {
    let call = |approval: bool| {
        ev(
            6,
            Payload::ToolCall(pb::ToolCall {
                turn: 1,
                step: 1,
                call_id: "c1".into(),
                name: "get_weather".into(),
                arguments: "{}".into(),
                awaiting_approval: approval,
                awaiting_client: !approval,
                idempotency_key: String::new(),
            }),
        )
    };
    for approval in [true, false] {
        let mut items = turn()[..8].to_vec();
        items.push(call(approval));
        let mut fold = RunFold::new("t1", "r1", 1, None, None);
        let events: Vec<Event> = items.iter().flat_map(|i| fold.apply(i)).collect();
        assert!(fold.finished());
        let end = events.last().unwrap();
        assert_eq!(kinds(&events)[events.len() - 2..], ["STEP_FINISHED", "RUN_FINISHED"]);
        match approval {
            true => assert_eq!(end.body["outcome"]["interrupts"][0]["toolCallId"], "c1"),
            false => assert_eq!(end.body["outcome"]["pendingToolCallIds"], json!(["c1"])),
        }
        // The next run starts at the call: the step is open again, the client's own result is not sent back.
        let mut next = RunFold::new("t1", "r2", 6, None, None);
        let mut rest = turn()[9..].to_vec();
        rest.insert(0, call(approval));
        let events: Vec<Event> = rest.iter().flat_map(|i| next.apply(i)).collect();
        let expected: &[&str] = match approval {
            true => &["RUN_STARTED", "STEP_STARTED", "TOOL_CALL_RESULT", "STEP_FINISHED", "STEP_STARTED"],
            false => &["RUN_STARTED", "STEP_STARTED", "STEP_FINISHED", "STEP_STARTED"],
        };
        assert_eq!(kinds(&events)[..expected.len()], *expected);
        assert_eq!(events.last().unwrap().kind(), "RUN_FINISHED");
    }
}

#[test]
fn a_start_that_is_no_run_ends_the_stream_with_a_run_error() {
    let mut fold = RunFold::new("t1", "r1", 3, None, Some(3 * SPAN + 5));
    let events: Vec<Event> = turn().iter().flat_map(|i| fold.apply(i)).collect();
    assert!(fold.finished());
    assert_eq!(kinds(&events), ["RUN_STARTED", "RUN_ERROR"]);
    assert_eq!(events[1].body["code"], "not_found");
}
