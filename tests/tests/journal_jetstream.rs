//! The JetStream journal (`turnstile_journal::jetstream`) on a real nats-server: the shared `SessionLog`
//! contract suite, then what only a server shows (two connections racing, atomic batches, restarts,
//! connect failures, stream verification, the live bus on core NATS).
//!
//! Below the gRPC API on purpose: this is the backend's own test, run here because the harness owns
//! nats-server. Every test starts its own server (fresh store, free loopback ports).

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../journal/tests/common/mod.rs"]
mod common;
#[macro_use]
#[path = "../../journal/tests/contract/mod.rs"]
mod contract;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use futures::StreamExt as _;
use prost::Message as _;
use tokio::sync::Barrier;
use turnstile_journal::jetstream::subjects;
use turnstile_journal::log::read_all;
use turnstile_journal::{JetStreamConfig, JetStreamLog, JournalError, LiveBus, NatsBus, SessionLog};
use turnstile_model::{LiveEvent, LivePayload, Status};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;
use turnstile_tests::nats::{NatsCluster, NatsServer};

use common::{batch, session};
use contract::Backend;

/// Generous bound on waits that only expire when something is broken.
const WAIT: Duration = Duration::from_secs(30);

async fn server() -> NatsServer {
    NatsServer::start().await.expect("nats-server starts")
}

async fn connect(server: &NatsServer) -> JetStreamLog {
    JetStreamLog::connect(JetStreamConfig::new(server.url())).await.expect("the journal connects")
}

async fn jetstream_backend() -> Backend {
    let server = server().await;
    let log = connect(&server).await;
    Backend { log: Arc::new(log), _keep: Box::new(server) }
}

/// The same contract with three partitions: sessions spread over three streams.
async fn partitioned_backend() -> Backend {
    let server = server().await;
    let config = JetStreamConfig { partitions: 3, ..JetStreamConfig::new(server.url()) };
    let log = JetStreamLog::connect(config).await.expect("the journal connects");
    Backend { log: Arc::new(log), _keep: Box::new(server) }
}

mod jetstream_one_partition {
    contract_suite!(super::jetstream_backend);
}

mod jetstream_three_partitions {
    contract_suite!(super::partitioned_backend);
}

/// Two writers on separate connections (as two workers would be), both with a warm cache at the same
/// last seq, append at once: exactly one wins, the loser gets `Conflict` with the winner's last seq, and
/// the log holds the winner's events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_two_connections_never_fork() {
    let server = server().await;
    let (a, b) = (Arc::new(connect(&server).await), Arc::new(connect(&server).await));
    race_two_writers(a, b, false).await;
}

/// The same race on R3 streams, each writer connected to another node: the loser gets `Conflict` too,
/// although the stream leader refuses a write that races one still being proposed with code 10164 ("wrong
/// last sequence" without the number), which async-nats does not report as `WrongLastSequence`; taken for
/// an unavailable journal, every such race counted as an append error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_two_connections_never_fork_at_r3() {
    let cluster = NatsCluster::start(3).await.expect("the NATS cluster starts");
    let connect = |i: usize| {
        let config = JetStreamConfig { replicas: 3, ..JetStreamConfig::new(cluster.node(i).url()) };
        async move { Arc::new(JetStreamLog::connect(config).await.expect("the journal connects")) }
    };
    let (a, b) = (connect(0).await, connect(1).await);
    race_two_writers(a, b, true).await;
}

