//! [`JetStreamLog`]: a session log on JetStream streams, and the store operations its
//! [`SessionLog`](crate::SessionLog) implementation (`session_log`), its tails (`tail`) and its deletes
//! (`delete`) are made of: locating a session's subject, the last-event cache, publishing a group, reading
//! through ordered consumers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::header::{
    NATS_BATCH_COMMIT, NATS_BATCH_COMMIT_FINAL, NATS_BATCH_ID, NATS_BATCH_SEQUENCE, NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
};
use async_nats::jetstream;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use futures::StreamExt as _;

use super::config::{JetStreamConfig, ensure_stream};
use super::refusals::{self, unavailable};
use super::{group, subjects};
use crate::log::JournalError;
use crate::sync::lock;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;

/// The most events one append may carry (the server's default cap on an atomic batch, which bounds an
/// oversized group split into messages too).
pub const MAX_BATCH: usize = 1000;

/// Entries in the last-seq cache before it is emptied. A miss costs one message get, so a crude bound is
/// enough to keep a long-running worker's memory flat.
const CACHE_LIMIT: usize = 100_000;

/// Where a session's log ends: its last seq and the stream sequence of the message holding it (always
/// that message's last event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LastEvent {
    pub seq: u64,
    pub stream_seq: u64,
}

/// A checked group: its events' encoded bodies and how they split into messages.
pub(super) struct Prepared {
    bodies: Vec<Vec<u8>>,
    runs: Vec<std::ops::Range<usize>>,
}

/// Why [`JetStreamLog::publish`] wrote nothing (or may have).
pub(super) enum Refusal {
    /// The subject's last message is not the expected one: nothing was written.
    WrongLastSequence,
    Failed(JournalError),
}

/// A [`SessionLog`](crate::SessionLog) on JetStream: one stream per partition, one subject per session, one message per
/// append group. Cheap to share behind an `Arc`; every call goes to the server, only the last-seq cache is local.
pub struct JetStreamLog {
    config: JetStreamConfig,
    client: async_nats::Client,
    js: jetstream::Context,
    /// `streams[p]` is partition p's stream.
    streams: Vec<Stream>,
    /// `archives[p]` is partition p's archive stream (decision 0181).
    archives: Vec<Stream>,
    /// session → where its log ended after this process's last append or read of it.
    last: Positions,
    /// session → where its archive ends, as this process last wrote or verified it.
    archived: super::archive::Ends,
}

/// Where this process last saw each session's log end (its last seq and that event's stream sequence),
/// shared with the snapshot store of the same process so a snapshot records the stream position of its
/// last event without asking the server (the owner has just appended it).
#[derive(Clone, Debug, Default)]
pub struct Positions(Arc<Mutex<HashMap<SessionRef, LastEvent>>>);

impl Positions {
    /// The stream sequence of event `seq` of `session`, if that is where this process last saw its log end.
    pub fn stream_seq_of(&self, session: &SessionRef, seq: u64) -> Option<u64> {
        lock(&self.0).get(session).filter(|l| l.seq == seq).map(|l| l.stream_seq)
    }
}

impl std::fmt::Debug for JetStreamLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamLog").field("config", &self.config).finish_non_exhaustive()
    }
}

