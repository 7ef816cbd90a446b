//! Reads from the latest snapshot plus the tail (decision 0020), on `turnstile dev --nats` with a snapshot
//! every 5 events: a session with turns, out-of-turn injects, a cancel of a running turn and pending
//! messages, whose last snapshot is behind its log. `GetInbox`, `GetSession` and a Watch resumed at every
//! seq give exactly what the full fold gives: the harness's own fold of the log read straight from
//! JetStream, and the server's answers once the snapshots are deleted (so it folds the whole log).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream;
use turnstile_journal::jetstream::SNAPSHOT_BUCKET;
use turnstile_journal::{JetStreamConfig, JetStreamLog};
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{CaughtUp, InboxSnapshot, InjectMode, SessionEvent, SessionInfo, WatchRequest};
use turnstile_tests::fold::Projection;
use turnstile_tests::{DevOptions, DevServer, NatsServer, Session, user_msg};

async fn start() -> (DevServer, tempfile::TempDir) {
    let nats = NatsServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, "[journal]\nsnapshot_every = 5\n").unwrap();
    let mut opts = DevOptions::nats(nats.url());
    opts.extra_args = vec!["--config".into(), config.display().to_string()];
    let mut server = DevServer::start_with(opts).await.unwrap();
    server.own_nats(nats);
    (server, dir)
}

/// Watch(after_seq, live = false) up to and including `caught_up`.
async fn resume(s: &Session, after_seq: u64) -> (Vec<SessionEvent>, CaughtUp) {
    let req = WatchRequest { session: Some(s.reference()), after_seq, live: false, resume: None };
    let mut stream = s.client().watch(req).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        match item.item {
            Some(Item::Event(e)) => events.push(e),
            Some(Item::CaughtUp(c)) => return (events, c),
            _ => {}
        }
    }
    panic!("the watch after {after_seq} ended before caught_up");
}

/// The seq of the stored snapshot under `key`, if any.
async fn snapshot_seq(kv: &jetstream::kv::Store, key: &str) -> Option<u64> {
    let bytes = kv.get(key).await.unwrap()?;
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    json["state"]["last_seq"].as_u64()
}

/// What every read of the session answers, compared field by field between the two phases.
#[derive(Debug, PartialEq)]
struct Reads {
    inbox: InboxSnapshot,
    info: SessionInfo,
    /// For each after_seq in 0..=last: the events and the caught-up marker.
    resumes: Vec<(Vec<SessionEvent>, CaughtUp)>,
}

async fn read_everything(s: &Session, last: u64) -> Reads {
    let mut resumes = Vec::new();
    for after in 0..=last {
        resumes.push(resume(s, after).await);
    }
    Reads { inbox: s.inbox().await.unwrap(), info: s.info().await.unwrap(), resumes }
}

#[tokio::test]
async fn reads_from_the_snapshot_equal_the_full_fold() {
    let (server, _dir) = start().await;
    let s = server.session();
    s.configure("scripted", InjectMode::OutOfTurn).await.unwrap();
    s.followup(user_msg("A", "first")).await.unwrap();
    s.when_idle().await.unwrap();
    // Out-of-turn injects: one user/message each, between turns.
    for i in 0..3 {
        s.inject(user_msg(&format!("i{i}"), &format!("note {i}"))).await.unwrap();
    }
    s.queue(user_msg("q1", "later one")).await.unwrap();
    // A running turn, an inject into it, then a cancel that keeps the inbox.
    s.followup(user_msg("B", "[[delay:3000]] slow")).await.unwrap();
    s.inject(user_msg("r1", "while running")).await.unwrap();
    s.cancel(true).await.unwrap();
    s.when_idle().await.unwrap();
    s.queue(user_msg("q2", "later two")).await.unwrap();
    s.inject(user_msg("i9", "after the cancel")).await.unwrap();

    let nats = async_nats::connect(server.nats().unwrap().url()).await.unwrap();
    let kv = jetstream::new(nats).get_key_value(SNAPSHOT_BUCKET).await.unwrap();
    let r = s.reference();
    let (full_key, read_key) = (format!("{}.{}", r.tenant, r.id), format!("{}.{}.read", r.tenant, r.id));
    let mut last = s.info().await.unwrap().last_seq;
    // The owner writes a snapshot every 5 events (in the background): wait for the one at or just below the
    // end, then make sure events follow it.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut snap = snapshot_seq(&kv, &read_key).await.unwrap_or(0);
    while snap + 5 <= last && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        snap = snapshot_seq(&kv, &read_key).await.unwrap_or(0);
    }
    if snap == last {
        last = s.queue(user_msg("q3", "after the snapshot")).await.unwrap().seq;
    }
    assert!(snap > 10 && snap < last, "a read snapshot at {snap}, behind the log's end {last}");
    assert!(snapshot_seq(&kv, &full_key).await.is_some(), "the owner's full snapshot is kept too");

    // The log as stored, read straight from JetStream, and the harness's own fold of it.
    let journal = JetStreamLog::connect(JetStreamConfig::new(server.nats().unwrap().url())).await.unwrap();
    let session = turnstile_model::SessionRef::new(r.tenant.clone(), r.id.clone()).unwrap();
    let stored: Vec<SessionEvent> = turnstile_journal::log::read_all(&journal, &session, 1)
        .await
        .unwrap()
        .iter()
        .map(turnstile_proto::codec::encode_session_event)
        .collect();
    assert_eq!(stored.len() as u64, last);
    let fold = Projection::fold(&stored).unwrap();
    assert!(!fold.next_turn.is_empty(), "the case leaves messages pending");

    let from_snapshot = read_everything(&s, last).await;
    assert_eq!(from_snapshot.inbox.seq, last);
    assert!(fold.matches(&from_snapshot.inbox), "GetInbox from the snapshot is the fold of the whole log");
    for (after, (events, caught_up)) in from_snapshot.resumes.iter().enumerate() {
        assert_eq!(events[..], stored[after..], "Watch after {after}");
        assert_eq!(caught_up.seq, last);
        assert_eq!(caught_up.inbox.as_ref(), Some(&from_snapshot.inbox), "caught_up after {after}");
    }
    assert_eq!(from_snapshot.info.last_seq, last);

    // Without snapshots the gateway folds the whole log: every read answers the same.
    kv.delete(&read_key).await.unwrap();
    kv.delete(&full_key).await.unwrap();
    assert_eq!(snapshot_seq(&kv, &read_key).await, None);
    let folded = read_everything(&s, last).await;
    assert_eq!(folded, from_snapshot);
}