/// `replicated`: the loser's re-read, and the check's, may be answered by a replica that has not applied
/// the winner's write yet (it was still being proposed when the loser was refused), so the loser's
/// `actual` is the winner's last seq or still the expected one, and the log is read until it holds the
/// winner's events.
async fn race_two_writers(a: Arc<JetStreamLog>, b: Arc<JetStreamLog>, replicated: bool) {
    for round in 0..10 {
        let s = session("race", &format!("r{round}"));
        a.append(&s, 0, &batch(&s, 1, 2, "seed"), None).await.unwrap();
        // Both caches now say "last seq 2".
        assert_eq!(b.last_seq(&s).await.unwrap(), 2);
        let barrier = Arc::new(Barrier::new(2));
        let writers: Vec<_> = [("a", Arc::clone(&a)), ("b", Arc::clone(&b))]
            .into_iter()
            .map(|(tag, log)| {
                let (s, barrier) = (s.clone(), Arc::clone(&barrier));
                // Odd rounds race a batch against a single event.
                let n = if tag == "a" { 3 } else { 1 + round % 2 * 2 };
                tokio::spawn(async move {
                    let events = batch(&s, 3, n, tag);
                    barrier.wait().await;
                    (events.clone(), log.append(&s, 2, &events, None).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut losers = Vec::new();
        for writer in writers {
            let (events, result) = writer.await.unwrap();
            match result {
                Ok(last) => winners.push((last, events)),
                Err(JournalError::Conflict { expected, actual, .. }) => losers.push((expected, actual)),
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one writer wins round {round}");
        let (last, events) = winners.remove(0);
        match losers[..] {
            [(2, actual)] if actual == last || replicated && actual == 2 => {}
            _ => panic!("round {round}: losers {losers:?}, the winner's last seq {last}"),
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        let stored = loop {
            let stored = read_all(&*a, &s, 1).await.unwrap();
            if !replicated || stored.len() >= 2 + events.len() || tokio::time::Instant::now() >= deadline {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(stored[2..], events[..], "the winner's events, whole, and nothing of the loser's");
    }
}

/// A multi-event append whose expected seq is stale (another writer got in between, unseen by this one's
/// cache) is refused as a whole: not one of its events is stored.
#[tokio::test]
async fn a_stale_batch_stores_nothing() {
    let server = server().await;
    let (a, b) = (connect(&server).await, connect(&server).await);
    let s = session("acme", "atomic");
    a.append(&s, 0, &batch(&s, 1, 2, "a"), None).await.unwrap();
    assert_eq!(b.last_seq(&s).await.unwrap(), 2);
    a.append(&s, 2, &batch(&s, 3, 1, "a"), None).await.unwrap();
    // b's cache still says 2, so it publishes with the stale stream sequence and the server refuses.
    let err = b.append(&s, 2, &batch(&s, 3, 5, "b"), None).await.unwrap_err();
    assert_eq!(err, JournalError::Conflict { session: s.clone(), expected: 2, actual: 3 });
    let stored = read_all(&b, &s, 1).await.unwrap();
    assert_eq!(stored, batch(&s, 1, 3, "a"));
    // The loser's batch left no trace in the stream either (not merely hidden from `read`): the winner's
    // two appends are two messages (decision 0021).
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut stream = jetstream::new(client).get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 2);
    // And b, now informed, appends after the winner.
    assert_eq!(b.append(&s, 3, &batch(&s, 4, 2, "b"), None).await.unwrap(), 5);
}

/// The server behaviour the backend relies on, checked with plain async-nats against 2.15.1 (ADR-50 atomic
/// batches; see docs/decisions/0004-jetstream-batches.md).
#[tokio::test]
async fn server_atomic_batches_are_all_or_nothing() {
    let server = server().await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    let mut stream = js
        .create_stream(jetstream::stream::Config {
            name: "PROBE".into(),
            subjects: vec!["probe.>".into()],
            allow_atomic_publish: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let headers = |batch: &str, i: usize, expected: Option<u64>, commit: bool| {
        let mut h = HeaderMap::new();
        h.insert("Nats-Batch-Id", batch);
        h.insert("Nats-Batch-Sequence", i.to_string().as_str());
        if let Some(e) = expected {
            h.insert("Nats-Expected-Last-Subject-Sequence", e.to_string().as_str());
        }
        if commit {
            h.insert("Nats-Batch-Commit", "1");
        }
        h
    };
    // (c) A single message with the expected-sequence header and no batch headers.
    let mut single = HeaderMap::new();
    single.insert("Nats-Expected-Last-Subject-Sequence", "0");
    let ack = js.publish_with_headers("probe.s", single, "one".into()).await.unwrap().await.unwrap();
    assert_eq!(ack.sequence, 1);
    // (a) A batch lands whole; the commit's ack answers for it.
    for i in 1..=2 {
        client
            .publish_with_headers("probe.s", headers("good", i, (i == 1).then_some(1), false), "x".into())
            .await
            .unwrap();
    }
    let ack =
        js.publish_with_headers("probe.s", headers("good", 3, None, true), "x".into()).await.unwrap().await.unwrap();
    assert_eq!((ack.sequence, ack.batch_size), (4, Some(3)));
    // (b) A batch whose first message has a stale expected sequence is refused whole, on the commit's ack.
    client.publish_with_headers("probe.s", headers("stale", 1, Some(1), false), "y".into()).await.unwrap();
    client.publish_with_headers("probe.s", headers("stale", 2, None, false), "y".into()).await.unwrap();
    let err = js.publish_with_headers("probe.s", headers("stale", 3, None, true), "y".into()).await.unwrap().await;
    let err = err.unwrap_err();
    assert_eq!(err.kind(), jetstream::context::PublishErrorKind::WrongLastSequence, "{err}");
    assert_eq!(stream.info().await.unwrap().state.messages, 4, "nothing of the stale batch is stored");
    // A batch that is never committed stores nothing: an append expecting the last committed sequence
    // still succeeds after it.
    client.publish_with_headers("probe.s", headers("open", 1, Some(4), false), "z".into()).await.unwrap();
    client.flush().await.unwrap();
    let mut next = HeaderMap::new();
    next.insert("Nats-Expected-Last-Subject-Sequence", "4");
    let ack = js.publish_with_headers("probe.s", next, "after".into()).await.unwrap().await.unwrap();
    assert_eq!(ack.sequence, 5);
}

/// A tail on one connection follows a writer on another, through batches of every size, without gap or
/// duplicate; a second tail started midway sees exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_another_writer_without_gaps() {
    const TOTAL: u64 = 200;
    let server = server().await;
    let (reader, writer) = (connect(&server).await, Arc::new(connect(&server).await));
    let s = session("acme", "follow");
    let mut early = reader.tail(&s, 0).await.unwrap();
    let task = {
        let (writer, s) = (Arc::clone(&writer), s.clone());
        tokio::spawn(async move {
            let mut last = 0;
            while last < TOTAL {
                let n = (last % 5 + 1).min(TOTAL - last);
                last = writer.append(&s, last, &batch(&s, last + 1, n, "w"), None).await.unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    while seen.len() < 50 {
        seen.push(next(&mut early).await.seq);
    }
    let midway = *seen.last().unwrap();
    let mut late = reader.tail(&s, midway).await.unwrap();
    while seen.last() != Some(&TOTAL) {
        seen.push(next(&mut early).await.seq);
    }
    let mut rest = Vec::new();
    while rest.last() != Some(&TOTAL) {
        rest.push(next(&mut late).await.seq);
    }
    task.await.unwrap();
    assert_eq!(seen, (1..=TOTAL).collect::<Vec<_>>());
    assert_eq!(rest, (midway + 1..=TOTAL).collect::<Vec<_>>());
    // Both tails match what `read` returns.
    assert_eq!(read_all(&reader, &s, 1).await.unwrap(), batch(&s, 1, TOTAL, "w"));
}

async fn next(stream: &mut turnstile_journal::EventStream) -> turnstile_model::Envelope {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("tail failed: {e}"),
        Ok(None) => panic!("tail ended"),
        Err(_) => panic!("no event within {WAIT:?}"),
    }
}

/// Retries `op` while the journal is unavailable (the client reconnecting), within a bound.
async fn until_available<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, JournalError>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match op().await {
            Ok(value) => return value,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still failing: {e}"),
        }
    }
}

/// A restarted server keeps the events (file storage); the same journal value reconnects and goes on, and
/// a fresh connection verifies the existing streams instead of recreating them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_keeps_the_log() {
    let mut server = server().await;
    let log = connect(&server).await;
    let s = session("acme", "durable");
    log.append(&s, 0, &batch(&s, 1, 4, "w"), None).await.unwrap();
    server.restart().await.expect("nats-server restarts");
    assert_eq!(until_available(|| log.last_seq(&s)).await, 4);
    let more = batch(&s, 5, 2, "w");
    assert_eq!(until_available(|| log.append(&s, 4, &more, None)).await, 6);
    let fresh = connect(&server).await;
    assert_eq!(read_all(&fresh, &s, 1).await.unwrap(), batch(&s, 1, 6, "w"));
    // A hard kill as well: what was acknowledged is there after the restart.
    server.kill();
    server.restart().await.expect("nats-server restarts after a kill");
    let after_kill = connect(&server).await;
    assert_eq!(read_all(&after_kill, &s, 1).await.unwrap(), batch(&s, 1, 6, "w"));
}

/// Nothing listens: `connect` fails with `Unavailable` naming the URL, well inside the bound.
#[tokio::test]
async fn connecting_to_nothing_fails_promptly_naming_the_url() {
    // Held bound, never listening, for the whole test.
    let closed = turnstile_tests::ports::ClosedPort::new().unwrap();
    let url = format!("nats://{}", closed.addr());
    let config = JetStreamConfig { connect_timeout: Duration::from_secs(2), ..JetStreamConfig::new(&url) };
    let result = tokio::time::timeout(WAIT, JetStreamLog::connect(config)).await.expect("connect gives up by itself");
    match result {
        Err(JournalError::Unavailable(message)) => assert!(message.contains(&url), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// An event stream made by someone else with another layout is refused, naming the field, and left as is.
#[tokio::test]
async fn a_stream_with_another_layout_is_refused() {
    let server = server().await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    let mut config = JetStreamConfig::new(server.url()).stream_config(0);
    config.storage = jetstream::stream::StorageType::Memory;
    js.create_stream(config).await.unwrap();
    match JetStreamLog::connect(JetStreamConfig::new(server.url())).await {
        Err(JournalError::Storage(message)) => {
            assert!(message.contains("TURNSTILE_EVENTS_0") && message.contains("storage"), "{message}");
        }
        other => panic!("expected Storage, got {other:?}"),
    }
    let mut stream = js.get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.storage, jetstream::stream::StorageType::Memory);
}

/// An append group is one message on the session's subject with the documented headers (seq range, types,
/// epoch, traceparent, the expected-sequence check) and a `SessionEventGroup` body.
#[tokio::test]
async fn an_append_group_is_stored_as_one_message_with_headers() {
    let server = server().await;
    let log = connect(&server).await;
    let s = session("acme", "headers");
    let events = batch(&s, 1, 3, "w");
    log.append(&s, 0, &events, Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")).await.unwrap();
    log.append(&s, 3, &batch(&s, 4, 1, "w"), None).await.unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let stream = jetstream::new(client).get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    let subject = subjects::event_subject(0, &s);
    assert_eq!(subject, "turnstile.ev.0.acme.headers");
    let first = stream.get_raw_message(1).await.unwrap();
    let header = |name: &str| first.headers.get(name).map(|v| v.as_str().to_owned());
    let types: Vec<&str> = events.iter().map(|e| e.event_type()).collect();
    assert_eq!(header("Turnstile-Type"), Some(types.join(",")));
    assert_eq!(header("Turnstile-Seq").as_deref(), Some("1"));
    assert_eq!(header("Turnstile-Last-Seq").as_deref(), Some("3"));
    assert_eq!(header("Turnstile-Epoch").as_deref(), Some("1"));
    assert_eq!(header("Nats-Expected-Last-Subject-Sequence").as_deref(), Some("0"));
    assert!(header("Nats-Batch-Id").is_none(), "a group that fits one message is no atomic batch");
    assert!(header("traceparent").is_some_and(|t| t.starts_with("00-0af7")));
    let group = pb::SessionEventGroup::decode(first.payload.clone()).unwrap();
    let decoded: Vec<_> = group.events.into_iter().map(|e| codec::decode_session_event(e).unwrap()).collect();
    assert_eq!(decoded, events);
    let last = stream.get_last_raw_message_by_subject(&subject).await.unwrap();
    assert_eq!(last.sequence, 2, "two appends, two messages");
    let header = |name: &str| last.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!((header("Turnstile-Seq"), header("Turnstile-Last-Seq")), (Some("4".into()), Some("4".into())));
    assert_eq!(header("Nats-Expected-Last-Subject-Sequence").as_deref(), Some("1"));
}

/// A log written in the old layout (one message per event, bare `SessionEvent` body, no
/// `Turnstile-Last-Seq`) reads the same, and appends go on after it in the new one: every read path
/// (read from each seq, read_after with and without a position, tail, last_seq) over the mixed log.
#[tokio::test]
async fn a_log_of_the_old_layout_reads_and_grows_in_the_new_one() {
    let server = server().await;
    let log = connect(&server).await;
    let s = session("acme", "old-layout");
    let subject = subjects::event_subject(0, &s);
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    for event in batch(&s, 1, 3, "w") {
        let mut headers = HeaderMap::new();
        headers.insert("Turnstile-Type", event.event_type());
        headers.insert("Turnstile-Seq", event.seq.to_string().as_str());
        headers.insert("Turnstile-Epoch", "1");
        js.publish_with_headers(subject.clone(), headers, codec::encode_event(&event).into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    assert_eq!(log.last_seq(&s).await.unwrap(), 3);
    assert_eq!(log.append(&s, 3, &batch(&s, 4, 4, "w"), None).await.unwrap(), 7);
    assert_eq!(log.append(&s, 7, &batch(&s, 8, 1, "w"), None).await.unwrap(), 8);
    let all = batch(&s, 1, 8, "w");
    for from in 1..=8 {
        assert_eq!(log.read(&s, from, 100).await.unwrap(), all[from as usize - 1..], "read from {from}");
        assert_eq!(log.read(&s, from, 1).await.unwrap(), all[from as usize - 1..from as usize], "one at {from}");
    }
    for after in 0..=8 {
        assert_eq!(log.read_after(&s, after, None).await.unwrap().unwrap(), all[after as usize..], "after {after}");
        let mut tail = log.tail(&s, after).await.unwrap();
        for want in after + 1..=8 {
            assert_eq!(next(&mut tail).await.seq, want, "tail after {after}");
        }
    }
    // Positions are message ends: event 3 (old layout, stream seq 3) and event 7 (the group at 4).
    assert_eq!(log.read_after(&s, 3, Some(3)).await.unwrap().unwrap(), all[3..]);
    assert_eq!(log.read_after(&s, 7, Some(4)).await.unwrap().unwrap(), all[7..]);
    assert_eq!(log.read_after(&s, 8, Some(5)).await.unwrap().unwrap(), []);
    assert_eq!(log.read_after(&s, 8, Some(4)).await.unwrap(), None, "not where event 8 is");
    assert_eq!(log.positions().stream_seq_of(&s, 8), Some(5));
}

/// Sessions interleaved in one stream with groups of varying sizes: every seq is found by the binary
/// search (read from it, tail after it), whichever message holds it.
#[tokio::test]
async fn the_search_finds_every_seq_among_groups_of_other_sessions() {
    let server = server().await;
    let log = connect(&server).await;
    let (a, b) = (session("acme", "search-a"), session("acme", "search-b"));
    let (mut last_a, mut last_b) = (0, 0);
    for round in 0..40u64 {
        let n = round % 7 + 1;
        last_a = log.append(&a, last_a, &batch(&a, last_a + 1, n, "a"), None).await.unwrap();
        last_b = log.append(&b, last_b, &batch(&b, last_b + 1, 1 + round % 3, "b"), None).await.unwrap();
    }
    let all = batch(&a, 1, last_a, "a");
    for from in 1..=last_a {
        assert_eq!(log.read(&a, from, 2).await.unwrap(), all[from as usize - 1..(from as usize + 1).min(all.len())]);
    }
    let mut tail = log.tail(&a, last_a - 5).await.unwrap();
    assert_eq!(next(&mut tail).await.seq, last_a - 4);
    assert_eq!(read_all(&log, &b, 1).await.unwrap(), batch(&b, 1, last_b, "b"));
}

/// A group too large for one message (three events of 1.5 MiB against the harness's 4 MiB `max_payload`)
/// is split into messages written as one atomic batch: it lands whole and reads back, and a stale one
/// stores nothing.
#[tokio::test]
async fn an_oversized_group_is_one_atomic_batch_of_messages() {
    let server = server().await;
    let (log, other) = (connect(&server).await, connect(&server).await);
    let s = session("acme", "oversized");
    let big = |seq: u64| {
        let mut event = common::event(&s, seq, "w");
        event.payload = turnstile_model::EventPayload::AssistantMessage {
            turn: 1,
            step: 1,
            text: "x".repeat(3 << 19),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: None,
            usage: None,
            model: None,
        };
        event
    };
    let events: Vec<_> = (1..=3).map(big).collect();
    assert_eq!(log.append(&s, 0, &events, None).await.unwrap(), 3);
    assert_eq!(other.read(&s, 1, 10).await.unwrap(), events);
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut stream = jetstream::new(client).get_stream("TURNSTILE_EVENTS_0").await.unwrap();
    let messages = stream.info().await.unwrap().state.messages;
    assert!(messages > 1, "the group took {messages} message(s)");
    let commit = stream.get_last_raw_message_by_subject(&subjects::event_subject(0, &s)).await.unwrap();
    assert_eq!(commit.headers.get("Nats-Batch-Commit").map(|v| v.as_str().to_owned()).as_deref(), Some("1"));
    // `other` read the log, so its cache says 3; one more append by `log` makes that stale.
    assert_eq!(log.append(&s, 3, &batch(&s, 4, 1, "w"), None).await.unwrap(), 4);
    let stale: Vec<_> = (4..=6).map(big).collect();
    assert_eq!(
        other.append(&s, 3, &stale, None).await.unwrap_err(),
        JournalError::Conflict { session: s.clone(), expected: 3, actual: 4 }
    );
    assert_eq!(stream.info().await.unwrap().state.messages, messages + 1, "the stale batch stored nothing");
}

fn live(session: &turnstile_model::SessionRef, n: u64) -> LiveEvent {
    let payload = if n.is_multiple_of(2) {
        LivePayload::AssistantDelta { turn: 1, step: 1, text: format!("d{n}"), reasoning: false, offset: 0 }
    } else {
        LivePayload::Status { status: Status::Running }
    };
    LiveEvent { session: session.clone(), after_seq: n, payload }
}

/// A plain async-nats subscriber on `turnstile.live.<tenant>.>` sees what `NatsBus` publishes, in order, on
/// the documented subjects; `NatsBus::subscribe` sees only its session's events.
#[tokio::test]
async fn live_events_reach_plain_nats_subscribers_in_order() {
    let server = server().await;
    let bus = NatsBus::connect(&server.url()).await.unwrap();
    let (a, b) = (session("acme", "a"), session("acme", "b"));
    let observer = async_nats::connect(server.url()).await.unwrap();
    let mut wildcard = observer.subscribe("turnstile.live.acme.>").await.unwrap();
    // `flush` would only prove the SUB left this process; the round trip proves the server has it.
    turnstile_journal::jetstream::barrier(&observer).await.unwrap();
    let mut only_a = bus.subscribe(&a).await.unwrap();
    let mut sent = Vec::new();
    for n in 1..=6u64 {
        let event = live(if n.is_multiple_of(3) { &b } else { &a }, n);
        bus.publish(&event).await.unwrap();
        sent.push(event);
    }
    for event in &sent {
        let message = tokio::time::timeout(WAIT, wildcard.next()).await.expect("in time").expect("open");
        assert_eq!(message.subject.as_str(), subjects::live_subject(&event.session, event.event_type()));
        assert_eq!(&codec::decode_live(&message.payload).unwrap(), event);
    }
    for event in sent.iter().filter(|e| e.session == a) {
        let got = tokio::time::timeout(WAIT, only_a.next()).await.expect("in time").expect("open");
        assert_eq!(&got, event);
    }
    assert!(sent.iter().any(|e| e.event_type() == "agent/status"));
    assert_eq!(subjects::live_subject(&a, "agent/status"), "turnstile.live.acme.a.agent.status");
}

/// `NatsBus::subscribe` returns only once the server has the subscription: an event published right
/// after, from another connection, is delivered.
#[tokio::test]
async fn a_bus_subscription_is_live_when_subscribe_returns() {
    let server = server().await;
    let (subscriber, publisher) =
        (NatsBus::connect(&server.url()).await.unwrap(), NatsBus::connect(&server.url()).await.unwrap());
    for round in 0..20 {
        let s = session("acme", &format!("fresh{round}"));
        let mut stream = subscriber.subscribe(&s).await.unwrap();
        publisher.publish(&live(&s, 1)).await.unwrap();
        let got = tokio::time::timeout(WAIT, stream.next()).await.expect("in time").expect("open");
        assert_eq!(got, live(&s, 1));
    }
}
