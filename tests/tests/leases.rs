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
use turnstile_tests::nats::{NatsCluster, NatsServer};
use turnstile_worker::WorkerConfig;
use turnstile_worker::cluster::leases::STORE_GRACE;
use turnstile_worker::cluster::{LeaseConfig, WorkerHandle, WorkerOptions, start_worker};
use turnstile_worker::ownership::Ownership;

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
        presence_every: Duration::from_millis(50),
    }
}

async fn worker(nats: &NatsServer, id: &str) -> WorkerHandle {
    worker_at(&nats.url(), id).await
}

/// A worker whose every NATS connection goes to `url` (a proxy's, to stall its link).
async fn worker_at(url: &str, id: &str) -> WorkerHandle {
    let log = Arc::new(JetStreamLog::connect(JetStreamConfig::new(url)).await.unwrap());
    let bus = Arc::new(NatsBus::new(log.client().clone()));
    let options = WorkerOptions {
        id: id.into(),
        advertise_addr: format!("127.0.0.1:1{id}"),
        leases: lease_config(),
        worker: WorkerConfig::default(),
        budgets: None,
    };
    let agents = turnstile_agent::AgentSetup::default().into();
    start_worker(options, agents, &log.client().clone(), 1, log.clone(), bus, Arc::new(NoSnapshots)).await.unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the lease of `shard` has been written `rounds` more times by its holder: each lease round
/// renews every lease its worker holds before it rebalances, so `rounds` renewals prove that at least
/// `rounds - 1` whole rounds (every decision to take or hand back a shard included) ran since the call.
async fn lease_rounds(kv: &ClusterKv, shard: u32, rounds: u64) {
    // A revision is the bucket's sequence number, not a count: count the changes.
    let revision = |entry: Option<turnstile_cluster::kv::LeaseEntry>| entry.map_or(0, |e| e.revision);
    let mut last = revision(kv.lease(shard).await.unwrap());
    let mut renewals = 0;
    let start = Instant::now();
    while renewals < rounds {
        assert!(start.elapsed() < WAIT, "timed out waiting for {rounds} renewals of shard {shard}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = revision(kv.lease(shard).await.unwrap());
        if now != last {
            (last, renewals) = (now, renewals + 1);
        }
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

/// Workers that start together race for the same free shards. At R3 the stream leader refuses the losers
/// of such a race with code 10164 ("wrong last sequence" without the number) rather than 10071: they must
/// still see `Lost` (logged at debug: an expected race), never a store error (a WARN "cannot acquire
/// lease" and an acquisition round given up, 5–12 of them at every start of a production cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_racing_for_a_lease_at_r3_lose_as_lost_never_as_a_store_error() {
    let cluster = NatsCluster::start(3).await.unwrap();
    let mut kvs = Vec::new();
    for i in 0..3 {
        let client = async_nats::connect(cluster.node(i).url()).await.unwrap();
        kvs.push(ClusterKv::open(&client, 3, SHARDS, Duration::from_secs(1)).await.unwrap());
    }
    let lease = |i: usize, epoch: u64| turnstile_cluster::kv::ShardLease {
        owner: format!("w{i}"),
        addr: "127.0.0.1:9".into(),
        epoch,
        expires_at_ms: now_ms() + 60_000,
    };
    let mut refusals = Vec::new();
    for shard in 0..SHARDS {
        // Three creates of the free shard at once, then three updates on the winner's revision at once.
        let mut revision = None;
        for epoch in [1, 2] {
            let leases: Vec<_> = (0..kvs.len()).map(|i| lease(i, epoch)).collect();
            let outcomes =
                futures::future::join_all(kvs.iter().zip(&leases).map(|(kv, l)| kv.put_lease(shard, l, revision)))
                    .await;
            let mut won = Vec::new();
            for outcome in outcomes {
                match outcome {
                    Ok(rev) => won.push(rev),
                    Err(turnstile_cluster::kv::CasError::Lost { shard: s }) => refusals.push(s),
                    Err(e) => panic!("shard {shard}, epoch {epoch}: a lost race reported as {e}"),
                }
            }
            assert_eq!(won.len(), 1, "exactly one writer wins shard {shard} at epoch {epoch}");
            revision = Some(won[0]);
        }
    }
    assert_eq!(refusals.len(), 2 * 2 * SHARDS as usize);
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

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A worker with a lease valid for a minute and no NATS connection. Its heartbeat is kept fresh for the
/// whole test (a crashed worker's lasts `worker_ttl`), so peers surely see it; dropping the handle ends it.
async fn ghost(kv: &ClusterKv, id: &str, presence: bool, shard: u32, epoch: u64) -> tokio::task::JoinHandle<()> {
    let beats = heartbeats(kv, id, presence).await;
    let lease = turnstile_cluster::kv::ShardLease {
        owner: id.into(),
        addr: "127.0.0.1:9".into(),
        epoch,
        expires_at_ms: now_ms() + 60_000,
    };
    kv.put_lease(shard, &lease, None).await.unwrap();
    beats
}

/// A live peer's heartbeat, kept fresh until the handle is aborted: a live worker as its peers see it.
async fn heartbeats(kv: &ClusterKv, id: &str, presence: bool) -> tokio::task::JoinHandle<()> {
    let info = turnstile_cluster::kv::WorkerInfo {
        id: id.into(),
        addr: "127.0.0.1:9".into(),
        capacity: 1,
        heartbeat_ms: now_ms(),
        presence,
    };
    kv.heartbeat(&info).await.unwrap();
    tokio::spawn({
        let kv = kv.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ =
                    kv.heartbeat(&turnstile_cluster::kv::WorkerInfo { heartbeat_ms: now_ms(), ..info.clone() }).await;
            }
        }
    })
}

/// docs/decisions/0019: a peer that advertises presence and has no subscriber on its presence subject is
/// dead, so its unexpired lease is taken at once with the next epoch. (The wait is bounded by `WAIT`, a
/// third of the lease's minute.)
#[tokio::test]
async fn a_lease_of_a_worker_whose_connection_is_gone_is_taken_before_it_expires() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = ClusterKv::open(&client, 1, SHARDS, Duration::from_secs(1)).await.unwrap();
    let beats = ghost(&kv, "gone", true, 0, 7).await;
    let w = worker(&nats, "3").await;
    let leases = w.leases();
    until("the dead worker's shard is taken", || leases.held_shards().contains(&0)).await;
    assert_eq!(leases.accepting(&session_in(0)), Ok(8), "takeover takes the next epoch");
    assert_eq!(leases.dead_peers(), vec!["gone".to_owned()]);
    beats.abort();
    w.shutdown(Duration::from_secs(2)).await;
}

/// A peer of a build without presence is never taken for dead: its lease is left alone while it lasts,
/// and the shard's other peers share the rest.
#[tokio::test]
async fn a_worker_without_presence_keeps_its_lease_until_it_expires() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = ClusterKv::open(&client, 1, SHARDS, Duration::from_secs(1)).await.unwrap();
    let beats = ghost(&kv, "old-build", false, 0, 7).await;
    let w = worker(&nats, "3").await;
    let leases = w.leases();
    until("the free shards are taken", || leases.held_shards().len() >= (SHARDS as usize) / 2).await;
    // Several of the worker's lease rounds pass, each of which would have taken shard 0 if it could.
    let held = leases.held_shards()[0];
    lease_rounds(&kv, held, 6).await;
    assert!(!leases.held_shards().contains(&0), "{:?}", leases.held_shards());
    assert!(leases.dead_peers().is_empty());
    assert_eq!(kv.lease(0).await.unwrap().unwrap().lease.owner, "old-build");
    beats.abort();
    w.shutdown(Duration::from_secs(2)).await;
}

