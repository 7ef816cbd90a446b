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
use turnstile_journal::{JetStreamConfig, JetStreamLog, JournalError};
use turnstile_model::SessionRef;
use turnstile_tests::nats::NatsServer;

use common::session;

async fn setup() -> (NatsServer, JetStreamLog, KvSnapshots) {
    let nats = NatsServer::start().await.expect("nats-server starts");
    let log = JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.expect("connect");
    let store = KvSnapshots::open(log.client(), 1).await.expect("bucket");
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
