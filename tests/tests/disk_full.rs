//! JetStream out of space (issue 14): `turnstile dev --nats` on a nats-server with a tiny
//! `max_file_store`. Followups of large messages are accepted until the store is full; then a write
//! answers UNAVAILABLE saying the journal is out of space, every acknowledged message is still in its
//! session's log, and once `DeleteSession` frees room the refused followup, retried with the same
//! MessageId, is accepted and every session goes idle by itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_tests::v1::SessionStatus;
use turnstile_tests::v1::session_event::Payload;
use turnstile_tests::{DevOptions, DevServer, NatsServer, Session, user_msg};

/// Each followup stores its text about three times (the insert splice, the user/message and the echo).
const TEXT_BYTES: usize = 96 * 1024;

/// The session's log, read again while the server answers UNAVAILABLE: a full nats-server may refuse a
/// new reader for a moment (seen once in three runs: "maximum consumers limit reached", code 10026, while
/// the ordered consumers of earlier reads were still being cleaned up). UNAVAILABLE says "retry"; any other
/// error, or 60 s of refusals, fails the test.
async fn replay_while_unavailable(session: &Session) -> Vec<turnstile_tests::v1::SessionEvent> {
    match session.replay_while_unavailable(0, std::time::Duration::from_secs(60)).await {
        Ok((events, _)) => events,
        Err(e) => panic!("reading {:?}: {e}", session.reference()),
    }
}

/// `WhenIdle`, asked again while the server answers UNAVAILABLE (the same reader refusal as above, seen on
/// a session whose turn hit the limit midway), for at most 60 s.
async fn when_idle_while_unavailable(session: &Session) -> turnstile_tests::v1::SessionInfo {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match session.when_idle().await {
            Ok(info) => return info,
            Err(s) if s.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("waiting for {:?} to go idle: {e}", session.reference()),
        }
    }
}

/// Fills the journal: one session per followup of `text`, each waited on, until a write is refused. The
/// accepted sessions with their message ids, and the refused one with its status.
async fn fill(server: &DevServer, text: &str) -> (Vec<(Session, String)>, Option<(Session, String, tonic::Status)>) {
    let mut accepted = Vec::new();
    for i in 0..64 {
        let session = server.session();
        let id = format!("m-{i}");
        match session.followup(user_msg(&id, text)).await {
            Ok(_) => {
                // The turn's own appends may hit the limit; then the session stays running until room
                // (a turn that has room ends in milliseconds: waiting longer only slows the test).
                let _ = session.when_idle_within(std::time::Duration::from_secs(3)).await;
                accepted.push((session, id));
            }
            Err(status) => return (accepted, Some((session, id, status))),
        }
    }
    (accepted, None)
}

/// Room comes back by deleting the sessions that finished; the refused followup (`stuck`), retried, is
/// accepted; every session left, including any whose turn hit the limit midway, finishes by itself. The
/// sessions left, each idle.
async fn recover(accepted: Vec<(Session, String)>, stuck: Session, stuck_id: &str, text: &str) -> Vec<Session> {
    let mut kept = Vec::new();
    for (session, _) in accepted {
        if session.info().await.unwrap().status == SessionStatus::Idle as i32 {
            session.delete().await.unwrap();
        } else {
            kept.push(session);
        }
    }
    let reply = stuck.followup(user_msg(stuck_id, text)).await.unwrap();
    assert_eq!(reply.turn, Some(1));
    kept.push(stuck);
    for session in &kept {
        let info = when_idle_while_unavailable(session).await;
        assert_eq!(info.status, SessionStatus::Idle as i32);
    }
    kept
}

