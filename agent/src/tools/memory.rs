//! The built-in tools `memory_get`, `memory_put` and `memory_search` (SPEC §20, decision 0147): an agent's
//! reach into its session's tenant's memory, confined to the namespaces its profile names (`memory = {
//! namespaces = [...] }`, in [`ToolContext::memory`]). A call naming another namespace is a failed call
//! that lists the agent's; a put is reported with the result ([`ToolReturn::memory`]) so the session
//! records it as `memory/written`, and the stored document names the call in its `written_by`.
//!
//! Arguments are a JSON object. `namespace` may be left out when the agent has exactly one.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use turnstile_journal::memory::{MemoryPut, MemoryStore, SearchQuery};
use turnstile_model::memory::MemoryWrite;

use super::{Tool, ToolContext, ToolReturn};

/// Where the node sets the memory store once it has opened it.
pub type MemorySlot = Arc<OnceLock<Arc<dyn MemoryStore>>>;

/// Search results a call returns when it does not say, and the most it may ask for.
const DEFAULT_HITS: u64 = 5;
const MAX_HITS: u64 = 20;

/// Which of the three tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryOp {
    Get,
    Put,
    Search,
}

/// One of the memory tools.
pub struct MemoryTool {
    op: MemoryOp,
    store: MemorySlot,
}

impl MemoryTool {
    pub fn new(op: MemoryOp, store: MemorySlot) -> Self {
        Self { op, store }
    }

    fn name(&self) -> &'static str {
        match self.op {
            MemoryOp::Get => "memory_get",
            MemoryOp::Put => "memory_put",
            MemoryOp::Search => "memory_search",
        }
    }
}

/// The arguments as an object, or the failed call that says what they must be.
fn object(name: &str, arguments: &str) -> Result<serde_json::Map<String, Value>, ToolReturn> {
    match serde_json::from_str(arguments.trim()) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(ToolReturn::failed(format!("{name} takes a JSON object of arguments, got {arguments:?}"))),
    }
}

/// One call of a memory tool: what its operation reads, and the tool's name for a failed call's message.
struct Call<'a> {
    name: &'static str,
    store: &'a dyn MemoryStore,
    ctx: &'a ToolContext,
    args: serde_json::Map<String, Value>,
}

impl Call<'_> {
    fn failed(&self, e: impl std::fmt::Display) -> ToolReturn {
        ToolReturn::failed(format!("{}: {e}", self.name))
    }

    fn string(&self, field: &str) -> Result<&str, ToolReturn> {
        self.args
            .get(field)
            .and_then(Value::as_str)
            .ok_or_else(|| self.failed(format!("\"{field}\" is missing or not a string")))
    }

    /// The namespace a call reaches: the one it names, which must be the agent's, or the agent's only one.
    fn namespace(&self) -> Result<&str, ToolReturn> {
        let ctx = self.ctx;
        let theirs = || if ctx.memory.is_empty() { "none".to_owned() } else { ctx.memory.join(", ") };
        match self.args.get("namespace").and_then(Value::as_str) {
            Some(ns) if ctx.memory.iter().any(|n| n == ns) => Ok(ns),
            Some(ns) => Err(self.failed(format!(
                "namespace {ns:?} is not one agent {} may reach (its namespaces: {}); use one of those",
                ctx.agent,
                theirs()
            ))),
            None => match ctx.memory.as_slice() {
                [only] => Ok(only),
                _ => Err(self.failed(format!(
                    "name the \"namespace\", one of {} (agent {}'s namespaces)",
                    theirs(),
                    ctx.agent
                ))),
            },
        }
    }
}

/// A stored document's JSON text as a value for the model (the store keeps only JSON).
fn value_of(document: &str) -> Value {
    serde_json::from_str(document).unwrap_or_else(|_| Value::String(document.to_owned()))
}

#[async_trait]
impl Tool for MemoryTool {
    fn description(&self) -> &str {
        match self.op {
            MemoryOp::Get => {
                "Reads the document stored at a key of long-term memory, kept across sessions. Returns \
                 {\"found\": true, \"document\": ...} or {\"found\": false}."
            }
            MemoryOp::Put => {
                "Stores a JSON document at a key of long-term memory, replacing what was there; it stays for later \
                 sessions. Use short path-like keys such as \"user/preferences\"."
            }
            MemoryOp::Search => {
                "Searches long-term memory, kept across sessions, for the documents that best match some words; \
                 returns the best matches first with their keys."
            }
        }
    }

