//! Round trips for every payload variant and source kind, and each decode error.

use crate::v1 as pb;
use prost::Message as _;

use super::*;
use turnstile_model::ValueError;
use turnstile_model::event::{
    CancelCause, Envelope, EventPayload, InjectMode, LiveEvent, LivePayload, RepairAction, Splice, SpliceOutcome,
    Status, ToolCallSpec, TurnEndReason, Usage,
};
use turnstile_model::goal::{GoalChange, GoalState};
use turnstile_model::inbox::Inbox;
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};

fn session() -> SessionRef {
    SessionRef { tenant: "acme".into(), id: "s-1".into() }
}

fn sources() -> Vec<MessageSource> {
    vec![
        MessageSource::User,
        MessageSource::Plugin { plugin: "memory".into(), form: Some("recall".into()) },
        MessageSource::Plugin { plugin: String::new(), form: None },
        MessageSource::Goal { goal_id: "g1".into(), revision: 3, round: 2 },
        MessageSource::Tool { call_id: "call-7".into() },
        MessageSource::Model { provider: "scripted".into(), model: "echo".into() },
        MessageSource::Session { tenant: "acme".into(), session: "other".into(), upto_seq: 9 },
    ]
}

fn message(id: &str, source: MessageSource) -> UserMessage {
    UserMessage {
        id: MessageId(id.into()),
        content: vec![
            ContentBlock::text("hello"),
            ContentBlock::Data { mime: "image/png".into(), bytes: vec![0, 1, 2, 255] },
        ]
        .into(),
        source,
    }
}

