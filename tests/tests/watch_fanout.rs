//! Watch fan-out (decision 0039): the watchers of one session on a gateway share one log reader (a
//! JetStream consumer) and one live subscription, whatever their number; each still gets the complete log
//! in order, a watcher joining mid-turn has no gap and no duplicate, one that falls behind the shared feed
//! catches up from the log, and the last one out releases the feed and its consumer.
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
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::Channel;
use turnstile_agent::AgentSetup;
use turnstile_gateway::watch::{self, WatchSpec};
use turnstile_gateway::{Gateway, GatewayConfig};
use turnstile_journal::jetstream::subjects;
use turnstile_journal::snapshot::NoSnapshots;
use turnstile_journal::{JetStreamConfig, JetStreamLog, LiveBus, NatsBus, SessionLog};
use turnstile_model::{LiveEvent, LivePayload, SessionRef};
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::watch_item::Item;
use turnstile_tests::nats::NatsServer;
use turnstile_worker::SessionHost;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(30);

struct Stack {
    api: AgentClient<Channel>,
    gateway: Gateway,
    log: Arc<JetStreamLog>,
    bus: Arc<NatsBus>,
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
    let api = AgentClient::connect(format!("http://{addr}")).await.unwrap();
    Stack { api, gateway, log, bus, js, _nats: nats }
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
            .followup(pb::DeliverRequest { session: Some(pb_session()), message: Some(message) })
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

/// A watcher whose client does not read falls behind a feed that keeps 4 items; once the client reads
/// again it gets every durable event exactly once, in order: the ones the feed dropped for it come from
/// the log.
#[tokio::test]
async fn a_lagging_watcher_catches_up_from_the_log() {
    let config = GatewayConfig { watch_feed_capacity: 4, ..GatewayConfig::default() };
    let stack = start(config).await;
    let log: Arc<dyn SessionLog> = stack.log.clone();
    let spec = WatchSpec { session: session(), after_seq: 0, live: true, resume: None };
    let stop = CancellationToken::new();
    let open = |capacity: usize| {
        let (tx, rx) = mpsc::channel::<Result<pb::WatchItem, Status>>(capacity);
        let run = watch::run(
            log.clone(),
            stack.gateway.feeds().clone(),
            Arc::new(NoSnapshots),
            stack.gateway.owners(),
            spec.clone(),
            tx,
            stop.clone(),
        );
        tokio::spawn(run);
        rx
    };
    // The slow one holds one item in its channel and then waits on its client.
    let mut slow = open(1);
    let mut fast = open(100_000);
    for rx in [&mut slow, &mut fast] {
        let first = tokio::time::timeout(PATIENCE, rx.recv()).await.unwrap().unwrap().unwrap();
        assert!(matches!(first.item, Some(Item::CaughtUp(pb::CaughtUp { seq: 0, .. }))));
    }

    for (id, text) in [("m1", "[[tool:echo one]] first"), ("m2", "[[tool:echo two]] second"), ("m3", "third")] {
        stack.followup(id, text).await;
    }
    let last = stack.idle().await;
    // The fast watcher follows the same broadcast: once it has the last event, the feed has sent it all.
    let mut fast_items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while durable_seqs(&fast_items).last() != Some(&last) {
            fast_items.push(fast.recv().await.unwrap().unwrap().item.unwrap());
        }
    })
    .await
    .expect("the fast watcher got the whole turn");
    assert!(last > 4 + 2, "the feed sent more than it keeps plus what the slow watcher holds: {last}");
    // Then only live events, more than the feed keeps: what the slow watcher still finds in the feed has
    // no durable event, so only the lag itself can tell it what it lost.
    for i in 0..8 {
        // Errors, not deltas: a watcher deduplicates a step's deltas by offset (SPEC §14).
        let payload = LivePayload::Error { turn: 3, step: 1, message: format!("late {i}") };
        stack.bus.publish(&LiveEvent { session: session(), after_seq: last, payload }).await.unwrap();
    }
    // The fast watcher may lag on this burst too (it also reads a feed of 4) and lose some of it, but the
    // feed keeps its newest items: once the last one reaches it, the burst has been broadcast.
    let is_last_late = |item: &Item| matches!(item, Item::Live(pb::LiveEvent { payload: Some(pb::live_event::Payload::Error(e)), .. }) if e.message == "late 7");
    tokio::time::timeout(PATIENCE, async {
        while !is_last_late(&fast.recv().await.unwrap().unwrap().item.unwrap()) {}
    })
    .await
    .expect("the fast watcher got the last late live event");

    let mut slow_items = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while durable_seqs(&slow_items).last() != Some(&last) {
            slow_items.push(slow.recv().await.unwrap().unwrap().item.unwrap());
        }
    })
    .await
    .expect("the slow watcher caught up");
    let log_seqs = stack.log_seqs().await;
    assert_eq!(durable_seqs(&slow_items), log_seqs, "the lagging watcher lost nothing and repeated nothing");
    assert_eq!(durable_seqs(&fast_items), log_seqs);
    check_live_order(&slow_items);
    check_live_order(&fast_items);
    stop.cancel();
}
