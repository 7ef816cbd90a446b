//! The session index's writes behind in batches (`turnstile_journal::jetstream::KvIndex`, decision 0177) on
//! a real nats-server: a session's changes within the writer's window cost one put; a flush writes what is
//! held back and returns once it is in the bucket; closing the index writes the rest; another node's mirror
//! sees the latest entry of every session; the writer's own echo is skipped without being decoded. A
//! change of nothing but a session's activity against what the bucket holds waits for the activity refresh
//! (decision 0198); a status change, a removal, a flush and the refresh itself write it.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use async_nats::jetstream;
use turnstile_journal::jetstream::{INDEX_BUCKET, KvIndex};
use turnstile_journal::{IndexEntry, SessionIndex};
use turnstile_model::Status;
use turnstile_model::{SessionRef, SessionState, SessionSummary};
use turnstile_tests::nats::NatsServer;

/// A window no test waits out: only a flush or the close writes.
const NEVER: Duration = Duration::from_secs(3600);

/// Generous bound on waits that only expire when something is broken.
const WAIT: Duration = Duration::from_secs(30);

fn entry(id: &str, last_seq: u64) -> IndexEntry {
    let mut state = SessionState::new(SessionRef::new("acme", id).unwrap(), 10);
    state.last_seq = last_seq;
    state.last_time_ms = last_seq;
    IndexEntry::of(&state, SessionSummary::of(&state, String::new(), "scripted".into()))
}

/// Puts the index bucket's stream has taken so far (its last sequence: one per put or purge).
async fn puts(client: &async_nats::Client) -> u64 {
    let js = jetstream::new(client.clone());
    let mut stream = js.get_stream(format!("KV_{INDEX_BUCKET}")).await.unwrap();
    stream.info().await.unwrap().state.last_sequence
}

/// The entry the bucket holds for `acme.<id>`.
async fn held(client: &async_nats::Client, id: &str) -> Option<IndexEntry> {
    let bucket = jetstream::new(client.clone()).get_key_value(INDEX_BUCKET).await.unwrap();
    bucket.get(format!("acme.{id}")).await.unwrap().map(|v| serde_json::from_slice(&v).unwrap())
}

