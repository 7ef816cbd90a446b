//! SPEC §20 memory in a real cluster: three clustered nats-servers (the bucket `turnstile_memory` at R3),
//! two workers and two gateways. An agent stores a fact in a session through one gateway; an agent in
//! another session, through the other gateway, finds it; a document put at one gateway is found at once by
//! a search at the other (a search waits until its node's index holds every acknowledged write); another
//! tenant finds nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{InjectMode, PutMemoryRequest, SearchMemoryRequest, SessionRef};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Cluster, ClusterOptions, Session, user_msg};

const CONFIG: &str = r#"
[agents.keeper]
tools = ["memory_put", "memory_search"]
memory = { namespaces = ["facts"] }
"#;

/// Runs one turn of `text` on `s` with `keeper` and returns its tool result's output (no error).
async fn tool_turn(s: &Session, id: &str, text: &str) -> String {
    s.configure("keeper", InjectMode::Unspecified).await.unwrap();
    s.followup(user_msg(id, text)).await.unwrap();
    s.when_idle().await.unwrap();
    let (events, _) = s.replay(0).await.unwrap();
    let result = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .expect("a tool result");
    assert_eq!(result.error, None, "{}", result.output);
    result.output
}

#[tokio::test]
async fn memory_written_through_one_gateway_is_found_through_the_other_on_r3() {
    let (_dir, path) = config_file(CONFIG);
    let mut opts = ClusterOptions::new(2, 2);
    opts.nats_nodes = 3;
    opts.worker_args = config_args(&path);
    opts.gateway_args = config_args(&path);
    let cluster = Cluster::start_with(opts).await.unwrap();
    cluster.wait_balanced().await.unwrap();

    // The bucket is replicated on all three nats-servers.
    let nats = async_nats::connect(cluster.nats_cluster().node(0).url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let mut stream = js.get_stream("KV_turnstile_memory").await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.num_replicas, 3);

    let tenant = "mem-cluster";
    let writer = Session::with_ref(cluster.client(0), SessionRef { tenant: tenant.into(), id: "writer".into() });
    let put = r#"[[tool:memory_put {"key": "gate", "document": {"fact": "the north gate opens at dawn"}}]]"#;
    let stored = tool_turn(&writer, "w1", put).await;
    assert!(stored.contains("\"stored\":true"), "{stored}");
    let (events, _) = writer.replay(0).await.unwrap();
    assert!(events.iter().any(|e| matches!(&e.payload, Some(Payload::MemoryWritten(m)) if m.key == "gate")));

    let reader = Session::with_ref(cluster.client(1), SessionRef { tenant: tenant.into(), id: "reader".into() });
    let found = tool_turn(&reader, "r1", r#"[[tool:memory_search {"query": "when does the gate open"}]]"#).await;
    let found: serde_json::Value = serde_json::from_str(&found).unwrap();
    assert_eq!(found["hits"][0]["key"], "gate", "{found}");

    // Put at gateway 1, searched at gateway 0 with no wait in between, twenty times.
    for i in 0..20 {
        let put = PutMemoryRequest {
            tenant: tenant.into(),
            namespace: "facts".into(),
            key: format!("k{i}"),
            document: format!(r#"{{"word": "marker{i}"}}"#),
        };
        cluster.client(1).put_memory(put).await.unwrap();
        let search = SearchMemoryRequest { tenant: tenant.into(), query: format!("marker{i}"), ..Default::default() };
        let hits = cluster.client(0).search_memory(search).await.unwrap().into_inner().hits;
        assert_eq!(hits.len(), 1, "round {i}: the other gateway's search missed an acknowledged put");
    }

    // Another tenant finds nothing.
    let search = SearchMemoryRequest { tenant: "someone-else".into(), query: "gate dawn".into(), ..Default::default() };
    assert!(cluster.client(1).search_memory(search).await.unwrap().into_inner().hits.is_empty());
}
