use super::*;

fn ev(seq: u64, payload: Payload) -> pb::WatchItem {
    let event = pb::SessionEvent { seq, time_unix_ms: 1_000_000 + seq, payload: Some(payload), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Event(event)) }
}

fn delta(step: u32, offset: u64, text: &str) -> pb::WatchItem {
    let d = pb::AssistantDelta { turn: 1, step, text: text.into(), reasoning: false, offset };
    let live = pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), ..Default::default() };
    pb::WatchItem { item: Some(pb::watch_item::Item::Live(live)) }
}

fn user(id: &str, text: &str) -> pb::UserMessage {
    pb::UserMessage {
        id: id.into(),
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.into() })),
        }],
        source: None,
    }
}

fn end(seq: u64, reason: Reason) -> pb::WatchItem {
    ev(seq, Payload::TurnEnd(pb::TurnEnd { turn: 1, reason: Some(pb::TurnEndReason { reason: Some(reason) }) }))
}

/// A turn of two steps: "hello" streamed then durable, a call awaiting approval, its decision and result,
/// then " world" only durable.
fn turn() -> Vec<pb::WatchItem> {
    vec![
        ev(1, Payload::InboxSpliced(pb::InboxSpliced { inserted: vec![user("m1", "hi")], ..Default::default() })),
        ev(2, Payload::TurnStart(pb::TurnStart { turn: 1 })),
        ev(3, Payload::StepStart(pb::StepStart { turn: 1, step: 1 })),
        ev(4, Payload::UserMessage(pb::UserMessageEvent { message: Some(user("m1", "hi")), turn: 1, step: 1 })),
        delta(1, 0, "hel"),
        delta(1, 3, "lo"),
        ev(
            5,
            Payload::AssistantMessage(pb::AssistantMessage {
                turn: 1,
                step: 1,
                text: "hello".into(),
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
                arguments: "x".into(),
                awaiting_approval: true,
                awaiting_client: false,
                idempotency_key: String::new(),
            }),
        ),
        ev(
            7,
            Payload::ToolDecision(pb::ToolDecision {
                turn: 1,
                step: 1,
                call_id: "c1".into(),
                approved: true,
                ..Default::default()
            }),
        ),
        ev(
            8,
            Payload::ToolResult(pb::ToolResult {
                turn: 1,
                step: 1,
                call_id: "c1".into(),
                output: "x".into(),
                ..Default::default()
            }),
        ),
        ev(9, Payload::StepStart(pb::StepStart { turn: 1, step: 2 })),
        ev(
            10,
            Payload::AssistantMessage(pb::AssistantMessage {
                turn: 1,
                step: 2,
                text: "world".into(),
                ..Default::default()
            }),
        ),
        end(11, Reason::Completed(pb::Empty {})),
    ]
}

fn run(items: &[pb::WatchItem], after: u64) -> (TurnFold, Vec<Step>) {
    let mut fold = TurnFold::new(1, after);
    let steps = items.iter().flat_map(|i| fold.apply(i)).collect();
    (fold, steps)
}

