//! The JetStream backend of the session log ([`JetStreamLog`]) and the core-NATS live bus ([`NatsBus`]):
//! the cluster's journal (ARCHITECTURE "JetStream layout"), where `turnstile dev` uses [`crate::embedded`].
//!
//! Layout: streams `TURNSTILE_EVENTS_<p>` (subjects `turnstile.ev.<p>.>`, file storage, configured
//! replicas, atomic publish and direct get on); one subject per session, `turnstile.ev.<p>.<tenant>.<id>`,
//! with the partition from a stable hash ([`subjects`]); **one message per append group**
//! (docs/decisions/0021-one-message-per-append-group.md), body a `SessionEventGroup` of the group's
//! events, headers `Turnstile-Seq` / `Turnstile-Last-Seq` (first and last seq held), `Turnstile-Type` (the
//! types, comma-separated), `Turnstile-Epoch` and, when given, `traceparent` ([`group`]). Messages of
//! the older one-event-per-message layout (no `Turnstile-Last-Seq`, body one `SessionEvent`) read the same.
//!
//! Single writer (SPEC §6): every append carries `Nats-Expected-Last-Subject-Sequence` = the stream
//! sequence of the message holding the session's last event. The writer keeps `session → (last seq, its
//! stream seq)` from its own appends and reads; on a miss it asks the stream leader for the subject's last
//! message. The server is the judge: a wrong-sequence answer becomes [`JournalError::Conflict`] (on a
//! first append, [`JournalError::FirstRefused`]), and a refusal for lack of room, told by the server's
//! error code, [`JournalError::OutOfSpace`].
//!
//! Files: `log` holds [`JetStreamLog`] and its store operations (locating a session's subject, the last-event
//! cache, publishing a group, reading through ordered consumers); `session_log` implements
//! [`crate::SessionLog`] with them, `tail` and `delete` the trait's tail and delete; [`group`] is the
//! message format, [`subjects`] the naming, `config` the streams' layout, [`archive`] the history archive
//! (a session's sealed history as few large messages, decision 0181), `snapshots` the KV snapshot store,
//! `bus` the live bus, `usage` the token usage folded from the streams into KV (SPEC §17).
//!
//! Reads: the stream sequence of the message holding event `from_seq` is found by a binary search of
//! `next-by-subject` gets (O(log n) small requests, from the leader so a read follows the writer's own
//! appends), then an ordered consumer filtered to the subject streams from there, drops the events before
//! `from_seq` and stops when its pending count reaches 0 — never by waiting for a timeout. `tail` is the
//! same consumer left open; it drops redeliveries and reports a jump as an error item. A tail lives as long
//! as the connection, not the [`JetStreamLog`] value.
//!
//! A group too large for one message (several large events; the server's `max_payload`) is split into
//! messages written as one JetStream atomic batch (ADR-50; docs/decisions/0004-jetstream-batches.md).
//! Measured against nats-server 2.15.1 with async-nats 0.51.0 (`tests/tests/journal_jetstream.rs` keeps
//! these checks):
//! - a batch (`Nats-Batch-Id`, `Nats-Batch-Sequence` 1..n, `Nats-Batch-Commit: 1` on the last) lands whole;
//!   the commit's ack carries the last stream sequence and `batch_size` n;
//! - a batch whose first message carries a stale expected sequence stores nothing; the *commit's* ack is
//!   the error, which async-nats reports as `PublishErrorKind::WrongLastSequence` (code 10071; at R3 a
//!   writer that loses a race gets 10164 instead, which [`wrong_last_sequence`] recognizes too);
//! - messages before the commit need no reply subject: with one, the server answers an empty flow-control
//!   reply (which async-nats cannot parse as an ack), so they go out as core publishes on the same
//!   connection, which keeps them in order before the commit;
//! - every other group is a plain publish with the expected-sequence header, no batch headers, which the
//!   server stores without the per-batch disk staging (and fsync) of an atomic batch.

mod agents;
pub mod archive;
mod bus;
mod config;
mod delete;
pub mod group;
mod index;
mod log;
mod memory;
mod refusals;
mod session_log;
mod snapshots;
pub mod subjects;
mod tail;
mod usage;
mod webhook;
mod webhook_registry;

use std::time::Duration;

pub use bus::{NatsBus, barrier};
pub use config::{JetStreamConfig, NatsSecurity, Retention};
pub use index::{ACTIVITY_REFRESH, INDEX_BUCKET, KvIndex, PendingWrites, WRITE_WINDOW};

