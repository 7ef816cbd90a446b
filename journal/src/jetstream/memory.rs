//! Memory in the JetStream KV bucket `turnstile_memory` (decision 0147): one key per document,
//! `<tenant>.<namespace>.<hex of the key>` (document keys may hold any character; hex keeps them KV-safe),
//! its [`MemoryDocument`] as JSON, replicated like every bucket of the journal (R3 in a cluster).
//!
//! Every node keeps a [`MemoryIndex`] of the whole bucket, fed by a watch of it, for lists, search and the
//! limits. A read that needs the index first waits until the index has applied the bucket's last sequence
//! (a stream-info request), so it sees every write acknowledged before it started, on any node; a write
//! waits until its own revision is applied here. A get reads the bucket itself.
//!
//! The limits are checked against this node's index before the write: two nodes writing the same tenant
//! at once may each admit a write the other's makes too many (bounded by the writes in flight).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use crate::log::JournalError;
use crate::memory::{
    ListPage, ListQuery, MemoryDocument, MemoryError, MemoryIndex, MemoryLimits, MemoryPut, MemoryStore, SearchHit,
    SearchQuery, check_address, check_values,
};

/// The bucket of memory documents.
pub const MEMORY_BUCKET: &str = "turnstile_memory";

/// How long a read waits for this node's index to catch up with the bucket.
const CATCH_UP: Duration = Duration::from_secs(10);

/// [`MemoryStore`] on a JetStream KV bucket.
pub struct KvMemory {
    store: kv::Store,
    stream: async_nats::jetstream::stream::Stream,
    index: Arc<Mutex<MemoryIndex>>,
    /// The last revision the index applied.
    applied: watch::Receiver<u64>,
    limits: MemoryLimits,
    _follower: super::Follower,
}

impl std::fmt::Debug for KvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvMemory").field("bucket", &MEMORY_BUCKET).finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("memory: {e}"))
}

fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn kv_key(tenant: &str, namespace: &str, key: &str) -> String {
    format!("{tenant}.{namespace}.{}", hex(key))
}

/// `(tenant, namespace, key)` of a bucket key; `None` for one this module did not write.
fn parse_kv_key(kv_key: &str) -> Option<(String, String, String)> {
    let mut parts = kv_key.splitn(3, '.');
    let (tenant, namespace, hexed) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = (0..hexed.len())
        .step_by(2)
        .map(|i| hexed.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()?;
    Some((tenant.to_owned(), namespace.to_owned(), String::from_utf8(bytes).ok()?))
}

impl KvMemory {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket and starts indexing it.
    pub async fn open(
        client: &async_nats::Client,
        replicas: usize,
        limits: MemoryLimits,
    ) -> Result<Self, JournalError> {
        let description = "Turnstile memory (SPEC §20): tenants' JSON documents by namespace and key";
        let store = super::open_bucket(client, MEMORY_BUCKET, description, replicas).await?;
        let js = async_nats::jetstream::new(client.clone());
        let stream = js.get_stream(format!("KV_{MEMORY_BUCKET}")).await.map_err(unavailable)?;
        let mut updates = store.watch_all().await.map_err(unavailable)?;
        let index = Arc::new(Mutex::new(MemoryIndex::default()));
        let (tx, applied) = watch::channel(0);
        let fed = index.clone();
        let follower = super::Follower::spawn(async move {
            while let Some(update) = updates.next().await {
                let Ok(entry) = update else { continue };
                let Some((tenant, namespace, key)) = parse_kv_key(&entry.key) else { continue };
                {
                    let mut index = crate::sync::lock(&fed);
                    match entry.operation {
                        kv::Operation::Put => match serde_json::from_slice::<MemoryDocument>(&entry.value) {
                            Ok(document) => index.insert(MemoryDocument { revision: entry.revision, ..document }),
                            Err(e) => tracing::warn!(key = %entry.key, error = %e, "unreadable memory document"),
                        },
                        kv::Operation::Delete | kv::Operation::Purge => {
                            index.remove(&tenant, &namespace, &key);
                        }
                    }
                }
                tx.send_modify(|r| *r = (*r).max(entry.revision));
            }
        });
        Ok(Self { store, stream, index, applied, limits, _follower: follower })
    }

    /// Waits until the index applied `revision`.
    async fn applied(&self, revision: u64) -> Result<(), JournalError> {
        let mut applied = self.applied.clone();
        match tokio::time::timeout(CATCH_UP, applied.wait_for(|&r| r >= revision)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(unavailable("the bucket's watch ended")),
            Err(_) => Err(unavailable(format!(
                "this node's index did not reach revision {revision} within {} s",
                CATCH_UP.as_secs()
            ))),
        }
    }

    /// Waits until the index holds every write the bucket acknowledged so far.
    async fn caught_up(&self) -> Result<(), JournalError> {
        let last = self.stream.get_info().await.map_err(unavailable)?.state.last_sequence;
        self.applied(last).await
    }
}

#[async_trait]
impl MemoryStore for KvMemory {
    fn limits(&self) -> MemoryLimits {
        self.limits
    }

    async fn put(&self, put: MemoryPut) -> Result<MemoryDocument, MemoryError> {
        check_values(&put, &self.limits)?;
        self.caught_up().await?;
        crate::sync::lock(&self.index).admit(&put, &self.limits)?;
        let key = kv_key(&put.tenant, &put.namespace, &put.key);
        // The bucket numbers the revision as it stores the document.
        let document = put.document(0);
        let value = Bytes::from(serde_json::to_vec(&document).map_err(|e| JournalError::Storage(e.to_string()))?);
        let revision = self.store.put(&key, value).await.map_err(unavailable)?;
        self.applied(revision).await?;
        Ok(MemoryDocument { revision, ..document })
    }

    async fn get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError> {
        check_address(namespace, key)?;
        match self.store.entry(kv_key(tenant, namespace, key)).await.map_err(unavailable)? {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let document: MemoryDocument = serde_json::from_slice(&entry.value).map_err(|e| {
                    JournalError::Storage(format!("memory document {} is not readable: {e}", entry.key))
                })?;
                Ok(Some(MemoryDocument { revision: entry.revision, ..document }))
            }
            _ => Ok(None),
        }
    }

    async fn delete(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError> {
        let Some(existing) = self.get(tenant, namespace, key).await? else { return Ok(None) };
        self.store.delete(kv_key(tenant, namespace, key)).await.map_err(unavailable)?;
        self.caught_up().await?;
        Ok(Some(existing))
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<ListPage, MemoryError> {
        self.caught_up().await?;
        Ok(crate::sync::lock(&self.index).list(tenant, query))
    }

    async fn search(&self, tenant: &str, query: &SearchQuery) -> Result<Vec<SearchHit>, MemoryError> {
        self.caught_up().await?;
        Ok(crate::sync::lock(&self.index).search(tenant, query))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_keys_carry_any_document_key() {
        for key in ["prefs/language", "a.b c", "ünïcode ✓", "x"] {
            let k = kv_key("t", "ns", key);
            assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'), "{k}");
            assert_eq!(parse_kv_key(&k), Some(("t".into(), "ns".into(), key.into())));
        }
        assert_eq!(parse_kv_key("t.ns.zz"), None);
    }
}
