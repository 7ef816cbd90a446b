//! Watch fan-out (decision 0039): the watchers of one session on a gateway share one log reader (a
//! JetStream consumer) and one live subscription, whatever their number; each still gets the complete log
//! in order, a watcher joining mid-turn has no gap and no duplicate, one that falls behind is cut and
//! resumes without loss (decision 0088), and the last one out releases the feed and its consumer.
//!
//! In process over a real nats-server (the harness's): the gateway, the worker host, the JetStream journal
//! and the NATS bus; the server's consumer count is read with the JetStream API. No timed assertions:
//! waits are bounded by a generous patience and only expire when something is broken.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use turnstile_agent::AgentSetup;
use turnstile_gateway::watch_buffer::BufferLimits;
use turnstile_gateway::{Gateway, GatewayConfig};
use turnstile_journal::jetstream::subjects;
use turnstile_journal::{JetStreamConfig, JetStreamLog, NatsBus, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::watch_item::Item;
use turnstile_tests::nats::NatsServer;
use turnstile_tests::watch::ResumingWatch;
use turnstile_worker::SessionHost;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(30);

struct Stack {
    api: AgentClient<Channel>,
    url: String,
    gateway: Gateway,
    log: Arc<JetStreamLog>,
    js: jetstream::Context,
    _nats: NatsServer,
}

async fn start(config: GatewayConfig) -> Stack {
    let nats = NatsServer::start().await.unwrap();
    let log = Arc::new(JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.unwrap());
    let bus = Arc::new(NatsBus::new(log.client().clone()));
    let js = jetstream::new(log.client().clone());
    let host = SessionHost::builder(log.clone(), bus.clone(), AgentSetup::default().into()).build();
    let gateway = Gateway::new(host, log.clone(), bus.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(turnstile_gateway::serve(gateway.clone(), listener, std::future::pending()));
    let url = format!("http://{addr}");
    let api = AgentClient::connect(url.clone()).await.unwrap();
    Stack { api, url, gateway, log, js, _nats: nats }
}

impl Stack {
    /// Consumers on the (single partition's) event stream now.
    async fn consumers(&self) -> usize {
        let mut stream = self.js.get_stream(subjects::stream_name(0)).await.unwrap();
        stream.info().await.unwrap().state.consumer_count
    }

    /// Waits until the event stream has `want` consumers (readers of reads and catch-ups are deleted
    /// right after they are dropped, so a count above it is transient).
    async fn until_consumers(&self, want: usize) {
        let reached = eventually(|| async { self.consumers().await == want }).await;
        assert!(reached, "the event stream kept {} consumers, not {want}", self.consumers().await);
    }

    async fn followup(&self, id: &str, text: &str) {
        let message = pb::UserMessage {
            id: id.into(),
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.into() })),
            }],
            source: None,
        };
        self.api
            .clone()
            .followup(pb::DeliverRequest { session: Some(pb_session()), message: Some(message), output_schema: None })
            .await
            .unwrap();
    }

    async fn idle(&self) -> u64 {
        let request = pb::WhenIdleRequest { session: Some(pb_session()), timeout_ms: 0 };
        self.api.clone().when_idle(request).await.unwrap().into_inner().last_seq
    }

    /// Every durable seq of the log, in order.
    async fn log_seqs(&self) -> Vec<u64> {
        let events = self.log.read(&session(), 1, 100_000).await.unwrap();
        events.iter().map(|e| e.seq).collect()
    }

    async fn watch(&self, after_seq: u64) -> tonic::Streaming<pb::WatchItem> {
        let request = pb::WatchRequest { session: Some(pb_session()), after_seq, live: true, resume: None };
        self.api.clone().watch(request).await.unwrap().into_inner()
    }
}

