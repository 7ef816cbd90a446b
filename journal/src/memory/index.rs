//! [`MemoryIndex`]: every document of every tenant in memory, with an inverted index per namespace for
//! `SearchMemory` and the per-tenant counts the limits need.
//!
//! Search is BM25 (k1 = 1.2, b = 0.75) over the words of each document: its key and every string, number
//! and boolean in its JSON value (object field names are left out: they say what a value is, not what it is
//! about). A word is a run of letters and digits, lower-cased; there is no stemming and no stop-word list.
//! The corpus statistics (document count, average length, document frequency) are those of the namespaces
//! searched, so a score compares documents of one search.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{ListPage, ListQuery, MemoryDocument, MemoryError, MemoryLimits, MemoryPut, SearchHit, SearchQuery};

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// The words of `text`: runs of letters and digits, lower-cased.
pub fn tokens(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase)
}

/// The words of a document: its key and the scalar values of its JSON, with their counts.
fn document_terms(key: &str, value: &serde_json::Value) -> HashMap<String, u32> {
    fn walk(value: &serde_json::Value, out: &mut HashMap<String, u32>) {
        match value {
            serde_json::Value::String(s) => tokens(s).for_each(|t| *out.entry(t).or_default() += 1),
            serde_json::Value::Number(n) => tokens(&n.to_string()).for_each(|t| *out.entry(t).or_default() += 1),
            serde_json::Value::Bool(b) => *out.entry(b.to_string()).or_default() += 1,
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            serde_json::Value::Object(fields) => fields.values().for_each(|v| walk(v, out)),
            serde_json::Value::Null => {}
        }
    }
    let mut out = HashMap::new();
    tokens(key).for_each(|t| *out.entry(t).or_default() += 1);
    walk(value, &mut out);
    out
}

struct Stored {
    document: MemoryDocument,
    terms: HashMap<String, u32>,
    length: u64,
}

#[derive(Default)]
struct Namespace {
    documents: BTreeMap<Arc<str>, Stored>,
    /// term → the keys holding it, with the term's count in each.
    postings: HashMap<String, HashMap<Arc<str>, u32>>,
    /// The sum of the documents' lengths (in words).
    length: u64,
}

#[derive(Default)]
struct TenantMemory {
    namespaces: BTreeMap<String, Namespace>,
    documents: usize,
    bytes: u64,
}

/// Every document, indexed.
#[derive(Default)]
pub struct MemoryIndex {
    tenants: HashMap<String, TenantMemory>,
}

impl std::fmt::Debug for MemoryIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryIndex").field("tenants", &self.tenants.len()).finish_non_exhaustive()
    }
}

impl MemoryIndex {
    /// Whether `put` fits `limits` given what its tenant keeps (a put over an existing key counts its
    /// new size instead of the old one).
    pub fn admit(&self, put: &MemoryPut, limits: &MemoryLimits) -> Result<(), MemoryError> {
        let Some(tenant) = self.tenants.get(&put.tenant) else { return Ok(()) };
        let old = tenant
            .namespaces
            .get(&put.namespace)
            .and_then(|ns| ns.documents.get(put.key.as_str()))
            .map(|s| s.document.document.len() as u64);
        if old.is_none() && tenant.documents >= limits.max_documents_per_tenant {
            return Err(MemoryError::TooManyDocuments {
                tenant: put.tenant.clone(),
                limit: limits.max_documents_per_tenant,
            });
        }
        let bytes = tenant.bytes - old.unwrap_or(0) + put.document.len() as u64;
        if bytes > limits.max_bytes_per_tenant {
            return Err(MemoryError::TenantFull {
                tenant: put.tenant.clone(),
                bytes,
                limit: limits.max_bytes_per_tenant,
            });
        }
        Ok(())
    }

    /// Stores `document` (replacing its key's), indexing its words. A document that is not JSON (which
    /// no store writes) is kept and found by its key's words only.
    pub fn insert(&mut self, document: MemoryDocument) {
        let value = serde_json::from_str(&document.document).unwrap_or(serde_json::Value::Null);
        let terms = document_terms(&document.key, &value);
        self.remove(&document.tenant, &document.namespace, &document.key);
        let tenant = self.tenants.entry(document.tenant.clone()).or_default();
        let ns = tenant.namespaces.entry(document.namespace.clone()).or_default();
        let key: Arc<str> = Arc::from(document.key.as_str());
        let length: u64 = terms.values().map(|&n| u64::from(n)).sum();
        for (term, &count) in &terms {
            ns.postings.entry(term.clone()).or_default().insert(key.clone(), count);
        }
        ns.length += length;
        tenant.documents += 1;
        tenant.bytes += document.document.len() as u64;
        ns.documents.insert(key, Stored { document, terms, length });
    }

