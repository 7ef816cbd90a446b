//! The cluster end to end: real `turnstile worker` and `turnstile gateway` processes on one nats-server.
//! Commands alternate between two gateways, so every scenario also checks that any gateway routes to the
//! owner and serves reads; the failover test SIGKILLs the owner mid-step.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tonic::Code;
use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{Cluster, DEFAULT_WAIT, Session, assert_lines, user_msg};

/// One completed single-step turn that claims `id` from the head of next-turn.
fn turn_lines(id: &str, turn: u64, reply: &str) -> Vec<String> {
    vec![
        format!("D turn/start {turn}"),
        "D spliced next-turn 0 1 []".to_owned(),
        format!("L claimed {id} {turn}"),
        format!("D step/start {turn}.1"),
        format!("D user/message {id}"),
        format!("D assistant/message {turn}.1 {reply:?}"),
        format!("D step/end {turn}.1"),
        format!("D turn/end {turn} completed"),
    ]
}

fn refs(lines: &[String]) -> Vec<&str> {
    lines.iter().map(String::as_str).collect()
}

fn strings(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}

fn entered(lines: &[String], id: &str) -> usize {
    lines.iter().filter(|l| l.split(' ').take(3).collect::<Vec<_>>() == ["D", "user/message", id]).count()
}

/// 3 workers, 2 gateways: 200 sessions spread over every worker, then SPEC scenarios 1, 3, 4, 13, 22 and
/// 24 with their commands alternating between the gateways.
#[tokio::test]
async fn sessions_spread_over_workers_and_scenarios_run_through_both_gateways() {
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

    s01_idle_followup(&cluster).await;
    s03_followup_while_streaming(&cluster).await;
    s04_idle_queue_then_followup(&cluster).await;
    s13_cancel_mid_stream_discards_queue(&cluster).await;
    s22_retry_is_idempotent(&cluster).await;
    s24_interrupt_runs_next_with_queue_behind(&cluster).await;
}

/// Scenario 1 (followup via gateway 0, watch and when_idle via gateway 1): the canonical order.
async fn s01_idle_followup(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s1.watch().await.unwrap();
    let reply = s0.followup(user_msg("A", "hello")).await.unwrap();
    assert_eq!((reply.seq, reply.turn), (1, Some(1)));
    let idle = s1.when_idle().await.unwrap();
    assert_eq!((idle.last_seq, idle.last_turn), (10, 1));
    let lines = watch.settle(&s1).await.unwrap();
    let mut expected = strings(&[
        "C caught_up 0",
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
    ]);
    expected.extend(turn_lines("A", 1, "echo: hello"));
    expected.extend(strings(&["D status idle", "L status idle"]));
    assert_lines(&lines, &refs(&expected));
}

/// Scenario 3: followup(B) via the other gateway while A streams: splice + inserted(B) only; B runs as
/// turn 2 with no idle in between.
async fn s03_followup_while_streaming(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s0.watch().await.unwrap();
    s0.followup(user_msg("A", "[[delay:1500]] slow")).await.unwrap();
    watch.wait_line("L delta 1.1 *").await.unwrap();
    let b = s1.followup(user_msg("B", "next")).await.unwrap();
    assert_eq!((b.seq, b.turn), (7, None));
    let lines = watch.settle(&s1).await.unwrap();
    let mut expected = strings(&[
        "C caught_up 0",
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "D step/start 1.1",
        "D user/message A",
        "D spliced next-turn 0 0 [B] wake",
        "L inserted B",
        "D assistant/message 1.1 \"echo: slow\"",
        "D step/end 1.1",
        "D turn/end 1 completed",
    ]);
    expected.extend(turn_lines("B", 2, "echo: next"));
    expected.extend(strings(&["D status idle", "L status idle"]));
    assert_lines(&lines, &refs(&expected));
}

/// Scenario 4: queue(Q) via gateway 1 writes one splice and no turn; followup(F) via gateway 0 runs Q,
/// then F.
async fn s04_idle_queue_then_followup(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s0.watch().await.unwrap();
    let q = s1.queue(user_msg("Q", "queued")).await.unwrap();
    assert_eq!((q.seq, q.turn), (1, None));
    let info = s0.info().await.unwrap();
    assert_eq!((info.status, info.last_seq, info.last_turn), (SessionStatus::Idle as i32, 1, 0));
    let f = s0.followup(user_msg("F", "follow")).await.unwrap();
    assert_eq!((f.seq, f.turn), (2, Some(1)));
    let lines = watch.settle(&s1).await.unwrap();
    let mut expected = strings(&[
        "C caught_up 0",
        "D spliced next-turn 0 0 [Q]",
        "L inserted Q",
        "D spliced next-turn 1 0 [F] wake",
        "L inserted F",
        "D status running",
        "L status running",
    ]);
    expected.extend(turn_lines("Q", 1, "echo: queued"));
    expected.extend(turn_lines("F", 2, "echo: follow"));
    expected.extend(strings(&["D status idle", "L status idle"]));
    assert_lines(&lines, &refs(&expected));
}

