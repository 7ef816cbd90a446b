//! A command's caller is answered once its group is durable, ahead of the live events and operations the
//! same input starts (decision 0199): a followup's reply does not wait for its live events to be published.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use log_support::TestLog;
use tokio::sync::Semaphore;
use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::{JournalError, LiveBus, LiveStream, LocalBus};
use turnstile_model::{Command, CommandReply, LiveEvent, SessionRef, Target, UserMessage};
use turnstile_worker::SessionHost;

/// A bus whose publishes wait until the test lets them through (one permit per event).
struct HeldBus {
    inner: LocalBus,
    gate: Semaphore,
}

#[async_trait]
impl LiveBus for HeldBus {
    async fn publish(&self, event: &LiveEvent) -> Result<(), JournalError> {
        self.gate.acquire().await.unwrap().forget();
        self.inner.publish(event).await
    }

    async fn subscribe(&self, session: &SessionRef) -> Result<LiveStream, JournalError> {
        self.inner.subscribe(session).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followup_is_answered_before_its_live_events_are_published() {
    let bus = Arc::new(HeldBus { inner: LocalBus::new(), gate: Semaphore::new(0) });
    let log = Arc::new(TestLog::recording());
    let host = SessionHost::builder(log, bus.clone(), AgentSetup::default().into()).build();
    let s = SessionRef::new("acme", "held").unwrap();
    let mut live = bus.subscribe(&s).await.unwrap();

    // No live event can be published yet: the answer comes all the same.
    let message = UserMessage::user_text("m1", "hello");
    let command =
        Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    let reply = host.execute(&s, command, None).await.unwrap();
    assert_eq!(reply, CommandReply::Sent { seq: 1, turn: Some(1) });

    // Let them through: they come in the driver's order, and the turn runs on to idle.
    bus.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    let first: Vec<&str> = live.by_ref().take(3).map(|e| e.event_type()).collect::<Vec<_>>().await;
    assert_eq!(first, ["agent/inbox/inserted", "agent/status", "agent/inbox/claimed"]);
    match host.execute(&s, Command::WhenIdle, Some(Duration::from_secs(20))).await.unwrap() {
        CommandReply::Idle(_) => {}
        other => panic!("WhenIdle answered {other:?}"),
    }
}