    /// Removes the document at `key`; the removed one.
    pub fn remove(&mut self, tenant: &str, namespace: &str, key: &str) -> Option<MemoryDocument> {
        let memory = self.tenants.get_mut(tenant)?;
        let ns = memory.namespaces.get_mut(namespace)?;
        let stored = ns.documents.remove(key)?;
        for term in stored.terms.keys() {
            if let Some(keys) = ns.postings.get_mut(term) {
                keys.remove(key);
                if keys.is_empty() {
                    ns.postings.remove(term);
                }
            }
        }
        ns.length -= stored.length;
        memory.documents -= 1;
        memory.bytes -= stored.document.document.len() as u64;
        if ns.documents.is_empty() {
            memory.namespaces.remove(namespace);
        }
        if memory.namespaces.is_empty() {
            self.tenants.remove(tenant);
        }
        Some(stored.document)
    }

    pub fn get(&self, tenant: &str, namespace: &str, key: &str) -> Option<&MemoryDocument> {
        self.tenants.get(tenant)?.namespaces.get(namespace)?.documents.get(key).map(|s| &s.document)
    }

    /// How many documents `tenant` keeps, and their bytes.
    pub fn usage(&self, tenant: &str) -> (usize, u64) {
        self.tenants.get(tenant).map_or((0, 0), |t| (t.documents, t.bytes))
    }

    /// A page of `tenant`'s documents in `(namespace, key)` order.
    pub fn list(&self, tenant: &str, query: &ListQuery) -> ListPage {
        let Some(memory) = self.tenants.get(tenant) else { return ListPage::default() };
        let limit = query.limit.max(1);
        let mut documents = Vec::new();
        let namespaces: Box<dyn Iterator<Item = (&String, &Namespace)>> = if query.namespace.is_empty() {
            Box::new(memory.namespaces.iter())
        } else {
            Box::new(memory.namespaces.get_key_value(&query.namespace).into_iter())
        };
        for (name, ns) in namespaces {
            let start = match &query.after {
                Some((after_ns, _)) if name < after_ns => continue,
                Some((after_ns, after_key)) if name == after_ns && after_key.as_str() >= query.prefix.as_str() => {
                    std::ops::Bound::Excluded(after_key.as_str())
                }
                _ => std::ops::Bound::Included(query.prefix.as_str()),
            };
            let range = ns.documents.range::<str, _>((start, std::ops::Bound::Unbounded));
            for (key, stored) in range {
                if !key.starts_with(query.prefix.as_str()) {
                    break;
                }
                if documents.len() == limit {
                    let next = documents.last().map(|d: &MemoryDocument| (d.namespace.clone(), d.key.clone()));
                    return ListPage { documents, next };
                }
                documents.push(stored.document.clone());
            }
        }
        ListPage { documents, next: None }
    }

