//! The session index on JetStream (SPEC §16, decision 0069): one KV entry per session in the bucket
//! `turnstile_index` under `<tenant>.<id>`, written by the session's owner, mirrored in memory by every node
//! through a KV watch; queries read the mirror.
//!
//! Writes never hold the owner up: [`KvIndex::submit`] applies the entry to the local mirror and queues it;
//! one writer task puts the latest entry of each queued session, concurrently across sessions and in order
//! for one session (a newer submission of a session replaces its queued one). An entry lost to a crash or a
//! failed put is written again when the session is next loaded (its new owner submits what it folded) or
//! changes.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use tokio::sync::{mpsc, watch};
use turnstile_model::message::SessionRef;

use crate::index::{IndexEntry, MemoryIndex, Query, SessionIndex};
use crate::log::JournalError;

/// The bucket of the session index.
pub const INDEX_BUCKET: &str = "turnstile_index";

/// Puts in flight at once, across sessions.
const MAX_CONCURRENT_PUTS: usize = 64;

fn key(session: &SessionRef) -> String {
    format!("{}.{}", session.tenant, session.id)
}

/// [`SessionIndex`] on a JetStream KV bucket with an in-memory mirror.
pub struct KvIndex {
    mirror: Arc<MemoryIndex>,
    writes: mpsc::UnboundedSender<(SessionRef, Option<IndexEntry>)>,
    /// Whether the mirror has caught up with the bucket's history (set once, by the mirror task).
    loaded: watch::Sender<bool>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex").field("bucket", &INDEX_BUCKET).field("mirror", &self.mirror).finish()
    }
}

impl KvIndex {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket and starts the mirror's watch and
    /// the writer. Queries see the whole index once [`SessionIndex::is_loaded`].
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let description = "Turnstile session index (status, agent, parent, labels, last activity)";
        let store = super::open_bucket(client, INDEX_BUCKET, description, replicas).await?;
        let mirror = Arc::new(MemoryIndex::default());
        let loaded = watch::Sender::new(false);
        // Like the bucket, the status and the watch wait out a leader election of its stream.
        let (empty, watch) = super::while_starting("the session index watch", || async {
            let empty = store.status().await.map_err(unavailable)?.values() == 0;
            Ok::<_, JournalError>((empty, store.watch_with_history(">").await.map_err(unavailable)?))
        })
        .await?;
        if empty {
            loaded.send_replace(true);
        }
        tokio::spawn(mirror_task(store.clone(), watch, mirror.clone(), loaded.clone()));
        let (writes, queue) = mpsc::unbounded_channel();
        tokio::spawn(writer_task(store, queue));
        Ok(Self { mirror, writes, loaded })
    }
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("session index: {e}"))
}

/// Applies the bucket's entries (its history first, then each change) to `mirror`. A watch that ends (its
/// stream's leader moved, NATS restarted) is opened again with the history: applying an entry twice changes
/// nothing, since the mirror keeps each session's entry with the highest `last_seq`.
async fn mirror_task(store: kv::Store, first: kv::Watch, mirror: Arc<MemoryIndex>, loaded: watch::Sender<bool>) {
    let mut watch = first;
    loop {
        follow(&mut watch, &mirror, &loaded).await;
        tracing::warn!("session index watch ended; reopening it");
        watch = loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            match store.watch_with_history(">").await {
                Ok(watch) => break watch,
                Err(e) => tracing::warn!(error = %e, "cannot reopen the session index watch yet; the mirror may lag"),
            }
        };
    }
}

/// Applies `watch`'s entries to `mirror` until the watch ends.
async fn follow(watch: &mut kv::Watch, mirror: &MemoryIndex, loaded: &watch::Sender<bool>) {
    while let Some(entry) = watch.next().await {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "session index watch failed; the index mirror may lag");
                continue;
            }
        };
        if (entry.delta == 0 || entry.seen_current) && !*loaded.borrow() {
            loaded.send_replace(true);
        }
        match entry.operation {
            kv::Operation::Put => match serde_json::from_slice::<IndexEntry>(&entry.value) {
                Ok(indexed) => mirror.apply(indexed),
                Err(e) => tracing::warn!(key = %entry.key, error = %e, "session index entry not readable; skipped"),
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some((tenant, id)) = entry.key.split_once('.')
                    && let Ok(session) = SessionRef::new(tenant, id)
                {
                    mirror.forget(&session);
                }
            }
        }
    }
}

/// Puts the queued entries: everything queued is taken at once (the latest per session), written
/// concurrently, then the next batch.
async fn writer_task(store: kv::Store, mut queue: mpsc::UnboundedReceiver<(SessionRef, Option<IndexEntry>)>) {
    while let Some(first) = queue.recv().await {
        let mut batch: HashMap<SessionRef, Option<IndexEntry>> = HashMap::from([first]);
        while let Ok((session, entry)) = queue.try_recv() {
            batch.insert(session, entry);
        }
        futures::stream::iter(batch)
            .for_each_concurrent(MAX_CONCURRENT_PUTS, |(session, entry)| {
                let store = store.clone();
                async move {
                    let result = match entry {
                        Some(entry) => match serde_json::to_vec(&entry) {
                            Ok(bytes) => store.put(key(&session), bytes.into()).await.map(|_| ()).map_err(|e| e.to_string()),
                            Err(e) => Err(e.to_string()),
                        },
                        None => store.purge(key(&session)).await.map_err(|e| e.to_string()),
                    };
                    if let Err(e) = result {
                        tracing::warn!(%session, error = %e, "session index not written; written again at its next change or load");
                    }
                }
            })
            .await;
    }
}

impl SessionIndex for KvIndex {
    fn submit(&self, entry: IndexEntry) {
        self.mirror.apply(entry.clone());
        let _ = self.writes.send((entry.session.clone(), Some(entry)));
    }

    fn remove(&self, session: &SessionRef) {
        self.mirror.forget(session);
        let _ = self.writes.send((session.clone(), None));
    }

    fn get(&self, session: &SessionRef) -> Option<IndexEntry> {
        self.mirror.get(session)
    }

    fn query(&self, query: &Query) -> Vec<IndexEntry> {
        self.mirror.query(query)
    }

    fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    fn loaded(&self) -> watch::Receiver<bool> {
        self.loaded.subscribe()
    }
}
