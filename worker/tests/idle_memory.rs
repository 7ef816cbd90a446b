//! Where the bytes of an idle session go (issue 11, decision 0037): a counting global allocator measures
//! the heap a `SessionHost` holds per idle loaded session (one queued message each, like the bench's idle
//! phase) and per passivated one, and checks what passivation must guarantee: nothing of the session stays
//! in the host, and a retried message id still answers its first seq after the session was unloaded.
//!
//! The figures are printed (`--no-capture`), never asserted: memory targets live in `turnstile-bench`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::snapshot::MemorySnapshots;
use turnstile_journal::{EmbeddedLog, LocalBus};
use turnstile_model::{Command, CommandReply, SessionRef, Target, UserMessage};
use turnstile_worker::{SessionHost, WorkerConfig};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes live on the heap (allocated and not yet freed).
fn live() -> i64 {
    let stats = ALLOCATOR.stats();
    stats.bytes_allocated as i64 - stats.bytes_deallocated as i64 + stats.bytes_reallocated as i64
}

fn queue(id: &str) -> Command {
    let message = UserMessage::user_text(id, "later");
    Command::Send { message, target: Target::NextTurn, wakeup: false, expected_turn: None, deadline: None }
}

fn session(i: usize) -> SessionRef {
    SessionRef::new("bench", format!("idle-0123abcd-{i}")).unwrap()
}

const SESSIONS: usize = 2_000;

/// Lets the runners' background work finish (paused time advances only when every task waits).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_holds_little_and_a_passivated_one_nothing() {
    let log = Arc::new(EmbeddedLog::in_memory());
    let snapshots = Arc::new(MemorySnapshots::default());
    let config = WorkerConfig { passivate_after: Duration::from_secs(60), ..WorkerConfig::default() };
    let host = SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into())
        .snapshots(snapshots.clone())
        .config(config)
        .build();
    // Warm up: the first session pays for lazily built statics and the runtime's timer wheel.
    for i in 0..10 {
        host.execute(&session(SESSIONS + i), queue(&format!("w{i}")), None).await.unwrap();
    }
    settle().await;

    let before = live();
    let mut seqs = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let reply = host.execute(&session(i), queue(&format!("q{i}")), None).await.unwrap();
        let CommandReply::Sent { seq, turn: None } = reply else { panic!("queue answered {reply:?}") };
        seqs.push(seq);
    }
    settle().await;
    let loaded = live();
    assert_eq!(host.loaded_sessions(), SESSIONS + 10);
    // Past `park_after` (200 ms) every idle session keeps only its fold.
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;

    let parked = live();
    assert_eq!(host.running_sessions(), 0, "every idle session parked its runner");
    assert_eq!(host.loaded_sessions(), SESSIONS + 10, "a parked session is still loaded");

    // A retry on a parked session answers from its fold, and the session parks again afterwards.
    let w = SESSIONS + 3;
    let retry = host.execute(&session(w), queue("w3"), None).await.unwrap();
    assert_eq!(retry, CommandReply::Sent { seq: 1, turn: None }, "the retry of w3 on its parked session");
    assert_eq!(host.running_sessions(), 1, "the command resumed the parked session");
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(host.running_sessions(), 0);
    // Passivation drops a parked session within `passivate_after` and one sweep (an eighth of it) after its
    // last input.
    tokio::time::sleep(Duration::from_secs(60 + 60 / 8 + 1)).await;
    settle().await;
    let passivated = live();
    assert_eq!(host.loaded_sessions(), 0, "every idle session passivated");
    assert_eq!(host.held_sessions(), 0, "a passivated session leaves nothing in the host");

    let per = |bytes: i64| bytes as f64 / SESSIONS as f64;
    println!(
        "idle loaded, runner running: {:.0} B/session; parked: {:.0} B/session; passivated: {:.0} B/session (the \
         embedded log and the snapshot store, which live in NATS in production); so a running runner holds \
         {:.0} B, a parked driver {:.0} B",
        per(loaded - before),
        per(parked - before),
        per(passivated - before),
        per(loaded - passivated),
        per(parked - passivated),
    );

    // A retried message id answers its first seq from the reloaded session (SPEC §1 dedup).
    for i in [0, SESSIONS / 2, SESSIONS - 1] {
        let reply = host.execute(&session(i), queue(&format!("q{i}")), None).await.unwrap();
        assert_eq!(reply, CommandReply::Sent { seq: seqs[i], turn: None }, "the retry of q{i}");
    }
}
