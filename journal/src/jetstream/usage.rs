//! Token usage in a cluster (SPEC §17, docs/decisions/0063-usage-folded-from-the-log.md): the event
//! streams folded into the KV bucket `turnstile_usage`.
//!
//! The count is derived from the durable log, never from what a worker saw: [`UsageFold`] reads each
//! partition's event stream in order with an ordered consumer and adds the usage of every
//! `assistant/message` it holds to its tenant's entry `tenant.<tenant>` (a [`UsageBook`] plus, per
//! partition, the stream sequence of the last message counted into it). An entry is changed by a
//! compare-and-set on its revision, and a message whose stream sequence is at or below the entry's mark
//! for its partition is skipped. Since every fold reads a partition in stream order from a point where
//! everything before was counted (its checkpoint `fold.<p>`, moved forward only after the entries),
//! several folds (every worker runs one) and replays after a crash count each message exactly once: the
//! entry holds exactly the messages of its tenant up to its mark. A step retried after a failover is a
//! new message only if the first attempt's `assistant/message` was never appended.
//!
//! [`KvUsage`] reads the entries: `GetUsage` on gateways, the budget check on workers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use turnstile_model::usage::{UsageBook, counted};
use turnstile_model::{Envelope, SessionRef, Usage};

use super::subjects::{parse_event_subject, stream_name};
use super::{HEADER_TYPE, group};
use crate::log::JournalError;
use crate::usage::UsageLedger;

/// The bucket of usage entries and fold checkpoints.
pub const USAGE_BUCKET: &str = "turnstile_usage";

/// How often a fold writes its checkpoint while messages come (and once the stream is quiet).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How long a fold waits before reading again after an error (the server away, a leader change).
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Compare-and-set attempts on one entry before the fold reads its partition again.
const CAS_ATTEMPTS: usize = 50;

/// What one message adds to its tenant: (UTC day, model key, usage) per `assistant/message`.
type Counts = Vec<(u64, String, Usage)>;

/// One tenant's entry: its usage and, per partition, the stream sequence of the last message counted.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TenantEntry {
    upto: BTreeMap<u32, u64>,
    book: UsageBook,
}

fn tenant_key(tenant: &str) -> String {
    format!("tenant.{tenant}")
}

fn checkpoint_key(partition: u32) -> String {
    format!("fold.{partition}")
}

/// The usage entries of a cluster ([`UsageLedger`] over the bucket [`USAGE_BUCKET`]).
#[derive(Clone)]
pub struct KvUsage {
    store: kv::Store,
}

impl std::fmt::Debug for KvUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvUsage").field("bucket", &USAGE_BUCKET).finish()
    }
}