/// Polls `check` until it holds; false when the patience ran out first.
async fn eventually<F: Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    tokio::time::timeout(PATIENCE, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

fn session() -> SessionRef {
    SessionRef { tenant: "default".into(), id: "fan".into() }
}

fn pb_session() -> pb::SessionRef {
    pb::SessionRef { tenant: "default".into(), id: "fan".into() }
}

/// Reads items until the durable event `last` (included).
async fn until_seq(stream: &mut tonic::Streaming<pb::WatchItem>, last: u64) -> Vec<Item> {
    let mut items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            let item = item.unwrap().item.unwrap();
            let done = matches!(&item, Item::Event(e) if e.seq == last);
            items.push(item);
            if done {
                return;
            }
        }
        panic!("the watch stream ended early: {items:?}");
    })
    .await
    .expect("the watch stream did not reach the last seq in time");
    items
}

/// Reads items up to and including the caught-up marker.
async fn until_caught_up(stream: &mut tonic::Streaming<pb::WatchItem>) -> Vec<Item> {
    let mut items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = stream.next().await {
            let item = item.unwrap().item.unwrap();
            let done = matches!(item, Item::CaughtUp(_));
            items.push(item);
            if done {
                return;
            }
        }
        panic!("the watch stream ended before caught_up");
    })
    .await
    .expect("no caught_up in time");
    items
}

fn durable_seqs(items: &[Item]) -> Vec<u64> {
    items.iter().filter_map(|i| if let Item::Event(e) = i { Some(e.seq) } else { None }).collect()
}

/// Every live event comes after the durable event it follows.
fn check_live_order(items: &[Item]) {
    let mut last_durable = 0;
    for item in items {
        match item {
            Item::Event(e) => last_durable = e.seq,
            Item::Live(l) => assert!(l.after_seq <= last_durable, "live after {} sent before it", l.after_seq),
            Item::CaughtUp(c) => last_durable = last_durable.max(c.seq),
        }
    }
}

#[tokio::test]
async fn many_watchers_share_one_consumer_and_get_the_same_complete_stream() {
    let stack = start(GatewayConfig::default()).await;
    stack.followup("m0", "before the watchers").await;
    stack.idle().await;
    let mut watchers = Vec::new();
    for _ in 0..50 {
        let mut w = stack.watch(0).await;
        let history = until_caught_up(&mut w).await;
        watchers.push((w, history));
    }
    // Fifty watchers, one reader: the feed's tail (the worker holds none between turns).
    stack.until_consumers(1).await;
    assert_eq!(stack.gateway.feeds().open(), 1);

    stack.followup("m1", "[[delay:300]] a reply streamed to every watcher [[tool:echo hi]]").await;
    stack.followup("m2", "and another").await;
    let last = stack.idle().await;
    let mut seen = Vec::new();
    for (w, history) in &mut watchers {
        let mut items = std::mem::take(history);
        items.extend(until_seq(w, last).await);
        seen.push(items);
    }
    let log = stack.log_seqs().await;
    for items in &seen {
        assert_eq!(durable_seqs(items), log, "every watcher has the whole log, in order, once");
        check_live_order(items);
        assert!(items.iter().any(|i| matches!(i, Item::Live(_))), "live events reach the watchers");
    }
    // The same items, live ones included: they all follow the one broadcast.
    assert!(seen.iter().all(|items| *items == seen[0]), "every watcher saw the same stream");
    stack.until_consumers(1).await;

    drop(watchers);
    assert!(eventually(|| async { stack.gateway.feeds().open() == 0 }).await, "the feed outlived its watchers");
    stack.until_consumers(0).await;

    // A new watcher starts a new feed.
    let mut again = stack.watch(0).await;
    let mut items = until_caught_up(&mut again).await;
    stack.until_consumers(1).await;
    stack.followup("m3", "after the feed restarted").await;
    let last = stack.idle().await;
    items.extend(until_seq(&mut again, last).await);
    assert_eq!(durable_seqs(&items), stack.log_seqs().await);
}