fn payloads() -> Vec<EventPayload> {
    let call = ToolCallSpec { call_id: "c1".into(), name: "echo".into(), arguments: "hi".into() };
    let mut out = vec![
        EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: vec![message("a", MessageSource::User), message("b", sources()[1].clone())],
            outcome: SpliceOutcome::None,
            wake: true,
            requested_target: Some(Target::NextStep),
            deadline: None,
        }),
        EventPayload::InboxSpliced(Splice {
            target: Target::NextStep,
            start: 1,
            removed_count: 2,
            inserted: vec![],
            outcome: SpliceOutcome::Canceled,
            wake: false,
            requested_target: None,
            deadline: None,
        }),
        EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: vec![message("r", MessageSource::User)],
            outcome: SpliceOutcome::Restored,
            wake: false,
            requested_target: None,
            deadline: None,
        }),
        EventPayload::Status(Status::Idle),
        EventPayload::Status(Status::Running),
        EventPayload::TurnStart { turn: 4 },
        EventPayload::StepStart { turn: 4, step: 1 },
        EventPayload::StepEnd { turn: 4, step: 1, spent: None },
        EventPayload::AssistantMessage {
            turn: 4,
            step: 1,
            text: "echo: hi".into(),
            tool_calls: vec![call.clone()],
            interrupted: true,
            max_tokens: true,
            reasoning: None,
            usage: None,
            model: None,
        },
        EventPayload::AssistantMessage {
            turn: 4,
            step: 2,
            text: "It is noon.".into(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: Some("The clock said 12:00.".into()),
            usage: Some(Usage { input_tokens: 1234, output_tokens: 56, ..Default::default() }),
            model: None,
        },
        EventPayload::AssistantMessage {
            turn: 4,
            step: 3,
            text: String::new(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: true,
            reasoning: Some(String::new()),
            usage: Some(Usage::default()),
            model: None,
        },
        EventPayload::ToolCall {
            turn: 4,
            step: 1,
            call: call.clone(),
            awaiting_approval: false,
            awaiting_client: false,
        },
        EventPayload::ToolCall {
            turn: 4,
            step: 1,
            call: call.clone(),
            awaiting_approval: true,
            awaiting_client: false,
        },
        EventPayload::ToolCall { turn: 4, step: 1, call, awaiting_approval: false, awaiting_client: true },
        EventPayload::ToolDecision {
            turn: 4,
            step: 1,
            call_id: "c1".into(),
            approved: true,
            reason: "ok".into(),
            timed_out: false,
        },
        EventPayload::ToolDecision {
            turn: 4,
            step: 1,
            call_id: "c1".into(),
            approved: false,
            reason: String::new(),
            timed_out: true,
        },
        EventPayload::ToolRepaired { turn: 4, step: 1, call_id: "c1".into(), action: RepairAction::Interrupted },
        EventPayload::ToolRepaired { turn: 4, step: 1, call_id: "c1".into(), action: RepairAction::Retried },
        EventPayload::ToolResult { turn: 4, step: 1, call_id: "c1".into(), output: "hi".into(), error: None },
        EventPayload::ToolResult {
            turn: 4,
            step: 1,
            call_id: "c1".into(),
            output: String::new(),
            error: Some("boom".into()),
        },
        EventPayload::GoalChange(GoalChange {
            goal_id: "g".into(),
            revision: 2,
            state: GoalState::Paused,
            objective: "ship it".into(),
            max_rounds: 5,
            round: 3,
            summary: None,
            reason: Some("turn ended error".into()),
        }),
        EventPayload::GoalChange(GoalChange {
            goal_id: "g".into(),
            revision: 2,
            state: GoalState::Completed,
            objective: "ship it".into(),
            max_rounds: 5,
            round: 4,
            summary: Some("shipped".into()),
            reason: None,
        }),
        EventPayload::Ignorable { event_type: "future/thing".into() },
        EventPayload::SessionConfigured {
            agent: "assistant".into(),
            inject_mode: InjectMode::Pending,
            parent: None,
            version: None,
        },
        EventPayload::SessionConfigured {
            agent: "scripted".into(),
            inject_mode: InjectMode::OutOfTurn,
            parent: None,
            version: Some(2),
        },
        EventPayload::SessionConfigured {
            agent: "researcher".into(),
            inject_mode: InjectMode::Pending,
            parent: Some(SessionRef { tenant: "acme".into(), id: "planner".into() }),
            version: None,
        },
        EventPayload::SessionOverridden(turnstile_model::overrides::SessionOverrides {
            system_prompt: Some("Answer in French.".into()),
            model: Some("large".into()),
            tools: Some(vec![]),
        }),
        EventPayload::SessionOverridden(turnstile_model::overrides::SessionOverrides::default()),
        EventPayload::ContextCompacted(turnstile_model::Compaction {
            upto_turn: 3,
            from_turn: 1,
            summary: "summary of turns 1..3".into(),
            summarized_turns: 2,
        }),
        EventPayload::SessionForked(turnstile_model::Fork {
            from: session(),
            at_turn: 2,
            at_seq: 17,
            agent: None,
            compacted: None,
            transcript: vec![
                turnstile_model::TranscriptEntry::User { turn: 2, step: 1, message: message("u", MessageSource::User) },
                turnstile_model::TranscriptEntry::Assistant {
                    turn: 2,
                    step: 1,
                    text: "hi".into(),
                    tool_calls: vec![ToolCallSpec { call_id: "c".into(), name: "echo".into(), arguments: "x".into() }],
                    interrupted: false,
                },
                turnstile_model::TranscriptEntry::ToolResult {
                    turn: 2,
                    step: 1,
                    call_id: "c".into(),
                    name: "echo".into(),
                    output: String::new(),
                    error: Some("boom".into()),
                },
            ],
        }),
    ];
    for source in sources() {
        out.push(EventPayload::UserMessage { message: message("m", source), turn: 4, step: 2 });
    }
    let reasons = [
        TurnEndReason::Completed,
        TurnEndReason::Blocked { reason: None },
        TurnEndReason::Blocked { reason: Some("step budget: 8 steps".into()) },
        TurnEndReason::MaxTokens,
        TurnEndReason::Aborted(CancelCause::User),
        TurnEndReason::Aborted(CancelCause::Parent),
        TurnEndReason::Aborted(CancelCause::Hook { reason: "budget".into() }),
        TurnEndReason::Aborted(CancelCause::Disposed),
        TurnEndReason::Error { message: "model failed".into(), code: "model".into() },
        TurnEndReason::Interrupted,
    ];
    out.extend(reasons.into_iter().map(|reason| EventPayload::TurnEnd { turn: 4, reason }));
    out
}

fn envelope(seq: u64, payload: EventPayload) -> Envelope {
    Envelope { session: session(), seq, time_ms: 1_700_000_000_000 + seq, epoch: 3, payload }
}

