//! Agent definitions as durable, versioned objects (SPEC §20, decision 0120).
//!
//! An agent is owned by one tenant (put through the API) or by the configuration file (shared with the
//! tenants the file lists). Its [`AgentRecord`] keeps every version ever put, so a session pinned to an
//! old version can always run it; a put whose definition is the latest one's is no new version, so
//! importing an unchanged file at every start writes nothing. A delete hides the agent from new sessions
//! and lists and keeps its versions for the sessions that run them.
//!
//! The store is a [`AgentStore`]: [`MemoryAgents`] for the embedded journal (in memory, or one JSON file
//! in the data directory), [`crate::jetstream::KvAgents`] in the KV bucket `turnstile_agents` (one key per
//! agent, written by compare-and-set, replicated like the other buckets: R3 in a cluster).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::log::JournalError;

/// Who owns an agent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentOwner {
    /// The configuration file: shared with the tenants its `tenants` lists (every tenant without one).
    File,
    /// One tenant, through the API: invisible to every other.
    Tenant(String),
}

impl AgentOwner {
    /// The key prefix: `file` or `tenant.<tenant>` (tenants and agent names are KV-key safe).
    fn key_prefix(&self) -> String {
        match self {
            Self::File => "file".to_owned(),
            Self::Tenant(t) => format!("tenant.{t}"),
        }
    }
}

/// The key of one agent in its store.
pub fn agent_key(owner: &AgentOwner, name: &str) -> String {
    format!("{}.{name}", owner.key_prefix())
}

/// One version of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVersion {
    /// 1, 2, … in the order they were put.
    pub version: u64,
    /// The SHA-256 of `definition`, hex: the content's identity (decision 0120).
    pub hash: String,
    /// The definition as canonical JSON (`turnstile_config::AgentConfig::definition`).
    pub definition: String,
    /// The tenants a file agent serves at this version; `None`: every tenant (and always for a tenant's own).
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    pub created_unix_ms: u64,
}

/// An agent and all its versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub owner: AgentOwner,
    pub name: String,
    /// Oldest first; never empty.
    pub versions: Vec<AgentVersion>,
    /// Deleted: no new session may configure it, lists leave it out; its versions stay runnable.
    #[serde(default)]
    pub deleted: bool,
}

impl AgentRecord {
    /// The newest version.
    pub fn latest(&self) -> Option<&AgentVersion> {
        self.versions.last()
    }

    /// Version `version`.
    pub fn version(&self, version: u64) -> Option<&AgentVersion> {
        self.versions.iter().find(|v| v.version == version)
    }
}

/// The content hash of a definition: SHA-256, lower-case hex.
pub fn definition_hash(definition: &str) -> String {
    Sha256::digest(definition.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Where agent records are kept: whole records, replaced by compare-and-set on a revision.
#[async_trait]
pub trait AgentStore: Send + Sync + 'static {
    /// The record under `key` and its revision.
    async fn load(&self, key: &str) -> Result<Option<(AgentRecord, u64)>, JournalError>;
    /// Writes `record` if the key is still at `revision` (0: absent); `Ok(false)` when it moved.
    async fn save(&self, record: &AgentRecord, revision: u64) -> Result<bool, JournalError>;
    /// Every record (deleted ones too).
    async fn list(&self) -> Result<Vec<AgentRecord>, JournalError>;
    /// Counts changes: it moves after every write of any node (the workers reload their catalog on it).
    fn changes(&self) -> watch::Receiver<u64>;
}

/// How many times a write is retried when another writer moved the record under it.
const CAS_ATTEMPTS: usize = 16;

/// What [`put`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Put {
    pub record: AgentRecord,
    /// A new version was written (false: the definition was already the latest, nothing changed).
    pub created: bool,
}

