//! `LocalBus`: per-session broadcast, best effort, flat memory.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures::StreamExt as _;
use turnstile_journal::{LiveBus, LiveStream, LocalBus};
use turnstile_model::{LiveEvent, LivePayload, SessionRef, Status};

const WAIT: Duration = Duration::from_secs(20);

fn delta(session: &SessionRef, n: u64) -> LiveEvent {
    LiveEvent {
        session: session.clone(),
        after_seq: n,
        payload: LivePayload::AssistantDelta { turn: 1, step: 1, text: format!("d{n}"), reasoning: false, offset: 0 },
    }
}

async fn next(stream: &mut LiveStream) -> LiveEvent {
    tokio::time::timeout(WAIT, stream.next()).await.expect("a live event in time").expect("stream open")
}

#[tokio::test]
async fn subscribers_get_their_sessions_events_in_order() {
    let bus = LocalBus::new();
    let (a, b) = (common::session("acme", "a"), common::session("acme", "b"));
    let mut first = bus.subscribe(&a).await.unwrap();
    let mut second = bus.subscribe(&a).await.unwrap();
    let mut other = bus.subscribe(&b).await.unwrap();
    for n in 1..=3 {
        bus.publish(&delta(&a, n)).await.unwrap();
    }
    let status = LiveEvent { session: b.clone(), after_seq: 9, payload: LivePayload::Status { status: Status::Idle } };
    bus.publish(&status).await.unwrap();
    for stream in [&mut first, &mut second] {
        for n in 1..=3 {
            assert_eq!(next(stream).await, delta(&a, n));
        }
    }
    // `b`'s subscriber sees only `b`'s event, first.
    assert_eq!(next(&mut other).await, status);
}

#[tokio::test]
async fn events_before_subscribing_are_not_seen() {
    let bus = LocalBus::new();
    let s = common::session("acme", "late");
    bus.publish(&delta(&s, 1)).await.unwrap();
    let mut stream = bus.subscribe(&s).await.unwrap();
    bus.publish(&delta(&s, 2)).await.unwrap();
    assert_eq!(next(&mut stream).await, delta(&s, 2));
}

#[tokio::test]
async fn a_lagging_subscriber_skips_and_keeps_going() {
    let bus = LocalBus::new();
    let s = common::session("acme", "flood");
    let mut stream = bus.subscribe(&s).await.unwrap();
    let total = turnstile_journal::embedded::LIVE_CAPACITY as u64 + 100;
    // Publishing never waits for the reader.
    for n in 1..=total {
        bus.publish(&delta(&s, n)).await.unwrap();
    }
    let mut seen = Vec::new();
    while seen.last() != Some(&total) {
        seen.push(next(&mut stream).await.after_seq);
    }
    assert!(seen.len() < total as usize, "some events were skipped");
    assert!(seen.windows(2).all(|w| w[0] + 1 == w[1]), "what is delivered is in order, without gaps after the skip");
}

#[tokio::test]
async fn sessions_without_subscribers_hold_no_memory() {
    let bus = LocalBus::new();
    let s = common::session("acme", "flat");
    for n in 0..100 {
        bus.publish(&delta(&common::session("acme", &format!("nobody-{n}")), 1)).await.unwrap();
    }
    assert_eq!(bus.subscribed_sessions(), 0);
    let one = bus.subscribe(&s).await.unwrap();
    let two = bus.subscribe(&s).await.unwrap();
    assert_eq!(bus.subscribed_sessions(), 1);
    drop(one);
    assert_eq!(bus.subscribed_sessions(), 1, "one subscriber is still there");
    drop(two);
    assert_eq!(bus.subscribed_sessions(), 0);
}
