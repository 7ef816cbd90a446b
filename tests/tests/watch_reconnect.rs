//! Watch reconnect (ARCHITECTURE "Watch"): a client whose stream drops mid-turn reconnects with the last
//! seq it saw and misses nothing, sees nothing twice: the durable events of both streams together are
//! exactly the log, in order. On both journals (`backend_tests!`).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_tests::watch::{check_stream, durable_events};
use turnstile_tests::{Backend, WatchRecorder, user_msg};

async fn reconnect_mid_turn_with_the_last_seq(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let first = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[delay:1500]] slow [[tool:echo hi]]")).await.unwrap();
    s.followup(user_msg("B", "[[delay:300]] next")).await.unwrap();
    // Mid-turn: the first step is streaming.
    first.wait_line("L delta 1.1 *").await.unwrap();
    let seen = first.disconnect().await;
    check_stream(&seen, 0).unwrap();
    let before = durable_events(&seen);
    let last = before.last().map_or(0, |e| e.seq);
    assert!(last >= 6, "the stream had reached the user/message: {last}");

    let second = WatchRecorder::start(s.client(), s.reference(), last, true).await.unwrap();
    second.settle(&s).await.unwrap();
    let after = second.events();
    assert_eq!(after.first().map(|e| e.seq), Some(last + 1), "the second stream starts right after the last seen");

    let (log, last_seq) = s.replay(0).await.unwrap();
    let union: Vec<_> = before.into_iter().chain(after).collect();
    assert_eq!(union, log, "both streams together are exactly the log, in order");
    assert_eq!(union.last().map(|e| e.seq), Some(last_seq));
    let text = |turn| second.assistant_message(turn, 1).map(|m| m.text);
    assert_eq!(text(2).as_deref(), Some("echo: next"), "the tail went on to turn 2");
}

/// Reconnecting at every seq of a finished log replays exactly the rest of it.
async fn reconnect_at_every_seq_replays_the_rest(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    s.followup(user_msg("A", "[[tool:echo hi]] go")).await.unwrap();
    s.when_idle().await.unwrap();
    let (log, last) = s.replay(0).await.unwrap();
    for after in 0..=last {
        let (rest, caught_up) = s.replay(after).await.unwrap();
        assert_eq!(caught_up, last);
        assert_eq!(rest, log[usize::try_from(after).unwrap()..], "after_seq {after}");
    }
}

turnstile_tests::backend_tests!(reconnect_mid_turn_with_the_last_seq, reconnect_at_every_seq_replays_the_rest);
