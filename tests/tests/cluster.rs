//! The cluster end to end: real `turnstile worker` and `turnstile gateway` processes on one nats-server.
//! Sessions spread over every worker and any gateway serves any session; the failover test SIGKILLs the
//! owner mid-step. The SPEC scenarios run on a cluster through `Deployment::Cluster` in the scenario files.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tonic::Code;
use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{Cluster, DEFAULT_WAIT, Session, user_msg};

fn entered(lines: &[String], id: &str) -> usize {
    lines.iter().filter(|l| l.split(' ').take(3).collect::<Vec<_>>() == ["D", "user/message", id]).count()
}

/// 3 workers, 2 gateways: 200 sessions spread over every worker, owners read through the other gateway.
/// (Every end-to-end SPEC scenario also runs on a cluster with alternating gateways: the `cluster::`
/// tests of `delivery.rs`, `cancel.rs` and `inbox.rs`.)
#[tokio::test]
async fn sessions_spread_over_workers_through_both_gateways() {
    let cluster = Cluster::start(3, 2).await.unwrap();

    // 200 sessions, in batches so that the two cores are not flooded with 200 turns at once.
    let sessions: Vec<Session> = (0..200).map(|i| cluster.session(i % 2)).collect();
    for batch in sessions.chunks(25) {
        let accepted = futures::future::join_all(batch.iter().map(|s| s.followup(user_msg("A", "hello")))).await;
        for reply in accepted {
            assert_eq!(reply.unwrap().turn, Some(1));
        }
    }
    // Owners are read through the *other* gateway. Shards may still be moving towards fair shares just
    // after start-up, so wait (bounded) until every worker owns some of these sessions.
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let owners = loop {
        let mut owners = BTreeSet::new();
        for (i, s) in sessions.iter().enumerate() {
            let info = cluster.session_via((i + 1) % 2, s).info().await.unwrap();
            owners.insert(info.owner);
        }
        if owners.len() == 3 || tokio::time::Instant::now() >= deadline {
            break owners;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(owners, BTreeSet::from(["w1".to_owned(), "w2".to_owned(), "w3".to_owned()]), "{}", cluster.logs());
    for s in sessions.iter().take(20) {
        let idle = s.when_idle().await.unwrap();
        assert_eq!((idle.status, idle.last_seq, idle.last_turn), (SessionStatus::Idle as i32, 10, 1));
    }
}

#[tokio::test]
async fn owner_killed_mid_step_is_served_again_by_another_worker() {
    let mut cluster = Cluster::start(3, 2).await.unwrap();
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s1.watch().await.unwrap();
    s0.followup(user_msg("A", "[[tool:sleep 3000]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep *").await.unwrap();
    let owner = s0.info().await.unwrap().owner;
    let victim = cluster.worker_index(&owner).unwrap_or_else(|| panic!("owner {owner:?} is not a worker"));

    cluster.kill9_worker(victim);
    let killed_at = Instant::now();
    // Each call already retries inside the gateway's routing deadline; the loop bounds the whole wait.
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    let b = loop {
        match s1.followup(user_msg("B", "bee")).await {
            Ok(reply) => break reply,
            Err(status) if status.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {}
            Err(status) => panic!("followup after the kill failed: {status:?}\n{}", cluster.logs()),
        }
    };
    let failover = killed_at.elapsed();
    println!("failover: {} ms from SIGKILL of {owner} to the next accepted followup", failover.as_millis());
    assert!(b.seq > 0);

    // Settle: the resumed turn 2 and B's turn have run and the session is idle.
    let lines = loop {
        let lines = watch.settle(&s0).await.unwrap();
        let b_done = lines.iter().any(|l| l.starts_with("D user/message B"))
            && lines.last().is_some_and(|l| l == "L status idle" || l == "D status idle");
        if b_done || tokio::time::Instant::now() >= deadline {
            break lines;
        }
    };
    let durable: Vec<String> = lines.iter().filter(|l| l.starts_with("D ")).cloned().collect();
    let at = |pattern: &str| {
        durable
            .iter()
            .position(|l| turnstile_tests::watch::line_matches(l, pattern))
            .unwrap_or_else(|| panic!("no {pattern:?} in:\n{}", durable.join("\n")))
    };
    let interrupted = at("D turn/end 1 interrupted");
    assert!(at("D tool/call 1.1 sleep 3000") < interrupted);
    assert!(at("D tool/result 1.1 error *") < interrupted, "the unfinished call got a synthetic error result");
    assert!(interrupted < at("D turn/start 2"));
    assert!(at("D tool/repaired 1.1 call-1-1-1 interrupted") < at("D tool/result 1.1 error *"));
    // The resumed turn answers the interrupted call's result; it does not ask the model A again, which
    // called the tool a second time (decision 0143).
    assert!(at("D turn/start 2") < at("D assistant/message 2.1 \"tool results: sleep failed: interrupted*"));
    assert!(!durable.iter().any(|l| l.starts_with("D tool/call 2.")), "the call is not run again");
    assert!(at("D turn/end 2 completed") < at("D user/message B"), "B runs after the resumed turn");
    assert_eq!((entered(&durable, "A"), entered(&durable, "B")), (1, 1), "each MessageId entered exactly once");
    assert_eq!(lines.last().map(String::as_str), Some("L status idle"));

    let info = s0.info().await.unwrap();
    assert_ne!(info.owner, owner, "another worker owns the session now");
    assert!(info.epoch > 1, "the new owner writes under a higher epoch, got {}", info.epoch);
    assert_eq!(info.status, SessionStatus::Idle as i32);
}
