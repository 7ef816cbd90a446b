use super::*;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;

const SESSION: &str = "s1";

fn ev(seq: u64, payload: Payload) -> pb::WatchItem {
    let event = pb::SessionEvent { seq, time_unix_ms: 1_000_000 + seq, payload: Some(payload), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(event)) }
}

fn delta(after_seq: u64, offset: u64, text: &str) -> pb::WatchItem {
    let d = pb::AssistantDelta { turn: 1, step: 1, text: text.into(), reasoning: false, offset };
    let live = pb::LiveEvent { after_seq, payload: Some(Live::AssistantDelta(d)), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Live(live)) }
}

fn user(id: &str, text: &str) -> pb::UserMessage {
    InputMessageLike(text).to(id)
}

struct InputMessageLike<'a>(&'a str);
impl InputMessageLike<'_> {
    fn to(&self, id: &str) -> pb::UserMessage {
        crate::openai::input::InputMessage { role: crate::openai::input::Role::User, text: self.0.into() }
            .to_pb(id.into())
    }
}

/// One turn of the canonical order (SPEC §5), the reply streamed as "hel" + "lo" before it is durable.
fn turn(text: &str) -> Vec<pb::WatchItem> {
    let reason = |r| Some(pb::TurnEndReason { reason: Some(r) });
    vec![
        ev(
            1,
            Payload::InboxSpliced(pb::InboxSpliced {
                inserted: vec![user("m1", "hi")],
                wake: true,
                ..Default::default()
            }),
        ),
        ev(2, Payload::Status(pb::StatusChanged { status: pb::SessionStatus::Running as i32 })),
        ev(3, Payload::TurnStart(pb::TurnStart { turn: 1 })),
        ev(4, Payload::InboxSpliced(pb::InboxSpliced { removed_count: 1, ..Default::default() })),
        ev(5, Payload::StepStart(pb::StepStart { turn: 1, step: 1 })),
        ev(6, Payload::UserMessage(pb::UserMessageEvent { message: Some(user("m1", "hi")), turn: 1, step: 1 })),
        delta(6, 0, &text[..3]),
        delta(6, 3, &text[3..]),
        ev(
            7,
            Payload::AssistantMessage(pb::AssistantMessage {
                turn: 1,
                step: 1,
                text: text.into(),
                usage: Some(pb::Usage { input_tokens: 3, output_tokens: 2, ..Default::default() }),
                ..Default::default()
            }),
        ),
        ev(8, Payload::StepEnd(pb::StepEnd { turn: 1, step: 1, ..Default::default() })),
        ev(9, Payload::TurnEnd(pb::TurnEnd { turn: 1, reason: reason(Reason::Completed(pb::Empty {})) })),
    ]
}

fn id(turn: u64) -> ResponseId {
    ResponseId { session: SESSION.into(), seq: 1, turn, conversation: false, after_approval: false }
}

fn run(items: &[pb::WatchItem], turn: u64, after: Option<u64>) -> (ResponseFold, Vec<Event>) {
    let mut fold = ResponseFold::new(id(turn), Meta::default(), after);
    let events = items.iter().flat_map(|i| fold.apply(i)).collect();
    (fold, events)
}

