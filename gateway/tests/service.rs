//! The gateway served on loopback over the real worker host and the in-memory journal.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers panic on setup failure by design

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::Code;
use tonic::transport::Channel;
use turnstile_agent::AgentSetup;
use turnstile_gateway::{Gateway, GatewayConfig};
use turnstile_journal::{EmbeddedLog, LocalBus};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::watch_item::Item;
use turnstile_worker::SessionHost;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(20);

async fn start() -> AgentClient<Channel> {
    let log = Arc::new(EmbeddedLog::in_memory());
    let bus = Arc::new(LocalBus::new());
    let host = SessionHost::builder(log.clone(), bus.clone(), AgentSetup::default().into()).build();
    let gateway = Gateway::new(host, log, bus, GatewayConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(turnstile_gateway::serve(gateway, listener, std::future::pending()));
    AgentClient::connect(format!("http://{addr}")).await.unwrap()
}

fn session(id: &str) -> Option<pb::SessionRef> {
    Some(pb::SessionRef { tenant: String::new(), id: id.into() })
}

fn text(id: &str, text: &str) -> Option<pb::UserMessage> {
    Some(pb::UserMessage {
        id: id.into(),
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.into() })),
        }],
        source: None,
    })
}

async fn followup(api: &mut AgentClient<Channel>, s: &str, id: &str, t: &str) -> pb::SendReply {
    api.followup(pb::DeliverRequest { session: session(s), message: text(id, t), output_schema: None })
        .await
        .unwrap()
        .into_inner()
}

async fn idle(api: &mut AgentClient<Channel>, s: &str) -> pb::SessionInfo {
    api.when_idle(pb::WhenIdleRequest { session: session(s), timeout_ms: 0 }).await.unwrap().into_inner()
}

/// Reads Watch items until `stop` says so.
async fn collect(stream: &mut tonic::Streaming<pb::WatchItem>, mut stop: impl FnMut(&Item) -> bool) -> Vec<Item> {
    let mut items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            let item = item.unwrap().item.unwrap();
            let done = stop(&item);
            items.push(item);
            if done {
                return;
            }
        }
        panic!("the watch stream ended early");
    })
    .await
    .expect("the watch stream did not deliver in time");
    items
}

fn is_idle_event(item: &Item) -> bool {
    matches!(item, Item::Event(e) if matches!(e.payload, Some(pb::session_event::Payload::Status(ref s)) if s.status == pb::SessionStatus::Idle as i32))
}

fn durable_seqs(items: &[Item]) -> Vec<u64> {
    items.iter().filter_map(|i| if let Item::Event(e) = i { Some(e.seq) } else { None }).collect()
}

#[tokio::test]
async fn a_session_without_writes_does_not_exist_but_can_be_watched() {
    let mut api = start().await;
    let err = api.get_inbox(pb::GetInboxRequest { session: session("s1") }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "session default/s1 does not exist: it has no accepted writes yet");
    let err = api.get_session(pb::GetSessionRequest { session: session("s1") }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let mut watch = api
        .watch(pb::WatchRequest { session: session("s1"), after_seq: 0, live: true, resume: None })
        .await
        .unwrap()
        .into_inner();
    let first = collect(&mut watch, |_| true).await;
    let [Item::CaughtUp(c)] = first.as_slice() else { panic!("expected caught_up first, got {first:?}") };
    assert_eq!(c.seq, 0);
    assert_eq!(c.inbox.as_ref().map(|i| i.next_turn.len()), Some(0));

    followup(&mut api, "s1", "m1", "hello").await;
    let items = collect(&mut watch, is_idle_event).await;
    let seqs = durable_seqs(&items);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "durable seqs must be contiguous from 1");
    // Every live event comes after the durable event it follows.
    let mut last_durable = 0;
    for item in &items {
        match item {
            Item::Event(e) => last_durable = e.seq,
            Item::Live(l) => assert!(l.after_seq <= last_durable, "live after {} sent before it", l.after_seq),
            Item::CaughtUp(_) => panic!("a second caught_up"),
        }
    }
}

#[tokio::test]
async fn a_reconnecting_watch_sees_no_gap_and_no_duplicate() {
    let mut api = start().await;
    followup(&mut api, "s1", "m1", "one").await;
    followup(&mut api, "s1", "m2", "two").await;
    let info = idle(&mut api, "s1").await;
    assert!(info.last_seq > 5);

    let after = 4;
    let mut watch = api
        .watch(pb::WatchRequest { session: session("s1"), after_seq: after, live: false, resume: None })
        .await
        .unwrap()
        .into_inner();
    let items = collect(&mut watch, |i| matches!(i, Item::CaughtUp(_))).await;
    assert_eq!(durable_seqs(&items), (after + 1..=info.last_seq).collect::<Vec<_>>());
    let Some(Item::CaughtUp(c)) = items.last() else { unreachable!() };
    assert_eq!(c.seq, info.last_seq);
    assert_eq!(c.status, pb::SessionStatus::Idle as i32);

    // The tail continues exactly after caught_up.
    followup(&mut api, "s1", "m3", "three").await;
    let more = collect(&mut watch, is_idle_event).await;
    assert_eq!(durable_seqs(&more).first(), Some(&(info.last_seq + 1)));
    assert!(more.iter().all(|i| matches!(i, Item::Event(_))), "live = false must leave out live events");
}

