//! Chaos on a real cluster (issue #4): real `turnstile worker` / `turnstile gateway` processes, real
//! nats-servers, real signals.
//!
//! - SPEC §7 28: the owner is SIGSTOPped mid-step past its lease, another worker takes the session over,
//!   then the first one wakes: one chain of seqs, epochs never go back, the stale step never lands.
//! - SPEC §7 27: the owner dies between a claim and `step/start` (the log is crafted to end there, since
//!   no directive holds a pre-step): the new owner restores the claim and runs it in the next turn.
//! - Rolling restart: every worker SIGTERMed and restarted in turn under load; every accepted MessageId
//!   is admitted exactly once or still pending.
//! - A 3-node NATS cluster (R3 streams) loses its stream leader to kill -9 under load: no accepted
//!   message is lost.
//!
//! The tests run one at a time (a process-wide lock): each starts a whole cluster, and two at once on two
//! cores would make lease timing, not the code, the subject of the test. Shards are fewer (32) and leases
//! shorter (1 s) than the defaults, to keep lease traffic and failover waits small.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tonic::{Code, Status};
use turnstile_cluster::kv::{ClusterKv, ShardMap};
use turnstile_journal::jetstream::subjects::shard_of;
use turnstile_journal::{JetStreamConfig, JetStreamLog, SessionLog};
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{SendReply, SessionEvent, SessionStatus, UserMessage, WatchItem};
use turnstile_tests::watch::{check_stream, line_matches};
use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT, Session, assert_lines, lines_of, user_msg};

/// One cluster at a time in this test binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Virtual shards of these clusters (every worker and gateway must agree).
const SHARDS: u32 = 32;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| (*a).to_owned()).collect()
}

