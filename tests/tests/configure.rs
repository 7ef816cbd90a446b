//! `ConfigureSession` end to end (SPEC §8): unknown agents and running sessions are refused and write
//! nothing; a configure writes one durable `session/configured` that `GetSession` and `Watch` show.
//! Every scenario runs on the embedded journal and on `--nats` (`backend_tests!`).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{InjectMode, SessionConfigured};
use turnstile_tests::{Backend, user_msg};

async fn unknown_agent_is_invalid_argument_listing_the_known_ones(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let err = s.configure("nope", InjectMode::Pending).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(err.message().contains("nope") && err.message().contains("scripted"), "{}", err.message());
    // Nothing was written: the session still does not exist.
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound);
}

async fn configure_while_running_is_failed_precondition_naming_the_turn(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let reply = s.followup(user_msg("A", "[[delay:3000]] one two three four five")).await.unwrap();
    assert_eq!(reply.turn, Some(1));
    let before = s.replay(0).await.unwrap().1;
    let err = s.configure("scripted", InjectMode::Pending).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("turn 1"), "{}", err.message());
    let (events, _) = s.replay(0).await.unwrap();
    assert!(events.iter().all(|e| e.r#type != "session/configured"), "nothing configured while running");
    assert!(events.len() as u64 >= before);
    s.cancel(false).await.unwrap();
    s.when_idle().await.unwrap();
}

async fn configure_scripted_writes_session_configured(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let info = s.configure("scripted", InjectMode::OutOfTurn).await.unwrap();
    assert_eq!((info.agent.as_str(), info.inject_mode, info.last_seq), ("scripted", InjectMode::OutOfTurn as i32, 1));
    let (events, last) = s.replay(0).await.unwrap();
    assert_eq!(last, 1);
    assert_eq!(events[0].r#type, "session/configured");
    assert_eq!(
        events[0].payload,
        Some(Payload::SessionConfigured(SessionConfigured {
            agent: "scripted".into(),
            inject_mode: InjectMode::OutOfTurn as i32,
            parent: None,
            // The file's agents are versions too (SPEC §20): the version configured is recorded.
            version: Some(1),
        }))
    );
    // The same configuration again writes nothing.
    assert_eq!(s.configure("scripted", InjectMode::OutOfTurn).await.unwrap().last_seq, 1);
    let info = s.info().await.unwrap();
    assert_eq!(info.agent, "scripted");
    assert_eq!(info.inject_mode, InjectMode::OutOfTurn as i32);
    // An unconfigured session reports the default agent.
    let other = server.session();
    other.followup(user_msg("A", "hi")).await.unwrap();
    other.when_idle().await.unwrap();
    let info = other.info().await.unwrap();
    assert_eq!((info.agent.as_str(), info.inject_mode), ("scripted", InjectMode::Pending as i32));
}

/// SPEC §11: with `out-of-turn` an idle inject is one `user/message {turn: 0, step: 0}` and nothing else;
/// a retry is deduplicated; a later followup runs as usual.
async fn an_out_of_turn_inject_to_an_idle_session_is_one_message_between_turns(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    s.configure("scripted", InjectMode::OutOfTurn).await.unwrap();
    let reply = s.inject(user_msg("I", "the build is green")).await.unwrap();
    assert_eq!((reply.seq, reply.turn), (2, None));
    assert_eq!(s.inject(user_msg("I", "the build is green")).await.unwrap().seq, 2, "a retry is deduplicated");
    let (events, last) = s.replay(0).await.unwrap();
    assert_eq!(last, 2, "nothing but the message: {events:?}");
    match &events[1].payload {
        Some(Payload::UserMessage(m)) => {
            assert_eq!((m.turn, m.step, m.message.as_ref().unwrap().id.as_str()), (0, 0, "I"));
        }
        other => panic!("expected user/message, got {other:?}"),
    }
    let info = s.info().await.unwrap();
    assert_eq!(info.status, turnstile_proto::v1::SessionStatus::Idle as i32);
    assert!(s.inbox().await.unwrap().next_step.is_empty(), "nothing pending");
    s.followup(user_msg("A", "go")).await.unwrap();
    let idle = s.when_idle().await.unwrap();
    assert_eq!(idle.last_turn, 1);
}

turnstile_tests::backend_tests!(
    unknown_agent_is_invalid_argument_listing_the_known_ones,
    configure_while_running_is_failed_precondition_naming_the_turn,
    configure_scripted_writes_session_configured,
    an_out_of_turn_inject_to_an_idle_session_is_one_message_between_turns,
);