#[tokio::test]
async fn a_full_journal_refuses_writes_keeps_what_it_acknowledged_and_resumes_after_deletes() {
    let nats = NatsServer::start_with_config("jetstream { max_file_store: 2MB }\n").await.unwrap();
    let mut server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    server.own_nats(nats);
    let text = "x".repeat(TEXT_BYTES);

    let (accepted, refused) = fill(&server, &text).await;
    let (stuck, stuck_id, status) = refused.expect("a 2 MB store filled up");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("the journal is out of space"), "{}", status.message());
    assert!(status.message().contains("retry with the same message id"), "{}", status.message());
    assert!(accepted.len() >= 2, "the store held a few followups first ({} did)", accepted.len());
    println!("accepted {} followups of {TEXT_BYTES} bytes before: {}", accepted.len(), status.message());

    // Nothing acknowledged is lost: every accepted MessageId is in its session's durable log.
    for (session, id) in &accepted {
        let events = replay_while_unavailable(session).await;
        let inserted = events.iter().any(|e| match &e.payload {
            Some(Payload::InboxSpliced(splice)) => splice.inserted.iter().any(|m| m.id == *id),
            _ => false,
        });
        assert!(inserted, "{id} is in the log of {:?}", session.reference());
    }

    recover(accepted, stuck, &stuck_id, &text).await;
}

/// The number of consumers on the server (`/jsz` `consumers`), `None` while it does not answer.
async fn consumers(nats: &NatsServer) -> Option<u64> {
    let body = nats.monitor_get("/jsz").await?;
    let at = body.find("\"consumers\":")?;
    body[at + "\"consumers\":".len()..].trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Issue 29 (decision 0078): the same on a real filesystem of 4 MiB (a tmpfs in the server's own mount
/// namespace) instead of a `max_file_store` limit. nats-server sizes its storage limit from that
/// filesystem (75% of its free space at start), so writes are refused by the same limit check (10023) as
/// with `max_file_store`. While the store is full, every read of every session (`GetSession`, a replay
/// through `Watch`, a live `Watch` opened and dropped) answers OK: readers are ordered consumers kept in
/// memory, which a full store does not refuse, and each is deleted when its reader ends, so reads in a loop
/// do not pile consumers up towards the server's limit (10026). After deletes free room, the refused
/// followup is accepted and every session goes idle, with no restart.
#[tokio::test]
async fn a_full_filesystem_keeps_reads_answering_and_recovers_without_restarts() {
    let nats = NatsServer::start_on_small_disk(4 * 1024 * 1024, "").await.unwrap();
    let mut server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    server.own_nats(nats);
    let nats = server.nats().expect("the server owns its nats-server");
    let text = "x".repeat(TEXT_BYTES);

    let (accepted, refused) = fill(&server, &text).await;
    let (stuck, stuck_id, status) = refused.expect("a 4 MiB filesystem filled up");
    println!("accepted {} followups, then {:?}: {}", accepted.len(), status.code(), status.message());
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("the journal is out of space"), "{}", status.message());

    // Reads while full, many times over: each answers, and consumers do not pile up.
    let before = consumers(nats).await;
    let mut most = 0;
    let mut errors = Vec::new();
    for round in 0..5 {
        for (session, id) in &accepted {
            match session.info().await {
                Ok(info) => assert!(info.last_seq > 0, "{id}: {info:?}"),
                Err(s) => errors.push(format!("round {round} GetSession {id}: {:?} {}", s.code(), s.message())),
            }
            match session.replay(0).await {
                Ok((events, _)) => assert!(format!("{events:?}").contains(&format!("id: \"{id}\"")), "{id}"),
                Err(e) => errors.push(format!("round {round} replay {id}: {e}")),
            }
            match session.watch().await {
                Ok(watch) => drop(watch),
                Err(e) => errors.push(format!("round {round} watch {id}: {e}")),
            }
            most = most.max(consumers(nats).await.unwrap_or(0));
        }
    }
    println!("reads while full: {} errors; consumers before {before:?}, at most {most}", errors.len());
    assert_eq!(errors, Vec::<String>::new());

    for session in recover(accepted, stuck, &stuck_id, &text).await {
        let events = replay_while_unavailable(&session).await;
        assert!(!events.is_empty());
    }
}
