//! Memory (SPEC §20, decision 0147): a tenant's durable JSON documents in namespaces, by key, searchable by
//! words.
//!
//! Every store keeps the same [`MemoryIndex`] of documents (the index answers lists, search and the
//! per-tenant counts the limits need): [`LocalMemory`] for the embedded journal (in memory, or an append-only
//! file in the data directory), [`crate::jetstream::KvMemory`] on the KV bucket `turnstile_memory` (one key
//! per document, replicated like every bucket: R3 in a cluster), whose index follows the bucket on every
//! node. Tenancy is in the signature: every call names its tenant, and nothing reads across tenants.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use turnstile_model::memory::MemoryValueError;

use crate::log::JournalError;

mod index;
mod local;

pub use index::{MemoryIndex, tokens};
pub use local::{LocalMemory, MEMORY_FILE};

/// One document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryDocument {
    pub tenant: String,
    pub namespace: String,
    pub key: String,
    /// The JSON value, as text.
    pub document: String,
    /// The store's revision of this write (grows with every write of the store).
    #[serde(default)]
    pub revision: u64,
    pub updated_unix_ms: u64,
    /// Who wrote it: `<tenant>/<session>/<call_id>` for an agent's `memory_put`; `None` through the API.
    #[serde(default)]
    pub written_by: Option<String>,
}

/// What a put writes.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPut {
    pub tenant: String,
    pub namespace: String,
    pub key: String,
    pub document: String,
    pub written_by: Option<String>,
    pub now_ms: u64,
}

impl MemoryPut {
    /// The document this put writes, as revision `revision` of its key.
    pub fn document(self, revision: u64) -> MemoryDocument {
        MemoryDocument {
            tenant: self.tenant,
            namespace: self.namespace,
            key: self.key,
            document: self.document,
            revision,
            updated_unix_ms: self.now_ms,
            written_by: self.written_by,
        }
    }
}

/// The per-tenant limits (config `[memory]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimits {
    /// `memory.max_document_bytes`: the largest document.
    pub max_document_bytes: usize,
    /// `memory.max_documents_per_tenant`: documents one tenant keeps, over all its namespaces.
    pub max_documents_per_tenant: usize,
    /// `memory.max_bytes_per_tenant`: the bytes of one tenant's documents, over all its namespaces.
    pub max_bytes_per_tenant: u64,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self { max_document_bytes: 64 * 1024, max_documents_per_tenant: 100_000, max_bytes_per_tenant: 256 << 20 }
    }
}

/// Why a memory call failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A namespace, key or document the rules refuse (INVALID_ARGUMENT).
    #[error(transparent)]
    Value(#[from] MemoryValueError),
    /// The tenant keeps as many documents as it may (RESOURCE_EXHAUSTED).
    #[error(
        "tenant {tenant} already keeps {limit} memory documents, the limit (config memory.max_documents_per_tenant); \
         delete documents it no longer needs, or raise the limit"
    )]
    TooManyDocuments { tenant: String, limit: usize },
    /// The tenant's documents would pass its byte limit (RESOURCE_EXHAUSTED).
    #[error(
        "tenant {tenant}'s memory would hold {bytes} bytes, over the limit of {limit} (config \
         memory.max_bytes_per_tenant); delete documents it no longer needs, or raise the limit"
    )]
    TenantFull { tenant: String, bytes: u64, limit: u64 },
    /// The store could not be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// A search result: the document and its BM25 score (higher is better).
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    pub document: MemoryDocument,
    pub score: f64,
}

/// A page of [`MemoryStore::list`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListPage {
    pub documents: Vec<MemoryDocument>,
    /// Where the next page starts (`(namespace, key)` after which to list); `None` at the end.
    pub next: Option<(String, String)>,
}

/// What [`MemoryStore::list`] lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListQuery {
    /// One namespace, or every namespace of the tenant when empty.
    pub namespace: String,
    /// Keys starting with this.
    pub prefix: String,
    /// Documents after this `(namespace, key)`.
    pub after: Option<(String, String)>,
    pub limit: usize,
}

/// What [`MemoryStore::search`] searches: the `limit` documents of `namespaces` (every namespace of the
/// tenant when empty) that best match the words of `text`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SearchQuery {
    pub namespaces: Vec<String>,
    pub text: String,
    pub limit: usize,
}

/// Where a tenant's memory is kept.
#[async_trait]
pub trait MemoryStore: Send + Sync + 'static {
    /// The limits every put is checked against.
    fn limits(&self) -> MemoryLimits;
    /// Writes a document (a new one or over the key's), after checking names, size and the tenant's limits.
    async fn put(&self, put: MemoryPut) -> Result<MemoryDocument, MemoryError>;
    /// The document at `key`.
    async fn get(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError>;
    /// Deletes the document at `key`; the deleted one, or `None` when there was none.
    async fn delete(&self, tenant: &str, namespace: &str, key: &str) -> Result<Option<MemoryDocument>, MemoryError>;
    /// A page of documents in `(namespace, key)` order.
    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<ListPage, MemoryError>;
    /// The documents that best match `query`, best first.
    async fn search(&self, tenant: &str, query: &SearchQuery) -> Result<Vec<SearchHit>, MemoryError>;
}

/// Checks a put against the rules of `turnstile_model::memory` and `limits`' document size.
pub(crate) fn check_values(put: &MemoryPut, limits: &MemoryLimits) -> Result<serde_json::Value, MemoryError> {
    use turnstile_model::memory::{validate_document, validate_key, validate_namespace};
    validate_namespace(&put.namespace)?;
    validate_key(&put.key)?;
    Ok(validate_document(&put.key, &put.document, limits.max_document_bytes)?)
}

/// Checks a namespace and key of a read.
pub(crate) fn check_address(namespace: &str, key: &str) -> Result<(), MemoryError> {
    turnstile_model::memory::validate_namespace(namespace)?;
    turnstile_model::memory::validate_key(key)?;
    Ok(())
}