impl KvUsage {
    /// Opens the bucket, creating it (file storage, `replicas`, history 1) if it does not exist.
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let store = super::open_bucket(
            client,
            USAGE_BUCKET,
            "Turnstile token usage per tenant, folded from the event streams",
            replicas,
        )
        .await?;
        Ok(Self { store })
    }

    async fn entry(&self, key: &str) -> Result<Option<kv::Entry>, JournalError> {
        self.store.entry(key).await.map_err(|e| JournalError::Unavailable(format!("reading usage {key}: {e}")))
    }

    /// Adds `counts` (day, model key, usage) of the message at `stream_seq` of `partition` to `tenant`'s
    /// entry, unless the entry already holds that message.
    async fn add(
        &self,
        tenant: &str,
        partition: u32,
        stream_seq: u64,
        counts: &[(u64, String, Usage)],
    ) -> Result<(), JournalError> {
        let key = tenant_key(tenant);
        for _ in 0..CAS_ATTEMPTS {
            let current = self.entry(&key).await?;
            let (mut entry, revision) = match &current {
                Some(e) => (decode_entry(&key, &e.value)?, e.revision),
                None => (TenantEntry::default(), 0),
            };
            if entry.upto.get(&partition).is_some_and(|&upto| upto >= stream_seq) {
                return Ok(());
            }
            for (day, model, usage) in counts {
                entry.book.count(*day, model, usage);
            }
            entry.upto.insert(partition, stream_seq);
            if let Some(latest) = counts.iter().map(|(day, ..)| *day).max() {
                entry.book.prune(latest);
            }
            let value = Bytes::from(serde_json::to_vec(&entry).map_err(|e| JournalError::Storage(e.to_string()))?);
            let written = if revision == 0 {
                self.store.create(&key, value).await.map(drop).map_err(|e| e.to_string())
            } else {
                self.store.update(&key, value, revision).await.map(drop).map_err(|e| e.to_string())
            };
            match written {
                Ok(()) => return Ok(()),
                // Another fold wrote first (or the answer was lost): read again; the mark decides.
                Err(e) => tracing::debug!(%key, error = %e, "usage entry changed under the fold; reading it again"),
            }
        }
        Err(JournalError::Unavailable(format!("usage entry {key} kept changing under the fold")))
    }

    async fn checkpoint(&self, partition: u32) -> Result<u64, JournalError> {
        let key = checkpoint_key(partition);
        Ok(match self.entry(&key).await? {
            Some(e) => std::str::from_utf8(&e.value).ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            None => 0,
        })
    }

    /// Moves `partition`'s checkpoint forward to `stream_seq` (never back).
    async fn advance(&self, partition: u32, stream_seq: u64) -> Result<(), JournalError> {
        let key = checkpoint_key(partition);
        for _ in 0..CAS_ATTEMPTS {
            let current = self.entry(&key).await?;
            let (at, revision) = match &current {
                Some(e) => (std::str::from_utf8(&e.value).ok().and_then(|v| v.parse().ok()).unwrap_or(0), e.revision),
                None => (0, 0),
            };
            if at >= stream_seq {
                return Ok(());
            }
            let value = Bytes::from(stream_seq.to_string());
            let written = if revision == 0 {
                self.store.create(&key, value).await.map(drop).map_err(|e| e.to_string())
            } else {
                self.store.update(&key, value, revision).await.map(drop).map_err(|e| e.to_string())
            };
            if written.is_ok() {
                return Ok(());
            }
        }
        Err(JournalError::Unavailable(format!("usage checkpoint {key} kept changing")))
    }
}

fn decode_entry(key: &str, value: &[u8]) -> Result<TenantEntry, JournalError> {
    serde_json::from_slice(value)
        .map_err(|e| JournalError::Storage(format!("usage entry {key} in {USAGE_BUCKET} is not readable: {e}")))
}

#[async_trait]
impl UsageLedger for KvUsage {
    async fn tenant_usage(&self, tenant: &str, since_day: u64) -> Result<UsageBook, JournalError> {
        let key = tenant_key(tenant);
        Ok(match self.entry(&key).await? {
            Some(e) => decode_entry(&key, &e.value)?.book.since(since_day),
            None => UsageBook::default(),
        })
    }
}

/// The folds of a cluster's partitions, running until dropped (or [`UsageFold::stop`]).
#[derive(Debug)]
pub struct UsageFold {
    tasks: Vec<JoinHandle<()>>,
}

impl UsageFold {
    /// Starts one fold per partition `0..partitions` over the event streams at `client`, into `usage`.
    pub fn start(client: &async_nats::Client, partitions: u32, usage: KvUsage) -> Self {
        Self::start_where(client, partitions, usage, Arc::new(|_| true))
    }