/// The other side of an early takeover: a live worker whose shard was taken under a newer epoch (as when
/// a peer took its brief disconnect for a death) stops writing that shard at once, by the map, drops it at
/// its next renewal, and does not take it back while the taker holds it.
#[tokio::test]
async fn a_worker_whose_shard_is_taken_under_a_newer_epoch_stops_writing_and_lets_go() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = ClusterKv::open(&client, 1, SHARDS, Duration::from_secs(1)).await.unwrap();
    let a = worker(&nats, "1").await;
    let la = a.leases();
    until("A holds every shard", || la.held_shards().len() == SHARDS as usize).await;
    let s = session_in(3);
    let epoch = la.accepting(&s).unwrap();
    assert!(la.may_write(&s, epoch));

    // A taker (a worker that answers presence probes, so A has no reason to take it back) writes the next
    // epoch by compare-and-set, long before A's lease would run out.
    let taker = tokio::spawn({
        let client = client.clone();
        async move {
            let mut presence = client.subscribe(turnstile_worker::cluster::presence::subject("taker")).await.unwrap();
            while let Some(m) = futures::StreamExt::next(&mut presence).await {
                if let Some(reply) = m.reply {
                    client.publish(reply, bytes::Bytes::new()).await.unwrap();
                }
            }
        }
    });
    let taker_info = turnstile_cluster::kv::WorkerInfo {
        id: "taker".into(),
        addr: "127.0.0.1:9".into(),
        capacity: 1,
        heartbeat_ms: now_ms(),
        presence: true,
    };
    kv.heartbeat(&taker_info).await.unwrap();
    let current = kv.lease(3).await.unwrap().unwrap();
    let taken = turnstile_cluster::kv::ShardLease {
        owner: "taker".into(),
        addr: "127.0.0.1:9".into(),
        epoch: current.lease.epoch + 1,
        expires_at_ms: now_ms() + 60_000,
    };
    kv.put_lease(3, &taken, Some(current.revision)).await.unwrap();

    until("A stops writing shard 3", || !la.may_write(&s, epoch)).await;
    until("A drops shard 3", || !la.held_shards().contains(&3)).await;
    assert_eq!(la.accepting(&s), Err(Some("127.0.0.1:9".into())), "A points at the taker");
    // Several of A's rounds pass; it must not have fought for the shard back.
    kv.heartbeat(&turnstile_cluster::kv::WorkerInfo { heartbeat_ms: now_ms(), ..taker_info.clone() }).await.unwrap();
    let held = la.held_shards()[0];
    lease_rounds(&kv, held, 4).await;
    assert!(!la.held_shards().contains(&3));
    assert_eq!(kv.lease(3).await.unwrap().unwrap().lease.owner, "taker");
    taker.abort();
    a.shutdown(Duration::from_secs(2)).await;
}

