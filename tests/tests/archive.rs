//! The history archive (decision 0181) on a real nats-server: a long read of an archived session yields
//! exactly what the log alone yields (seqs and bytes), an archive that does not meet the log (torn,
//! gapped, of another format, left over from a deleted log) is ignored, and a delete removes it. The
//! last test runs the real binary: a Watch from 0 through the gateway of `turnstile dev --nats` on a
//! session its owner archived.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../journal/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::StreamExt as _;
use prost::Message as _;
use turnstile_journal::jetstream::archive::{CHUNK_EVENTS, Chunk, HEADER_ARCHIVE_FORMAT};
use turnstile_journal::jetstream::subjects;
use turnstile_journal::{JetStreamConfig, JetStreamLog, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::InjectMode;
use turnstile_tests::nats::NatsServer;
use turnstile_tests::{DevOptions, DevServer, Session, user_msg};

use common::{batch, session};

/// Generous bound on waits that only expire when something is broken.
const WAIT: Duration = Duration::from_secs(60);

async fn connect(server: &NatsServer) -> JetStreamLog {
    JetStreamLog::connect(JetStreamConfig::new(server.url())).await.expect("the journal connects")
}

async fn js(server: &NatsServer) -> jetstream::Context {
    jetstream::new(async_nats::connect(server.url()).await.unwrap())
}

/// Writes `n` events to a new session: mostly one event per append (as injects are), every seventh
/// append a group of three, so chunks hold both.
async fn write(log: &JetStreamLog, s: &SessionRef, n: u64) {
    let mut last = log.last_seq(s).await.unwrap();
    let mut i = 0;
    while last < n {
        let size = if i % 7 == 6 { 3.min(n - last) } else { 1 };
        last = log.append(s, last, &batch(s, last + 1, size, "w"), None).await.unwrap();
        i += 1;
    }
}

/// Every event after `after` through `last` as a Watch sends them (`tail_as_sent`), encoded.
async fn watched(log: &JetStreamLog, s: &SessionRef, after: u64, last: u64) -> Vec<(u64, Vec<u8>)> {
    let mut tail = log.tail_as_sent(s, after).await.unwrap();
    let mut out = Vec::new();
    while out.len() < (last - after) as usize {
        let event = tokio::time::timeout(WAIT, tail.next()).await.unwrap().unwrap().unwrap();
        out.push((event.seq, event.encode_to_vec()));
    }
    out
}

/// The archive stream's consumers: a tail that reads the archive holds one while it is open.
async fn archive_readers(server: &NatsServer) -> usize {
    let mut stream = js(server).await.get_stream(subjects::archive_stream_name(0)).await.unwrap();
    stream.info().await.unwrap().state.consumer_count
}

/// The archive's messages of `s` (headers and bodies), in order.
async fn archive_messages(server: &NatsServer, s: &SessionRef) -> Vec<(Chunk, Vec<u8>)> {
    let stream = js(server).await.get_stream(subjects::archive_stream_name(0)).await.unwrap();
    let subject = subjects::archive_subject(0, s);
    let mut out: Vec<(Chunk, Vec<u8>)> = Vec::new();
    let mut from = 1;
    loop {
        match stream.raw_message_builder().next_by_subject(subject.clone()).sequence(from).send().await {
            Ok(m) => {
                out.push((Chunk::of(Some(&m.headers)).expect("a chunk of this format"), m.payload.to_vec()));
                from = m.sequence + 1;
            }
            Err(e) if e.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => return out,
            Err(e) => panic!("{e}"),
        }
    }
}

/// What a long read yields before archiving, the archive written, and the same reads after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_an_archived_session_yield_exactly_what_the_log_yields() {
    let server = NatsServer::start().await.unwrap();
    let log = connect(&server).await;
    let s = session("acme", "long");
    write(&log, &s, 2_600).await;
    let before = watched(&log, &s, 0, 2_600).await;
    let loaded = log.read_after(&s, 0, None).await.unwrap().unwrap();
    let behind = watched(&log, &s, 1_234, 2_600).await;

    // Whole chunks of whole log messages, at most through the seq given.
    let reached = log.archive(&s, 2_500).await.unwrap();
    let chunks = archive_messages(&server, &s).await;
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    assert_eq!(reached, chunks[1].0.last);
    assert_eq!(chunks[0].0.first, 1);
    assert_eq!(chunks[1].0.first, chunks[0].0.last + 1);
    assert!(chunks.iter().all(|(c, _)| c.last - c.first + 1 >= CHUNK_EVENTS && c.last - c.first < CHUNK_EVENTS + 3));
    // A chunk's body is the SessionEventGroup of its events, as stored.
    let group = pb::SessionEventGroup::decode(chunks[0].1.as_slice()).unwrap();
    assert_eq!(group.events.len() as u64, chunks[0].0.last);
    // Nothing more is due before another whole chunk: a second call writes nothing.
    assert_eq!(log.archive(&s, 2_600).await.unwrap(), reached);
    assert_eq!(archive_messages(&server, &s).await.len(), 2);

    // The archive is read (the tail holds a reader on the archive stream) and the items are the log's.
    let mut tail = log.tail_as_sent(&s, 0).await.unwrap();
    let first = tokio::time::timeout(WAIT, tail.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((first.seq, first.encode_to_vec()), before[0]);
    assert_eq!(archive_readers(&server).await, 1, "a Watch from 0 reads the archive");
    drop(tail);
    assert_eq!(watched(&log, &s, 0, 2_600).await, before);
    assert_eq!(watched(&log, &s, 1_234, 2_600).await, behind);
    // A fresh process (no cache) loads the same events through the archive.
    let cold = connect(&server).await;
    assert_eq!(cold.read_after(&s, 0, None).await.unwrap().unwrap(), loaded);
    assert_eq!(watched(&cold, &s, 0, 2_600).await, before);
    // And the tail goes on past the log's end.
    log.append(&s, 2_600, &batch(&s, 2_601, 2, "w"), None).await.unwrap();
    let mut tail = log.tail_as_sent(&s, 0).await.unwrap();
    let mut seqs = Vec::new();
    while seqs.len() < 2_602 {
        seqs.push(tokio::time::timeout(WAIT, tail.next()).await.unwrap().unwrap().unwrap().seq);
    }
    assert_eq!(seqs, (1..=2_602).collect::<Vec<_>>());
}

/// Publishes a message on the session's archive subject as a writer that got it wrong would have.
async fn publish_chunk(server: &NatsServer, s: &SessionRef, headers: async_nats::HeaderMap, body: Vec<u8>) {
    js(server)
        .await
        .publish_with_headers(subjects::archive_subject(0, s), headers, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Archives that do not meet the log are read around, never trusted: a chunk whose body disagrees with
/// its headers, a chunk that does not follow the one before, a chunk of a newer archive format, and an
/// archive left over from a log deleted without it (a build that knew no archive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_that_does_not_meet_the_log_is_ignored() {
    let server = NatsServer::start().await.unwrap();
    let log = connect(&server).await;

    // Torn: the first chunk is valid, the second claims more events than its body holds.
    let s = session("acme", "torn");
    write(&log, &s, 2_400).await;
    let want = watched(&log, &s, 0, 2_400).await;
    log.archive(&s, 1_100).await.unwrap();
    let chunks = archive_messages(&server, &s).await;
    assert_eq!(chunks.len(), 1);
    let (good, body) = &chunks[0];
    // Its end is real (the log message holding seq 2,000), so only its body betrays it.
    let (log_last, last) = stream_seq_of(&server, &s, 2_000).await.unwrap();
    let torn = Chunk { first: good.last + 1, last, log_first: good.log_last + 1, log_last };
    publish_chunk(&server, &s, torn.headers(), body[..body.len() / 2].to_vec()).await;
    assert_eq!(watched(&log, &s, 0, 2_400).await, want, "a torn chunk: the log from where the archive failed");

    // Gapped: a chunk that skips seqs.
    let s = session("acme", "gapped");
    write(&log, &s, 2_400).await;
    let want = watched(&log, &s, 0, 2_400).await;
    log.archive(&s, 1_100).await.unwrap();
    let (good, body) = archive_messages(&server, &s).await.remove(0);
    let (log_last, last) = stream_seq_of(&server, &s, 2_200).await.unwrap();
    let gap = Chunk { first: good.last + 5, last, log_first: good.log_last + 5, log_last };
    publish_chunk(&server, &s, gap.headers(), body).await;
    assert_eq!(watched(&log, &s, 0, 2_400).await, want, "a gap: the log from the seq after the good chunk");

    // Another archive format: left to the build that wrote it, and not read.
    let s = session("acme", "newer");
    write(&log, &s, 1_200).await;
    let want = watched(&log, &s, 0, 1_200).await;
    let (log_last, last) = stream_seq_of(&server, &s, 1_100).await.unwrap();
    let chunk = Chunk { first: 1, last, log_first: 1, log_last };
    let mut headers = chunk.headers();
    headers.insert(HEADER_ARCHIVE_FORMAT, "2");
    publish_chunk(&server, &s, headers, b"not this build's layout".to_vec()).await;
    assert_eq!(watched(&log, &s, 0, 1_200).await, want);
    assert_eq!(log.archive(&s, 1_200).await.unwrap(), 0, "this build does not write over it");

    // Left over: the log purged as a build without archives deletes, and a longer new log under the same
    // id, so only the proof that the archive's end is still the log's rejects it.
    let s = session("acme", "reused");
    write(&log, &s, 2_300).await;
    log.archive(&s, 2_300).await.unwrap();
    assert_eq!(archive_messages(&server, &s).await.len(), 2);
    let events = js(&server).await.get_stream(subjects::stream_name(0)).await.unwrap();
    events.purge().filter(subjects::event_subject(0, &s)).await.unwrap();
    let fresh = connect(&server).await;
    write(&fresh, &s, 3_500).await;
    // The readers of the archives above give their consumers back in the background.
    let deadline = tokio::time::Instant::now() + WAIT;
    while archive_readers(&server).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the archive readers above were not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut tail = fresh.tail_as_sent(&s, 0).await.unwrap();
    let first = tokio::time::timeout(WAIT, tail.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.seq, 1);
    assert_eq!(archive_readers(&server).await, 0, "the old archive is not read");
    drop(tail);
    let want = watched(&fresh, &s, 0, 3_500).await;
    assert_eq!(want.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), (1..=3_500).collect::<Vec<_>>());
    assert_eq!(fresh.read_after(&s, 0, None).await.unwrap().unwrap().len(), 3_500);
    // The owner's next archiving purges it and starts over from the new log.
    let reached = fresh.archive(&s, 3_500).await.unwrap();
    let chunks = archive_messages(&server, &s).await;
    assert_eq!((chunks.len(), chunks[0].0.first, chunks[2].0.last), (3, 1, reached));
    assert_eq!(watched(&fresh, &s, 0, 3_500).await, want);
}

/// The stream sequence and last seq of the log message of `s` holding `seq`.
async fn stream_seq_of(server: &NatsServer, s: &SessionRef, seq: u64) -> Option<(u64, u64)> {
    let stream = js(server).await.get_stream(subjects::stream_name(0)).await.unwrap();
    let subject = subjects::event_subject(0, s);
    let mut from = 1;
    loop {
        let m = stream.raw_message_builder().next_by_subject(subject.clone()).sequence(from).send().await.ok()?;
        let first: u64 = m.headers.get("Turnstile-Seq")?.as_str().parse().ok()?;
        let last: u64 = m.headers.get("Turnstile-Last-Seq").map_or(Some(first), |v| v.as_str().parse().ok())?;
        if (first..=last).contains(&seq) {
            return Some((m.sequence, last));
        }
        from = m.sequence + 1;
    }
}

/// `DeleteSession` removes the archive with the log, even when the log is already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_removes_the_archive() {
    let server = NatsServer::start().await.unwrap();
    let log = connect(&server).await;
    let s = session("acme", "deleted");
    write(&log, &s, 1_100).await;
    assert!(log.archive(&s, 1_100).await.unwrap() >= CHUNK_EVENTS);
    assert_eq!(archive_messages(&server, &s).await.len(), 1);
    assert_eq!(log.delete(&s).await.unwrap(), 1_100);
    let archive = js(&server).await.get_stream(subjects::archive_stream_name(0)).await.unwrap();
    let gone = archive.get_last_raw_message_by_subject(&subjects::archive_subject(0, &s)).await.unwrap_err();
    assert_eq!(gone.kind(), LastRawMessageErrorKind::NoMessageFound);
    // A new log under the name archives from its own seq 1.
    write(&log, &s, 1_050).await;
    assert!(log.archive(&s, 1_050).await.unwrap() >= CHUNK_EVENTS);
    assert_eq!(archive_messages(&server, &s).await[0].0.first, 1);
}

