//! Failover from connection loss (docs/decisions/0019): a kill -9 closes the owner's NATS connection at
//! once, and the other workers take its shards on that, not on the lease running out.
//!
//! The leases here last 30 s and the test gives itself 15 s from the kill to a completed turn, so it can
//! only pass if the takeover does not wait for expiry. That bound is a failure detector, not a speed
//! target: the speed is measured by `turnstile-bench failover`.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use tonic::Code;
use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{Cluster, ClusterOptions, user_msg};

/// Far beyond `AFTER_KILL`: a takeover that waits for the lease cannot finish in time.
const LEASE_TTL_MS: &str = "30000";
/// From the kill until the followup's turn has completed.
const AFTER_KILL: Duration = Duration::from_secs(15);

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test]
async fn killed_owner_is_replaced_long_before_its_lease_expires() {
    let mut opts = ClusterOptions::new(3, 1);
    opts.worker_args = args(&["--shards", "32", "--lease-ttl-ms", LEASE_TTL_MS, "--renew-ms", "250"]);
    opts.gateway_args = args(&["--shards", "32", "--route-deadline-ms", "3000"]);
    let mut cluster = Cluster::start_with(opts).await.unwrap();
    let s = cluster.session(0);
    let watch = s.watch().await.unwrap();
    // The owner dies mid-step, with a tool call open.
    s.followup(user_msg("A", "[[tool:sleep 1000]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep *").await.unwrap();
    let before = s.info().await.unwrap();
    let victim = cluster.worker_index(&before.owner).unwrap_or_else(|| panic!("{:?} is not a worker", before.owner));

    cluster.kill9_worker(victim);
    let killed_at = Instant::now();
    let outcome = tokio::time::timeout(AFTER_KILL, async {
        // Each call retries inside the gateway's routing deadline; UNAVAILABLE means no owner yet.
        let b = loop {
            match s.followup(user_msg("B", "bee")).await {
                Ok(reply) => break reply,
                Err(status) if status.code() == Code::Unavailable => {}
                Err(status) => panic!("followup after the kill failed: {status:?}"),
            }
        };
        let accepted = killed_at.elapsed();
        // B runs after the resumed turn, and the session goes idle.
        watch.wait_line("D user/message B").await.unwrap();
        watch.wait_line("D status idle").await.unwrap();
        (b, accepted, s.info().await.unwrap())
    })
    .await;
    let (b, accepted, after) = outcome.unwrap_or_else(|_| {
        panic!(
            "no completed turn {AFTER_KILL:?} after killing {} (leases last {LEASE_TTL_MS} ms):\n{}\n{}",
            before.owner,
            watch.lines().join("\n"),
            cluster.logs()
        )
    });
    println!("failover: followup accepted {} ms after SIGKILL of {}", accepted.as_millis(), before.owner);
    assert!(b.seq > 0);
    assert_ne!(after.owner, before.owner, "another worker owns the session");
    assert!(after.epoch > before.epoch, "the taker writes under a higher epoch ({} > {})", after.epoch, before.epoch);
    assert_eq!(after.status, SessionStatus::Idle as i32);

    let lines = watch.settle(&s).await.unwrap();
    let durable: Vec<&String> = lines.iter().filter(|l| l.starts_with("D ")).collect();
    let at = |pattern: &str| {
        durable
            .iter()
            .position(|l| turnstile_tests::watch::line_matches(l, pattern))
            .unwrap_or_else(|| panic!("no {pattern:?} in:\n{}", lines.join("\n")))
    };
    // The taker repaired the open turn, resumed it, then ran B.
    assert!(at("D tool/result 1.1 error *") < at("D turn/end 1 interrupted"));
    assert!(at("D turn/end 1 interrupted") < at("D turn/start 2"));
    assert!(at("D turn/end 2 completed") < at("D user/message B"));
}