/// Puts `definition` as the newest version of `owner`'s agent `name` (creating it, or bringing a deleted
/// one back): a new version unless it equals the latest one (same definition and tenants) of an agent
/// that is not deleted.
pub async fn put(
    store: &dyn AgentStore,
    owner: &AgentOwner,
    name: &str,
    definition: &str,
    tenants: Option<Vec<String>>,
    now_ms: u64,
) -> Result<Put, JournalError> {
    let key = agent_key(owner, name);
    let hash = definition_hash(definition);
    for _ in 0..CAS_ATTEMPTS {
        let (mut record, revision) = match store.load(&key).await? {
            Some((record, revision)) => (record, revision),
            None => {
                (AgentRecord { owner: owner.clone(), name: name.to_owned(), versions: Vec::new(), deleted: false }, 0)
            }
        };
        if !record.deleted && record.latest().is_some_and(|v| v.hash == hash && v.tenants == tenants) {
            return Ok(Put { record, created: false });
        }
        let version = record.latest().map_or(1, |v| v.version + 1);
        record.versions.push(AgentVersion {
            version,
            hash: hash.clone(),
            definition: definition.to_owned(),
            tenants: tenants.clone(),
            created_unix_ms: now_ms,
        });
        record.deleted = false;
        if store.save(&record, revision).await? {
            return Ok(Put { record, created: true });
        }
    }
    Err(JournalError::Unavailable(format!("agent {name:?} kept changing while it was put; retry")))
}

/// Marks `owner`'s agent `name` deleted; `None` when there is no such agent (or it is deleted already).
pub async fn delete(
    store: &dyn AgentStore,
    owner: &AgentOwner,
    name: &str,
) -> Result<Option<AgentRecord>, JournalError> {
    let key = agent_key(owner, name);
    for _ in 0..CAS_ATTEMPTS {
        let Some((mut record, revision)) = store.load(&key).await? else { return Ok(None) };
        if record.deleted {
            return Ok(None);
        }
        record.deleted = true;
        if store.save(&record, revision).await? {
            return Ok(Some(record));
        }
    }
    Err(JournalError::Unavailable(format!("agent {name:?} kept changing while it was deleted; retry")))
}

/// [`AgentStore`] in memory, optionally kept in one JSON file (`turnstile dev --data-dir`).
#[derive(Debug)]
pub struct MemoryAgents {
    records: Mutex<BTreeMap<String, (AgentRecord, u64)>>,
    file: Option<PathBuf>,
    changes: watch::Sender<u64>,
}

impl Default for MemoryAgents {
    fn default() -> Self {
        Self { records: Mutex::default(), file: None, changes: watch::channel(0).0 }
    }
}

/// The file of [`MemoryAgents::open`] in a data directory.
pub const AGENTS_FILE: &str = "agents.json";

impl MemoryAgents {
    /// Records kept in `dir/agents.json`, read now if it exists.
    pub fn open(dir: &std::path::Path) -> Result<Self, JournalError> {
        let file = dir.join(AGENTS_FILE);
        let records: Vec<AgentRecord> = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| JournalError::Storage(format!("{} is not readable: {e}", file.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(JournalError::Storage(format!("cannot read {}: {e}", file.display()))),
        };
        let records = records.into_iter().map(|r| (agent_key(&r.owner, &r.name), (r, 1))).collect();
        Ok(Self { records: Mutex::new(records), file: Some(file), changes: watch::channel(0).0 })
    }

    /// Writes every record to the file (a temporary file renamed over it, so a crash leaves one or the other).
    fn persist(&self, records: &BTreeMap<String, (AgentRecord, u64)>) -> Result<(), JournalError> {
        let Some(file) = &self.file else { return Ok(()) };
        let all: Vec<&AgentRecord> = records.values().map(|(r, _)| r).collect();
        let bytes = serde_json::to_vec_pretty(&all).map_err(|e| JournalError::Storage(e.to_string()))?;
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, file))
            .map_err(|e| JournalError::Storage(format!("cannot write {}: {e}", file.display())))
    }
}

