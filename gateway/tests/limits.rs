//! The gateway's limits (decision 0033): the request size limit of the public API
//! (`GatewayConfig::max_request_bytes`: a request of exactly the limit is decoded and served, one byte more
//! is refused before it is decoded and writes nothing) and the per-tenant quotas (request rate, open Watch
//! streams: RESOURCE_EXHAUSTED with `retry-after-ms`, nothing of the refused call done, other tenants and
//! accepted calls unaffected).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on setup failure by design

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tonic::Code;
use tonic::transport::Channel;
use turnstile_agent::AgentSetup;
use turnstile_gateway::{Gateway, GatewayConfig, QuotaConfig};
use turnstile_journal::SessionLog;
use turnstile_journal::{EmbeddedLog, LocalBus};
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_worker::{Limits, SessionHost, WorkerConfig};

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(20);

async fn start(config: GatewayConfig) -> AgentClient<Channel> {
    start_with_parts(config).await.0
}

/// The client, the served gateway (to read its quota counts) and its log (read without going through the
/// quotas).
async fn start_with_parts(config: GatewayConfig) -> (AgentClient<Channel>, Gateway, Arc<EmbeddedLog>) {
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    // Room for the test's 5 MiB splice in the driver, so only the gateway's limit is under test.
    let limits = Limits { max_message_bytes: 4 << 20, max_pending_bytes: 8 << 20, ..Limits::default() };
    let host = SessionHost::builder(log.clone(), bus.clone(), AgentSetup::default().into())
        .config(WorkerConfig { limits, ..WorkerConfig::default() })
        .build();
    let gateway = Gateway::new(host, log.clone(), bus, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(turnstile_gateway::serve(gateway.clone(), listener, std::future::pending()));
    (AgentClient::connect(format!("http://{addr}")).await.unwrap(), gateway, log)
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

fn in_tenant(tenant: &str, id: &str) -> Option<pb::SessionRef> {
    Some(pb::SessionRef { tenant: tenant.into(), id: id.into() })
}

fn queue(tenant: &str, id: &str) -> pb::DeliverRequest {
    pb::DeliverRequest { session: in_tenant(tenant, "s"), message: Some(text(id, "hello")), output_schema: None }
}

fn watch(tenant: &str, id: &str) -> pb::WatchRequest {
    pb::WatchRequest { session: in_tenant(tenant, id), after_seq: 0, live: true, resume: None }
}

/// RESOURCE_EXHAUSTED naming `key`, with a `retry-after-ms` hint of at least 1 ms; the hint.
#[track_caller]
fn assert_exhausted(err: &tonic::Status, key: &str) -> u64 {
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains(&format!("config limits.{key}")), "{err:?}");
    let hint = err.metadata().get("retry-after-ms").expect("a retry-after-ms hint").to_str().unwrap();
    let hint: u64 = hint.parse().unwrap();
    assert!(hint >= 1, "{err:?}");
    hint
}

#[tokio::test]
async fn a_tenant_over_its_request_rate_is_refused_with_a_retry_hint_and_nothing_is_written() {
    // One request a minute after a burst of two: the third comes long before a minute has passed.
    let quotas = QuotaConfig { requests_per_minute: 1, request_burst: 2, ..QuotaConfig::default() };
    let (mut api, _gateway, log) = start_with_parts(GatewayConfig { quotas, ..GatewayConfig::default() }).await;
    assert_eq!(api.queue(queue("t1", "q1")).await.unwrap().into_inner().seq, 1);
    assert_eq!(api.queue(queue("t1", "q2")).await.unwrap().into_inner().seq, 2);

    let err = api.queue(queue("t1", "q3")).await.unwrap_err();
    let hint = assert_exhausted(&err, "tenant_requests_per_minute");
    assert!(hint <= 60_000, "one request conforms again within a minute: {err:?}");
    assert!(err.message().contains("1 per minute (burst 2"), "{err:?}");
    let session = SessionRef::new("t1", "s").unwrap();
    assert_eq!(log.last_seq(&session).await.unwrap(), 2, "the refused delivery wrote nothing");
    // Reads count too, and are refused the same way.
    let err = api.get_inbox(pb::GetInboxRequest { session: in_tenant("t1", "s") }).await.unwrap_err();
    assert_exhausted(&err, "tenant_requests_per_minute");

    // Another tenant has its own budget.
    assert_eq!(api.queue(queue("t2", "q1")).await.unwrap().into_inner().seq, 1);
    let inbox = api.get_inbox(pb::GetInboxRequest { session: in_tenant("t2", "s") }).await.unwrap().into_inner();
    assert_eq!(inbox.next_turn.len(), 1);
}

#[tokio::test]
async fn a_tenant_at_its_watch_limit_is_refused_until_one_of_its_streams_ends() {
    let quotas = QuotaConfig { max_watches: 1, ..QuotaConfig::default() };
    let (mut api, gateway, _log) = start_with_parts(GatewayConfig { quotas, ..GatewayConfig::default() }).await;
    let first = api.watch(watch("t1", "a")).await.unwrap().into_inner();
    assert_eq!(gateway.quotas().open_watches("t1"), 1);

    let err = api.watch(watch("t1", "b")).await.unwrap_err();
    assert_eq!(assert_exhausted(&err, "tenant_max_watches"), 1000);
    assert!(err.message().contains("has 1 Watch streams open"), "{err:?}");
    assert_eq!(gateway.quotas().open_watches("t1"), 1, "the refused stream took no slot");
    // Other tenants and other calls of the same tenant are unaffected.
    let _other = api.watch(watch("t2", "a")).await.unwrap().into_inner();
    assert_eq!(api.queue(queue("t1", "q1")).await.unwrap().into_inner().seq, 1);

    // The slot frees once the gateway sees the client go (its stream task ends).
    drop(first);
    tokio::time::timeout(PATIENCE, async {
        while gateway.quotas().open_watches("t1") > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the ended stream's slot was freed");
    let mut again = api.watch(watch("t1", "b")).await.unwrap().into_inner();
    let caught_up = tokio::time::timeout(PATIENCE, again.message()).await.unwrap().unwrap();
    assert!(caught_up.is_some(), "the new stream is served");
}

/// A message with more blocks than `max_message_bytes` can hold is refused at the gateway, naming the limit
/// and the count, before its blocks are decoded or the message routed (issue 37: 300,000 empty blocks cost a
/// gateway seconds); one block fewer than the bound passes the gateway and is judged by the owner's driver.
#[tokio::test]
async fn a_message_with_more_blocks_than_the_limit_holds_is_refused_at_the_gateway() {
    let config = GatewayConfig { max_message_bytes: 64 * 100, ..GatewayConfig::default() };
    let (mut api, _gateway, log) = start_with_parts(config).await;
    let blocks = |n: usize| pb::UserMessage {
        id: "m".into(),
        content: (0..n)
            .map(|_| pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: "x".into() })),
            })
            .collect(),
        source: None,
    };
    let err = api
        .followup(pb::DeliverRequest { session: session(), message: Some(blocks(101)), output_schema: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("message.content: message m has 101 content blocks"), "{}", err.message());
    assert!(
        err.message().contains("at most 100 fit the limit of 6400 (config limits.max_message_bytes)"),
        "{}",
        err.message()
    );
    let splice = pb::SpliceRequest {
        session: session(),
        target: pb::Target::NextTurn as i32,
        start: 0,
        delete_count: 0,
        inserted: vec![text("ok", "fine"), blocks(101)],
    };
    let err = api.splice(splice).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("inserted[1].content: message m has 101 content blocks"), "{}", err.message());
    let s = SessionRef::new("default", "s").unwrap();
    assert_eq!(log.last_seq(&s).await.unwrap(), 0, "nothing refused was written");
    // At the bound the gateway lets it through; the driver (with its own, larger limit here) accepts it.
    let reply = api
        .followup(pb::DeliverRequest { session: session(), message: Some(blocks(100)), output_schema: None })
        .await
        .unwrap();
    assert!(reply.into_inner().seq > 0);
}