    fn input_schema(&self) -> Value {
        let namespace =
            json!({"type": "string", "description": "The memory namespace (optional when the agent has one)."});
        match self.op {
            MemoryOp::Get => json!({
                "type": "object",
                "properties": {"namespace": namespace, "key": {"type": "string", "description": "The document's key."}},
                "required": ["key"],
                "additionalProperties": false,
            }),
            MemoryOp::Put => json!({
                "type": "object",
                "properties": {
                    "namespace": namespace,
                    "key": {"type": "string", "description": "The document's key."},
                    "document": {"description": "The JSON value to store, e.g. {\"fact\": \"...\"}."},
                },
                "required": ["key", "document"],
                "additionalProperties": false,
            }),
            MemoryOp::Search => json!({
                "type": "object",
                "properties": {
                    "namespace": {"type": "string", "description": "One namespace to search (default: all the agent's)."},
                    "query": {"type": "string", "description": "Words to look for."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HITS, "description": "How many results (default 5)."},
                },
                "required": ["query"],
                "additionalProperties": false,
            }),
        }
    }

    async fn call(&self, ctx: &ToolContext, arguments: &str, _abort: &CancellationToken) -> ToolReturn {
        let name = self.name();
        let Some(store) = self.store.get() else {
            return ToolReturn::failed(format!("{name} cannot run here: this node keeps no memory store"));
        };
        let args = match object(name, arguments) {
            Ok(args) => args,
            Err(failed) => return failed,
        };
        let call = Call { name, store: store.as_ref(), ctx, args };
        let result = match self.op {
            MemoryOp::Get => get(&call).await,
            MemoryOp::Put => put(&call).await,
            MemoryOp::Search => search(&call).await,
        };
        result.unwrap_or_else(|failed| failed)
    }
}

async fn get(call: &Call<'_>) -> Result<ToolReturn, ToolReturn> {
    let (store, ctx) = (call.store, call.ctx);
    let namespace = call.namespace()?;
    let key = call.string("key")?;
    let found = store.get(&ctx.session.tenant, namespace, key).await.map_err(|e| call.failed(e))?;
    let out = match found {
        Some(d) => json!({"found": true, "namespace": namespace, "key": key, "document": value_of(&d.document),
                          "updated_unix_ms": d.updated_unix_ms}),
        None => json!({"found": false, "namespace": namespace, "key": key}),
    };
    Ok(ToolReturn::ok(out.to_string()))
}

async fn put(call: &Call<'_>) -> Result<ToolReturn, ToolReturn> {
    let (store, ctx) = (call.store, call.ctx);
    let namespace = call.namespace()?;
    let key = call.string("key")?;
    let document = call.args.get("document").ok_or_else(|| call.failed("\"document\" is missing"))?;
    let put = MemoryPut {
        tenant: ctx.session.tenant.clone(),
        namespace: namespace.to_owned(),
        key: key.to_owned(),
        document: document.to_string(),
        written_by: Some(format!("{}/{}/{}", ctx.session.tenant, ctx.session.id, ctx.call_id)),
        now_ms: turnstile_ops::clock::now_ms(),
    };
    let written = store.put(put).await.map_err(|e| call.failed(e))?;
    let out = json!({"stored": true, "namespace": namespace, "key": key, "revision": written.revision});
    Ok(ToolReturn {
        memory: vec![MemoryWrite {
            namespace: written.namespace,
            key: written.key,
            revision: written.revision,
            bytes: written.document.len() as u64,
        }],
        ..ToolReturn::ok(out.to_string())
    })
}

async fn search(call: &Call<'_>) -> Result<ToolReturn, ToolReturn> {
    let (store, ctx) = (call.store, call.ctx);
    let query = call.string("query")?;
    let namespaces: Vec<String> = match call.args.get("namespace") {
        Some(_) => vec![call.namespace()?.to_owned()],
        None if ctx.memory.is_empty() => {
            return Err(call.failed(format!("agent {} may reach no memory namespace", ctx.agent)));
        }
        None => ctx.memory.clone(),
    };
    let limit = match call.args.get("limit") {
        None => DEFAULT_HITS,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_HITS).contains(&n) => n,
            _ => return Err(call.failed(format!("\"limit\" must be a whole number from 1 to {MAX_HITS}"))),
        },
    };
    let query = SearchQuery { namespaces, text: query.to_owned(), limit: limit as usize };
    let hits = store.search(&ctx.session.tenant, &query).await.map_err(|e| call.failed(e))?;
    let hits: Vec<Value> = hits
        .into_iter()
        .map(|h| {
            json!({"namespace": h.document.namespace, "key": h.document.key, "score": (h.score * 1000.0).round() / 1000.0,
                   "document": value_of(&h.document.document)})
        })
        .collect();
    Ok(ToolReturn::ok(json!({ "hits": hits }).to_string()))
}