/// How long a starting node keeps trying to open its buckets and the shard watch before it gives up: longer
/// than a JetStream leader election after a kill (a few seconds), short enough that a NATS that cannot
/// serve them is reported while someone still watches the start.
pub const STARTING: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds or [`STARTING`] has passed, pausing 250 ms doubling to 2 s between
/// tries: a node that starts while a bucket's stream elects a leader (its leader was killed, or NATS is
/// restarting) is answered "timed out" for a few seconds and must wait that out rather than exit (the
/// fault campaign's KV leader kill found it). A NATS without JetStream still fails the start, after
/// [`STARTING`].
pub async fn while_starting<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Result<T, E> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(250);
    loop {
        match attempt().await {
            Err(e) if started.elapsed() + pause < STARTING => {
                tracing::warn!(error = %e, retry_ms = pause.as_millis() as u64, "cannot open {what} yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            done => return done,
        }
    }
}

/// The task that follows a bucket for the store that holds it (its watch feeds a mirror or an index): it
/// ends when the store is dropped.
pub(crate) struct Follower(tokio::task::JoinHandle<()>);

impl Follower {
    pub(crate) fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Hands `apply` each entry of a followed bucket's `watch`, for as long as the task runs. A watch that ends
/// (its stream's leader moved, NATS restarted) is opened again on `store` with the history, so `apply` sees
/// entries again and must be idempotent. `what` names the bucket in the log.
pub(crate) async fn follow_bucket(
    store: async_nats::jetstream::kv::Store,
    mut watch: async_nats::jetstream::kv::Watch,
    what: &str,
    mut apply: impl FnMut(async_nats::jetstream::kv::Entry),
) {
    use futures::StreamExt as _;
    loop {
        while let Some(entry) = watch.next().await {
            match entry {
                Ok(entry) => apply(entry),
                Err(e) => tracing::warn!(error = %e, "{what} watch failed; the mirror may lag"),
            }
        }
        tracing::warn!("{what} watch ended; reopening it");
        watch = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match store.watch_with_history(">").await {
                Ok(watch) => break watch,
                Err(e) => tracing::warn!(error = %e, "cannot reopen the {what} watch yet; the mirror may lag"),
            }
        };
    }
}

/// Opens KV bucket `bucket`, creating it (file storage, `replicas`, history 1, `description`) when it does
/// not exist: the index and webhook buckets, which any node may be the first to need.
pub async fn open_bucket(
    client: &async_nats::Client,
    bucket: &str,
    description: &str,
    replicas: usize,
) -> Result<async_nats::jetstream::kv::Store, crate::log::JournalError> {
    open_bucket_with(
        client,
        async_nats::jetstream::kv::Config {
            bucket: bucket.to_owned(),
            description: description.to_owned(),
            history: 1,
            storage: async_nats::jetstream::stream::StorageType::File,
            num_replicas: replicas.max(1),
            ..Default::default()
        },
    )
    .await
}

/// Opens the KV bucket `config` names, creating it with `config` when it does not exist; waits out a leader
/// election of its stream ([`while_starting`]). The one get-or-create of every bucket of the journal, the
/// gateways' quotas and the cluster's ownership buckets.
pub async fn open_bucket_with(
    client: &async_nats::Client,
    config: async_nats::jetstream::kv::Config,
) -> Result<async_nats::jetstream::kv::Store, crate::log::JournalError> {
    let js = async_nats::jetstream::new(client.clone());
    let bucket = config.bucket.as_str();
    while_starting(&format!("KV bucket {bucket}"), || async {
        if let Ok(store) = js.get_key_value(bucket).await {
            return Ok(store);
        }
        js.create_key_value(config.clone())
            .await
            .map_err(|e| crate::log::JournalError::Unavailable(format!("cannot create KV bucket {bucket}: {e}")))
    })
    .await
}
pub use agents::{AGENT_BUCKET, KvAgents};
pub use log::{JetStreamLog, MAX_BATCH, Positions};
pub use memory::{KvMemory, MEMORY_BUCKET};

/// Whether `err`, or an error it wraps, is JetStream refusing a conditional write because the subject's
/// last sequence was not the expected one: code 10071 (`wrong last sequence: N`), or 10164, the same
/// refusal without the number, which the leader of a replicated stream answers while an earlier write to
/// the subject is still being proposed, i.e. to the losers of a race (measured at R3 with nats-server
/// 2.15.1: 40 of 40 losers of 3 concurrent creates of one key got 10164). async-nats 0.51 reports only
/// 10071 as `WrongLastSequence` / `WrongLastRevision`; 10164 arrives as `Other`, which must not be taken
/// for an unavailable store.
pub fn wrong_last_sequence(err: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::{Error, ErrorCode};
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(js) = e.downcast_ref::<Error>() {
            return matches!(
                js.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            );
        }
        current = e.source();
    }
    false
}
pub use snapshots::{KvSnapshots, SNAPSHOT_BUCKET};
pub use usage::{KvUsage, USAGE_BUCKET, UsageFold};
pub use webhook::{KvWebhookPositions, WEBHOOK_BUCKET};
pub use webhook_registry::{KvWebhookRegistry, WEBHOOK_REGISTRY_BUCKET};