#[tokio::test]
async fn bad_requests_are_refused_and_write_nothing() {
    let mut api = start().await;
    let err = api
        .send(pb::SendRequest { session: session("s1"), message: text("m1", "x"), target: 0, wakeup: true })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("TARGET_NEXT_TURN"), "{}", err.message());
    let err = api
        .followup(pb::DeliverRequest { session: session("s1"), message: text("", "x"), output_schema: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("message.id"), "{}", err.message());
    let err = api
        .queue(pb::DeliverRequest { session: session("s 1"), message: text("m", "x"), output_schema: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = api.get_session(pb::GetSessionRequest { session: session("s1") }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "a refused request must not create the session");
}

#[tokio::test]
async fn inject_defaults_its_source_to_a_plugin_and_queue_to_a_user() {
    let mut api = start().await;
    api.inject(pb::DeliverRequest { session: session("s1"), message: text("i1", "ctx"), output_schema: None })
        .await
        .unwrap();
    let reply = api
        .queue(pb::DeliverRequest { session: session("s1"), message: text("q1", "later"), output_schema: None })
        .await
        .unwrap();
    assert_eq!(reply.get_ref().turn, None, "a non-waking delivery opens no turn");
    let inbox = api.get_inbox(pb::GetInboxRequest { session: session("s1") }).await.unwrap().into_inner();
    assert_eq!(inbox.seq, 2);
    let source = |m: &pb::UserMessage| m.source.clone().and_then(|s| s.kind);
    assert_eq!(
        source(&inbox.next_step[0]),
        Some(pb::message_source::Kind::Plugin(pb::PluginSource { plugin: String::new(), form: String::new() }))
    );
    assert_eq!(source(&inbox.next_turn[0]), Some(pb::message_source::Kind::User(pb::UserSource {})));
    let info = api.get_session(pb::GetSessionRequest { session: session("s1") }).await.unwrap().into_inner();
    assert_eq!((info.status, info.last_seq, info.owner.as_str()), (pb::SessionStatus::Idle as i32, 2, "dev"));
}

#[tokio::test]
async fn list_sessions_pages_by_last_name() {
    let mut api = start().await;
    for s in ["a", "b", "c"] {
        api.queue(pb::DeliverRequest { session: session(s), message: text("m", "x"), output_schema: None })
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut page_token = String::new();
    loop {
        let reply = api
            .list_sessions(pb::ListSessionsRequest {
                page_token,
                page_size: 2,
                tenant: String::new(),
                parent: String::new(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(reply.sessions.len() <= 2);
        names.extend(reply.sessions.into_iter().map(|s| s.session.unwrap().id));
        if reply.next_page_token.is_empty() {
            break;
        }
        page_token = reply.next_page_token;
    }
    assert_eq!(names, ["a", "b", "c"]);
    let err = api
        .list_sessions(pb::ListSessionsRequest {
            page_token: String::new(),
            page_size: 1001,
            tenant: String::new(),
            parent: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let other = api
        .list_sessions(pb::ListSessionsRequest {
            page_token: String::new(),
            page_size: 0,
            tenant: "acme".into(),
            parent: String::new(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(other.sessions.is_empty());
}

#[tokio::test]
async fn a_delivery_with_no_content_is_refused_saying_what_to_send() {
    let mut api = start().await;
    let empty = |content: Vec<pb::ContentBlock>| Some(pb::UserMessage { id: "m1".into(), content, source: None });
    let blank = pb::ContentBlock { block: Some(pb::content_block::Block::Text(pb::TextBlock { text: " \n".into() })) };
    for message in [empty(vec![]), empty(vec![blank.clone()]), empty(vec![blank.clone(), blank])] {
        let err = api
            .followup(pb::DeliverRequest { session: session("s1"), message, output_schema: None })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(
            err.message(),
            "message m1 has no content; send at least one text block with non-blank text, or a data block with bytes"
        );
    }
    let err = api.get_session(pb::GetSessionRequest { session: session("s1") }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "a refused delivery must not create the session");
    // A data block alone is content.
    let image = pb::ContentBlock {
        block: Some(pb::content_block::Block::Data(pb::DataBlock { mime: "image/png".into(), bytes: vec![1, 2, 3] })),
    };
    api.queue(pb::DeliverRequest { session: session("s1"), message: empty(vec![image]), output_schema: None })
        .await
        .unwrap();
}

#[tokio::test]
async fn every_call_that_needs_a_session_answers_not_found_on_one_never_written() {
    let mut api = start().await;
    let missing = "session default/ghost does not exist: it has no accepted writes yet";
    let s = || session("ghost");
    let results = [
        ("Compact", api.compact(pb::CompactRequest { session: s() }).await.map(|_| ())),
        ("GetInbox", api.get_inbox(pb::GetInboxRequest { session: s() }).await.map(|_| ())),
        ("GetSession", api.get_session(pb::GetSessionRequest { session: s() }).await.map(|_| ())),
        ("DeleteSession", api.delete_session(pb::DeleteSessionRequest { session: s() }).await.map(|_| ())),
    ];
    for (call, result) in results {
        let err = result.expect_err(call);
        assert_eq!((call, err.code(), err.message()), (call, Code::NotFound, missing));
    }
    let err = api.get_session(pb::GetSessionRequest { session: s() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "no call above may create the session");
}