#[async_trait]
impl AgentStore for MemoryAgents {
    async fn load(&self, key: &str) -> Result<Option<(AgentRecord, u64)>, JournalError> {
        Ok(crate::sync::lock(&self.records).get(key).cloned())
    }

    async fn save(&self, record: &AgentRecord, revision: u64) -> Result<bool, JournalError> {
        let key = agent_key(&record.owner, &record.name);
        {
            let mut records = crate::sync::lock(&self.records);
            let current = records.get(&key).map_or(0, |(_, r)| *r);
            if current != revision {
                return Ok(false);
            }
            let previous = records.insert(key.clone(), (record.clone(), revision + 1));
            if let Err(e) = self.persist(&records) {
                match previous {
                    Some(p) => records.insert(key, p),
                    None => records.remove(&key),
                };
                return Err(e);
            }
        }
        self.changes.send_modify(|n| *n += 1);
        Ok(true)
    }

    async fn list(&self) -> Result<Vec<AgentRecord>, JournalError> {
        Ok(crate::sync::lock(&self.records).values().map(|(r, _)| r.clone()).collect())
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tenant(t: &str) -> AgentOwner {
        AgentOwner::Tenant(t.to_owned())
    }

    #[tokio::test]
    async fn every_change_is_a_new_version_and_an_unchanged_put_is_none() {
        let store = MemoryAgents::default();
        let mut changes = store.changes();
        let first = put(&store, &tenant("a"), "helper", r#"{"system":"one"}"#, None, 10).await.unwrap();
        assert!(first.created);
        assert_eq!(first.record.latest().unwrap().version, 1);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        let again = put(&store, &tenant("a"), "helper", r#"{"system":"one"}"#, None, 20).await.unwrap();
        assert!(!again.created, "the same definition is no new version");
        assert!(!changes.has_changed().unwrap(), "nothing was written");
        let second = put(&store, &tenant("a"), "helper", r#"{"system":"two"}"#, None, 30).await.unwrap();
        assert_eq!(second.record.versions.iter().map(|v| v.version).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(second.record.version(1).unwrap().definition, r#"{"system":"one"}"#);
        assert_eq!(second.record.latest().unwrap().hash, definition_hash(r#"{"system":"two"}"#));
        // Another tenant's agent of the same name is another agent.
        let other = put(&store, &tenant("b"), "helper", r#"{"system":"one"}"#, None, 40).await.unwrap();
        assert_eq!(other.record.latest().unwrap().version, 1);
    }

    #[tokio::test]
    async fn a_deleted_agent_keeps_its_versions_and_a_put_brings_it_back_as_a_new_version() {
        let store = MemoryAgents::default();
        put(&store, &tenant("a"), "x", "{}", None, 1).await.unwrap();
        let deleted = delete(&store, &tenant("a"), "x").await.unwrap().unwrap();
        assert!(deleted.deleted && deleted.versions.len() == 1);
        assert_eq!(delete(&store, &tenant("a"), "x").await.unwrap(), None, "already deleted");
        assert_eq!(delete(&store, &tenant("b"), "x").await.unwrap(), None, "another tenant's: none");
        let back = put(&store, &tenant("a"), "x", "{}", None, 2).await.unwrap();
        assert!(back.created && !back.record.deleted);
        assert_eq!(back.record.latest().unwrap().version, 2);
    }

    #[tokio::test]
    async fn records_in_a_data_directory_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = MemoryAgents::open(dir.path()).unwrap();
            put(&store, &AgentOwner::File, "x", "{}", Some(vec!["a".into()]), 1).await.unwrap();
        }
        let store = MemoryAgents::open(dir.path()).unwrap();
        let all = store.list().await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].versions[0].tenants, Some(vec!["a".to_owned()]));
        assert!(!put(&store, &AgentOwner::File, "x", "{}", Some(vec!["a".into()]), 2).await.unwrap().created);
    }
}