use crate::log::JournalError;

/// The durable types (SPEC §5) of the events a message holds, in order, comma-separated, e.g.
/// `agent/inbox/spliced,agent/status`.
pub const HEADER_TYPE: &str = "Turnstile-Type";
/// The session seq of the (first) event a message holds.
pub const HEADER_SEQ: &str = "Turnstile-Seq";
/// The seq of the last event a message holds: on every message of the one-message-per-group layout
/// (decision 0021), absent on the single-event messages written before it.
pub const HEADER_LAST_SEQ: &str = "Turnstile-Last-Seq";
/// The writer's owner epoch.
pub const HEADER_EPOCH: &str = "Turnstile-Epoch";
/// The message format ([`group::GROUP_FORMAT`]): on every message written since formats were numbered
/// (SPEC §18, decision 0072); a message without it is format 1 when it has `Turnstile-Last-Seq`, else the
/// single-event layout before decision 0021.
pub const HEADER_FORMAT: &str = "Turnstile-Format";
/// W3C trace context of the append.
pub const HEADER_TRACEPARENT: &str = "traceparent";

/// The servers of a `--nats` value: one URL or a comma-separated list of them (`nats://a:4222,nats://b:4222`;
/// blanks around commas and empty items are ignored). The client connects to one of them and learns the
/// rest of the cluster from it, but with several seeds it can also start while one seed is down.
fn server_addrs(urls: &str) -> Result<Vec<async_nats::ServerAddr>, JournalError> {
    let servers = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| JournalError::Unavailable(format!("invalid NATS server URL {u:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(JournalError::Unavailable(format!("no NATS server URL in {urls:?}")));
    }
    Ok(servers)
}

/// How often the client pings its server. async-nats gives a connection up after three unanswered pings
/// and reconnects (to another server of the list when it has one): with its default of 60 s a hung server,
/// or one cut off by a partition, kept a process on a dead connection for three minutes (decision 0076).
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// Connects once, bounded: an unreachable server is an error naming the URL, not an endless retry. Once
/// connected, the client reconnects on its own (calls in between fail as [`JournalError::Unavailable`]).
/// `config.security` adds a credentials file and TLS (a CA or client certificate makes TLS required, so a
/// server that offers none is refused instead of silently spoken to in clear text).
async fn connect(config: &JetStreamConfig) -> Result<async_nats::Client, JournalError> {
    let (url, timeout) = (config.url.as_str(), config.connect_timeout);
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(timeout)
        .request_timeout(Some(config.request_timeout))
        .ping_interval(PING_INTERVAL);
    let security = &config.security;
    if let Some(creds) = &security.creds {
        options = options.credentials_file(creds).await.map_err(|e| {
            JournalError::Unavailable(format!("cannot use NATS credentials file {}: {e}", creds.display()))
        })?;
    }
    if let Some(ca) = &security.ca {
        // async-nats reads the file only while connecting; check it now so the error names it.
        std::fs::metadata(ca)
            .map_err(|e| JournalError::Unavailable(format!("cannot read NATS CA file {}: {e}", ca.display())))?;
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &security.client_cert {
        for file in [cert, key] {
            std::fs::metadata(file)
                .map_err(|e| JournalError::Unavailable(format!("cannot read NATS TLS file {}: {e}", file.display())))?;
        }
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if security.requires_tls() {
        options = options.require_tls(true);
    }
    let servers = server_addrs(url)?;
    // The outer timeout also bounds DNS and the handshake, which `connection_timeout` may not cover.
    match tokio::time::timeout(timeout + Duration::from_secs(1), options.connect(servers)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(JournalError::Unavailable(format!("cannot connect to NATS at {url}: {e}"))),
        Err(_) => {
            Err(JournalError::Unavailable(format!("cannot connect to NATS at {url}: no answer within {timeout:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::server_addrs;

    #[test]
    fn one_url_is_one_server() {
        let servers = server_addrs("nats://127.0.0.1:4222").unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!((servers[0].host(), servers[0].port()), ("127.0.0.1", 4222));
    }

    #[test]
    fn a_comma_separated_list_is_every_server_in_order() {
        let servers = server_addrs("nats://127.0.0.1:4222, nats://127.0.0.1:4223,,127.0.0.1:4224").unwrap();
        let got: Vec<(String, u16)> = servers.iter().map(|s| (s.host().to_owned(), s.port())).collect();
        let want = [4222, 4223, 4224].map(|p| ("127.0.0.1".to_owned(), p));
        assert_eq!(got, want);
    }

    #[test]
    fn an_empty_or_invalid_list_is_an_error() {
        assert!(server_addrs("").is_err());
        assert!(server_addrs(" , ").is_err());
        assert!(server_addrs("nats://127.0.0.1:4222,nats://[bad").is_err());
    }
}