/// Scenario 13: cancel(user) via gateway 1 mid-stream: interrupted message, aborted{user}, the queued
/// item (queued via gateway 0) discarded.
async fn s13_cancel_mid_stream_discards_queue(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s1.watch().await.unwrap();
    s0.followup(user_msg("A", "[[delay:3000]] one two three four five six seven eight nine ten")).await.unwrap();
    watch.wait_line("L delta 1.1 *").await.unwrap();
    s0.queue(user_msg("Q", "queued")).await.unwrap();
    s1.cancel(false).await.unwrap();
    let lines = watch.settle(&s0).await.unwrap();
    assert_lines(
        &lines,
        &[
            "C caught_up 0",
            "D spliced next-turn 0 0 [A] wake",
            "L inserted A",
            "D status running",
            "L status running",
            "D turn/start 1",
            "D spliced next-turn 0 1 []",
            "L claimed A 1",
            "D step/start 1.1",
            "D user/message A",
            "D spliced next-turn 0 0 [Q]",
            "L inserted Q",
            "D spliced next-turn 0 1 [] canceled",
            "L discarded Q",
            "D assistant/message 1.1 interrupted *",
            "D step/end 1.1",
            "D turn/end 1 aborted{user}",
            "D status idle",
            "L status idle",
        ],
    );
    let message = watch.assistant_message(1, 1).unwrap();
    assert_eq!(message.text, watch.delta_text(1, 1), "the interrupted text is what the deltas delivered");
    let inbox = s0.inbox().await.unwrap();
    assert!(inbox.next_turn.is_empty() && inbox.next_step.is_empty());
}

/// Scenario 22: a retried followup through the other gateway returns the same seq and writes nothing.
async fn s22_retry_is_idempotent(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let first = s0.followup(user_msg("A", "hello")).await.unwrap();
    s0.when_idle().await.unwrap();
    let before = s0.replay(0).await.unwrap();
    let retry = s1.followup(user_msg("A", "hello")).await.unwrap();
    assert_eq!(retry.seq, first.seq, "a retry returns the original acceptance");
    let err = s1.followup(user_msg("A", "other text")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    s1.when_idle().await.unwrap();
    assert_eq!(s1.replay(0).await.unwrap(), before, "nothing was written");
}

/// Scenario 24: interrupt(X) via gateway 1 while turn 1 sleeps in a tool with B queued via gateway 0:
/// turn 1 aborted{user}, turn 2 runs X, turn 3 runs B.
async fn s24_interrupt_runs_next_with_queue_behind(cluster: &Cluster) {
    let s0 = cluster.session(0);
    let s1 = cluster.session_via(1, &s0);
    let watch = s0.watch().await.unwrap();
    s1.followup(user_msg("A", "[[tool:sleep 2000]]")).await.unwrap();
    watch.wait_line("D tool/call 1.1 *").await.unwrap();
    s0.queue(user_msg("B", "queued")).await.unwrap();
    let x = s1.interrupt(user_msg("X", "now")).await.unwrap();
    assert_eq!(x.turn, None);
    let lines = watch.settle(&s1).await.unwrap();
    let mut expected = strings(&[
        "C caught_up 0",
        "D spliced next-turn 0 0 [A] wake",
        "L inserted A",
        "D status running",
        "L status running",
        "D turn/start 1",
        "D spliced next-turn 0 1 []",
        "L claimed A 1",
        "D step/start 1.1",
        "D user/message A",
        "D assistant/message 1.1 \"echo: \" call sleep 2000",
        "D tool/call 1.1 sleep 2000",
        "D spliced next-turn 0 0 [B]",
        "L inserted B",
        "D spliced next-turn 0 0 [X] wake",
        "L inserted X",
        "D tool/result 1.1 error *",
        "D step/end 1.1",
        "D turn/end 1 aborted{user}",
        "D status idle",
        "L status idle",
        "D status running",
        "L status running",
    ]);
    expected.extend(turn_lines("X", 2, "echo: now"));
    expected.extend(turn_lines("B", 3, "echo: queued"));
    expected.extend(strings(&["D status idle", "L status idle"]));
    assert_lines(&lines, &refs(&expected));
}

/// SPEC §7 26 in a cluster: SIGKILL the owner mid-step (A sleeps in a tool). Another worker takes the
/// shard, the session's open turn ends `interrupted`, the interrupted prompt is answered in the next
/// turn, and a followup sent after the kill (through the other gateway) is accepted and runs; no
/// MessageId is lost or entered twice. Prints the time from the kill to the accepted followup.
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
    assert!(at("D turn/start 2") < at("D assistant/message 2.1 \"echo: go\" call sleep 3000"), "A is answered again");
    assert!(at("D turn/end 2 completed") < at("D user/message B"), "B runs after the resumed turn");
    assert_eq!((entered(&durable, "A"), entered(&durable, "B")), (1, 1), "each MessageId entered exactly once");
    assert_eq!(lines.last().map(String::as_str), Some("L status idle"));

    let info = s0.info().await.unwrap();
    assert_ne!(info.owner, owner, "another worker owns the session now");
    assert!(info.epoch > 1, "the new owner writes under a higher epoch, got {}", info.epoch);
    assert_eq!(info.status, SessionStatus::Idle as i32);
}
