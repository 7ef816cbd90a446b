//! SPEC §20 memory against the real binary, on both journals (`backend_tests!`): an agent stores a fact with
//! `memory_put` in one session (also `memory/written` in that session's log, and `written_by` on the
//! document); an agent in a new session of the same tenant finds it with `memory_search`; the tools refuse a
//! namespace the profile does not name; another tenant reads nothing through the API, the tools or an
//! export; the API's limits answer with the field and the limit; an export of the tenant carries its memory
//! and an import brings it back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::transport::Channel;
use tonic::{Code, Request};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::export_item::Item;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::transcript_item::Item as TranscriptKind;
use turnstile_proto::v1::{
    ConfigureSessionRequest, DeleteMemoryRequest, DeliverRequest, ExportSessionsRequest, GetMemoryRequest,
    GetTranscriptRequest, ListMemoryRequest, PutMemoryRequest, SearchMemoryRequest, SessionRef, WhenIdleRequest,
};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Backend, DevOptions, user_msg};

const TOKEN_A: &str = "memory-tenant-a-0123456789";
const TOKEN_B: &str = "memory-tenant-b-0123456789";

const CONFIG: &str = r#"
[memory]
max_document_bytes = 256
max_documents_per_tenant = 4

[agents.keeper]
tools = ["memory_get", "memory_put", "memory_search"]
memory = { namespaces = ["facts", "notes"] }
"#;

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn own(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

/// Configures `id` with `keeper`, runs one turn of `text` to its end and returns its first tool result
/// (output, error).
async fn tool_turn(c: &mut AgentClient<Channel>, token: &str, id: &str, text: &str) -> (String, Option<String>) {
    let configure = ConfigureSessionRequest { session: own(id), agent: "keeper".into(), ..Default::default() };
    c.configure_session(authed(configure, token)).await.unwrap();
    let message = user_msg(&uuid::Uuid::new_v4().to_string(), text);
    c.followup(authed(DeliverRequest { session: own(id), message: Some(message), output_schema: None }, token))
        .await
        .unwrap();
    c.when_idle(authed(WhenIdleRequest { session: own(id), timeout_ms: 20_000 }, token)).await.unwrap();
    let req = GetTranscriptRequest { session: own(id), after_seq: 0, page_size: 1000 };
    let items = c.get_transcript(authed(req, token)).await.unwrap().into_inner().items;
    items
        .into_iter()
        .find_map(|i| match i.item {
            Some(TranscriptKind::ToolResult(r)) => Some((r.output, r.error)),
            _ => None,
        })
        .expect("a tool result")
}

async fn search(c: &mut AgentClient<Channel>, token: &str, query: &str) -> Vec<String> {
    let req = SearchMemoryRequest { query: query.into(), ..Default::default() };
    let hits = c.search_memory(authed(req, token)).await.unwrap().into_inner().hits;
    hits.into_iter().map(|h| h.document.unwrap().key).collect()
}

async fn an_agent_remembers_across_sessions_and_no_other_tenant_can_read_it(backend: Backend) {
    let (dir, path) = config_file(CONFIG);
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a admin\n{TOKEN_B} tenant-b admin\n")).unwrap();
    let mut args = config_args(&path);
    args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
    let server = backend.start_dev_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let mut c = server.client();

    // Session 1 stores a fact.
    let put = r#"[[tool:memory_put {"namespace": "facts", "key": "pets/ada", "document": {"fact": "Ada's cat is named Turing"}}]]"#;
    let (output, error) = tool_turn(&mut c, TOKEN_A, "s1", put).await;
    assert_eq!(error, None, "{output}");
    let stored: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!((stored["stored"].as_bool(), stored["key"].as_str()), (Some(true), Some("pets/ada")));
    // The write is an event of session 1, just before its result, naming the call.
    let session = SessionRef { tenant: "tenant-a".into(), id: "s1".into() };
    // The log as a Watch with the token streams it, up to `caught_up`.
    let req = turnstile_proto::v1::WatchRequest { session: Some(session), after_seq: 0, live: false, resume: None };
    let mut stream = c.watch(authed(req, TOKEN_A)).await.unwrap().into_inner();
    let mut types = Vec::new();
    let mut written = None;
    while let Some(item) = stream.message().await.unwrap() {
        let Some(turnstile_proto::v1::watch_item::Item::Event(event)) = item.item else { break };
        types.push(event.r#type.clone());
        if let Some(Payload::MemoryWritten(m)) = event.payload {
            assert!(event.ignorable, "memory/written is written ignorable, for readers that predate it");
            written = Some(m);
        }
    }
    let written = written.expect("a memory/written event in session 1");
    assert_eq!((written.namespace.as_str(), written.key.as_str(), written.turn), ("facts", "pets/ada", 1));
    let at = types.iter().position(|t| t == "memory/written").unwrap();
    assert_eq!(types[at + 1], "tool/result", "{types:?}");
    let got = GetMemoryRequest { namespace: "facts".into(), key: "pets/ada".into(), ..Default::default() };
    let document = c.get_memory(authed(got.clone(), TOKEN_A)).await.unwrap().into_inner();
    assert_eq!(document.written_by, format!("tenant-a/s1/{}", written.call_id));
    assert_eq!(document.revision, written.revision);
    let value: serde_json::Value = serde_json::from_str(&document.document).unwrap();
    assert_eq!(value["fact"], "Ada's cat is named Turing");

    // A new session of the same tenant finds it by words.
    let (output, error) =
        tool_turn(&mut c, TOKEN_A, "s2", r#"[[tool:memory_search {"query": "what is the cat called"}]]"#).await;
    assert_eq!(error, None, "{output}");
    let found: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!(found["hits"][0]["key"], "pets/ada", "{output}");
    assert_eq!(found["hits"][0]["document"]["fact"], "Ada's cat is named Turing");

    // A namespace the profile does not name is refused, naming the agent's.
    let (_, error) =
        tool_turn(&mut c, TOKEN_A, "s3", r#"[[tool:memory_put {"namespace": "secrets", "key": "k", "document": 1}]]"#)
            .await;
    assert_eq!(
        error.as_deref(),
        Some(
            r#"memory_put: namespace "secrets" is not one agent keeper may reach (its namespaces: facts, notes); use one of those"#
        )
    );

    // Another tenant reads nothing: not by key, by search, by list, through its agent's tools, or an export.
    let e = c.get_memory(authed(got.clone(), TOKEN_B)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(search(&mut c, TOKEN_B, "Turing cat").await.is_empty());
    let list = c.list_memory(authed(ListMemoryRequest::default(), TOKEN_B)).await.unwrap().into_inner();
    assert!(list.documents.is_empty());
    let (output, error) = tool_turn(&mut c, TOKEN_B, "s1", r#"[[tool:memory_search {"query": "Turing cat"}]]"#).await;
    assert_eq!((output.as_str(), error), (r#"{"hits":[]}"#, None));
    let (output, _) =
        tool_turn(&mut c, TOKEN_B, "s2", r#"[[tool:memory_get {"namespace": "facts", "key": "pets/ada"}]]"#).await;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&output).unwrap()["found"], false);
    let naming_a = GetMemoryRequest { tenant: "tenant-a".into(), ..got.clone() };
    assert_eq!(c.get_memory(authed(naming_a, TOKEN_B)).await.unwrap_err().code(), Code::PermissionDenied);
    let export = |token: &'static str| {
        let mut c = c.clone();
        async move {
            let mut stream =
                c.export_sessions(authed(ExportSessionsRequest::default(), token)).await.unwrap().into_inner();
            let mut memory = Vec::new();
            while let Some(item) = stream.message().await.unwrap() {
                if let Some(Item::Memory(m)) = item.item {
                    memory.push(m);
                }
            }
            memory
        }
    };
    assert!(export(TOKEN_B).await.is_empty(), "tenant-b's export holds none of tenant-a's memory");
    let exported = export(TOKEN_A).await;
    assert_eq!(exported.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["pets/ada"]);

    // The limits answer with the field and the limit.
    let put = |key: &str, document: &str| PutMemoryRequest {
        namespace: "notes".into(),
        key: key.into(),
        document: document.into(),
        ..Default::default()
    };
    let e = c.put_memory(authed(put("big", &format!("\"{}\"", "x".repeat(300))), TOKEN_A)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "document \"big\" is 302 bytes, over the limit of 256 (config memory.max_document_bytes); store less per key \
         or split it over several keys"
    );
    let e = c.put_memory(authed(put("k", "not json"), TOKEN_A)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.put_memory(authed(PutMemoryRequest { namespace: "a.b".into(), ..put("k", "1") }, TOKEN_A)).await;
    assert_eq!(e.unwrap_err().code(), Code::InvalidArgument);
    for key in ["n1", "n2", "n3"] {
        c.put_memory(authed(put(key, r#"{"note": "kept"}"#), TOKEN_A)).await.unwrap();
    }
    let e = c.put_memory(authed(put("n4", "1"), TOKEN_A)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert_eq!(
        e.message(),
        "tenant tenant-a already keeps 4 memory documents, the limit (config memory.max_documents_per_tenant); delete \
         documents it no longer needs, or raise the limit"
    );
    // tenant-b's limit is its own.
    c.put_memory(authed(put("n1", "1"), TOKEN_B)).await.unwrap();

    // List pages by prefix; delete answers the document, then NOT_FOUND.
    let page = ListMemoryRequest { namespace: "notes".into(), prefix: "n".into(), page_size: 2, ..Default::default() };
    let first = c.list_memory(authed(page.clone(), TOKEN_A)).await.unwrap().into_inner();
    assert_eq!(first.documents.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), ["n1", "n2"]);
    let next = ListMemoryRequest { page_token: first.next_page_token, ..page };
    let second = c.list_memory(authed(next, TOKEN_A)).await.unwrap().into_inner();
    assert_eq!(second.documents.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), ["n3"]);
    assert!(second.next_page_token.is_empty());
    let delete = DeleteMemoryRequest { namespace: "notes".into(), key: "n3".into(), ..Default::default() };
    assert_eq!(c.delete_memory(authed(delete.clone(), TOKEN_A)).await.unwrap().into_inner().key, "n3");
    assert_eq!(c.delete_memory(authed(delete, TOKEN_A)).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(search(&mut c, TOKEN_A, "kept").await, ["n1", "n2"]);
}

turnstile_tests::backend_tests!(an_agent_remembers_across_sessions_and_no_other_tenant_can_read_it);