#[test]
fn every_durable_payload_round_trips_through_bytes() {
    for (i, payload) in payloads().into_iter().enumerate() {
        let event = envelope(i as u64 + 1, payload);
        let back = decode_event(&encode_event(&event)).unwrap();
        assert_eq!(back, event);
    }
}

#[test]
fn encoded_type_is_the_payload_type_and_ignorable_keeps_its_own() {
    for payload in payloads() {
        let event = encode_session_event(&envelope(1, payload.clone()));
        match &payload {
            EventPayload::Ignorable { event_type } => {
                assert_eq!(&event.r#type, event_type);
                assert!(event.ignorable && event.payload.is_none());
            }
            // The repair's record (SPEC §20) is known here, and skipped by a reader from before it.
            EventPayload::ToolRepaired { .. } => {
                assert_eq!(event.r#type, "tool/repaired");
                assert!(event.ignorable && event.payload.is_some());
            }
            // So are a session's overrides: an older reader runs the agent as it is.
            EventPayload::SessionOverridden(_) => {
                assert_eq!(event.r#type, "session/overridden");
                assert!(event.ignorable && event.payload.is_some());
            }
            other => {
                assert_eq!(event.r#type, other.event_type());
                assert!(!event.ignorable);
            }
        }
    }
}

#[test]
fn every_live_payload_round_trips_through_bytes() {
    let live = [
        LivePayload::Inserted { message: message("a", MessageSource::User) },
        LivePayload::Discarded { message: message("b", sources()[3].clone()) },
        LivePayload::Claimed { message: message("c", sources()[4].clone()), turn: 2 },
        LivePayload::Status { status: Status::Running },
        LivePayload::Status { status: Status::Idle },
        LivePayload::AssistantDelta { turn: 2, step: 1, text: "ec".into(), reasoning: false, offset: 0 },
        LivePayload::AssistantDelta { turn: 2, step: 1, text: "hmm".into(), reasoning: true, offset: 0 },
        LivePayload::Error { turn: 2, step: 1, message: "hook failed".into() },
    ];
    for payload in live {
        let event = LiveEvent { session: session(), after_seq: 12, payload };
        assert_eq!(encode_live_event(&event).r#type, event.event_type());
        assert_eq!(decode_live(&encode_live(&event)).unwrap(), event);
    }
}

#[test]
fn events_written_before_reasoning_and_usage_decode_without_them() {
    // What a writer that predates fields 7 and 8 (`AssistantMessage`) and 4 (`AssistantDelta`) produced.
    let old = pb::AssistantMessage { turn: 1, step: 1, text: "hi".into(), ..Default::default() };
    let event = pb::SessionEvent {
        session: Some(encode_session_ref(&session())),
        seq: 1,
        time_unix_ms: 5,
        epoch: 1,
        r#type: "assistant/message".into(),
        ignorable: false,
        format: 0,
        payload: Some(pb::session_event::Payload::AssistantMessage(old)),
    };
    let back = decode_event(&event.encode_to_vec()).unwrap();
    assert!(
        matches!(&back.payload, EventPayload::AssistantMessage { reasoning: None, usage: None, text, .. } if text == "hi"),
        "{back:?}"
    );
    let delta = pb::LiveEvent {
        session: Some(encode_session_ref(&session())),
        after_seq: 1,
        r#type: "assistant/delta".into(),
        payload: Some(pb::live_event::Payload::AssistantDelta(pb::AssistantDelta {
            turn: 1,
            step: 1,
            text: "h".into(),
            ..Default::default()
        })),
    };
    let back = decode_live(&delta.encode_to_vec()).unwrap();
    assert_eq!(
        back.payload,
        LivePayload::AssistantDelta { turn: 1, step: 1, text: "h".into(), reasoning: false, offset: 0 }
    );
}

#[test]
fn every_source_kind_round_trips() {
    for source in sources() {
        assert_eq!(decode_message_source(encode_message_source(&source)).unwrap(), source);
        let m = message("id-1", source);
        assert_eq!(decode_user_message(encode_user_message(&m)).unwrap(), m);
    }
}

#[test]
fn plugin_form_empty_is_none() {
    let pb_source = pb::MessageSource {
        kind: Some(pb::message_source::Kind::Plugin(pb::PluginSource { plugin: "p".into(), form: String::new() })),
    };
    assert_eq!(decode_message_source(pb_source).unwrap(), MessageSource::Plugin { plugin: "p".into(), form: None });
    let encoded = encode_message_source(&MessageSource::Plugin { plugin: "p".into(), form: None });
    assert_eq!(
        encoded.kind,
        Some(pb::message_source::Kind::Plugin(pb::PluginSource { plugin: "p".into(), form: String::new() }))
    );
}

#[test]
fn targets_statuses_causes_and_reasons_round_trip() {
    for t in [Target::NextTurn, Target::NextStep] {
        assert_eq!(decode_target(encode_target(t).into()).unwrap(), t);
    }
    for s in [Status::Idle, Status::Running] {
        assert_eq!(decode_status(encode_status(s).into()).unwrap(), s);
    }
    for c in [CancelCause::User, CancelCause::Parent, CancelCause::Hook { reason: "r".into() }, CancelCause::Disposed] {
        assert_eq!(decode_cancel_cause(encode_cancel_cause(&c)).unwrap(), c);
        let reason = TurnEndReason::Aborted(c);
        assert_eq!(decode_turn_end_reason(encode_turn_end_reason(&reason)).unwrap(), reason);
    }
    let splice = Splice {
        target: Target::NextStep,
        start: 0,
        removed_count: 1,
        inserted: vec![],
        outcome: SpliceOutcome::None,
        wake: false,
        requested_target: None,
        deadline: None,
    };
    assert_eq!(decode_splice(encode_splice(&splice)).unwrap(), splice);
}

#[test]
fn inbox_snapshot_carries_both_lists_and_the_seq() {
    let inbox = Inbox {
        next_turn: vec![message("t1", MessageSource::User), message("t2", MessageSource::User)],
        next_step: vec![message("s1", sources()[2].clone())],
    };
    let snapshot = encode_inbox(&inbox, 42);
    assert_eq!(snapshot.seq, 42);
    assert_eq!(snapshot.next_turn.len(), 2);
    assert_eq!(snapshot.next_turn[1].id, "t2");
    assert_eq!(snapshot.next_step[0].id, "s1");
    assert_eq!(decode_inbox_snapshot(snapshot).unwrap(), (42, inbox));
}

// ---- decode errors ----

fn err_string(result: Result<impl std::fmt::Debug, CodecError>) -> String {
    result.unwrap_err().to_string()
}

fn pb_message() -> pb::UserMessage {
    encode_user_message(&message("ok", MessageSource::User))
}

#[test]
fn empty_content_block_names_its_index() {
    let mut m = pb_message();
    m.content[1].block = None;
    let e = decode_user_message(m).unwrap_err();
    assert_eq!(e.path(), Some("message.content[1]"));
    assert_eq!(e.to_string(), "message.content[1]: content block has neither text nor data; set one of them");
}

#[test]
fn message_id_length_is_checked() {
    let mut m = pb_message();
    m.id = "x".repeat(129);
    let e = decode_user_message(m).unwrap_err();
    assert_eq!(e, CodecError::value("message.id", ValueError::MessageIdLength { len: 129 }));
    assert!(e.to_string().starts_with("message.id: message id must be 1 to 128 bytes, got 129"));
    let mut m = pb_message();
    m.id = String::new();
    assert_eq!(decode_user_message(m).unwrap_err().path(), Some("message.id"));
}

#[test]
fn missing_source_is_an_error_unless_a_default_is_given() {
    let mut m = pb_message();
    m.source = None;
    let e = decode_user_message(m.clone()).unwrap_err();
    assert_eq!(e.path(), Some("message.source"));
    assert!(e.to_string().contains("is missing"), "{e}");
    let inject_default = MessageSource::Plugin { plugin: String::new(), form: None };
    let decoded = decode_user_message_with_default_source(m, inject_default.clone()).unwrap();
    assert_eq!(decoded.source, inject_default);
    // A source that is present wins over the default.
    let decoded = decode_user_message_with_default_source(pb_message(), inject_default).unwrap();
    assert_eq!(decoded.source, MessageSource::User);
}

#[test]
fn source_without_kind_is_refused() {
    let mut m = pb_message();
    m.source = Some(pb::MessageSource { kind: None });
    assert_eq!(decode_user_message(m).unwrap_err().path(), Some("message.source"));
}

#[test]
fn source_value_rules_point_at_the_field() {
    let cases = [
        (MessageSource::Plugin { plugin: "p".into(), form: Some("gossip".into()) }, "message.source.plugin.form"),
        (MessageSource::Goal { goal_id: "g".into(), revision: 1, round: 0 }, "message.source.goal.round"),
        (MessageSource::Goal { goal_id: String::new(), revision: 1, round: 1 }, "message.source.goal.goal_id"),
        (MessageSource::Tool { call_id: String::new() }, "message.source.tool.call_id"),
    ];
    for (source, path) in cases {
        let mut m = pb_message();
        m.source = Some(encode_message_source(&source));
        let e = decode_user_message(m).unwrap_err();
        assert_eq!(e.path(), Some(path), "{e}");
    }
    let mut m = pb_message();
    m.source = Some(encode_message_source(&MessageSource::Plugin { plugin: "p".into(), form: Some("gossip".into()) }));
    assert!(err_string(decode_user_message(m)).contains("use one of instructions"));
}

#[test]
fn unspecified_and_unknown_targets_are_refused() {
    assert_eq!(
        err_string(decode_target(0)),
        "target: TARGET_UNSPECIFIED is not a target; use TARGET_NEXT_TURN or TARGET_NEXT_STEP"
    );
    assert!(err_string(decode_target(9)).starts_with("target: 9 is not a known target"));
    assert!(err_string(decode_status(0)).starts_with("status: SESSION_STATUS_UNSPECIFIED"));
    assert!(err_string(decode_status(5)).starts_with("status: 5 is not a known status"));
}

#[test]
fn empty_cause_and_reason_are_refused() {
    assert_eq!(decode_cancel_cause(pb::CancelCause { cause: None }).unwrap_err().path(), Some("cause"));
    assert_eq!(decode_turn_end_reason(pb::TurnEndReason { reason: None }).unwrap_err().path(), Some("reason"));
    let aborted_without_cause =
        pb::TurnEndReason { reason: Some(pb::turn_end_reason::Reason::Aborted(pb::CancelCause { cause: None })) };
    assert_eq!(decode_turn_end_reason(aborted_without_cause).unwrap_err().path(), Some("reason.aborted"));
}

#[test]
fn bad_session_refs_are_refused() {
    let e = decode_session_ref(pb::SessionRef { tenant: "ac me".into(), id: "s".into() }).unwrap_err();
    assert_eq!(e.path(), Some("session"));
    assert!(e.to_string().contains("' '"), "{e}");
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.session = None;
    assert_eq!(decode_session_event(event).unwrap_err().path(), Some("session"));
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.session = Some(pb::SessionRef { tenant: String::new(), id: "s".into() });
    assert_eq!(decode_session_event(event).unwrap_err().path(), Some("session"));
}

#[test]
fn seq_zero_is_refused() {
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.seq = 0;
    assert_eq!(decode_session_event(event).unwrap_err().path(), Some("seq"));
}

#[test]
fn unknown_type_is_refused_unless_ignorable() {
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.r#type = "future/thing".into();
    event.payload = None;
    let e = decode_session_event(event.clone()).unwrap_err();
    assert_eq!(e.path(), Some("type"));
    assert!(e.to_string().contains("not marked ignorable"), "{e}");
    event.ignorable = true;
    assert_eq!(
        decode_session_event(event).unwrap().payload,
        EventPayload::Ignorable { event_type: "future/thing".into() }
    );
}

#[test]
fn missing_payload_is_refused_unless_ignorable() {
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.payload = None;
    assert_eq!(decode_session_event(event.clone()).unwrap_err().path(), Some("payload"));
    event.ignorable = true;
    assert_eq!(
        decode_session_event(event).unwrap().payload,
        EventPayload::Ignorable { event_type: "turn/start".into() }
    );
}

#[test]
fn type_must_match_payload_even_when_ignorable() {
    let mut event = encode_session_event(&envelope(1, EventPayload::TurnStart { turn: 1 }));
    event.r#type = "turn/end".into();
    event.ignorable = true;
    let e = decode_session_event(event).unwrap_err();
    assert_eq!(e.path(), Some("type"));
    assert!(e.to_string().contains("\"turn/start\""), "{e}");
}

#[test]
fn session_configured_needs_an_agent_and_a_named_inject_mode() {
    let payload = EventPayload::SessionConfigured {
        agent: "a".into(),
        inject_mode: InjectMode::OutOfTurn,
        parent: None,
        version: None,
    };
    let mut event = encode_session_event(&envelope(1, payload));
    assert_eq!(event.r#type, "session/configured");
    if let Some(pb::session_event::Payload::SessionConfigured(c)) = &mut event.payload {
        c.inject_mode = 0;
    }
    let e = decode_session_event(event.clone()).unwrap_err();
    assert_eq!(e.path(), Some("session_configured.inject_mode"));
    assert!(e.to_string().contains("INJECT_MODE_PENDING"), "{e}");
    if let Some(pb::session_event::Payload::SessionConfigured(c)) = &mut event.payload {
        c.inject_mode = 9;
    }
    assert_eq!(decode_session_event(event.clone()).unwrap_err().path(), Some("session_configured.inject_mode"));
    if let Some(pb::session_event::Payload::SessionConfigured(c)) = &mut event.payload {
        c.inject_mode = 1;
        c.agent = String::new();
    }
    assert_eq!(decode_session_event(event).unwrap_err().path(), Some("session_configured.agent"));
    // A request may leave the mode unspecified: it means pending there.
    assert_eq!(inject_mode_at(0, "inject_mode", Some(InjectMode::Pending)).unwrap(), InjectMode::Pending);
}

#[test]
fn nested_payload_errors_name_the_path() {
    let splice = Splice {
        target: Target::NextTurn,
        start: 0,
        removed_count: 0,
        inserted: vec![message("a", MessageSource::User), message("b", MessageSource::User)],
        outcome: SpliceOutcome::None,
        wake: false,
        requested_target: None,
        deadline: None,
    };
    let mut event = encode_session_event(&envelope(1, EventPayload::InboxSpliced(splice)));
    if let Some(pb::session_event::Payload::InboxSpliced(s)) = &mut event.payload {
        s.inserted[1].id = String::new();
    }
    assert_eq!(decode_session_event(event.clone()).unwrap_err().path(), Some("inbox_spliced.inserted[1].id"));
    if let Some(pb::session_event::Payload::InboxSpliced(s)) = &mut event.payload {
        s.inserted[1].id = "b".into();
        s.target = 0;
    }
    assert_eq!(decode_session_event(event.clone()).unwrap_err().path(), Some("inbox_spliced.target"));
    if let Some(pb::session_event::Payload::InboxSpliced(s)) = &mut event.payload {
        s.target = 1;
        s.outcome = 7;
    }
    assert_eq!(decode_session_event(event.clone()).unwrap_err().path(), Some("inbox_spliced.outcome"));
    if let Some(pb::session_event::Payload::InboxSpliced(s)) = &mut event.payload {
        s.outcome = 0;
        s.requested_target = 7;
    }
    assert_eq!(decode_session_event(event).unwrap_err().path(), Some("inbox_spliced.requested_target"));

    let mut end = encode_session_event(&envelope(
        1,
        EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Blocked { reason: None } },
    ));
    if let Some(pb::session_event::Payload::TurnEnd(t)) = &mut end.payload {
        t.reason = None;
    }
    assert_eq!(decode_session_event(end).unwrap_err().path(), Some("turn_end.reason"));

    let m = message("m", MessageSource::User);
    let mut um = encode_session_event(&envelope(1, EventPayload::UserMessage { message: m, turn: 1, step: 1 }));
    if let Some(pb::session_event::Payload::UserMessage(u)) = &mut um.payload {
        u.message = None;
    }
    assert_eq!(decode_session_event(um).unwrap_err().path(), Some("user_message.message"));

    let mut status = encode_session_event(&envelope(1, EventPayload::Status(Status::Idle)));
    status.payload = Some(pb::session_event::Payload::Status(pb::StatusChanged { status: 0 }));
    assert_eq!(decode_session_event(status).unwrap_err().path(), Some("status.status"));
}

#[test]
fn live_type_mismatch_and_missing_payload_are_refused() {
    let event = LiveEvent {
        session: session(),
        after_seq: 3,
        payload: LivePayload::Claimed { message: message("a", MessageSource::User), turn: 1 },
    };
    let mut pb_event = encode_live_event(&event);
    pb_event.r#type = "agent/inbox/inserted".into();
    assert_eq!(decode_live_event(pb_event.clone()).unwrap_err().path(), Some("type"));
    pb_event.payload = None;
    assert_eq!(decode_live_event(pb_event).unwrap_err().path(), Some("payload"));
    let mut pb_event = encode_live_event(&event);
    if let Some(pb::live_event::Payload::Claimed(c)) = &mut pb_event.payload {
        c.message = None;
    }
    assert_eq!(decode_live_event(pb_event).unwrap_err().path(), Some("claimed.message"));
}

#[test]
fn garbage_bytes_are_malformed() {
    let garbage = [0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(matches!(decode_event(&garbage), Err(CodecError::Malformed { what: "SessionEvent", .. })));
    assert!(matches!(decode_live(&garbage), Err(CodecError::Malformed { what: "LiveEvent", .. })));
    // Valid protobuf of the wrong shape still fails validation rather than decoding to something.
    let bytes = pb::SessionRef { tenant: "a".into(), id: "b".into() }.encode_to_vec();
    assert!(decode_event(&bytes).is_err());
}

#[test]
fn a_goal_change_that_breaks_the_goal_rules_names_its_field() {
    let good = pb::GoalChange {
        goal_id: "g".into(),
        revision: 1,
        state: "active".into(),
        objective: "o".into(),
        max_rounds: 3,
        ..Default::default()
    };
    let cases = [
        (pb::GoalChange { goal_id: String::new(), ..good.clone() }, "goal_change.goal_id"),
        (pb::GoalChange { goal_id: "g".repeat(65), ..good.clone() }, "goal_change.goal_id"),
        (pb::GoalChange { revision: 0, ..good.clone() }, "goal_change.revision"),
        (pb::GoalChange { max_rounds: 0, ..good.clone() }, "goal_change.max_rounds"),
        (pb::GoalChange { state: "done".into(), ..good.clone() }, "goal_change.state"),
    ];
    for (change, path) in cases {
        let event = pb::SessionEvent {
            session: Some(encode_session_ref(&session())),
            seq: 1,
            time_unix_ms: 5,
            epoch: 1,
            r#type: "goal/change".into(),
            ignorable: false,
            format: EVENT_FORMAT,
            payload: Some(pb::session_event::Payload::GoalChange(change)),
        };
        let err = decode_event(&event.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains(path), "{path}: {err}");
    }
}

#[test]
fn every_event_format_decodes_and_encoding_writes_this_builds() {
    // SPEC §18: 0 (before formats were numbered) and this build's decode alike; a newer writer's event
    // (a rolling upgrade) decodes by the protobuf rules, its unknown fields skipped.
    let event =
        Envelope { session: session(), seq: 3, time_ms: 9, epoch: 2, payload: EventPayload::TurnStart { turn: 1 } };
    let mut pb_event = encode_session_event(&event);
    assert_eq!(pb_event.format, EVENT_FORMAT);
    for format in [0, EVENT_FORMAT, EVENT_FORMAT + 1] {
        pb_event.format = format;
        let mut bytes = pb_event.encode_to_vec();
        // A field this build does not know (a newer writer's), length-delimited field 99.
        prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut bytes);
        prost::encoding::encode_varint(3, &mut bytes);
        bytes.extend_from_slice(b"new");
        assert_eq!(decode_event(&bytes).unwrap(), event, "format {format}");
    }
}

#[test]
fn a_nested_error_names_its_whole_path() {
    // Nested decoders build their paths only when they fail (`CodecError::under`): the path must still be
    // the whole one, from the event's payload down to the field.
    let splice = |inserted: Vec<pb::UserMessage>, target: i32| pb::InboxSpliced {
        target,
        inserted,
        outcome: pb::SpliceOutcome::None as i32,
        ..Default::default()
    };
    let mut bad_block = pb_message();
    bad_block.content[1].block = None;
    let e = values::decode_splice(splice(vec![pb_message(), bad_block], pb::Target::NextTurn as i32)).unwrap_err();
    assert_eq!(e.path(), Some("inbox_spliced.inserted[1].content[1]"));
    let mut bad_id = pb_message();
    bad_id.id = String::new();
    let e = values::decode_splice(splice(vec![bad_id], pb::Target::NextTurn as i32)).unwrap_err();
    assert_eq!(e.path(), Some("inbox_spliced.inserted[0].id"));
    let mut no_source = pb_message();
    no_source.source = None;
    let e = values::decode_splice(splice(vec![no_source], pb::Target::NextTurn as i32)).unwrap_err();
    assert_eq!(e.path(), Some("inbox_spliced.inserted[0].source"));
    let e = values::decode_splice(splice(vec![], 99)).unwrap_err();
    assert_eq!(e.path(), Some("inbox_spliced.target"));
    assert_eq!(CodecError::invalid("", "x").under("a.b").path(), Some("a.b"), "an empty path is the parent itself");
    assert_eq!(CodecError::invalid("[2]", "x").under("a").path(), Some("a[2]"));
    assert_eq!(CodecError::invalid("c", "x").under("").path(), Some("c"));
}

#[test]
fn a_stored_event_is_sent_as_the_round_trip_would_send_it() {
    let round_trip = |e: pb::SessionEvent| encode_session_event(&decode_session_event(e).unwrap());
    for (i, payload) in payloads().into_iter().enumerate() {
        let stored = encode_session_event(&envelope(i as u64 + 1, payload));
        assert_eq!(stored_as_sent(stored.clone()).unwrap(), round_trip(stored.clone()), "{:?}", stored.r#type);
        // Format 0 (written before formats were numbered) takes the round trip and goes out as format 1.
        let old = pb::SessionEvent { format: 0, ..stored.clone() };
        assert_eq!(stored_as_sent(old).unwrap(), stored);
    }
    // An ignorable event of a type this build does not know goes out as the decoder makes it (no payload).
    let unknown = pb::SessionEvent {
        r#type: "agent/from-the-future".into(),
        ignorable: true,
        ..encode_session_event(&envelope(7, EventPayload::Status(Status::Idle)))
    };
    let sent = stored_as_sent(unknown.clone()).unwrap();
    assert_eq!(sent, round_trip(unknown));
    assert!(sent.payload.is_none() && sent.ignorable);
    // A type that names another payload is refused on either path.
    let mismatched = pb::SessionEvent {
        r#type: "agent/turn/start".into(),
        ..encode_session_event(&envelope(8, EventPayload::Status(Status::Idle)))
    };
    assert_eq!(stored_as_sent(mismatched).unwrap_err().path(), Some("type"));
}

/// SPEC §20: a `tool/call` carries its idempotency key, `tenant/session/turn/step/call_id`; one stored
/// before keys existed is sent with it; a repair action the reader does not know is refused by name.
#[test]
fn a_tool_call_carries_its_idempotency_key_and_old_ones_get_it_when_sent() {
    let call = ToolCallSpec { call_id: "call-4-1-1".into(), name: "echo".into(), arguments: "hi".into() };
    let payload = EventPayload::ToolCall { turn: 4, step: 1, call, awaiting_approval: false, awaiting_client: false };
    let stored = encode_session_event(&envelope(9, payload));
    let key = |e: &pb::SessionEvent| match &e.payload {
        Some(pb::session_event::Payload::ToolCall(c)) => c.idempotency_key.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(key(&stored), format!("{}/4/1/call-4-1-1", session()));
    let mut old = stored.clone();
    if let Some(pb::session_event::Payload::ToolCall(c)) = &mut old.payload {
        c.idempotency_key.clear();
    }
    assert_eq!(key(&stored_as_sent(old).unwrap()), key(&stored));

    let repaired = EventPayload::ToolRepaired { turn: 4, step: 1, call_id: "c1".into(), action: RepairAction::Retried };
    let mut unknown = encode_session_event(&envelope(10, repaired));
    if let Some(pb::session_event::Payload::ToolRepaired(r)) = &mut unknown.payload {
        r.action = 0;
    }
    assert_eq!(decode_session_event(unknown).unwrap_err().path(), Some("tool_repaired.action"));
}
