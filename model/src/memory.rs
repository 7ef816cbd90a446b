//! Memory (SPEC §20, decision 0147): a tenant's durable JSON documents, in namespaces, by key. The rules
//! for names and sizes live here, once, for the API, the built-in tools and the stores; so does
//! `memory/written`, the event an agent's write adds to its session (provenance).

use serde::{Deserialize, Serialize};

/// The longest namespace, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 64;
/// The longest document key, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Why a namespace, key or document is refused, naming the field and the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryValueError {
    #[error(
        "namespace {value:?} is not a namespace: use 1 to {MAX_NAMESPACE_LEN} of A-Z, a-z, 0-9, '-' and '_' \
         (for example user-42 or support_agent)"
    )]
    Namespace { value: String },
    #[error(
        "key: must be 1 to {MAX_KEY_LEN} bytes without control characters, got {len} bytes; use a short path \
         such as prefs/language"
    )]
    Key { len: usize },
    #[error("document: is not JSON ({detail}); send a JSON value such as {{\"fact\": \"...\"}}")]
    NotJson { detail: String },
    #[error(
        "document {key:?} is {bytes} bytes, over the limit of {limit} (config memory.max_document_bytes); \
         store less per key or split it over several keys"
    )]
    TooLarge { key: String, bytes: usize, limit: usize },
}

/// Checks a namespace: the characters of a session id, at most [`MAX_NAMESPACE_LEN`] bytes.
pub fn validate_namespace(namespace: &str) -> Result<(), MemoryValueError> {
    let ok = !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_LEN
        && namespace.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok { Ok(()) } else { Err(MemoryValueError::Namespace { value: namespace.to_owned() }) }
}

/// Checks a key: any text of 1 to [`MAX_KEY_LEN`] bytes without control characters (`/` may structure it:
/// `ListMemory` lists by prefix).
pub fn validate_key(key: &str) -> Result<(), MemoryValueError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.chars().any(char::is_control) {
        return Err(MemoryValueError::Key { len: key.len() });
    }
    Ok(())
}

/// Checks a document: JSON, at most `limit` bytes as sent. Returns it parsed (search reads its words).
pub fn validate_document(key: &str, document: &str, limit: usize) -> Result<serde_json::Value, MemoryValueError> {
    if document.len() > limit {
        return Err(MemoryValueError::TooLarge { key: key.to_owned(), bytes: document.len(), limit });
    }
    serde_json::from_str(document).map_err(|e| MemoryValueError::NotJson { detail: e.to_string() })
}

/// `memory/written` (SPEC §20): a write an agent made through `memory_put`, recorded in its session just
/// before the call's `tool/result`. The document itself is in the call's arguments (`tool/call`); the
/// store's copy names the call in its `written_by`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryWritten {
    pub turn: u64,
    pub step: u32,
    pub call_id: String,
    pub namespace: String,
    pub key: String,
    /// The store's revision of the document after the write.
    pub revision: u64,
    /// The document's size in bytes.
    pub bytes: u64,
}

/// A write a tool reports with its result (the driver records it as [`MemoryWritten`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryWrite {
    pub namespace: String,
    pub key: String,
    pub revision: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keys_and_documents() {
        assert!(validate_namespace("user-42").is_ok());
        for bad in ["", "a.b", "a/b", &"x".repeat(65)] {
            assert_eq!(validate_namespace(bad), Err(MemoryValueError::Namespace { value: bad.to_owned() }));
        }
        assert!(validate_key("prefs/language").is_ok());
        assert_eq!(validate_key(""), Err(MemoryValueError::Key { len: 0 }));
        assert_eq!(validate_key("a\nb"), Err(MemoryValueError::Key { len: 3 }));
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(validate_document("k", r#"{"a":1}"#, 7).is_ok());
        assert_eq!(
            validate_document("k", r#"{"a":10}"#, 7),
            Err(MemoryValueError::TooLarge { key: "k".into(), bytes: 8, limit: 7 })
        );
        assert!(matches!(validate_document("k", "{", 100), Err(MemoryValueError::NotJson { .. })));
    }
}
