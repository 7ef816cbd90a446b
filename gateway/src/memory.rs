//! `PutMemory`, `GetMemory`, `ListMemory`, `SearchMemory` and `DeleteMemory` (SPEC §20, decision 0147): a
//! tenant's memory, in the store the node opened ([`MemoryStore`]). Every call acts in the tenant the
//! tenancy rule resolved ([`crate::scope`]), which is the only tenant the store is asked about.

use std::sync::Arc;

use tonic::Status;
use turnstile_journal::memory::{ListQuery, MemoryDocument, MemoryError, MemoryPut, MemoryStore, SearchQuery};
use turnstile_model::Tenant;
use turnstile_proto::v1 as pb;

use crate::service::Gateway;
use crate::status;

/// `ListMemory`'s page size when the request says 0, and the largest it may ask for.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1000;
/// `SearchMemory`'s result count when the request says 0, and the largest it may ask for.
pub const DEFAULT_HITS: usize = 10;
pub const MAX_HITS: usize = 100;

/// A document on the wire.
pub fn encode(document: MemoryDocument) -> pb::MemoryDocument {
    pb::MemoryDocument {
        tenant: document.tenant,
        namespace: document.namespace,
        key: document.key,
        document: document.document,
        revision: document.revision,
        updated_unix_ms: document.updated_unix_ms,
        written_by: document.written_by.unwrap_or_default(),
    }
}

/// The status of a memory error: the rules' refusals name the field, the limits name their key.
pub fn from_memory(err: MemoryError) -> Status {
    match err {
        MemoryError::Value(e) => Status::invalid_argument(e.to_string()),
        e @ (MemoryError::TooManyDocuments { .. } | MemoryError::TenantFull { .. }) => {
            Status::resource_exhausted(e.to_string())
        }
        MemoryError::Journal(e) => status::from_journal(e),
    }
}

fn not_found(namespace: &str, key: &str) -> Status {
    Status::not_found(format!("memory {namespace}/{key:?} not found; ListMemory lists the keys there are"))
}

/// `page_token` is `<namespace>\n<key>` (keys hold no control characters).
fn page_token(after: Option<(String, String)>) -> String {
    after.map(|(ns, key)| format!("{ns}\n{key}")).unwrap_or_default()
}

fn parse_page_token(token: &str) -> Result<Option<(String, String)>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token.split_once('\n').map(|(ns, key)| Some((ns.to_owned(), key.to_owned()))).ok_or_else(|| {
        Status::invalid_argument("page_token: is not a token ListMemory gave; send the last reply's next_page_token")
    })
}

impl Gateway {
    fn memory(&self) -> Result<&Arc<dyn MemoryStore>, Status> {
        self.memory.as_ref().ok_or_else(|| {
            Status::unimplemented("this gateway keeps no memory (it was started without a memory store)")
        })
    }

    pub(crate) async fn put_memory_in(
        &self,
        tenant: &Tenant,
        req: pb::PutMemoryRequest,
    ) -> Result<pb::MemoryDocument, Status> {
        let put = MemoryPut {
            tenant: tenant.as_str().to_owned(),
            namespace: req.namespace,
            key: req.key,
            document: req.document,
            written_by: None,
            now_ms: turnstile_ops::clock::now_ms(),
        };
        self.memory()?.put(put).await.map(encode).map_err(from_memory)
    }

    pub(crate) async fn get_memory_in(
        &self,
        tenant: &Tenant,
        req: pb::GetMemoryRequest,
    ) -> Result<pb::MemoryDocument, Status> {
        let found = self.memory()?.get(tenant.as_str(), &req.namespace, &req.key).await.map_err(from_memory)?;
        found.map(encode).ok_or_else(|| not_found(&req.namespace, &req.key))
    }

    pub(crate) async fn delete_memory_in(
        &self,
        tenant: &Tenant,
        req: pb::DeleteMemoryRequest,
    ) -> Result<pb::MemoryDocument, Status> {
        let deleted = self.memory()?.delete(tenant.as_str(), &req.namespace, &req.key).await.map_err(from_memory)?;
        deleted.map(encode).ok_or_else(|| not_found(&req.namespace, &req.key))
    }

    pub(crate) async fn list_memory_in(
        &self,
        tenant: &Tenant,
        req: pb::ListMemoryRequest,
    ) -> Result<pb::ListMemoryReply, Status> {
        if !req.namespace.is_empty() {
            turnstile_model::memory::validate_namespace(&req.namespace)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let limit = status::bounded("page_size", req.page_size as usize, DEFAULT_PAGE, MAX_PAGE)?;
        let query = ListQuery {
            namespace: req.namespace,
            prefix: req.prefix,
            after: parse_page_token(&req.page_token)?,
            limit,
        };
        let page = self.memory()?.list(tenant.as_str(), &query).await.map_err(from_memory)?;
        Ok(pb::ListMemoryReply {
            documents: page.documents.into_iter().map(encode).collect(),
            next_page_token: page_token(page.next),
        })
    }

    pub(crate) async fn search_memory_in(
        &self,
        tenant: &Tenant,
        req: pb::SearchMemoryRequest,
    ) -> Result<pb::SearchMemoryReply, Status> {
        for namespace in &req.namespaces {
            turnstile_model::memory::validate_namespace(namespace)
                .map_err(|e| Status::invalid_argument(format!("namespaces: {e}")))?;
        }
        if turnstile_journal::memory::tokens(&req.query).next().is_none() {
            return Err(Status::invalid_argument(
                "query: has no words; send the words to look for, for example \"favourite colour\"",
            ));
        }
        let limit = status::bounded("limit", req.limit as usize, DEFAULT_HITS, MAX_HITS)?;
        let query = SearchQuery { namespaces: req.namespaces, text: req.query, limit };
        let hits = self.memory()?.search(tenant.as_str(), &query).await.map_err(from_memory)?;
        Ok(pb::SearchMemoryReply {
            hits: hits
                .into_iter()
                .map(|h| pb::MemoryHit { document: Some(encode(h.document)), score: h.score })
                .collect(),
        })
    }
}
