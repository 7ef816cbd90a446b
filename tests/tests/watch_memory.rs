//! Watch streams whose clients never read (issue 37, decision 0088): a real `turnstile dev`, ten Watch
//! streams each on its own gRPC connection that read their `caught_up` and then nothing, while the session
//! produces large events. What the gateway holds for them is bounded in bytes: the process grows by less
//! than [`GROWTH_LIMIT`] the whole time (measured from `/proc/PID/status`; before the bound, 256 items of
//! any size per stream: ~430 MB at 60 such turns), every stream is cut with UNAVAILABLE naming the seq to resume
//! after, once cut they hold no feed and no buffered byte, and a client that resumes from there gets every
//! durable event exactly once.
//!
//! A memory bound, not a timing: the turns are paced by `WhenIdle` and every wait is on a condition.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tonic::transport::Endpoint;
use turnstile_proto::v1::WatchRequest;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::watch_item::Item;
use turnstile_tests::watch::{ResumingWatch, durable_events};
use turnstile_tests::{DevOptions, DevServer, user_msg};

const WATCHERS: usize = 10;
/// The text of each followup; the scripted agent echoes it, so a turn brings about three times this.
const TEXT_BYTES: usize = 256 * 1024;
const TURNS: usize = 16;
/// What the process may grow by while its watchers are stuck: the ten watchers' `limits.watch_buffer_bytes`
/// (4 MiB each, if no item were shared), the in-memory journal's copy of the turns (~12 MiB) and the
/// allocator's slack. Measured with mimalloc told to return freed pages at once
/// (`DevOptions::measuring_memory`, decision 0197): +33–37 MB at the peak, +32–41 MB once cut; with glibc's
/// malloc +22.5 MB. Before the bound this test's process reached 285 MB (decision 0088). A bound on growth,
/// not on the whole process: mimalloc's start-up RSS is ~15 MB higher than glibc's.
const GROWTH_LIMIT: u64 = 80 * 1024 * 1024;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(30);

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[tokio::test]
async fn stuck_watchers_are_bounded_in_bytes_cut_and_resume_without_loss() {
    let server = DevServer::start_with(DevOptions::measuring_memory()).await.unwrap();
    let s = server.session();
    let rss = || server.rss_bytes().expect("the server is running");
    let before = rss();

    // Each on its own connection, as separate clients would be; each reads its caught_up, then nothing.
    let mut stuck = Vec::new();
    for _ in 0..WATCHERS {
        let channel = Endpoint::from_shared(server.url()).unwrap().connect().await.unwrap();
        let mut client = AgentClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
        let request = WatchRequest { session: Some(s.reference()), after_seq: 0, live: true, resume: None };
        let mut stream = client.watch(request).await.unwrap().into_inner();
        let first = tokio::time::timeout(PATIENCE, stream.message()).await.unwrap().unwrap().unwrap();
        assert!(matches!(first.item, Some(Item::CaughtUp(_))), "{first:?}");
        stuck.push((client, stream, first));
    }

    let text = "x".repeat(TEXT_BYTES);
    let mut peak = rss();
    for i in 0..TURNS {
        s.followup(user_msg(&format!("m{i}"), &text)).await.unwrap();
        s.when_idle().await.unwrap();
        peak = peak.max(rss());
    }
    let (log, last) = s.replay(0).await.unwrap();
    println!(
        "{WATCHERS} stuck watchers, {TURNS} turns of {} KiB: RSS {:.1} MB before, peak {:.1} MB",
        TEXT_BYTES / 1024,
        mb(before),
        mb(peak)
    );
    let grown = peak.saturating_sub(before);
    assert!(grown < GROWTH_LIMIT, "the server grew by {:.1} MB with {WATCHERS} stuck watchers", mb(grown));

    // Each stream was cut: read now, it brings what its connection had taken, then UNAVAILABLE naming the
    // last seq it sent.
    let mut watches = Vec::new();
    for (client, stream, first) in stuck {
        let mut watch = ResumingWatch::from_stream(client, s.reference(), stream, vec![first]);
        watch.until_cut().await.unwrap();
        watches.push(watch);
    }

    // Cut, they hold nothing: no feed, no buffered byte, and the memory is back.
    let released = tokio::time::timeout(PATIENCE, async {
        loop {
            let feeds = server.metric("turnstile_watch_feeds_open").await;
            let bytes = server.metric("turnstile_watch_buffered_bytes").await;
            if feeds == Some(0.0) && bytes == Some(0.0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "the gateway kept {:?} feeds and {:?} bytes for cut watchers",
        server.metric("turnstile_watch_feeds_open").await,
        server.metric("turnstile_watch_buffered_bytes").await
    );
    let after = rss();
    println!("RSS once they were cut: {:.1} MB", mb(after));
    let grown = after.saturating_sub(before);
    assert!(grown < GROWTH_LIMIT, "the server still held {:.1} MB more after cutting its watchers", mb(grown));

    // Resumed from where the cut said, each gets the rest: every durable event once, in order.
    for (i, mut watch) in watches.into_iter().enumerate() {
        watch.until_seq(last).await.unwrap();
        assert_eq!(watch.cuts, 1, "watcher {i}");
        assert_eq!(durable_events(&watch.items), log, "watcher {i}: every event once, none missing");
    }
}

/// A client that stopped reading its Watch does not hold the server's stop: on SIGTERM the server ends its
/// calls and, after `turnstile_ops::grpc::STOP_GRACE` (10 s), closes the connections still open and exits
/// by itself. Before the bound it ran until SIGKILL (30 s and more measured), which made every gateway of a
/// rolling upgrade take its whole termination grace when one client did not read.
#[tokio::test]
async fn a_watcher_that_never_reads_does_not_hold_the_stop() {
    let mut server = DevServer::start().await.unwrap();
    let s = server.session();
    let channel = Endpoint::from_shared(server.url()).unwrap().connect().await.unwrap();
    let mut client = AgentClient::new(channel);
    let request = WatchRequest { session: Some(s.reference()), after_seq: 0, live: true, resume: None };
    let mut stream = client.watch(request).await.unwrap().into_inner();
    let first = tokio::time::timeout(PATIENCE, stream.message()).await.unwrap().unwrap().unwrap();
    assert!(matches!(first.item, Some(Item::CaughtUp(_))), "{first:?}");
    // More than the connection's windows and buffers take, so the server's writes to it are stuck.
    let text = "x".repeat(TEXT_BYTES);
    for i in 0..TURNS {
        s.followup(user_msg(&format!("m{i}"), &text)).await.unwrap();
        s.when_idle().await.unwrap();
    }

    server.terminate().unwrap();
    let exited = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(status) = server.exited() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let status = exited.unwrap_or_else(|_| panic!("still running {PATIENCE:?} after SIGTERM\n{}", server.log_tail()));
    assert!(status.contains("exit status: 0"), "{status}\n{}", server.log_tail());
    assert!(log.contains("calls still open after the stop grace"), "it stopped without the bound: {log}");
    drop(stream);
}