/// Waits until the bucket's stream has taken `n` puts (up to [`WAIT`]).
async fn until_puts(client: &async_nats::Client, n: u64) {
    let deadline = Instant::now() + WAIT;
    while puts(client).await < n {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {n} puts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `id`'s entry at `last_seq`, with `status`, its last activity at `ms`.
fn at(id: &str, last_seq: u64, status: Status, ms: u64) -> IndexEntry {
    let mut e = entry(id, last_seq);
    e.summary.status = status;
    e.summary.last_time_ms = ms;
    e
}

/// Waits until `what` holds (up to [`WAIT`]).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn changes_within_the_window_cost_one_put_each_session_and_a_flush_writes_them() {
    let server = NatsServer::start().await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let writer = KvIndex::open_with_window(&client, 1, NEVER).await.unwrap();
    let other = async_nats::connect(server.url()).await.unwrap();
    let reader = KvIndex::open(&other, 1).await.unwrap();

    // Fifty changes of one session and one of another, with the runtime free to run the writer between.
    for seq in 1..=50 {
        writer.submit(entry("busy", seq));
        tokio::task::yield_now().await;
    }
    writer.submit(entry("quiet", 1));
    // The writing node's own queries see every change at once.
    assert_eq!(writer.get(&SessionRef::new("acme", "busy").unwrap()).unwrap().summary.last_seq, 50);
    assert_eq!(writer.pending_writes(), 2, "one write queued per session");
    assert_eq!(puts(&client).await, 0, "nothing is put before the window ends");

    writer.flush().await;
    assert_eq!(puts(&client).await, 2, "the flush wrote one put per session, and it was in the bucket on return");
    let busy = SessionRef::new("acme", "busy").unwrap();
    until("the other node's mirror to see the latest entry", || {
        reader.get(&busy).is_some_and(|e| e.summary.last_seq == 50)
    })
    .await;
    assert_eq!(reader.get(&SessionRef::new("acme", "quiet").unwrap()), Some(entry("quiet", 1)));
    // The writer's mirror got both echoes and skipped them; the reader, which wrote nothing, decoded both.
    until("the writer's mirror to skip its two echoes", || writer.echoes_skipped() == 2).await;
    assert_eq!(reader.echoes_skipped(), 0);
    assert_eq!(writer.get(&busy).unwrap().summary.last_seq, 50, "skipping the echo lost nothing");
}

#[tokio::test]
async fn a_closed_index_writes_what_it_held_back() {
    let server = NatsServer::start().await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let writer = KvIndex::open_with_window(&client, 1, NEVER).await.unwrap();
    writer.submit(entry("s", 7));
    writer.remove(&SessionRef::new("acme", "gone").unwrap());
    // The process stops without a flush: dropping the index ends the window.
    drop(writer);
    let other = async_nats::connect(server.url()).await.unwrap();
    let reader = KvIndex::open(&other, 1).await.unwrap();
    let s = SessionRef::new("acme", "s").unwrap();
    until("the held-back entry to reach the bucket", || reader.get(&s).is_some()).await;
    assert_eq!(reader.get(&s), Some(entry("s", 7)));
}

/// `turnstile dev --nats` stopped right after a turn ended: the session's last entry (idle, at the log's
/// last seq), still inside the writer's window, is in the bucket when the process has exited.
#[tokio::test]
async fn a_stopped_dev_server_has_written_its_sessions_last_entries() {
    let nats = NatsServer::start().await.unwrap();
    let server = turnstile_tests::DevServer::start_with(turnstile_tests::DevOptions::nats(nats.url())).await.unwrap();
    let session = server.session();
    session.followup(turnstile_tests::user_msg("m1", "hello")).await.unwrap();
    let idle = session.when_idle().await.unwrap();
    let r = session.reference();
    server.stop().await;

    let client = async_nats::connect(nats.url()).await.unwrap();
    let bucket = jetstream::new(client).get_key_value(INDEX_BUCKET).await.unwrap();
    let value = bucket.get(format!("{}.{}", r.tenant, r.id)).await.unwrap().expect("the session's entry was written");
    let written: IndexEntry = serde_json::from_slice(&value).unwrap();
    assert_eq!(written.summary.last_seq, idle.last_seq, "the last entry, not an earlier one");
    assert_eq!(written.summary.status, turnstile_model::Status::Idle);
}

/// Decision 0198 on a real nats-server, with a writer that puts as soon as it can (no window) and never
/// refreshes activity by the clock (an hour): what it puts and what it keeps back, told apart by the
/// bucket's stream sequence once a later write of another session is put (the writer puts batch by batch,
/// and this runtime's one thread runs it only when the test waits).
#[tokio::test]
async fn a_change_of_activity_alone_is_held_back_and_anything_else_is_put() {
    let server = NatsServer::start().await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let writer = KvIndex::open_with_periods(&client, 1, Duration::ZERO, NEVER).await.unwrap();
    let s = SessionRef::new("acme", "s").unwrap();

    writer.submit(at("s", 1, Status::Idle, 1_000));
    until_puts(&client, 1).await;
    // A followup later: running, then idle again, with only its activity moved (by less than the refresh).
    writer.submit(at("s", 2, Status::Running, 1_400));
    // The followup's turn moved the session's last turn too: no query filters on it.
    let mut idle = at("s", 4, Status::Idle, 1_410);
    idle.summary.last_turn += 1;
    writer.submit(idle);
    writer.submit(at("other", 1, Status::Idle, 1_000));
    until_puts(&client, 2).await;
    assert_eq!(held(&client, "other").await, Some(at("other", 1, Status::Idle, 1_000)));
    assert_eq!(held(&client, "s").await, Some(at("s", 1, Status::Idle, 1_000)), "activity alone is held back");
    assert_eq!(writer.pending_writes(), 1, "and still queued");
    assert_eq!(writer.get(&s).unwrap().summary.last_seq, 4, "the node's own queries see it at once");

    // A status change is put at once, whatever waits.
    writer.submit(at("s", 5, Status::Running, 1_500));
    until_puts(&client, 3).await;
    assert_eq!(held(&client, "s").await.unwrap().summary.status, Status::Running);
    assert_eq!(writer.pending_writes(), 0);

    // Activity moved by the refresh or more (an hour here) is put at once.
    writer.submit(at("s", 6, Status::Running, 1_500 + 3_600_000));
    until_puts(&client, 4).await;
    assert_eq!(held(&client, "s").await.unwrap().summary.last_seq, 6);

    // Activity alone again: held back until a flush, which writes it.
    writer.submit(at("s", 7, Status::Running, 1_501 + 3_600_000));
    writer.submit(at("other", 2, Status::Running, 1_000));
    until_puts(&client, 5).await;
    assert_eq!(held(&client, "s").await.unwrap().summary.last_seq, 6, "held back");
    writer.flush().await;
    assert_eq!(puts(&client).await, 6, "the flush returned with it put");
    assert_eq!(held(&client, "s").await.unwrap().summary.last_seq, 7);

    // A removal is put at once.
    writer.remove(&s);
    until_puts(&client, 7).await;
    assert_eq!(held(&client, "s").await, None);
}

/// A session that goes quiet after a change of activity alone gets it written once the refresh passes.
#[tokio::test]
async fn a_held_back_activity_is_written_when_its_refresh_passes() {
    let server = NatsServer::start().await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let writer = KvIndex::open_with_periods(&client, 1, Duration::ZERO, Duration::from_millis(200)).await.unwrap();
    writer.submit(at("s", 1, Status::Idle, 1_000));
    until_puts(&client, 1).await;
    writer.submit(at("s", 2, Status::Idle, 1_001));
    // No flush, no other write: only the refresh writes it.
    until_puts(&client, 2).await;
    assert_eq!(held(&client, "s").await.unwrap().summary.last_seq, 2);
    assert_eq!(writer.pending_writes(), 0);
}