#[tokio::test]
async fn a_watcher_joining_mid_turn_has_no_gap_and_no_duplicate() {
    let stack = start(GatewayConfig::default()).await;
    let mut first = stack.watch(0).await;
    let mut head = until_caught_up(&mut first).await;
    stack
        .followup("A", "[[delay:1500]] a slow reply streamed word by word over a second and a half [[tool:echo hi]]")
        .await;
    // Mid-turn: the first step is streaming through the feed.
    tokio::time::timeout(PATIENCE, async {
        while let Some(item) = first.next().await {
            let item = item.unwrap().item.unwrap();
            let delta = matches!(
                &item,
                Item::Live(pb::LiveEvent { payload: Some(pb::live_event::Payload::AssistantDelta(_)), .. })
            );
            head.push(item);
            if delta {
                return;
            }
        }
    })
    .await
    .expect("no delta in time");
    let mid = durable_seqs(&head).last().copied().unwrap();

    // From the start, and from the middle.
    let mut whole = stack.watch(0).await;
    let mut resumed = stack.watch(mid).await;
    let last = stack.idle().await;
    let whole_items = until_seq(&mut whole, last).await;
    let resumed_items = until_seq(&mut resumed, last).await;
    let first_items = until_seq(&mut first, last).await;

    let log = stack.log_seqs().await;
    assert_eq!(durable_seqs(&whole_items), log, "joined mid-turn from seq 0");
    assert_eq!(durable_seqs(&resumed_items), log[usize::try_from(mid).unwrap()..], "joined mid-turn after seq {mid}");
    let first_all: Vec<Item> = head.into_iter().chain(first_items).collect();
    assert_eq!(durable_seqs(&first_all), log, "the watcher that was there all along");
    for items in [&whole_items, &resumed_items, &first_all] {
        check_live_order(items);
    }
    stack.until_consumers(1).await;
}

/// A watcher whose client does not read falls behind (decision 0088): once what waits for it passes
/// `watch_buffer_bytes` it is cut with UNAVAILABLE naming the last seq it sent, what it held is released,
/// and the client resuming from there gets every durable event exactly once, in order. A watcher of the
/// same feed whose client reads goes on (resuming too, should it ever fall that far behind).
#[tokio::test]
async fn a_watcher_that_falls_behind_is_cut_and_resumes_without_loss() {
    let limits = BufferLimits { per_watcher: 16 * 1024, ..BufferLimits::default() };
    let stack = start(GatewayConfig { watch_buffers: limits, ..GatewayConfig::default() }).await;
    // A client whose connection takes 64 KiB before the gateway must hold the rest for it.
    let narrow = Endpoint::from_shared(stack.url.clone())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut slow = ResumingWatch::open(AgentClient::new(narrow), pb_session(), 0).await.unwrap();
    let mut fast = ResumingWatch::open(stack.api.clone(), pb_session(), 0).await.unwrap();
    for w in [&mut slow, &mut fast] {
        let first = w.next().await.unwrap();
        assert!(matches!(first.item, Some(Item::CaughtUp(pb::CaughtUp { seq: 0, .. }))), "{first:?}");
    }
    let (items, mut fast_items) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let next = fast.next().await;
            let failed = next.is_err();
            if items.send(next).is_err() || failed {
                break;
            }
        }
    });

    let text = "x".repeat(8 * 1024);
    for i in 0..20 {
        stack.followup(&format!("m{i}"), &format!("[[tool:echo {i}]] {text}")).await;
        stack.idle().await;
    }
    let last = stack.idle().await;
    let log = stack.log_seqs().await;

    let mut fast_seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while durable_seqs(&fast_seen).last() != Some(&last) {
            fast_seen.push(fast_items.recv().await.unwrap().unwrap().item.unwrap());
        }
    })
    .await
    .expect("the reading watcher got the whole log");
    reader.abort();
    let fast_durable: Vec<u64> = durable_seqs(&fast_seen);
    assert_eq!(fast_durable, log, "the reading watcher: every event once");

    // Everything the gateway held for the slow one was released when it was cut.
    assert!(
        eventually(|| async { stack.gateway.feeds().buffers().held() == 0 }).await,
        "the gateway still holds {} bytes",
        stack.gateway.feeds().buffers().held()
    );
    slow.until_seq(last).await.unwrap();
    assert!(slow.cuts >= 1, "the watcher that never read was not cut");
    let slow_items: Vec<Item> = slow.items.iter().filter_map(|i| i.item.clone()).collect();
    assert_eq!(durable_seqs(&slow_items), log, "the resumed watcher: every event once, none missing");
    check_live_order(&slow_items);
}
