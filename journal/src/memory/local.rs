//! [`LocalMemory`]: memory for the embedded journal, in memory or in `memory.jsonl` in the data directory
//! (`turnstile dev --data-dir`): one line per write, appended and flushed before the write is answered,
//! replayed and compacted (rewritten with one line per document) when the store opens.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{
    ListPage, ListQuery, MemoryDocument, MemoryError, MemoryIndex, MemoryLimits, MemoryPut, MemoryStore, SearchHit,
    SearchQuery, check_address, check_values,
};
use crate::log::JournalError;

/// The file of [`LocalMemory::open`] in a data directory.
pub const MEMORY_FILE: &str = "memory.jsonl";

/// One line of the file.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Put(MemoryDocument),
    Delete { tenant: String, namespace: String, key: String },
}

struct State {
    index: MemoryIndex,
    revision: u64,
    file: Option<std::fs::File>,
}

/// [`MemoryStore`] in this process.
pub struct LocalMemory {
    state: Mutex<State>,
    limits: MemoryLimits,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for LocalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalMemory").field("path", &self.path).finish_non_exhaustive()
    }
}

fn storage(path: &Path, e: impl std::fmt::Display) -> JournalError {
    JournalError::Storage(format!("memory file {}: {e}", path.display()))
}

impl LocalMemory {
    /// Memory kept in this process only.
    pub fn in_memory(limits: MemoryLimits) -> Self {
        let state = State { index: MemoryIndex::default(), revision: 0, file: None };
        Self { state: Mutex::new(state), limits, path: None }
    }

    /// Memory kept in `dir/memory.jsonl`, read now if it exists.
    pub fn open(dir: &Path, limits: MemoryLimits) -> Result<Self, JournalError> {
        let path = dir.join(MEMORY_FILE);
        let mut index = MemoryIndex::default();
        let mut revision = 0;
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    let line: Line =
                        serde_json::from_str(line).map_err(|e| storage(&path, format!("line {}: {e}", n + 1)))?;
                    match line {
                        Line::Put(document) => {
                            revision = revision.max(document.revision);
                            index.insert(document);
                        }
                        Line::Delete { tenant, namespace, key } => {
                            index.remove(&tenant, &namespace, &key);
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(storage(&path, e)),
        }
        // Compact: one line per live document, written aside and renamed over the file.
        let tmp = path.with_extension("jsonl.tmp");
        let mut out = Vec::new();
        for document in index.documents() {
            serde_json::to_writer(&mut out, &Line::Put(document.clone())).map_err(|e| storage(&path, e))?;
            out.push(b'\n');
        }
        std::fs::write(&tmp, out).and_then(|()| std::fs::rename(&tmp, &path)).map_err(|e| storage(&path, e))?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| storage(&path, e))?;
        let state = State { index, revision, file: Some(file) };
        Ok(Self { state: Mutex::new(state), limits, path: Some(path) })
    }

    /// Appends `line` to the file, if there is one; nothing changes in memory when this fails.
    fn append(&self, state: &mut State, line: &Line) -> Result<(), JournalError> {
        let (Some(file), Some(path)) = (state.file.as_mut(), &self.path) else { return Ok(()) };
        let mut bytes = serde_json::to_vec(line).map_err(|e| storage(path, e))?;
        bytes.push(b'\n');
        file.write_all(&bytes).and_then(|()| file.sync_data()).map_err(|e| storage(path, e))
    }
}

#[async_trait]
impl MemoryStore for LocalMemory {
    fn limits(&self) -> MemoryLimits {
        self.limits
    }

    async fn put(&self, put: MemoryPut) -> Result<MemoryDocument, MemoryError> {
        check_values(&put, &self.limits)?;
        let mut state = crate::sync::lock(&self.state);
        state.index.admit(&put, &self.limits)?;
        let document = put.document(state.revision + 1);
        self.append(&mut state, &Line::Put(document.clone()))?;
        state.revision += 1;
        state.index.insert(document.clone());
        Ok(document)
    }

    async fn get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError> {
        check_address(namespace, key)?;
        Ok(crate::sync::lock(&self.state).index.get(tenant, namespace, key).cloned())
    }

    async fn delete(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError> {
        check_address(namespace, key)?;
        let mut state = crate::sync::lock(&self.state);
        if state.index.get(tenant, namespace, key).is_none() {
            return Ok(None);
        }
        let line = Line::Delete { tenant: tenant.to_owned(), namespace: namespace.to_owned(), key: key.to_owned() };
        self.append(&mut state, &line)?;
        state.revision += 1;
        Ok(state.index.remove(tenant, namespace, key))
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<ListPage, MemoryError> {
        Ok(crate::sync::lock(&self.state).index.list(tenant, query))
    }

    async fn search(&self, tenant: &str, query: &SearchQuery) -> Result<Vec<SearchHit>, MemoryError> {
        Ok(crate::sync::lock(&self.state).index.search(tenant, query))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn put(key: &str, document: &str) -> MemoryPut {
        MemoryPut {
            tenant: "t".into(),
            namespace: "n".into(),
            key: key.into(),
            document: document.into(),
            written_by: Some("t/s1/c1".into()),
            now_ms: 7,
        }
    }

    #[tokio::test]
    async fn documents_in_a_data_directory_survive_a_restart_and_deletes_stay_deleted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LocalMemory::open(dir.path(), MemoryLimits::default()).unwrap();
            store.put(put("a", r#"{"fact": "kept"}"#)).await.unwrap();
            store.put(put("b", r#"{"fact": "deleted"}"#)).await.unwrap();
            assert_eq!(store.delete("t", "n", "b").await.unwrap().unwrap().key, "b");
            assert!(store.delete("t", "n", "b").await.unwrap().is_none());
        }
        let store = LocalMemory::open(dir.path(), MemoryLimits::default()).unwrap();
        let a = store.get("t", "n", "a").await.unwrap().unwrap();
        assert_eq!(
            (a.document.as_str(), a.written_by.as_deref(), a.updated_unix_ms),
            (r#"{"fact": "kept"}"#, Some("t/s1/c1"), 7)
        );
        assert!(store.get("t", "n", "b").await.unwrap().is_none());
        assert_eq!(
            store
                .search("t", &SearchQuery { text: "kept".into(), limit: 5, ..SearchQuery::default() })
                .await
                .unwrap()
                .len(),
            1
        );
        let next = store.put(put("c", "1")).await.unwrap();
        assert!(next.revision > a.revision, "revisions go on growing after a restart");
    }

    #[tokio::test]
    async fn refusals_name_the_field_and_the_limit_and_write_nothing() {
        let limits = MemoryLimits { max_document_bytes: 16, max_documents_per_tenant: 1, max_bytes_per_tenant: 1000 };
        let store = LocalMemory::in_memory(limits);
        let e = store.put(put("a", r#"{"x": "much too long"}"#)).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "document \"a\" is 22 bytes, over the limit of 16 (config memory.max_document_bytes); store less per \
             key or split it over several keys"
        );
        assert!(matches!(store.put(put("a", "{")).await, Err(MemoryError::Value(_))));
        assert!(matches!(
            store.put(MemoryPut { namespace: "a.b".into(), ..put("a", "1") }).await,
            Err(MemoryError::Value(_))
        ));
        store.put(put("a", "1")).await.unwrap();
        assert!(matches!(store.put(put("b", "2")).await, Err(MemoryError::TooManyDocuments { limit: 1, .. })));
        assert!(store.get("t", "n", "b").await.unwrap().is_none());
    }
}