    /// The `query.limit` best documents for `query` ([`SearchQuery`]), by BM25; ties in key order.
    pub fn search(&self, tenant: &str, query: &SearchQuery) -> Vec<SearchHit> {
        let SearchQuery { namespaces, text: query, limit } = query;
        let limit = *limit;
        let Some(memory) = self.tenants.get(tenant) else { return Vec::new() };
        let searched: Vec<&Namespace> = if namespaces.is_empty() {
            memory.namespaces.values().collect()
        } else {
            namespaces.iter().filter_map(|n| memory.namespaces.get(n)).collect()
        };
        let count: u64 = searched.iter().map(|ns| ns.documents.len() as u64).sum();
        if count == 0 {
            return Vec::new();
        }
        let average = searched.iter().map(|ns| ns.length).sum::<u64>() as f64 / count as f64;
        let mut words: Vec<String> = tokens(query).collect();
        words.sort();
        words.dedup();
        let mut scores: HashMap<(usize, &str), f64> = HashMap::new();
        for word in &words {
            let frequency: u64 =
                searched.iter().map(|ns| ns.postings.get(word).map_or(0, |keys| keys.len() as u64)).sum();
            if frequency == 0 {
                continue;
            }
            let idf = (1.0 + (count as f64 - frequency as f64 + 0.5) / (frequency as f64 + 0.5)).ln();
            for (i, ns) in searched.iter().enumerate() {
                let Some(keys) = ns.postings.get(word) else { continue };
                for (key, &tf) in keys {
                    let length = ns.documents.get(key).map_or(0, |s| s.length) as f64;
                    let tf = f64::from(tf);
                    let norm = if average > 0.0 { length / average } else { 1.0 };
                    *scores.entry((i, key)).or_default() += idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * norm));
                }
            }
        }
        let mut hits: Vec<((usize, &str), f64)> = scores.into_iter().collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        hits.into_iter()
            .take(limit)
            .filter_map(|((i, key), score)| {
                searched[i].documents.get(key).map(|s| SearchHit { document: s.document.clone(), score })
            })
            .collect()
    }

    /// Every document (a store's file is rewritten from it).
    pub fn documents(&self) -> impl Iterator<Item = &MemoryDocument> {
        self.tenants
            .values()
            .flat_map(|t| t.namespaces.values())
            .flat_map(|ns| ns.documents.values())
            .map(|s| &s.document)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn search(namespaces: &[String], text: &str) -> SearchQuery {
        SearchQuery { namespaces: namespaces.to_vec(), text: text.to_owned(), limit: 10 }
    }

    fn doc(tenant: &str, ns: &str, key: &str, value: &str) -> MemoryDocument {
        MemoryDocument {
            tenant: tenant.into(),
            namespace: ns.into(),
            key: key.into(),
            document: value.into(),
            revision: 1,
            updated_unix_ms: 0,
            written_by: None,
        }
    }

    fn keys(hits: &[SearchHit]) -> Vec<&str> {
        hits.iter().map(|h| h.document.key.as_str()).collect()
    }

    #[test]
    fn search_ranks_rare_and_repeated_words_first_and_stays_in_its_tenant_and_namespaces() {
        let mut index = MemoryIndex::default();
        index.insert(doc("a", "user-1", "pets", r#"{"fact": "Ada has a cat named Turing"}"#));
        index.insert(doc("a", "user-1", "food", r#"{"fact": "Ada likes cat-shaped cookies and tea", "n": 3}"#));
        index.insert(doc("a", "user-1", "tea", r#"{"fact": "tea tea tea, always tea"}"#));
        index.insert(doc("a", "user-2", "pets", r#"{"fact": "Bob has a dog"}"#));
        index.insert(doc("b", "user-1", "pets", r#"{"fact": "the other tenant's cat"}"#));
        let hits = index.search("a", &search(&[], "Turing cat"));
        assert_eq!(keys(&hits), ["pets", "food"], "the rare word first; no other tenant's document");
        assert!(hits[0].score > hits[1].score);
        assert_eq!(
            keys(&index.search("a", &search(&[], "tea"))),
            ["tea", "food"],
            "a word said more often ranks higher"
        );
        assert_eq!(keys(&index.search("a", &search(&["user-2".into()], "cat dog"))), ["pets"]);
        assert_eq!(index.search("a", &search(&["user-2".into()], "cat dog"))[0].document.namespace, "user-2");
        assert!(index.search("a", &search(&[], "fact")).is_empty(), "field names are not words");
        assert_eq!(keys(&index.search("a", &search(&[], "3"))), ["food"], "numbers are words");
        assert!(index.search("c", &search(&[], "cat")).is_empty());
        // Replaced and removed documents leave the index.
        index.insert(doc("a", "user-1", "pets", r#"{"fact": "no more animals"}"#));
        assert_eq!(keys(&index.search("a", &search(&[], "turing"))), Vec::<&str>::new());
        assert_eq!(index.remove("a", "user-1", "food").unwrap().key, "food");
        assert_eq!(keys(&index.search("a", &search(&[], "cat"))), Vec::<&str>::new());
        assert_eq!(index.usage("a").0, 3);
    }

    #[test]
    fn lists_page_by_prefix_in_namespace_then_key_order() {
        let mut index = MemoryIndex::default();
        for (ns, key) in [("n1", "a/1"), ("n1", "a/2"), ("n1", "b/1"), ("n2", "a/3"), ("n2", "c")] {
            index.insert(doc("t", ns, key, "{}"));
        }
        let list = |namespace: &str, prefix: &str, after: Option<(String, String)>, limit| {
            let q = ListQuery { namespace: namespace.into(), prefix: prefix.into(), after, limit };
            let page = index.list("t", &q);
            let keys: Vec<String> = page.documents.iter().map(|d| format!("{}:{}", d.namespace, d.key)).collect();
            (keys, page.next)
        };
        let (first, next) = list("", "a/", None, 2);
        assert_eq!(first, ["n1:a/1", "n1:a/2"]);
        let (second, next) = list("", "a/", next, 2);
        assert_eq!(second, ["n2:a/3"]);
        assert_eq!(next, None);
        assert_eq!(list("n1", "", None, 10).0, ["n1:a/1", "n1:a/2", "n1:b/1"]);
        assert_eq!(list("n3", "", None, 10).0, Vec::<String>::new());
        assert_eq!(list("n1", "", Some(("n1".into(), "a/2".into())), 10).0, ["n1:b/1"]);
    }

    #[test]
    fn limits_count_documents_and_bytes_per_tenant() {
        let mut index = MemoryIndex::default();
        let limits = MemoryLimits { max_document_bytes: 100, max_documents_per_tenant: 2, max_bytes_per_tenant: 10 };
        index.insert(doc("t", "n", "a", "1234"));
        index.insert(doc("t", "n", "b", "12"));
        let put = |key: &str, document: &str| MemoryPut {
            tenant: "t".into(),
            namespace: "n".into(),
            key: key.into(),
            document: document.into(),
            written_by: None,
            now_ms: 0,
        };
        assert!(matches!(index.admit(&put("c", "1"), &limits), Err(MemoryError::TooManyDocuments { limit: 2, .. })));
        assert!(index.admit(&put("a", "12345678"), &limits).is_ok(), "a replacement counts its new size");
        assert!(matches!(
            index.admit(&put("a", "123456789"), &limits),
            Err(MemoryError::TenantFull { bytes: 11, limit: 10, .. })
        ));
        let other = MemoryPut { tenant: "u".into(), ..put("c", "1") };
        assert!(index.admit(&other, &limits).is_ok(), "another tenant's limits are its own");
    }
}