/// `workers` workers and `gateways` gateways with short leases (TTL 1 s, renewals every 250 ms, drains
/// bounded by 5 s) on 32 shards.
fn options(workers: usize, gateways: usize) -> ClusterOptions {
    let mut opts = ClusterOptions::new(workers, gateways);
    let shards = SHARDS.to_string();
    opts.worker_args =
        args(&["--shards", &shards, "--lease-ttl-ms", "1000", "--renew-ms", "250", "--drain-timeout-ms", "5000"]);
    opts.gateway_args = args(&["--shards", &shards, "--route-deadline-ms", "5000"]);
    opts
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn journal_ref(s: &Session) -> turnstile_model::SessionRef {
    let r = s.reference();
    turnstile_model::SessionRef::new(&r.tenant, &r.id).unwrap()
}

/// The journal as the cluster's processes see it, from the test (for the shard map and crafted logs).
async fn journal(cluster: &Cluster) -> JetStreamLog {
    let mut config = JetStreamConfig::new(cluster.nats_url());
    config.shards = SHARDS;
    config.replicas = cluster.nats_cluster().len().min(3);
    JetStreamLog::connect(config).await.unwrap()
}

/// The live shard map (a KV watch of `turnstile_shards`).
async fn shard_map(log: &JetStreamLog) -> (ClusterKv, watch::Receiver<ShardMap>) {
    let kv = ClusterKv::open(log.client(), 1, SHARDS, Duration::from_secs(3)).await.unwrap();
    let map = kv.watch_shards().await.unwrap();
    (kv, map)
}

/// How many shards `worker` holds now.
fn owned(map: &watch::Receiver<ShardMap>, worker: &str) -> usize {
    let (map, now) = (map.borrow(), now_ms());
    (0..SHARDS).filter(|s| map.owner(*s, now).is_some_and(|l| l.owner == worker)).count()
}

/// Waits (bounded) until every shard is held and each of `workers` holds at least `at_least` of them.
async fn wait_shares(cluster: &Cluster, map: &watch::Receiver<ShardMap>, workers: &[String], at_least: usize) {
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    loop {
        let held: Vec<usize> = workers.iter().map(|w| owned(map, w)).collect();
        let total: usize = {
            let (m, now) = (map.borrow(), now_ms());
            (0..SHARDS).filter(|s| m.owner(*s, now).is_some()).count()
        };
        if total == SHARDS as usize && held.iter().all(|h| *h >= at_least) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "shares not reached: {workers:?} hold {held:?} (want >= {at_least}), {total} of {SHARDS} held\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn items(events: Vec<SessionEvent>) -> Vec<WatchItem> {
    events.into_iter().map(|e| WatchItem { item: Some(Item::Event(e)) }).collect()
}

/// The durable log from a fresh replay (asked again only while UNAVAILABLE: a shard or stream leader
/// moving), checked (contiguous seqs, epochs and times never decreasing).
async fn checked_log(s: &Session) -> Vec<SessionEvent> {
    let (events, _) = s
        .replay_while_unavailable(0, DEFAULT_WAIT)
        .await
        .unwrap_or_else(|e| panic!("replay of {:?} failed: {e}", s.reference()));
    check_stream(&items(events.clone()), 0).unwrap_or_else(|e| panic!("{e}"));
    events
}

fn durable_lines(events: &[SessionEvent]) -> Vec<String> {
    lines_of(&items(events.to_vec()), false)
}

/// `WhenIdle`, retried while the session moves (UNAVAILABLE), bounded.
async fn when_idle(s: &Session) {
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT * 2;
    loop {
        match s.when_idle().await {
            Ok(info) if info.status == SessionStatus::Idle as i32 => return,
            Ok(_) => {}
            Err(status)
                if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
                    && tokio::time::Instant::now() < deadline => {}
            Err(status) => panic!("when_idle failed: {status:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "session {:?} never became idle", s.reference());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Clone, Copy, Debug)]
enum Preset {
    Followup,
    Steer,
}

/// Delivers `message`, retrying a retryable failure (UNAVAILABLE) with the *same* MessageId, up to
/// `max_attempts`. Returns the last result and how many retries it took.
async fn deliver(
    s: &Session,
    preset: Preset,
    message: &UserMessage,
    max_attempts: usize,
) -> (Result<SendReply, Status>, usize) {
    let mut retries = 0;
    loop {
        let result = match preset {
            Preset::Followup => s.followup(message.clone()).await,
            Preset::Steer => s.steer(message.clone(), None).await,
        };
        match result {
            Err(status) if status.code() == Code::Unavailable && retries + 1 < max_attempts => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return (other, retries),
        }
    }
}

/// What a load loop did.
#[derive(Debug, Default)]
struct Tally {
    /// (session index, MessageId) of every accepted delivery.
    accepted: Vec<(usize, String)>,
    /// Attempts beyond the first, over all deliveries.
    retries: usize,
    /// Deliveries that needed at least one retry.
    retried_calls: usize,
    /// Deliveries that failed for good (any status after the retries, or a non-retryable one).
    failures: Vec<String>,
    /// The longest delivery, retries included, and when it started (ms since the load began).
    slowest: (Duration, u128),
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.accepted.extend(other.accepted);
        self.retries += other.retries;
        self.retried_calls += other.retried_calls;
        self.failures.extend(other.failures);
        if other.slowest.0 > self.slowest.0 {
            self.slowest = other.slowest;
        }
    }
}

/// A load loop over `sessions[i]` for the `i` in `mine`: one delivery at a time, each with a fresh
/// MessageId, alternating gateways through `via` (one [`Session`] per gateway for each session), a
/// followup or, when `steers`, every third one a steer; every fourth sleeps 200 ms in a tool.
async fn load(
    via: Arc<Vec<Vec<Session>>>,
    mine: Vec<usize>,
    steers: bool,
    stop: Arc<AtomicBool>,
    pace: Duration,
    started: Instant,
    task: usize,
) -> Tally {
    let mut tally = Tally::default();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let i = mine[n % mine.len()];
        let gateway = (n + task) % via.len();
        let s = &via[gateway][i];
        let preset = if steers && n % 3 == 2 { Preset::Steer } else { Preset::Followup };
        let id = format!("m{task}-{n}-{}", uuid::Uuid::new_v4().simple());
        let text = if n % 4 == 1 { format!("[[tool:sleep 200]] {id}") } else { format!("hi {id}") };
        let message = user_msg(&id, &text);
        let at = Instant::now();
        let (result, retries) = deliver(s, preset, &message, 12).await;
        let took = at.elapsed();
        if took > tally.slowest.0 {
            tally.slowest = (took, at.duration_since(started).as_millis());
        }
        tally.retries += retries;
        tally.retried_calls += usize::from(retries > 0);
        match result {
            Ok(_) => tally.accepted.push((i, id)),
            Err(status) => tally.failures.push(format!(
                "{preset:?} {id} to session {i} via gateway {gateway} failed after {retries} retries: {:?} {}",
                status.code(),
                status.message()
            )),
        }
        n += 1;
        tokio::time::sleep(pace).await;
    }
    tally
}

/// Starts `tasks` load loops over `sessions` (split evenly); returns the stop flag and the handles.
fn start_load(
    via: Arc<Vec<Vec<Session>>>,
    tasks: usize,
    steers: bool,
    pace: Duration,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<Tally>>, Instant) {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sessions = via[0].len();
    let handles = (0..tasks)
        .map(|t| {
            let mine: Vec<usize> = (0..sessions).filter(|i| i % tasks == t).collect();
            tokio::spawn(load(via.clone(), mine, steers, stop.clone(), pace, started, t))
        })
        .collect();
    (stop, handles, started)
}

async fn stop_load(stop: &AtomicBool, handles: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for h in handles {
        tally.merge(h.await.unwrap());
    }
    tally
}

/// What the logs say about the accepted MessageIds.
#[derive(Debug, Default)]
struct Audit {
    admitted: usize,
    pending: usize,
    /// Turns ended `interrupted` (cut by a handoff or a crash and resumed by the next owner).
    interrupted: usize,
    problems: Vec<String>,
}

/// Waits until every session is idle, then reads every log (checked) and inbox: each accepted id must be
/// admitted (`user/message`) exactly once and not pending, or not admitted and pending; nothing else may
/// be admitted.
async fn audit(sessions: &[Session], accepted: &[(usize, String)]) -> Audit {
    for s in sessions {
        when_idle(s).await;
    }
    let mut by_session: HashMap<usize, Vec<&str>> = HashMap::new();
    for (i, id) in accepted {
        by_session.entry(*i).or_default().push(id);
    }
    let mut audit = Audit::default();
    for (i, s) in sessions.iter().enumerate() {
        let events = checked_log(s).await;
        audit.interrupted += durable_lines(&events)
            .iter()
            .filter(|l| l.starts_with("D turn/end ") && l.ends_with(" interrupted"))
            .count();
        let mut admitted: HashMap<String, usize> = HashMap::new();
        for e in &events {
            if let Some(turnstile_proto::v1::session_event::Payload::UserMessage(m)) = &e.payload {
                *admitted.entry(m.message.as_ref().map(|m| m.id.clone()).unwrap_or_default()).or_default() += 1;
            }
        }
        let inbox = s.inbox().await.unwrap();
        let pending: HashSet<String> = inbox.next_turn.iter().chain(&inbox.next_step).map(|m| m.id.clone()).collect();
        let mine: HashSet<&str> = by_session.get(&i).map(|v| v.iter().copied().collect()).unwrap_or_default();
        for id in &mine {
            let (n, p) = (admitted.get(*id).copied().unwrap_or(0), pending.contains(*id));
            match (n, p) {
                (1, false) => audit.admitted += 1,
                (0, true) => audit.pending += 1,
                _ => {
                    audit.problems.push(format!("session {i} {:?}: {id} admitted {n}x, pending {p}", s.reference().id))
                }
            }
        }
        for (id, n) in &admitted {
            if !mine.contains(id.as_str()) {
                audit.problems.push(format!("session {i}: {id} admitted {n}x but never accepted"));
            }
        }
    }
    audit
}

/// SPEC §7 28: two writers race on one session. The owner is SIGSTOPped while A sleeps in a tool, past
/// its lease; another worker takes the shard, repairs the open turn (`turn/end 1 interrupted`) and
/// resumes it. Then the first worker gets SIGCONT after its tool's sleep is over, so its in-flight step
/// wants to commit at once. The log holds one chain (contiguous seqs, epochs never decreasing, nothing
/// under the old epoch after the takeover), the stale step's tool result never lands, and a followup
/// through a gateway runs.
#[tokio::test]
async fn s28_paused_owner_wakes_after_takeover_and_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_with(options(3, 2)).await.unwrap();
    let log = journal(&cluster).await;
    let (_kv, map) = shard_map(&log).await;
    let workers: Vec<String> = (0..3).map(|i| cluster.worker_id(i)).collect();
    wait_shares(&cluster, &map, &workers, 10).await;

    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s1.watch().await.unwrap();
    s0.followup(user_msg("A", "[[tool:sleep 3000]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep 3000").await.unwrap();
    let tool_started = Instant::now();
    let before = s1.info().await.unwrap();
    let (old_owner, old_epoch) = (before.owner.clone(), before.epoch);
    let victim = cluster.worker_index(&old_owner).unwrap_or_else(|| panic!("owner {old_owner:?} is not a worker"));

    cluster.sigstop_worker(victim);
    let stopped_at = Instant::now();
    watch.wait_line("D turn/end 1 interrupted").await.unwrap();
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let new_owner = loop {
        let info = s1.info().await.unwrap();
        if !info.owner.is_empty() && info.owner != old_owner {
            break info.owner;
        }
        assert!(tokio::time::Instant::now() < deadline, "the owner never changed from {old_owner}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let takeover = stopped_at.elapsed();
    println!("s28: {old_owner} paused; {new_owner} wrote turn/end interrupted {} ms later", takeover.as_millis());

    // Pacing, not an assertion: wake the stale worker only once its tool's sleep is over, so its stale
    // step has a result to commit the moment it runs again.
    tokio::time::sleep_until((tool_started + Duration::from_millis(3300)).into()).await;
    cluster.sigcont_worker(victim);

    // The stale worker notices that it lost the shard (its renewal's compare-and-set fails, or its
    // lease lapsed by its own clock) and stops the session.
    let shard = shard_of(&journal_ref(&s0), SHARDS);
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let noticed = loop {
        let text = std::fs::read_to_string(cluster.worker_log(victim)).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| {
                (l.contains("lease taken over") && l.contains(&format!("shard={shard}")))
                    || (l.contains("leases lapsed") && l.contains(&shard.to_string()))
                    || (l.contains("append failed") && l.contains(&s0.reference().id))
            })
            .map(str::to_owned)
            .collect();
        if !lines.is_empty() {
            break lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{old_owner} never noticed losing shard {shard}:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("s28: {old_owner} after SIGCONT: {}", noticed.join(" | "));

    // The session keeps working: a followup through gateway 0 is accepted and runs.
    let (b, retries) = deliver(&s0, Preset::Followup, &user_msg("B", "bee"), 20).await;
    let b = b.unwrap_or_else(|e| panic!("followup after the race failed: {e:?}\n{}", cluster.logs()));
    assert!(b.seq > 0);
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    loop {
        when_idle(&s0).await;
        let lines = durable_lines(&checked_log(&s0).await);
        if lines.iter().any(|l| l == "D user/message B") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "B never ran:\n{}", lines.join("\n"));
    }
    let events = checked_log(&s0).await;
    let lines = durable_lines(&events);
    println!("s28: B accepted after {retries} retries; log:\n{}", lines.join("\n"));

    // One chain, and the takeover is a clean cut: up to it only the old epoch (at most), from it only
    // newer ones.
    let cut = events.iter().position(|e| e.epoch > old_epoch).expect("no event of the new owner");
    assert!(events[..cut].iter().all(|e| e.epoch <= old_epoch));
    assert!(events[cut..].iter().all(|e| e.epoch > old_epoch), "an event after the takeover carries the old epoch");
    assert_lines(
        &lines[..cut + 3],
        &[
            "D spliced next-turn 0 0 [A] wake",
            "D status running",
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "D step/start 1.1",
            "D user/message A",
            "D assistant/message 1.1 \"echo: go\" call sleep 3000",
            "D tool/call 1.1 sleep 3000",
            // The new owner's repair: the stale step's call is recorded interrupted and gets a synthetic
            // error result.
            "D tool/repaired 1.1 call-1-1-1 interrupted",
            "D tool/result 1.1 error *",
            "D step/end 1.1",
        ],
    );
    assert_eq!(lines.get(cut + 3).map(String::as_str), Some("D turn/end 1 interrupted"));
    // The stale step never landed: one result for 1.1 (the synthetic error), no second step of turn 1.
    let count = |pattern: &str| lines.iter().filter(|l| line_matches(l, pattern)).count();
    assert_eq!(count("D tool/result 1.1 *"), 1, "{}", lines.join("\n"));
    assert_eq!(count("D step/start 1.2"), 0, "{}", lines.join("\n"));
    assert_eq!(count("D assistant/message 1.2*"), 0, "{}", lines.join("\n"));
    // The resumed turn answers the interrupted call's result, and never runs it again; each id entered once.
    let at = |pattern: &str| lines.iter().position(|l| line_matches(l, pattern));
    assert!(at("D turn/start 2") < at("D assistant/message 2.1 \"tool results: sleep failed: interrupted*"));
    assert_eq!(count("D tool/call *"), 1, "{}", lines.join("\n"));
    assert_eq!((count("D user/message A"), count("D user/message B")), (1, 1));
    // Once the paused worker is back, the fair share may hand the shard back to it: between the release
    // and the new take the shard map names no owner, and `GetSession` says so with an empty owner. Wait
    // (bounded) for the map to name one again; a real failure still ends the test with the last answer.
    let mut info = s0.info().await.unwrap();
    for _ in 0..200 {
        if !info.owner.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        info = s0.info().await.unwrap();
    }
    assert_ne!(info.owner, "", "no owner named 10 s after the log was read: {info:?}");
    assert!(info.epoch > old_epoch);
}

/// SPEC §7 27 in a cluster: the owner dies after claiming A and before `step/start`. No directive holds
/// a pre-step long enough to signal the owner there (the decision takes microseconds), so the test
/// writes that log itself: the first four events of a real idle followup (splice, status running,
/// turn/start, claim) and a real queue splice of B, copied into a fresh session whose shard a worker
/// holds, stamped with that worker's epoch. Then that worker is SIGKILLed. The next owner repairs the
/// session on acquiring the shard, with no client command: `turn/end 1 interrupted`, A restored to the
/// head (`restored`, live `inserted`), A runs in turn 2, B in turn 3.
#[tokio::test]
async fn s27_owner_killed_between_claim_and_step_start_restores_the_claim() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start_with(options(3, 2)).await.unwrap();
    let log = journal(&cluster).await;
    let (kv, map) = shard_map(&log).await;
    let workers: Vec<String> = (0..3).map(|i| cluster.worker_id(i)).collect();
    wait_shares(&cluster, &map, &workers, 10).await;

    let model = cluster.session(0);
    model.followup(user_msg("A", "hello")).await.unwrap();
    model.when_idle().await.unwrap();
    model.queue(user_msg("B", "bee")).await.unwrap();
    let model_lines = durable_lines(&checked_log(&model).await);
    assert_eq!(model_lines[3], "D spliced next-turn 0 1 []", "event 4 is the claim");
    assert_eq!(model_lines.last().map(String::as_str), Some("D spliced next-turn 0 0 [B]"));
    let written = log.read(&journal_ref(&model), 1, 100).await.unwrap();
    assert_eq!(written.len(), model_lines.len());

    let target = cluster.session(1);
    let to = journal_ref(&target);
    let shard = shard_of(&to, SHARDS);
    let lease = kv.lease(shard).await.unwrap().expect("the shard has a lease").lease;
    assert!(lease.is_held(now_ms()), "shard {shard} is not held: {lease:?}");
    let crashed: Vec<_> = written[..4]
        .iter()
        .chain(written.last())
        .zip(1..)
        .map(|(e, seq)| {
            let mut e = e.clone();
            e.session = to.clone();
            e.seq = seq;
            e.epoch = lease.epoch;
            e
        })
        .collect();
    assert_eq!(log.append(&to, 0, &crashed, None).await.unwrap(), 5);
    let watch = target.watch().await.unwrap();

    // The worker that holds the shard now (it may have moved since the lease was read) is the one that
    // "crashed".
    let owner = kv.lease(shard).await.unwrap().expect("the shard has a lease").lease;
    let victim =
        cluster.worker_index(&owner.owner).unwrap_or_else(|| panic!("owner {:?} is not a worker", owner.owner));
    cluster.kill9_worker(victim);
    let killed_at = Instant::now();
    watch.wait_line("D turn/end 3 *").await.unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    println!("s27: {} killed; turn 3 ended {} ms later", owner.owner, killed_at.elapsed().as_millis());
    let lines = watch.settle(&target).await.unwrap();
    assert_lines(
        &lines,
        &[
            "D spliced next-turn 0 0 [A] wake",
            "D status running",
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "D spliced next-turn 0 0 [B]",
            "C caught_up 5",
            // Written by the new owner.
            "D turn/end 1 interrupted",
            "D spliced next-turn 0 0 [A] restored",
            "L inserted A",
            "D turn/start 2",
            "D spliced next-turn 0 1 []",
            "L claimed A 2",
            "D step/start 2.1",
            "D user/message A",
            "D assistant/message 2.1 \"echo: hello\"",
            "D step/end 2.1",
            "D turn/end 2 completed",
            "D turn/start 3",
            "D spliced next-turn 0 1 []",
            "L claimed B 3",
            "D step/start 3.1",
            "D user/message B",
            "D assistant/message 3.1 \"echo: bee\"",
            "D step/end 3.1",
            "D turn/end 3 completed",
            "D status idle",
            "L status idle",
        ],
    );
    let events = checked_log(&target).await;
    assert!(events[..5].iter().all(|e| e.epoch == lease.epoch));
    assert!(events[5..].iter().all(|e| e.epoch > owner.epoch), "the repair is written under a newer epoch");
    let info = target.info().await.unwrap();
    assert_ne!(info.owner, owner.owner, "another worker owns the session now");
    // The restored message is still the original acceptance: a retry returns its first seq.
    assert_eq!(target.followup(user_msg("A", "hello")).await.unwrap().seq, 1);
}

/// Rolling restart: 3 workers, 2 gateways, 50 sessions under a steady load of followups and steers
/// (alternating gateways, fresh MessageIds, some sleeping 200 ms in a tool), each retried with the same
/// MessageId while it fails UNAVAILABLE. Meanwhile each worker in turn is SIGTERMed (it drains and
/// releases its shards) and started again, and the next goes only once the restarted one holds its
/// share again. At the end every accepted id is admitted exactly once or still pending, and no call
/// failed for good.
#[tokio::test]
async fn rolling_restart_under_load_loses_and_duplicates_nothing() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start_with(options(3, 2)).await.unwrap();
    let log = journal(&cluster).await;
    let (_kv, map) = shard_map(&log).await;
    let workers: Vec<String> = (0..3).map(|i| cluster.worker_id(i)).collect();
    wait_shares(&cluster, &map, &workers, 10).await;

    let first: Vec<Session> = (0..50).map(|_| cluster.session(0)).collect();
    let via = Arc::new(vec![first.clone(), first.iter().map(|s| cluster.session_via(1, s)).collect::<Vec<_>>()]);
    let (stop, handles, started) = start_load(via, 5, true, Duration::from_millis(50));

    let mut restarts = Vec::new();
    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(3)).await; // pacing: let load run between restarts
        let t = Instant::now();
        cluster.sigterm_worker(i, Duration::from_secs(15)).await;
        let stopped = t.elapsed();
        cluster.restart_worker(i).await.unwrap();
        // Its share back (it takes released and expired shards at once; others hand theirs over at a
        // step boundary).
        wait_shares(&cluster, &map, &workers, 10).await;
        let back = t.elapsed();
        // It came back on a port of its own choosing, and its leases name that port: gateways dial
        // what the lease says.
        let bound = cluster.worker_addr(i).to_string();
        let leased: Vec<String> = {
            let (map, now) = (map.borrow(), now_ms());
            (0..SHARDS)
                .filter_map(|s| map.owner(s, now))
                .filter(|l| l.owner == workers[i])
                .map(|l| l.addr.clone())
                .collect()
        };
        assert!(leased.iter().all(|a| *a == bound), "{} bound {bound} but its leases say {leased:?}", workers[i]);
        println!(
            "rolling restart: {} drained and exited in {} ms, holds {} shards again {} ms after SIGTERM",
            workers[i],
            stopped.as_millis(),
            owned(&map, &workers[i]),
            back.as_millis()
        );
        restarts.push((stopped, back));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // pacing: some load after the last restart
    let tally = stop_load(&stop, handles).await;
    let load_ms = started.elapsed().as_millis();

    let audit = audit(&first, &tally.accepted).await;
    println!(
        "rolling restart: {load_ms} ms of load; accepted {}, admitted {}, pending {}, retries {} (in {} calls), \
         slowest call {} ms (started at {} ms), failed {}; {} turns cut by a handoff and resumed",
        tally.accepted.len(),
        audit.admitted,
        audit.pending,
        tally.retries,
        tally.retried_calls,
        tally.slowest.0.as_millis(),
        tally.slowest.1,
        tally.failures.len(),
        audit.interrupted
    );
    assert!(tally.failures.is_empty(), "calls failed for good:\n{}\n{}", tally.failures.join("\n"), cluster.logs());
    assert!(audit.problems.is_empty(), "{} problems:\n{}", audit.problems.len(), audit.problems.join("\n"));
    assert_eq!(audit.admitted + audit.pending, tally.accepted.len());
    assert!(tally.accepted.len() >= 100, "the load made too little progress: {}", tally.accepted.len());
}

/// A 3-node NATS cluster (R3 streams and buckets): kill -9 the event stream's leader under a steady
/// load of followups to 20 sessions and keep going, retrying retryable failures with the same
/// MessageId. No accepted message is lost or admitted twice.
#[tokio::test]
async fn nats_stream_leader_killed_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut opts = options(2, 2);
    opts.nats_nodes = 3;
    let mut cluster = Cluster::start_with(opts).await.unwrap();
    let log = journal(&cluster).await;
    let (_kv, map) = shard_map(&log).await;
    let workers: Vec<String> = (0..2).map(|i| cluster.worker_id(i)).collect();
    wait_shares(&cluster, &map, &workers, 15).await;

    let first: Vec<Session> = (0..20).map(|_| cluster.session(0)).collect();
    let via = Arc::new(vec![first.clone(), first.iter().map(|s| cluster.session_via(1, s)).collect::<Vec<_>>()]);
    let (stop, handles, started) = start_load(via, 4, false, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(3)).await; // pacing: load before the kill

    let nats = cluster.nats_cluster();
    let meta = nats.meta_leader().await;
    let leader = nats.stream_leader("TURNSTILE_EVENTS_0").await;
    let name = leader.clone().or(meta.clone()).expect("neither a stream nor a meta leader is known");
    let victim = nats.index_of(&name).unwrap_or_else(|| panic!("no member named {name:?}"));
    let killed_ms = started.elapsed().as_millis();
    cluster.kill9_nats(victim);
    println!("nats: killed {name} (stream leader {leader:?}, meta leader {meta:?}) at {killed_ms} ms into the load");
    let after = cluster.nats_cluster();
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let new_leader = loop {
        if let Some(l) = after.stream_leader("TURNSTILE_EVENTS_0").await.filter(|l| *l != name) {
            break l;
        }
        assert!(tokio::time::Instant::now() < deadline, "no new stream leader\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("nats: new stream leader {new_leader} after {} ms", started.elapsed().as_millis() - killed_ms);
    tokio::time::sleep(Duration::from_secs(8)).await; // pacing: load after the kill
    let tally = stop_load(&stop, handles).await;

    let audit = audit(&first, &tally.accepted).await;
    println!(
        "nats: accepted {}, admitted {}, pending {}, retries {} (in {} calls), slowest call {} ms (started at {} ms), failed {}",
        tally.accepted.len(),
        audit.admitted,
        audit.pending,
        tally.retries,
        tally.retried_calls,
        tally.slowest.0.as_millis(),
        tally.slowest.1,
        tally.failures.len()
    );
    // What the workers made of the NATS kill: a worker whose connection was on the killed server has no
    // presence while it reconnects, and a peer may take that for a death (docs/decisions/0019).
    for i in 0..cluster.workers() {
        let text = std::fs::read_to_string(cluster.worker_log(i)).unwrap_or_default();
        let gone = text.lines().filter(|l| l.contains("NATS connection is gone")).count();
        let back = text.lines().filter(|l| l.contains("answers its presence probes again")).count();
        let reconnects = text.lines().filter(|l| l.contains("event: disconnected")).count();
        println!("nats: {} found a peer gone {gone}×, back {back}×; disconnected {reconnects}×", cluster.worker_id(i));
    }
    assert!(tally.failures.is_empty(), "calls failed for good:\n{}\n{}", tally.failures.join("\n"), cluster.logs());
    assert!(audit.problems.is_empty(), "{} problems:\n{}", audit.problems.len(), audit.problems.join("\n"));
    assert_eq!(audit.admitted + audit.pending, tally.accepted.len());
    assert!(tally.accepted.len() >= 50, "the load made too little progress: {}", tally.accepted.len());
}
