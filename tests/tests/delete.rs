//! `DeleteSession` (SPEC §12) end to end, on the embedded journal, on `--nats` and in a cluster (the
//! command crosses the gateway → worker hop): a running turn is canceled, the log, snapshots and dedup
//! state go, reads answer NOT_FOUND, the id starts over as a new session, and the call is tenant-scoped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::{Code, Request};
use turnstile_tests::v1::{DeleteSessionRequest, DeliverRequest, GetSessionRequest, SessionRef, SessionStatus};
use turnstile_tests::{Deployment, DevOptions, DevServer, user_msg};

/// A session with a finished turn and a running one (a long tool call) with a queued message behind it
/// is deleted; afterwards nothing of it is left and the same id and MessageIds start a new session.
async fn delete_running_session_then_reuse_the_id(deployment: Deployment) {
    let server = deployment.start().await.unwrap();
    let s = server.session();
    s.followup(user_msg("A", "first")).await.unwrap();
    s.when_idle().await.unwrap();
    let watch = s.watch().await.unwrap();
    assert_eq!(s.followup(user_msg("B", "[[tool:sleep 600000]]")).await.unwrap().turn, Some(2));
    s.queue(user_msg("Q", "queued")).await.unwrap();
    watch.wait_line("D tool/call 2.1 *").await.unwrap();
    assert_eq!(s.info().await.unwrap().status, SessionStatus::Running as i32);

    let reply = s.delete().await.unwrap();
    assert!(reply.seq > 0, "the reply carries the deleted log's last seq");

    for err in [s.info().await.unwrap_err(), s.inbox().await.unwrap_err(), s.delete().await.unwrap_err()] {
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
        assert!(err.message().contains("does not exist"), "{}", err.message());
    }
    let (events, caught_up) = s.replay(0).await.unwrap();
    assert!(events.is_empty() && caught_up == 0, "a watch of the deleted session finds no history");

    // Same id, same MessageIds: a new session from seq 1 (no dedup memory of the old A).
    let again = s.followup(user_msg("A", "second life")).await.unwrap();
    assert_eq!((again.seq, again.turn), (1, Some(1)));
    let info = s.when_idle().await.unwrap();
    assert_eq!(info.last_turn, 1);
    let (events, _) = s.replay(0).await.unwrap();
    assert_eq!(events.first().map(|e| e.seq), Some(1));
    assert!(events.iter().all(|e| e.seq <= info.last_seq));
    assert!(
        format!("{events:?}").contains("second life") && !format!("{events:?}").contains("\"first\""),
        "only the new session's events"
    );
}

turnstile_tests::scenario_tests!(delete_running_session_then_reuse_the_id);

const TOKEN_A: &str = "token-of-tenant-a-0123456789";
const TOKEN_B: &str = "token-of-tenant-b-9876543210";

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test]
async fn delete_is_tenant_scoped() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let args = vec!["--auth-tokens".to_owned(), tokens.display().to_string()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let mut client = server.client();
    let b_session = Some(SessionRef { tenant: "tenant-b".into(), id: "b-secret".into() });
    let req = DeliverRequest {
        session: b_session.clone(),
        message: Some(user_msg("m1", "hello from b")),
        output_schema: None,
    };
    client.queue(authed(req, TOKEN_B)).await.unwrap();

    // A names B's session: NOT_FOUND with the words of a session that does not exist, and nothing goes.
    let err = client.delete_session(authed(DeleteSessionRequest { session: b_session.clone() }, TOKEN_A)).await;
    let err = err.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "session tenant-b/b-secret does not exist: it has no accepted writes yet");
    let info = client.get_session(authed(GetSessionRequest { session: b_session.clone() }, TOKEN_B)).await;
    assert_eq!(info.unwrap().into_inner().last_seq, 1, "B's session is untouched");

    // B deletes its own.
    let reply = client.delete_session(authed(DeleteSessionRequest { session: b_session.clone() }, TOKEN_B)).await;
    assert_eq!(reply.unwrap().into_inner().seq, 1);
    let gone = client.get_session(authed(GetSessionRequest { session: b_session }, TOKEN_B)).await;
    assert_eq!(gone.unwrap_err().code(), Code::NotFound);
}