/// Decision 0174, the rolling upgrade's stalled shards: a worker whose leases lapsed while the lease store
/// did not answer it, and whose shards a live peer took meanwhile, holds nothing when the store answers
/// again. It must still take the peer's leases once they expire: the peer lost them in the same outage and
/// is at its share with the rest (as in the run where two of three workers owned nothing for 4 minutes
/// and 21 of 32 shards had no owner). Before the fix, such a worker asked the store nothing (no lease to
/// renew, no candidate it may take while the store is "failing"), so it never saw the outage end.
#[tokio::test]
async fn a_worker_left_with_no_lease_by_a_store_outage_takes_a_live_peers_expired_leases_after_it() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = ClusterKv::open(&client, 1, SHARDS, Duration::from_secs(1)).await.unwrap();
    let proxy = turnstile_tests::proxy::CutProxy::start(nats.client_addr()).await.unwrap();
    let w = worker_at(&proxy.nats_url(), "1").await;
    let leases = w.leases();
    until("the worker holds every shard", || leases.held_shards().len() == SHARDS as usize).await;

    // The worker's link stops carrying anything: to it, the lease store stopped answering.
    proxy.hold();
    // A live peer (a fresh heartbeat; no presence, so never taken for dead) takes every shard meanwhile,
    // under the next epoch, and then loses the leases itself: they run out and are not renewed.
    let peer = heartbeats(&kv, "2", false).await;
    let mut taken = Vec::new();
    for shard in 0..SHARDS {
        // A renewal the worker sent just before the hold may still land: read again and retry then.
        loop {
            let current = kv.lease(shard).await.unwrap().unwrap();
            let epoch = current.lease.epoch + 1;
            let lease = turnstile_cluster::kv::ShardLease {
                owner: "2".into(),
                addr: "127.0.0.1:9".into(),
                epoch,
                expires_at_ms: now_ms() + 300,
            };
            match kv.put_lease(shard, &lease, Some(current.revision)).await {
                Ok(_) => {
                    taken.push(epoch);
                    break;
                }
                Err(turnstile_cluster::CasError::Lost { .. }) => continue,
                Err(e) => panic!("taking shard {shard}: {e}"),
            }
        }
    }
    // Unanswered, the worker's leases lapse (their TTL and the store grace, decision 0094).
    let lapse = Instant::now();
    while !leases.held_shards().is_empty() {
        assert!(lapse.elapsed() < WAIT + STORE_GRACE, "the worker's leases never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.release();

    // Every expired lease names the live peer; the worker takes them all (the peer, which let its leases
    // run out, is out of the fair share) under a newer epoch.
    until("the worker takes the peer's expired leases", || leases.held_shards().len() == SHARDS as usize).await;
    for shard in 0..SHARDS {
        let now = kv.lease(shard).await.unwrap().unwrap().lease;
        assert_eq!(now.owner, "1", "shard {shard}");
        assert!(
            now.epoch > taken[shard as usize],
            "shard {shard}: epoch {} after the peer's {}",
            now.epoch,
            taken[shard as usize]
        );
    }
    peer.abort();
    w.shutdown(Duration::from_secs(2)).await;
}