fn text_deltas(events: &[Event]) -> String {
    events
        .iter()
        .filter(|e| e.kind() == "response.output_text.delta")
        .map(|e| e.body["delta"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_streamed_turn_gives_the_documented_events_in_order_with_rising_numbers() {
    let (fold, events) = run(&turn("hello"), 1, None);
    let kinds: Vec<&str> = events.iter().map(Event::kind).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert!(events.windows(2).all(|w| w[0].number < w[1].number), "{events:?}");
    assert_eq!(text_deltas(&events), "hello");
    let done = fold.snapshot();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "hello");
    assert_eq!(done["usage"]["total_tokens"], 5);
    assert_eq!(fold.inputs().len(), 1);
}

#[test]
fn a_stream_resumed_after_any_event_sends_the_rest_exactly_once() {
    let items = turn("hello");
    let (_, all) = run(&items, 1, None);
    for (k, seen) in all.iter().enumerate() {
        // Live (with the same deltas) and from the log alone (the step ended: no deltas at all).
        let durable: Vec<_> =
            items.iter().filter(|i| !matches!(i.item, Some(pb::watch_item::Item::Live(_)))).cloned().collect();
        for source in [&items, &durable] {
            let (_, rest) = run(source, 1, Some(seen.number));
            let mut got: Vec<&Event> = all[..=k].iter().collect();
            got.extend(rest.iter());
            assert!(got.windows(2).all(|w| w[0].number < w[1].number), "after {}: {got:?}", seen.number);
            let text: String = got
                .iter()
                .filter(|e| e.kind() == "response.output_text.delta")
                .map(|e| e.body["delta"].as_str().unwrap())
                .collect();
            assert_eq!(text, "hello", "resumed after {}", seen.number);
            assert_eq!(got.last().unwrap().kind(), "response.completed");
        }
    }
}

#[test]
fn the_turn_is_found_by_message_id_when_the_session_was_busy() {
    let (fold, events) = run(&turn("hello"), 0, None);
    assert_eq!(fold.turn(), Some(1));
    assert_eq!(text_deltas(&events), "hello");
}

#[test]
fn a_message_removed_before_its_turn_is_a_cancelled_response() {
    let items = &turn("hello")[..1];
    let (mut fold, _) = run(items, 0, None);
    let caught =
        pb::CaughtUp { seq: 1, inbox: Some(pb::InboxSnapshot::default()), status: pb::SessionStatus::Idle as i32 };
    let events = fold.apply(&pb::WatchItem { item: Some(pb::watch_item::Item::CaughtUp(caught)) });
    assert_eq!(fold.status(), "cancelled");
    assert_eq!(events.last().unwrap().kind(), "response.failed");
}

#[test]
fn a_response_whose_delivery_is_not_in_the_log_is_missing() {
    let mut fold = ResponseFold::new(ResponseId { seq: 5, ..id(1) }, Meta::default(), None);
    let caught = pb::CaughtUp { seq: 3, ..Default::default() };
    fold.apply(&pb::WatchItem { item: Some(pb::watch_item::Item::CaughtUp(caught)) });
    assert!(fold.missing());
}

#[test]
fn a_turn_interrupted_by_a_failover_ends_its_cut_reply_and_the_response_goes_on_in_the_next_turn() {
    let reason = |r| Some(pb::TurnEndReason { reason: Some(r) });
    let mut items = turn("hello");
    // The owner dies after the first delta: the new owner repairs (step/end, turn/end interrupted) and
    // turn 2 answers the same input.
    items.truncate(7);
    items.push(ev(7, Payload::StepEnd(pb::StepEnd { turn: 1, step: 1, ..Default::default() })));
    items.push(ev(8, Payload::TurnEnd(pb::TurnEnd { turn: 1, reason: reason(Reason::Interrupted(pb::Empty {})) })));
    items.push(ev(9, Payload::TurnStart(pb::TurnStart { turn: 2 })));
    items.push(ev(10, Payload::StepStart(pb::StepStart { turn: 2, step: 1 })));
    items.push(ev(
        11,
        Payload::AssistantMessage(pb::AssistantMessage {
            turn: 2,
            step: 1,
            text: "again".into(),
            ..Default::default()
        }),
    ));
    items.push(ev(12, Payload::TurnEnd(pb::TurnEnd { turn: 2, reason: reason(Reason::Completed(pb::Empty {})) })));
    let (fold, events) = run(&items, 1, None);
    assert!(events.windows(2).all(|w| w[0].number < w[1].number), "{events:?}");
    let done = fold.snapshot();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["status"], "incomplete");
    assert_eq!(done["output"][0]["content"][0]["text"], "hel");
    assert_eq!(done["output"][1]["content"][0]["text"], "again");
    let item_done = events.iter().filter(|e| e.kind() == "response.output_item.done").count();
    assert_eq!(item_done, 2);
}

/// A turn whose step 1 calls `echo`, which waits for approval (at seq 7); approved, it runs, and step 2
/// replies "done".
fn approval_turn() -> Vec<pb::WatchItem> {
    let reason = |r| Some(pb::TurnEndReason { reason: Some(r) });
    let mut items = turn("hello")[..6].to_vec();
    let call = pb::ToolCall {
        turn: 1,
        step: 1,
        call_id: "c1".into(),
        name: "echo".into(),
        arguments: "{}".into(),
        awaiting_approval: true,
        ..Default::default()
    };
    items.push(ev(7, Payload::ToolCall(call)));
    let decision = pb::ToolDecision { turn: 1, step: 1, call_id: "c1".into(), approved: true, ..Default::default() };
    items.push(ev(8, Payload::ToolDecision(decision)));
    let result = pb::ToolResult { turn: 1, step: 1, call_id: "c1".into(), output: "ok".into(), ..Default::default() };
    items.push(ev(9, Payload::ToolResult(result)));
    items.push(ev(10, Payload::StepStart(pb::StepStart { turn: 1, step: 2 })));
    let reply = pb::AssistantMessage { turn: 1, step: 2, text: "done".into(), ..Default::default() };
    items.push(ev(11, Payload::AssistantMessage(reply)));
    items.push(ev(12, Payload::TurnEnd(pb::TurnEnd { turn: 1, reason: reason(Reason::Completed(pb::Empty {})) })));
    items
}

#[test]
fn a_call_awaiting_approval_ends_the_response_and_the_next_one_continues_after_it() {
    let items = approval_turn();
    let (fold, events) = run(&items, 1, None);
    assert_eq!(events.last().unwrap().kind(), "response.completed");
    let done = fold.snapshot();
    assert_eq!(done["output"].as_array().unwrap().len(), 1);
    assert_eq!(done["output"][0]["type"], "mcp_approval_request");
    let next = ResponseId { seq: 7, after_approval: true, ..id(1) };
    let mut fold = ResponseFold::new(next, Meta::default(), None);
    let events: Vec<Event> = items[6..].iter().flat_map(|i| fold.apply(i)).collect();
    assert!(events.windows(2).all(|w| w[0].number < w[1].number), "{events:?}");
    let done = fold.snapshot();
    assert_eq!(done["status"], "completed");
    assert_eq!(
        (done["output"][0]["type"].as_str(), done["output"][0]["output"].as_str()),
        (Some("mcp_call"), Some("ok"))
    );
    assert_eq!(done["output"][1]["content"][0]["text"], "done");
    assert_eq!(text_deltas(&events), "done");
}
