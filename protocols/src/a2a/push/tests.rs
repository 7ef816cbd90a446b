use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;

use super::*;

fn ev(seq: u64, payload: Payload) -> pb::SessionEvent {
    pb::SessionEvent { seq, time_unix_ms: 1_000_000 + seq, payload: Some(payload), ..Default::default() }
}

fn user(id: &str) -> pb::UserMessage {
    let text = pb::TextBlock { text: "hi".into() };
    pb::UserMessage {
        id: id.into(),
        content: vec![pb::ContentBlock { block: Some(pb::content_block::Block::Text(text)) }],
        source: None,
    }
}

/// An earlier turn (m0) then the task's (m1): delivered at 3, started, a reply, the end.
fn log() -> Vec<pb::SessionEvent> {
    let splice = |id: &str| Payload::InboxSpliced(pb::InboxSpliced { inserted: vec![user(id)], ..Default::default() });
    let end = |turn| {
        let reason = pb::TurnEndReason { reason: Some(Reason::Completed(Default::default())) };
        Payload::TurnEnd(pb::TurnEnd { turn, reason: Some(reason) })
    };
    vec![
        ev(1, splice("a2a-m0")),
        ev(2, end(1)),
        ev(3, splice("a2a-m1")),
        ev(4, Payload::TurnStart(pb::TurnStart { turn: 2 })),
        ev(5, Payload::StepStart(pb::StepStart { turn: 2, step: 1 })),
        ev(6, Payload::UserMessage(pb::UserMessageEvent { message: Some(user("a2a-m1")), turn: 2, step: 1 })),
        ev(
            7,
            Payload::AssistantMessage(pb::AssistantMessage {
                turn: 2,
                step: 1,
                text: "echo".into(),
                ..Default::default()
            }),
        ),
        ev(8, end(2)),
    ]
}

fn state(body: &Value) -> &str {
    body["statusUpdate"]["status"]["state"].as_str().unwrap_or_default()
}

/// Each event that changes the task renders as the stream would show it, at that event only; the end
/// says the task ended; another turn's events render nothing.
#[test]
fn each_change_of_the_task_is_one_stream_response() {
    let log = log();
    let at = |seq| render("s", "a2a-m1", &log, seq).unwrap();
    assert_eq!(at(3).bodies, Vec::<Value>::new(), "the delivery itself changes no state A2A shows");
    assert_eq!(state(&at(6).bodies[0]), "TASK_STATE_WORKING");
    let reply = &at(7).bodies[0]["artifactUpdate"];
    assert_eq!(
        (reply["artifact"]["parts"][0]["text"].as_str(), reply["append"].as_bool()),
        (Some("echo"), Some(false))
    );
    let end = at(8);
    assert_eq!((state(&end.bodies[0]), end.ended), ("TASK_STATE_COMPLETED", true));
    assert_eq!(end.bodies[0]["statusUpdate"]["taskId"], json!(task::encode(&TaskId { session: "s".into(), seq: 3 })));
    assert!(!at(7).ended);
    assert_eq!(render("s", "a2a-m1", &log[..2], 2), None, "before the delivery there is no task");
    assert_eq!(render("s", "a2a-m0", &log, 8).map(|r| r.bodies), Some(Vec::new()), "another task's turn");
}