/// How long start-up keeps asking a reachable server whose JetStream does not answer yet (a fresh
/// cluster electing its meta leader, a busy node): long enough for an election, short enough to fail.
const STREAM_SETUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// [`ensure_stream`], retried while the server is reachable but JetStream requests time out. A layout
/// mismatch, a server without JetStream or any other refusal is returned at once.
async fn ensure_stream_patiently(
    js: &jetstream::Context,
    want: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, JournalError> {
    let started = std::time::Instant::now();
    let partition = want.name.clone();
    loop {
        match ensure_stream(js, want.clone()).await {
            // Only a timeout means "not yet": no responders (JetStream off) or a refusal will not change.
            Err(JournalError::Unavailable(e))
                if e.contains("timed out") && started.elapsed() < STREAM_SETUP_PATIENCE =>
            {
                tracing::warn!(stream = %partition, error = %e, "JetStream not answering yet; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

impl JetStreamLog {
    /// Connects to `config.url` (bounded by `config.connect_timeout`) and creates or verifies the event
    /// streams. An unreachable server is [`JournalError::Unavailable`] naming the URL; a stream with another
    /// layout is [`JournalError::Storage`] naming the field.
    pub async fn connect(config: JetStreamConfig) -> Result<Self, JournalError> {
        config.validate()?;
        let client = super::connect(&config).await?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(config.request_timeout);
        let mut streams = Vec::with_capacity(config.partitions as usize);
        let mut archives = Vec::with_capacity(config.partitions as usize);
        for p in 0..config.partitions {
            streams.push(ensure_stream_patiently(&js, config.stream_config(p)).await?);
            archives.push(ensure_stream_patiently(&js, config.archive_stream_config(p)).await?);
        }
        Ok(Self {
            config,
            client,
            js,
            streams,
            archives,
            last: Positions::default(),
            archived: super::archive::Ends::default(),
        })
    }

    /// The positions this log learns from its appends and reads, for [`super::KvSnapshots::with_positions`].
    pub fn positions(&self) -> Positions {
        self.last.clone()
    }

    pub fn config(&self) -> &JetStreamConfig {
        &self.config
    }

    /// The underlying connection (for a [`super::NatsBus`] on the same connection).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// `streams()[p]` is partition p's stream.
    pub(super) fn streams(&self) -> &[Stream] {
        &self.streams
    }

    fn partition(&self, session: &SessionRef) -> u32 {
        subjects::partition_of(subjects::shard_of(session, self.config.shards), self.config.partitions)
    }

    pub(super) fn locate(&self, session: &SessionRef) -> (&Stream, String) {
        let p = self.partition(session);
        // `validate` made partitions ≥ 1 and `connect` opened one stream per partition; partition_of is
        // below partitions, so the index is in range.
        let stream = &self.streams[p as usize];
        (stream, subjects::event_subject(p, session))
    }

    /// The session's archive stream and subject (decision 0181).
    pub(super) fn locate_archive(&self, session: &SessionRef) -> (&Stream, String) {
        let p = self.partition(session);
        // As in `locate`: one archive stream per partition, opened with the event streams.
        let stream = &self.archives[p as usize];
        (stream, subjects::archive_subject(p, session))
    }

    /// Where this process last saw the session's archive end.
    pub(super) fn archived(&self) -> &super::archive::Ends {
        &self.archived
    }

    /// The JetStream context (for the archive's conditional publishes).
    pub(super) fn js(&self) -> &jetstream::Context {
        &self.js
    }

    pub(super) fn cached(&self, session: &SessionRef) -> Option<LastEvent> {
        lock(&self.last.0).get(session).copied()
    }

    pub(super) fn remember(&self, session: &SessionRef, last: LastEvent) {
        let mut cache = lock(&self.last.0);
        if cache.len() >= CACHE_LIMIT && !cache.contains_key(session) {
            cache.clear();
        }
        cache.insert(session.clone(), last);
    }

    pub(super) fn forget(&self, session: &SessionRef) {
        lock(&self.last.0).remove(session);
    }

    /// The session's last event as the stream leader has it (no cache).
    pub(super) async fn fetch_last(&self, session: &SessionRef) -> Result<Option<LastEvent>, JournalError> {
        let (stream, subject) = self.locate(session);
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => {
                let (_, seq) = group::header_range(session, Some(&message.headers), message.sequence)?;
                let last = LastEvent { seq, stream_seq: message.sequence };
                self.remember(session, last);
                Ok(Some(last))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                // An empty log is a position too: the owner's first append after loading a fresh session
                // then checks "no message on the subject" without asking again.
                self.remember(session, LastEvent { seq: 0, stream_seq: 0 });
                Ok(None)
            }
            Err(e) => Err(unavailable(format!("reading the last event of {session}"), e)),
        }
    }

    /// The stream sequence of the message holding the session's event `seq`, or `None` when the log is
    /// shorter. Binary search over `next-by-subject` gets, so a read from the middle of a long log costs
    /// O(log n) small gets instead of replaying the log before it.
    pub(super) async fn stream_seq_of(&self, session: &SessionRef, seq: u64) -> Result<Option<u64>, JournalError> {
        let Some(last) = self.fetch_last(session).await? else { return Ok(None) };
        self.stream_seq_before(session, seq, last).await
    }

    /// [`JetStreamLog::stream_seq_of`] given the session's last event.
    pub(super) async fn stream_seq_before(
        &self,
        session: &SessionRef,
        seq: u64,
        last: LastEvent,
    ) -> Result<Option<u64>, JournalError> {
        if seq > last.seq {
            return Ok(None);
        }
        if seq == last.seq {
            return Ok(Some(last.stream_seq));
        }
        let (stream, subject) = self.locate(session);
        // Stream seqs of one subject strictly increase with the session seqs its messages hold. A message
        // may hold several events (decision 0021), so the seq bounds no stream sequence from below: the
        // search runs over the stream sequences up to the last event's.
        let (mut lo, mut hi) = (1, last.stream_seq);
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            let message = stream
                .raw_message_builder()
                .next_by_subject(subject.clone())
                .sequence(mid)
                .send()
                .await
                .map_err(|e| unavailable(format!("locating seq {seq} of {session}"), e))?;
            let (first, last_held) = group::header_range(session, Some(&message.headers), message.sequence)?;
            if (first..=last_held).contains(&seq) {
                return Ok(Some(message.sequence));
            }
            if last_held < seq {
                // The message holding `seq` comes after this one.
                lo = message.sequence + 1;
            } else {
                // It is before `mid`: the subject's first message at or after mid is already past it.
                hi = mid - 1;
            }
        }
        Err(JournalError::Corrupt {
            session: session.clone(),
            seq,
            detail: "the session's seqs are not contiguous in its stream".into(),
        })
    }

    /// The stream sequence to consume from so that every event with seq ≥ `seq` is delivered, including
    /// ones not appended yet, given where the log ends (`last`, just fetched; `None`: no events): the
    /// event's own stream seq, else just past the log's end.
    pub(super) async fn start_of(
        &self,
        session: &SessionRef,
        seq: u64,
        last: Option<LastEvent>,
    ) -> Result<u64, JournalError> {
        // From the first event, or a session without events: a consumer filtered on the subject from
        // stream sequence 1 finds whatever comes.
        let Some(last) = last.filter(|_| seq > 1) else { return Ok(1) };
        Ok(self.stream_seq_before(session, seq, last).await?.unwrap_or(last.stream_seq + 1))
    }

    /// An ordered consumer on the session's subject from stream sequence `start` (1 = everything), and the
    /// guard that deletes it on the server when the reader is dropped.
    pub(super) async fn consumer(
        &self,
        session: &SessionRef,
        start: u64,
    ) -> Result<(jetstream::consumer::pull::Ordered, Release), JournalError> {
        let (stream, subject) = self.locate(session);
        ordered_reader(stream, subject, session, start).await
    }

    /// Checks a group ([`crate::log::check_batch`]) and splits it into messages that fit the server's
    /// `max_payload`: the encoded bodies of each message's events.
    pub(super) fn prepare(
        &self,
        session: &SessionRef,
        expected_last_seq: u64,
        events: &[Envelope],
    ) -> Result<Prepared, JournalError> {
        let bodies: Vec<Vec<u8>> = crate::log::check_batch(session, expected_last_seq, events, MAX_BATCH)?
            .into_iter()
            .map(|c| c.body)
            .collect();
        // Refuse up front what the server would refuse for size: that is not worth a retry.
        let max_payload = self.client.server_info().max_payload;
        let runs = group::split_to_fit(events, &bodies, max_payload).map_err(|len| {
            JournalError::Storage(format!(
                "an event of session {session} is {len} bytes but the NATS server's max_payload is {max_payload}; \
                 raise max_payload in the nats-server configuration (to at least the message size limit plus \
                 64 KiB) or lower Turnstile's message size limit"
            ))
        })?;
        Ok(Prepared { bodies, runs })
    }

    /// Publishes a prepared group after the message at `expected_stream_seq` of the session's subject (0:
    /// none) and remembers where the log ends now.
    pub(super) async fn publish(
        &self,
        session: &SessionRef,
        expected_last_seq: u64,
        expected_stream_seq: u64,
        events: &[Envelope],
        prepared: Prepared,
        traceparent: Option<&str>,
    ) -> Result<u64, Refusal> {
        let (_, subject) = self.locate(session);
        let Prepared { bodies, runs } = prepared;
        // The connection the group goes out on: if it is gone before the ack, so is the ack.
        let connects = self.client.statistics().connects.load(std::sync::atomic::Ordering::Relaxed);
        let n = runs.len();
        // One id per batch; a uuid is 36 chars, within the server's 64.
        let batch_id = (n > 1).then(|| uuid::Uuid::new_v4().to_string());
        let mut commit = None;
        for (i, run) in runs.into_iter().enumerate() {
            let mut headers = group::group_headers(&events[run.clone()], traceparent);
            if i == 0 {
                // On a batch the server checks it on the first message, for the whole batch.
                headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, expected_stream_seq.to_string().as_str());
            }
            if let Some(id) = &batch_id {
                headers.insert(NATS_BATCH_ID, id.as_str());
                headers.insert(NATS_BATCH_SEQUENCE, (i + 1).to_string().as_str());
            }
            let body = group::encode_group(bodies[run].iter().map(Vec::as_slice));
            if i + 1 < n {
                // Not the commit: a core publish without a reply subject. The server acks only the commit,
                // for the whole batch (a reply subject would just get an empty flow-control answer).
                self.client
                    .publish_with_headers(subject.clone(), headers, body.into())
                    .await
                    .map_err(|e| Refusal::Failed(unavailable(format!("appending to {session}"), e)))?;
            } else {
                if batch_id.is_some() {
                    headers.insert(NATS_BATCH_COMMIT, NATS_BATCH_COMMIT_FINAL);
                }
                commit = Some(self.js.publish_with_headers(subject.clone(), headers, body.into()).await);
            }
        }
        let ack = match commit {
            Some(Ok(ack)) => tokio::select! {
                ack = ack => ack,
                () = connection_lost(&self.client, connects) => {
                    self.forget(session);
                    return Err(Refusal::Failed(unavailable(
                        format!("appending to {session} (re-read the log: it may have landed)"),
                        "the connection to NATS was lost before the server acknowledged",
                    )));
                }
            },
            Some(Err(e)) => Err(e),
            // check_batch refused empty groups, so there was at least one run and the loop ran its last.
            None => {
                return Err(Refusal::Failed(JournalError::InvalidBatch {
                    session: session.clone(),
                    detail: "no events".into(),
                }));
            }
        };
        match ack {
            Ok(ack) => {
                let last = expected_last_seq + events.len() as u64;
                self.remember(session, LastEvent { seq: last, stream_seq: ack.sequence });
                Ok(last)
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence || super::wrong_last_sequence(&e) => {
                Err(Refusal::WrongLastSequence)
            }
            Err(e) if refusals::out_of_space(&e) => {
                self.forget(session);
                Err(Refusal::Failed(JournalError::OutOfSpace(format!("appending to {session}: {e}"))))
            }
            Err(e) => {
                // The outcome may be unknown (a lost ack): the next append must ask the server.
                self.forget(session);
                Err(Refusal::Failed(unavailable(
                    format!("appending to {session} (re-read the log: it may have landed)"),
                    e,
                )))
            }
        }
    }

    /// Up to `limit` events from stream sequence `start` on, ending at the log's end as the consumer
    /// reports it (`pending == 0`), never by waiting.
    pub(super) async fn read_from(
        &self,
        session: &SessionRef,
        start: u64,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<Envelope>, JournalError> {
        let (mut messages, _release) = self.consumer(session, start).await?;
        let mut out = Vec::new();
        while out.len() < limit {
            // Bounded: the reader stops at the log's end (`pending == 0`), so waiting here means a message the
            // consumer reported is not coming (its server cut off or restarted under it). Without the bound
            // a worker's load hung for good after a partition (the fault campaign: a session whose owner
            // never answered again); with it the read fails, and the caller retries with a new consumer.
            let next = tokio::time::timeout(self.config.request_timeout, messages.next()).await.map_err(|_| {
                unavailable(
                    format!("reading {session}"),
                    format!("no message within {} ms; read it again", self.config.request_timeout.as_millis()),
                )
            })?;
            let Some(message) = next else { break };
            let message = message.map_err(|e| unavailable(format!("reading {session}"), e))?;
            let pending = message.info().map(|i| i.pending).unwrap_or(0);
            for event in decode(session, &message)? {
                if event.seq < from_seq || out.len() >= limit {
                    continue;
                }
                if let Some(prev) = out.last().map(|e: &Envelope| e.seq)
                    && event.seq != prev + 1
                {
                    return Err(JournalError::Corrupt {
                        session: session.clone(),
                        seq: event.seq,
                        detail: format!("follows seq {prev}: the stored log has a gap"),
                    });
                }
                out.push(event);
            }
            if pending == 0 {
                break;
            }
        }
        Ok(out)
    }
}

/// An ordered consumer on `subject` of `stream` from stream sequence `start` (1 = everything), and the
/// guard that deletes it on the server when the reader is dropped: a session's log or its archive.
pub(super) async fn ordered_reader(
    stream: &Stream,
    subject: String,
    session: &SessionRef,
    start: u64,
) -> Result<(jetstream::consumer::pull::Ordered, Release), JournalError> {
    let deliver_policy =
        if start <= 1 { DeliverPolicy::All } else { DeliverPolicy::ByStartSequence { start_sequence: start } };
    // Named by us so it can be deleted by name (the ordered stream does not expose the server's name).
    let name = format!("reader-{}", uuid::Uuid::new_v4().simple());
    let consumer = stream
        .create_consumer(OrderedConfig {
            name: Some(name.clone()),
            filter_subject: subject,
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| refusals::reader_refused(session, e))?;
    let release = Release { stream: Some(stream.clone()), name };
    let messages = consumer.messages().await.map_err(|e| unavailable(format!("reading {session}"), e))?;
    Ok((messages, release))
}

/// Resolves once the client's connection is not the one it had when `connects` was read: it is down, or
/// it came back (`connects` counts every connection made). A request in flight on a connection that broke
/// gets no reply, so its caller would wait for the whole request timeout (5 s) after a NATS node died under
/// it (decision 0094); polled, since async-nats only reports connection changes to a callback.
pub(super) async fn connection_lost(client: &async_nats::Client, connects: u64) {
    let stats = client.statistics();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if client.connection_state() != async_nats::connection::State::Connected
            || stats.connects.load(std::sync::atomic::Ordering::Relaxed) != connects
        {
            return;
        }
    }
}

/// [`decode`] in the form readers send events on.
pub(super) fn decode_as_sent(
    session: &SessionRef,
    message: &jetstream::Message,
) -> Result<Vec<turnstile_proto::v1::SessionEvent>, JournalError> {
    let stream_seq = message.info().map_or(0, |i| i.stream_sequence);
    group::decode_message_as_sent(session, message.message.headers.as_ref(), &message.message.payload, stream_seq)
}

/// Decodes one stored message (a group, or one event of the old layout) and checks it against its
/// headers and subject.
pub(super) fn decode(session: &SessionRef, message: &jetstream::Message) -> Result<Vec<Envelope>, JournalError> {
    // The stream sequence only names the message in an error.
    let stream_seq = message.info().map_or(0, |i| i.stream_sequence);
    group::decode_message(session, message.message.headers.as_ref(), &message.message.payload, stream_seq)
}

/// Deletes a reader's consumer when the reader is dropped. An ordered consumer nobody pulls from stays on
/// the server for its inactivity threshold (30 s) and counts against the server's consumer limit
/// meanwhile: a gateway that opens and closes many readers (Watch joins, reads) would pile them up.
/// Best effort: a consumer the delete misses (a recreated one, named `<name>_<n>`, or no runtime) still
/// expires on its own.
#[derive(Debug)]
pub(super) struct Release {
    stream: Option<Stream>,
    name: String,
}

impl Drop for Release {
    fn drop(&mut self) {
        let (Some(stream), Ok(runtime)) = (self.stream.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        runtime.spawn(async move {
            if let Err(e) = stream.delete_consumer(&name).await {
                tracing::debug!(consumer = %name, error = %e, "deleting a reader's consumer failed; it expires on its own");
            }
        });
    }
}