fn text(steps: &[Step]) -> String {
    steps
        .iter()
        .filter_map(|s| match &s.change {
            Change::Text { piece, .. } => Some(piece.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_turn_folds_to_its_changes_at_rising_positions() {
    let (fold, steps) = run(&turn(), 0);
    let positions: Vec<u64> = steps.iter().map(|s| s.position).collect();
    let mut sorted = positions.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(positions, sorted, "positions rise and are unique: {steps:?}");
    assert_eq!(text(&steps), "helloworld", "the durable message adds nothing the deltas sent");
    assert_eq!(fold.reply(), "hello\n\nworld");
    assert_eq!(fold.prompt(), "hi");
    assert_eq!(fold.turn(), Some(1));
    assert!(matches!(steps[0].change, Change::Accepted));
    assert!(matches!(steps[1].change, Change::Started { turn: 1 }));
    assert!(steps.iter().any(|s| matches!(&s.change, Change::Waiting(c) if c.call_id == "c1" && c.seq == 6)));
    assert!(steps.iter().any(|s| matches!(&s.change, Change::Decided { approved: true, .. })));
    assert_eq!(steps.last().unwrap().change, Change::Ended(Outcome::Completed));
    assert!(fold.finished() && fold.waiting().is_none());
}

#[test]
fn a_fold_resumed_after_any_position_sends_exactly_the_rest() {
    let (_, all) = run(&turn(), 0);
    for (i, at) in all.iter().enumerate() {
        let (_, rest) = run(&turn(), at.position);
        assert_eq!(rest, all[i + 1..], "resumed after {}", at.position);
    }
    // In the middle of a delta's bytes: after "he" (end offset 2) of step 1 (step/start at 3).
    let (_, rest) = run(&turn(), 3 * SPAN + 2 + 2);
    assert_eq!(text(&rest), "lloworld");
}

#[test]
fn a_call_awaiting_approval_is_the_waiting_call_until_decided() {
    let items = turn();
    let (fold, _) = run(&items[..8], 0);
    let call = fold.waiting().unwrap();
    assert_eq!((call.call_id.as_str(), call.name.as_str(), call.seq), ("c1", "echo", 6));
    assert!(!fold.finished());
}

#[test]
fn a_message_removed_before_its_turn_ends_cancelled() {
    let items = vec![
        ev(1, Payload::InboxSpliced(pb::InboxSpliced { inserted: vec![user("m1", "hi")], ..Default::default() })),
        pb::WatchItem {
            item: Some(pb::watch_item::Item::CaughtUp(pb::CaughtUp {
                seq: 1,
                status: pb::SessionStatus::Idle as i32,
                ..Default::default()
            })),
        },
    ];
    let (fold, steps) = run(&items, 0);
    assert!(matches!(fold.outcome(), Some(Outcome::Cancelled(_))));
    assert_eq!(steps.last().unwrap().position, END);
}

#[test]
fn a_read_that_catches_up_before_the_delivery_is_missing() {
    let caught =
        pb::WatchItem { item: Some(pb::watch_item::Item::CaughtUp(pb::CaughtUp { seq: 0, ..Default::default() })) };
    let (fold, steps) = run(&[caught], 0);
    assert!(fold.missing() && steps.is_empty());
}

#[test]
fn ends_map_to_outcomes() {
    let cases = [
        (Reason::MaxTokens(pb::Empty {}), Outcome::MaxTokens),
        (
            Reason::Error(pb::TurnError { message: "m".into(), code: "model_failed".into() }),
            Outcome::Failed { code: "model_failed".into(), message: "m".into() },
        ),
        (Reason::Aborted(pb::CancelCause::default()), Outcome::Cancelled("turn 1 was cancelled (user)".into())),
    ];
    for (reason, outcome) in cases {
        let mut items = turn()[..4].to_vec();
        items.push(end(5, reason));
        let (fold, _) = run(&items, 0);
        assert_eq!(fold.outcome(), Some(&outcome));
    }
}

#[test]
fn each_step_s_reply_ends_once_with_its_whole_text_and_a_late_delta_adds_nothing() {
    let mut items = turn();
    // A live delta of step 1 read after its durable message (a lagging live read).
    items.insert(7, delta(1, 3, "lo"));
    let (fold, steps) = run(&items, 0);
    let replies: Vec<(u64, &str, bool)> = steps
        .iter()
        .filter_map(|s| match &s.change {
            Change::Replied { step, text, interrupted } => Some((*step, text.as_str(), *interrupted)),
            _ => None,
        })
        .collect();
    assert_eq!(replies, [(3, "hello", false), (9, "world", false)]);
    assert_eq!(text(&steps), "helloworld");
    assert_eq!(fold.inputs().len(), 1);
}

#[test]
fn a_call_of_a_client_tool_is_a_client_call_and_no_wait_for_a_decision() {
    let mut items = turn()[..7].to_vec();
    items.push(ev(
        6,
        Payload::ToolCall(pb::ToolCall {
            turn: 1,
            step: 1,
            call_id: "c1".into(),
            name: "lookup".into(),
            awaiting_client: true,
            ..Default::default()
        }),
    ));
    let (fold, steps) = run(&items, 0);
    assert!(matches!(&steps.last().unwrap().change, Change::ClientCall(c) if c.call_id == "c1" && c.seq == 6));
    assert!(fold.waiting().is_none());
}

#[test]
fn a_fold_continuing_a_known_turn_reads_it_from_the_call_on() {
    let mut fold = TurnFold::new(6, 0).in_turn(Some(1));
    let steps: Vec<Step> = turn()[7..].iter().flat_map(|i| fold.apply(i)).collect();
    assert!(matches!(steps[0].change, Change::Accepted));
    assert!(matches!(&steps[1].change, Change::Waiting(c) if c.seq == 6));
    assert_eq!(text(&steps), "world");
    assert_eq!(fold.outcome(), Some(&Outcome::Completed));
}
