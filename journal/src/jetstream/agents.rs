//! Agent definitions in the JetStream KV bucket `turnstile_agents` (decision 0120): one key per agent
//! (`file.<name>` or `tenant.<tenant>.<name>`), its whole [`AgentRecord`] as JSON, replaced by
//! compare-and-set on the key's revision; replicated like every bucket of the journal (R3 in a cluster).

use async_nats::jetstream::kv;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use crate::agents::{AgentRecord, AgentStore, agent_key};
use crate::log::JournalError;

/// The bucket of agent definitions.
pub const AGENT_BUCKET: &str = "turnstile_agents";

/// [`AgentStore`] on a JetStream KV bucket; a task follows the bucket so [`AgentStore::changes`] moves on
/// every node's write.
pub struct KvAgents {
    store: kv::Store,
    changes: watch::Sender<u64>,
    _follower: super::Follower,
}

impl std::fmt::Debug for KvAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvAgents").field("bucket", &AGENT_BUCKET).finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("agent definitions: {e}"))
}

impl KvAgents {
    /// Opens (or creates: file storage, `replicas`, history 1) the bucket and starts following it.
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let description = "Turnstile agent definitions (every version of every agent)";
        let store = super::open_bucket(client, AGENT_BUCKET, description, replicas).await?;
        let changes = watch::channel(0).0;
        // Like the bucket, the watch waits out a leader election of its stream (the fault campaign found a
        // worker that started during one exit here).
        let mut updates = super::while_starting("the agent definitions watch", || async {
            store.watch_all().await.map_err(unavailable)
        })
        .await?;
        let tx = changes.clone();
        let follower = super::Follower::spawn(async move {
            while let Some(update) = updates.next().await {
                if update.is_ok() {
                    tx.send_modify(|n| *n += 1);
                }
            }
        });
        Ok(Self { store, changes, _follower: follower })
    }
}

fn decode(key: &str, value: &[u8]) -> Result<AgentRecord, JournalError> {
    serde_json::from_slice(value)
        .map_err(|e| JournalError::Storage(format!("agent {key} in {AGENT_BUCKET} is not readable: {e}")))
}

#[async_trait]
impl AgentStore for KvAgents {
    async fn load(&self, key: &str) -> Result<Option<(AgentRecord, u64)>, JournalError> {
        match self.store.entry(key).await.map_err(unavailable)? {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((decode(key, &entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    async fn save(&self, record: &AgentRecord, revision: u64) -> Result<bool, JournalError> {
        let key = agent_key(&record.owner, &record.name);
        let value = Bytes::from(serde_json::to_vec(record).map_err(|e| JournalError::Storage(e.to_string()))?);
        let written = if revision == 0 {
            self.store.create(&key, value).await.map(drop).map_err(|e| e.to_string())
        } else {
            self.store.update(&key, value, revision).await.map(drop).map_err(|e| e.to_string())
        };
        match written {
            Ok(()) => Ok(true),
            // A wrong revision (another writer first) or a lost answer: the caller reads again.
            Err(e) => {
                tracing::debug!(%key, error = %e, "agent record changed under the write; reading it again");
                Ok(false)
            }
        }
    }

    async fn list(&self) -> Result<Vec<AgentRecord>, JournalError> {
        let mut keys = self.store.keys().await.map_err(unavailable)?;
        let mut records = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(unavailable)?;
            if let Some((record, _)) = self.load(&key).await? {
                records.push(record);
            }
        }
        Ok(records)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}
