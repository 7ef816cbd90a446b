//! Passivation from the parking queue (decision 0178), in paused time: a parked session is dropped once
//! `passivate_after` has passed since it parked, and one that was resumed and parked again meanwhile is
//! dropped at its second parking's time, not its first; a crowd of parked sessions larger than one chunk
//! of the sweep is passivated in the same sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::{EmbeddedLog, LocalBus};
use turnstile_model::{Command, CommandReply, SessionRef, Target, UserMessage};
use turnstile_worker::{SessionHost, WorkerConfig};

fn queue(id: &str) -> Command {
    let message = UserMessage::user_text(id, "later");
    Command::Send { message, target: Target::NextTurn, wakeup: false, expected_turn: None, deadline: None }
}

fn session(i: usize) -> SessionRef {
    SessionRef::new("acme", format!("s{i}")).unwrap()
}

/// Lets the runners' background work finish (paused time advances only when every task waits).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// More than one chunk of the sweep (1,024 per hold of the lock).
const CROWD: usize = 2_500;

#[tokio::test(start_paused = true)]
async fn a_parked_session_goes_at_its_last_parkings_time_and_a_crowd_goes_in_one_sweep() {
    let config = WorkerConfig { passivate_after: Duration::from_secs(60), ..WorkerConfig::default() };
    let host = SessionHost::builder(
        Arc::new(EmbeddedLog::in_memory()),
        Arc::new(LocalBus::new()),
        AgentSetup::default().into(),
    )
    .config(config)
    .build();
    for i in 0..CROWD {
        host.execute(&session(i), queue(&format!("q{i}")), None).await.unwrap();
    }
    // Past `park_after` (200 ms) every one is parked.
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(host.running_sessions(), 0);
    assert_eq!(host.loaded_sessions(), CROWD);

    // Half way, session 0 takes a command and parks again: its first parking is stale from now on.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let again = host.execute(&session(0), queue("again"), None).await.unwrap();
    assert!(matches!(again, CommandReply::Sent { .. }), "{again:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(host.running_sessions(), 0, "session 0 parked again");

    // Past the first parkings' time and a sweep (an eighth of `passivate_after`): the crowd is gone in
    // that sweep, session 0 stays (its first parking's entry is skipped).
    tokio::time::sleep(Duration::from_secs(60 - 31 + 60 / 8 + 1)).await;
    settle().await;
    assert_eq!(host.loaded_sessions(), 1, "every session but the one parked again passivated");
    assert_eq!(host.held_sessions(), 1);

    // Past its second parking's time, it goes too.
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(host.loaded_sessions(), 0);
    assert_eq!(host.held_sessions(), 0, "a passivated session leaves nothing in the host");
    // And it answers from its log afterwards: the retry of its first message keeps its seq.
    let retry = host.execute(&session(0), queue("q0"), None).await.unwrap();
    assert_eq!(retry, CommandReply::Sent { seq: 1, turn: None });
}