    /// [`UsageFold::start`], each partition's fold running only while `mine(partition)` says so (checked
    /// before it starts and at each checkpoint): a cluster's workers each fold the partitions whose lowest
    /// shard they hold, so every message is read by one fold instead of one per worker (decision 0180).
    /// Several folds of a partition at once (a hand-over) still count each message once.
    pub fn start_where(
        client: &async_nats::Client,
        partitions: u32,
        usage: KvUsage,
        mine: Arc<dyn Fn(u32) -> bool + Send + Sync>,
    ) -> Self {
        let tasks = (0..partitions.max(1))
            .map(|p| {
                let (js, usage, mine) = (jetstream::new(client.clone()), usage.clone(), mine.clone());
                tokio::spawn(async move {
                    loop {
                        if !mine(p) {
                            tokio::time::sleep(CHECKPOINT_EVERY).await;
                            continue;
                        }
                        match fold_partition(&js, p, &usage, mine.as_ref()).await {
                            Ok(()) => tracing::debug!(partition = p, "usage fold handed over"),
                            Err(e) => {
                                tracing::warn!(partition = p, error = %e, "usage fold stopped; reading on shortly");
                                tokio::time::sleep(RETRY_AFTER).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Self { tasks }
    }

    /// Stops the folds (what they counted stays; the next fold goes on from the checkpoints).
    pub fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for UsageFold {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads partition `p` from its checkpoint on, counting as it goes, until an error, or until `mine(p)` no
/// longer holds at a checkpoint (then `Ok`, with the checkpoint written).
async fn fold_partition(
    js: &jetstream::Context,
    p: u32,
    usage: &KvUsage,
    mine: &(dyn Fn(u32) -> bool + Send + Sync),
) -> Result<(), JournalError> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| JournalError::Unavailable(format!("{what}: {e}"));
    let from = usage.checkpoint(p).await?;
    let stream = js.get_stream(stream_name(p)).await.map_err(|e| unavailable("opening the event stream", &e))?;
    let deliver_policy =
        if from == 0 { DeliverPolicy::All } else { DeliverPolicy::ByStartSequence { start_sequence: from + 1 } };
    let consumer = stream
        .create_consumer(OrderedConfig { deliver_policy, ..Default::default() })
        .await
        .map_err(|e| unavailable("opening the usage fold's reader", &e))?;
    let mut messages = consumer.messages().await.map_err(|e| unavailable("reading the event stream", &e))?;
    let (mut counted_to, mut written) = (from, from);
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    loop {
        tokio::select! {
            next = messages.next() => {
                let Some(message) = next else {
                    return Err(JournalError::Unavailable("the event stream's reader ended".into()));
                };
                let message = message.map_err(|e| unavailable("reading the event stream", &e))?;
                let seq = message.info().map_err(|e| unavailable("a message without its info", &e))?.stream_sequence;
                if seq <= counted_to {
                    continue; // an ordered consumer that recreated itself may repeat
                }
                if let Some((tenant, counts)) = usage_of(&message) {
                    usage.add(&tenant, p, seq, &counts).await?;
                }
                counted_to = seq;
            }
            _ = tick.tick() => {
                if counted_to > written {
                    usage.advance(p, counted_to).await?;
                    written = counted_to;
                }
                if !mine(p) {
                    return Ok(());
                }
            }
        }
    }
}

/// The tenant and the usage counted from one stored message, when it holds an `assistant/message` with
/// usage. A message that cannot be decoded counts nothing (the readers of that session report it).
fn usage_of(message: &jetstream::Message) -> Option<(String, Counts)> {
    let headers = message.message.headers.as_ref();
    let types = headers?.get(HEADER_TYPE)?.as_str();
    if !types.split(group::TYPE_SEPARATOR).any(|t| t == "assistant/message") {
        return None;
    }
    let session: SessionRef = parse_event_subject(message.message.subject.as_str())?;
    let seq = message.info().map_or(0, |i| i.stream_sequence);
    let events: Vec<Envelope> = match group::decode_message(&session, headers, &message.message.payload, seq) {
        Ok(events) => events,
        Err(e) => {
            tracing::warn!(%session, stream_seq = seq, error = %e, "usage fold: an undecodable message counts nothing");
            return None;
        }
    };
    let counts: Counts = events.iter().filter_map(counted).collect();
    (!counts.is_empty()).then_some((session.tenant, counts))
}
