//! The request size limit of the public API (`GatewayConfig::max_request_bytes`, decision 0033): a request
//! of exactly the limit is decoded and served, one byte more is refused before it is decoded and writes
//! nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on setup failure by design

use std::sync::Arc;

use prost::Message;
use tonic::Code;
use tonic::transport::Channel;
use turnstile_gateway::{Gateway, GatewayConfig};
use turnstile_journal::{EmbeddedLog, LocalBus};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_worker::{Limits, SessionHost, WorkerConfig};

async fn start(config: GatewayConfig) -> AgentClient<Channel> {
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    // Room for the test's 5 MiB splice in the driver, so only the gateway's limit is under test.
    let limits = Limits { max_message_bytes: 4 << 20, max_pending_bytes: 8 << 20, ..Limits::default() };
    let host = SessionHost::new(log.clone(), bus.clone(), WorkerConfig { limits, ..WorkerConfig::default() });
    let gateway = Gateway::new(host, log, bus, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(turnstile_gateway::serve(gateway, listener, std::future::pending()));
    AgentClient::connect(format!("http://{addr}")).await.unwrap()
}

fn session() -> Option<pb::SessionRef> {
    Some(pb::SessionRef { tenant: String::new(), id: "s".into() })
}

fn text(id: &str, text: &str) -> pb::UserMessage {
    pb::UserMessage {
        id: id.into(),
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.into() })),
        }],
        source: None,
    }
}

/// A splice inserting two messages of `len` bytes each at the head of next-turn.
fn splice(ids: [&str; 2], len: usize) -> pb::SpliceRequest {
    pb::SpliceRequest {
        session: session(),
        target: pb::Target::NextTurn as i32,
        start: 0,
        delete_count: 0,
        inserted: ids.iter().map(|id| text(id, &"x".repeat(len))).collect(),
    }
}

#[tokio::test]
async fn a_request_one_byte_over_max_request_bytes_is_refused_and_one_at_it_is_served() {
    // Above tonic's default of 4 MiB, so the test also shows that the default no longer applies.
    let at_limit = splice(["a", "b"], 2 * 1024 * 1024 + 512);
    let over = splice(["c", "d"], 2 * 1024 * 1024 + 512);
    let mut over = over;
    if let Some(pb::content_block::Block::Text(t)) = &mut over.inserted[1].content[0].block {
        t.text.push('x');
    }
    let limit = at_limit.encoded_len();
    assert_eq!(over.encoded_len(), limit + 1, "the refused request is one byte longer");
    let mut api = start(GatewayConfig { max_request_bytes: limit, ..GatewayConfig::default() })
        .await
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);

    let err = api.splice(over).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains(&format!("decoded message length too large: found {} bytes", limit + 1))
            && err.message().contains(&format!("the limit is: {limit} bytes")),
        "{err:?}"
    );
    let inbox = api.get_inbox(pb::GetInboxRequest { session: session() }).await;
    assert!(inbox.is_err_and(|e| e.code() == Code::NotFound), "the refused splice wrote nothing");

    api.splice(at_limit).await.unwrap();
    let inbox = api.get_inbox(pb::GetInboxRequest { session: session() }).await.unwrap().into_inner();
    let ids: Vec<&str> = inbox.next_turn.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"], "the request at the limit was decoded and applied");
}
