//! Snapshots in the JetStream KV bucket `turnstile_snapshots`, loaded with the JetStream log: the same
//! cases as the embedded journal's (`journal/tests/snapshot_cases`), on a real nats-server.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../journal/tests/common/mod.rs"]
mod common;
#[path = "../../journal/tests/snapshot_cases/mod.rs"]
mod snapshot_cases;

use async_nats::jetstream;
use turnstile_journal::jetstream::{KvSnapshots, SNAPSHOT_BUCKET};
use turnstile_journal::snapshot::{Snapshot, SnapshotStore};
use turnstile_journal::{JetStreamConfig, JetStreamLog, JournalError, SessionLog};
use turnstile_model::SessionRef;
use turnstile_tests::nats::NatsServer;

use common::{batch, session};

async fn setup() -> (NatsServer, JetStreamLog, KvSnapshots) {
    let nats = NatsServer::start().await.expect("nats-server starts");
    let log = JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.expect("connect");
    let store = KvSnapshots::open(log.client(), 1).await.expect("bucket").with_positions(log.positions());
    (nats, log, store)
}

#[tokio::test]
async fn snapshot_plus_tail_equals_full_fold() {
    let (_nats, log, store) = setup().await;
    snapshot_cases::snapshot_plus_tail_equals_full_fold(&log, &store, session("t", "a")).await;
}

// Multi-threaded so the synchronous raw-put callback can block on the KV write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_snapshots_are_ignored() {
    let (_nats, log, store) = setup().await;
    let kv = jetstream::new(log.client().clone()).get_key_value(SNAPSHOT_BUCKET).await.expect("bucket exists");
    let put = |s: &SessionRef, b: Vec<u8>| {
        let (kv, key) = (kv.clone(), format!("{}.{}", s.tenant, s.id));
        // The case function is synchronous about writes; block on this one put.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move { kv.put(key, b.into()).await.expect("put") })
        });
    };
    snapshot_cases::unusable_snapshots_are_ignored(&log, &store, &put, session("t", "b"), session("t", "c")).await;
}

#[tokio::test]
async fn snapshot_ahead_of_the_log_is_ignored() {
    let (_nats, log, store) = setup().await;
    snapshot_cases::snapshot_ahead_of_the_log_is_ignored(&log, &store, session("t", "d")).await;
}

#[tokio::test]
async fn a_bucket_with_other_replicas_is_refused() {
    let (_nats, log, _store) = setup().await;
    let err = KvSnapshots::open(log.client(), 3).await.expect_err("replicas differ");
    assert!(matches!(&err, JournalError::Storage(m) if m.contains("1 replicas but 3")), "{err}");
}

#[tokio::test]
async fn reads_load_the_read_snapshot_plus_tail() {
    let (_nats, log, store) = setup().await;
    snapshot_cases::reads_load_the_read_snapshot_plus_tail(&log, &store, session("t", "e")).await;
}

/// A snapshot saved by the process that appended its last event records that event's stream sequence;
/// the tail is read from there. A position that is not the event's (a log reset and written again) is
/// detected: the read answers `None` instead of events of another history.
#[tokio::test]
async fn snapshots_record_the_stream_position_of_their_last_event() {
    let (_nats, log, store) = setup().await;
    let (s, noise) = (session("t", "p"), session("t", "q"));
    let events = batch(&s, 1, 30, "p");
    // Another session's events in between, so stream and event sequences differ.
    log.append(&noise, 0, &batch(&noise, 1, 7, "n"), None).await.unwrap();
    log.append(&s, 0, &events[..20], None).await.unwrap();
    let at_20 = turnstile_model::SessionState::fold(s.clone(), 10_000, &events[..20]).unwrap();
    store.save(&Snapshot::of(&at_20)).await.unwrap();
    log.append(&s, 20, &events[20..], None).await.unwrap();

    let position = store.load_for_reads(&s).await.unwrap().and_then(|snap| snap.position).expect("a recorded position");
    // One message per append (decision 0021): the noise at 1, events 1..=20 at 2, 21..=30 at 3.
    assert_eq!(position, 2, "the stream sequence of the message ending with event 20");
    assert_eq!(store.load(&s).await.unwrap().and_then(|snap| snap.position), Some(position));
    assert_eq!(log.read_after(&s, 20, Some(position)).await.unwrap(), Some(events[20..].to_vec()));
    assert_eq!(log.read_after(&s, 20, None).await.unwrap(), Some(events[20..].to_vec()), "found by search");
    assert_eq!(log.read_after(&s, 30, Some(position + 1)).await.unwrap(), Some(vec![]));
    // A position before the event's message only reads more: the events up to 20 are dropped.
    assert_eq!(log.read_after(&s, 20, Some(1)).await.unwrap(), Some(events[20..].to_vec()));
    // Positions that cannot be event 20's: the last message and past it.
    assert_eq!(log.read_after(&s, 20, Some(position + 1)).await.unwrap(), None);
    assert_eq!(log.read_after(&s, 20, Some(10_000)).await.unwrap(), None);
    assert_eq!(log.read_after(&s, 30, Some(position)).await.unwrap(), None);
    assert_eq!(log.read_after(&s, 31, None).await.unwrap(), None, "past the end");
    assert_eq!(log.read_after(&s, 0, None).await.unwrap(), Some(events.clone()));
}
