//! Shard leases on a real nats-server, with workers in this process (the multi-process cluster tests
//! are in `cluster.rs`): fair shares, disjoint ownership, higher epochs on takeover, and release on leave.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile_cluster::kv::ClusterKv;
use turnstile_journal::snapshot::NoSnapshots;
use turnstile_journal::{JetStreamConfig, JetStreamLog, NatsBus};
use turnstile_model::SessionRef;
use turnstile_tests::nats::NatsServer;
use turnstile_worker::WorkerConfig;
use turnstile_worker::cluster::{LeaseConfig, WorkerHandle, WorkerOptions, start_worker};
use turnstile_worker::host::Ownership;

const SHARDS: u32 = 8;
const WAIT: Duration = Duration::from_secs(20);

fn lease_config() -> LeaseConfig {
    LeaseConfig {
        shards: SHARDS,
        ttl: Duration::from_millis(900),
        renew_every: Duration::from_millis(150),
        worker_ttl: Duration::from_millis(1200),
        drain_timeout: Duration::from_secs(2),
        max_acquire_per_tick: 64,
    }
}

async fn worker(nats: &NatsServer, id: &str) -> WorkerHandle {
    let log = Arc::new(JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.unwrap());
    let bus = Arc::new(NatsBus::new(log.client().clone()));
    let options = WorkerOptions {
        id: id.into(),
        advertise_addr: format!("127.0.0.1:1{id}"),
        leases: lease_config(),
        worker: WorkerConfig::default(),
    };
    start_worker(options, &log.client().clone(), 1, log.clone(), bus, Arc::new(NoSnapshots)).await.unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session of each shard, found by search (the hash is fixed, so this is deterministic).
fn session_in(shard: u32) -> SessionRef {
    (0..)
        .map(|i| SessionRef::new("t", format!("s{i}")).unwrap())
        .find(|s| turnstile_journal::jetstream::subjects::shard_of(s, SHARDS) == shard)
        .unwrap()
}

#[tokio::test]
async fn two_workers_split_the_shards_and_a_leaver_hands_them_over_with_higher_epochs() {
    let nats = NatsServer::start().await.unwrap();
    let (a, b) = (worker(&nats, "1").await, worker(&nats, "2").await);
    let (la, lb) = (a.leases(), b.leases());
    until("a fair split", || la.held_shards().len() == 4 && lb.held_shards().len() == 4).await;
    let (sa, sb): (BTreeSet<u32>, BTreeSet<u32>) =
        (la.held_shards().into_iter().collect(), lb.held_shards().into_iter().collect());
    assert!(sa.is_disjoint(&sb), "{sa:?} / {sb:?}");

    // Ownership answers follow the leases: the owner accepts, the other points at it.
    let in_a = session_in(*sa.iter().next().unwrap());
    let epoch_before = la.accepting(&in_a).expect("A owns its shard");
    assert!(la.may_write(&in_a, epoch_before));
    until("B learns A's address", || lb.accepting(&in_a) == Err(Some("127.0.0.1:11".into()))).await;

    // A leaves cleanly: B takes every shard, each of A's with a higher epoch, without waiting for expiry.
    a.shutdown(Duration::from_secs(2)).await;
    until("B holds everything", || lb.held_shards().len() == SHARDS as usize).await;
    let epoch_after = lb.accepting(&in_a).expect("B owns A's old shard");
    assert!(epoch_after > epoch_before, "{epoch_after} > {epoch_before}");
    assert!(!la.may_write(&in_a, epoch_before), "the leaver no longer writes");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_lease_that_is_not_renewed_is_taken_over_after_its_ttl() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = ClusterKv::open(&client, 1, SHARDS, Duration::from_secs(1)).await.unwrap();
    // A "dead" worker holding shard 0 until shortly from now, at epoch 7.
    let expires = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64 + 700;
    let dead = turnstile_cluster::kv::ShardLease {
        owner: "dead".into(),
        addr: "127.0.0.1:9".into(),
        epoch: 7,
        expires_at_ms: expires,
    };
    kv.put_lease(0, &dead, None).await.unwrap();
    let w = worker(&nats, "3").await;
    let leases = w.leases();
    until("the dead worker's shard is taken", || leases.held_shards().contains(&0)).await;
    assert_eq!(leases.accepting(&session_in(0)), Ok(8), "takeover takes the next epoch");
    let stored = kv.lease(0).await.unwrap().unwrap().lease;
    assert_eq!((stored.owner.as_str(), stored.epoch), ("3", 8));
    w.shutdown(Duration::from_secs(2)).await;
}