/// The real binary: `turnstile dev --nats` archives a long session as its owner snapshots it (every 100
/// events by default); a Watch from 0 through its gateway yields exactly the events the log stores, the
/// same as once the archive is purged; `DeleteSession` removes the archive with the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_archives_and_a_watch_from_0_yields_the_stored_log() {
    let nats = NatsServer::start().await.unwrap();
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let s = server.session();
    s.configure("scripted", InjectMode::OutOfTurn).await.unwrap();
    let mut n = 0;
    while s.info().await.unwrap().last_seq < 1_250 {
        for _ in 0..50 {
            s.inject(user_msg(&format!("i{n}"), &format!("note {n}"))).await.unwrap();
            n += 1;
        }
    }
    let last = s.info().await.unwrap().last_seq;
    let r = s.reference();
    let session = SessionRef::new(&r.tenant, &r.id).unwrap();
    // The owner archives after a snapshot, in the background: wait for its first chunk.
    let deadline = tokio::time::Instant::now() + WAIT;
    let chunks = loop {
        let chunks = archive_messages(&nats, &session).await;
        if !chunks.is_empty() {
            break chunks;
        }
        assert!(tokio::time::Instant::now() < deadline, "the owner wrote no archive chunk");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(chunks[0].0.first, 1);
    assert!(chunks[0].0.last >= CHUNK_EVENTS, "{:?}", chunks[0].0);

    // The log as stored, each event's protobuf.
    let stream = js(&nats).await.get_stream(subjects::stream_name(0)).await.unwrap();
    let mut stored = Vec::new();
    let mut from = 1;
    while let Ok(m) =
        stream.raw_message_builder().next_by_subject(subjects::event_subject(0, &session)).sequence(from).send().await
    {
        stored.extend(
            pb::SessionEventGroup::decode(m.payload.as_ref()).unwrap().events.iter().map(|e| e.encode_to_vec()),
        );
        from = m.sequence + 1;
    }
    assert_eq!(stored.len() as u64, last);

    let encoded = |events: Vec<pb::SessionEvent>| events.iter().map(|e| e.encode_to_vec()).collect::<Vec<_>>();
    let (archived, caught_up) = s.replay(0).await.unwrap();
    assert_eq!(caught_up, last);
    assert_eq!(encoded(archived), stored, "a Watch from 0 with the archive");
    let archive = js(&nats).await.get_stream(subjects::archive_stream_name(0)).await.unwrap();
    archive.purge().filter(subjects::archive_subject(0, &session)).await.unwrap();
    let (log_only, _) = s.replay(0).await.unwrap();
    assert_eq!(encoded(log_only), stored, "a Watch from 0 without it");

    // A new process archives again from its first snapshot (the old one remembers its archive's end and
    // would wait for another 1,000 events); then the session is deleted with its archive.
    server.stop().await;
    let server = DevServer::start_with(DevOptions::nats(nats.url())).await.unwrap();
    let s = Session::with_ref(server.client(), r);
    for i in 0..120 {
        s.inject(user_msg(&format!("more{i}"), "more")).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while archive_messages(&nats, &session).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the owner did not archive again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.delete().await.unwrap();
    let gone = archive.get_last_raw_message_by_subject(&subjects::archive_subject(0, &session)).await.unwrap_err();
    assert_eq!(gone.kind(), LastRawMessageErrorKind::NoMessageFound);
    server.stop().await;
}
