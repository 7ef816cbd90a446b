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
            inject_mode: InjectMode::OutOfTurn as i32
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

turnstile_tests::backend_tests!(
    unknown_agent_is_invalid_argument_listing_the_known_ones,
    configure_while_running_is_failed_precondition_naming_the_turn,
    configure_scripted_writes_session_configured,
);
