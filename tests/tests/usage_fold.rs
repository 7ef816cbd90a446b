//! The JetStream usage fold (`turnstile_journal::jetstream::UsageFold`, decision 0063) on a real nats-server:
//! every durable `assistant/message` is counted once into its tenant's entry, however many folds run and
//! however often one reads the streams again from an older checkpoint, across partitions.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use async_nats::jetstream;
use turnstile_journal::jetstream::{KvUsage, USAGE_BUCKET, UsageFold, subjects};
use turnstile_journal::{JetStreamConfig, JetStreamLog, SessionLog, UsageLedger};
use turnstile_model::usage::day_of;
use turnstile_model::{Envelope, EventPayload, ModelRef, SessionRef, Status, Usage};
use turnstile_tests::nats::NatsServer;

/// Appends to `session` (after `last`) one group: a status, then an `assistant/message` using `tokens`
/// input and 1 output token; the new last seq.
async fn answer(log: &JetStreamLog, session: &SessionRef, last: u64, tokens: u64, time_ms: u64) -> u64 {
    let events = vec![
        Envelope {
            session: session.clone(),
            seq: last + 1,
            time_ms,
            epoch: 1,
            payload: EventPayload::Status(Status::Running),
        },
        Envelope {
            session: session.clone(),
            seq: last + 2,
            time_ms,
            epoch: 1,
            payload: EventPayload::AssistantMessage {
                turn: 1,
                step: 1,
                text: "ok".into(),
                tool_calls: vec![],
                interrupted: false,
                max_tokens: false,
                reasoning: None,
                usage: Some(Usage { input_tokens: tokens, output_tokens: 1, ..Usage::default() }),
                model: Some(ModelRef::new("openai", "m")),
            },
        },
    ];
    log.append(session, last, &events, None).await.unwrap()
}

/// Waits (up to 15 s) until `tenant` used `want` tokens on `day`; the last count either way.
async fn used(ledger: &KvUsage, tenant: &str, day: u64, want: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let used = ledger.tenant_usage(tenant, day).await.unwrap().used_on(day);
        if used == want || Instant::now() > until {
            return used;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn each_message_is_counted_once_by_several_folds_and_after_a_replay_from_the_start() {
    let server = NatsServer::start().await.unwrap();
    let config = JetStreamConfig { partitions: 2, ..JetStreamConfig::new(server.url()) };
    let log = JetStreamLog::connect(config).await.unwrap();
    let client = log.client().clone();
    let ledger = KvUsage::open(&client, 1).await.unwrap();
    let now = turnstile_ops::clock::now_ms();
    let day = day_of(now);

    // Several sessions of two tenants, over both partitions.
    let sessions: Vec<SessionRef> =
        (0..6).map(|i| SessionRef::new(if i % 2 == 0 { "a" } else { "b" }, format!("s{i}")).unwrap()).collect();
    let mut last = vec![0; sessions.len()];
    for round in 0..3 {
        for (i, s) in sessions.iter().enumerate() {
            last[i] = answer(&log, s, last[i], 10 * (round + 1), now).await;
        }
    }
    // a: 3 sessions × (10 + 20 + 30 + 3 output) = 189; b the same.
    let first = UsageFold::start(&client, 2, ledger.clone());
    let second = UsageFold::start(&client, 2, ledger.clone());
    assert_eq!(used(&ledger, "a", day, 189).await, 189);
    assert_eq!(used(&ledger, "b", day, 189).await, 189);

    // A fold that reads everything again (the checkpoints gone) counts nothing twice: once its checkpoints
    // reach the streams' ends, it has read every message again.
    drop((first, second));
    let store = jetstream::new(client.clone()).get_key_value(USAGE_BUCKET).await.unwrap();
    for p in 0..2 {
        // `fold.<p>`: the checkpoint of partition p (the module docs of `jetstream::usage`).
        store.purge(format!("fold.{p}")).await.unwrap();
    }
    let replay = UsageFold::start(&client, 2, ledger.clone());
    caught_up(&client, &store).await;
    assert_eq!(ledger.tenant_usage("a", day).await.unwrap().used_on(day), 189);
    assert_eq!(ledger.tenant_usage("b", day).await.unwrap().used_on(day), 189);

    // New messages are counted once, with two folds running.
    let another = UsageFold::start(&client, 2, ledger.clone());
    last[0] = answer(&log, &sessions[0], last[0], 1000, now).await;
    assert_eq!(used(&ledger, "a", day, 1190).await, 1190);
    caught_up(&client, &store).await;
    let book = ledger.tenant_usage("a", day).await.unwrap();
    assert_eq!(book.used_on(day), 1190);
    assert_eq!(
        book.per_model_since(day)["openai/m"],
        Usage { input_tokens: 1180, output_tokens: 10, ..Usage::default() }
    );
    assert_eq!(ledger.tenant_usage("b", day).await.unwrap().used_on(day), 189);
    drop((replay, another));
}

/// Waits (up to 15 s) until the checkpoint of both partitions is their stream's last message: a fold has
/// read everything.
async fn caught_up(client: &async_nats::Client, store: &jetstream::kv::Store) {
    let js = jetstream::new(client.clone());
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let mut done = true;
        for p in 0..2 {
            let mut stream = js.get_stream(subjects::stream_name(p)).await.unwrap();
            let last = stream.info().await.unwrap().state.last_sequence;
            let at: u64 = store
                .get(format!("fold.{p}"))
                .await
                .unwrap()
                .and_then(|v| std::str::from_utf8(&v).ok().and_then(|v| v.parse().ok()))
                .unwrap_or(0);
            done &= at >= last;
        }
        if done {
            return;
        }
        assert!(Instant::now() < until, "the folds never read the streams to their ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Decision 0180: a partition is folded only where `mine` says so; when it moves to another worker (a
/// hand-over of its lowest shard), the new holder goes on from the checkpoint and nothing is counted
/// twice or lost, the old one stopping at its next checkpoint.
#[tokio::test]
async fn a_partitions_fold_moves_to_its_new_holder_and_counts_each_message_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    let server = NatsServer::start().await.unwrap();
    let config = JetStreamConfig { partitions: 2, ..JetStreamConfig::new(server.url()) };
    let log = JetStreamLog::connect(config).await.unwrap();
    let client = log.client().clone();
    let ledger = KvUsage::open(&client, 1).await.unwrap();
    let now = turnstile_ops::clock::now_ms();
    let day = day_of(now);
    // Both partitions are held by worker 1, then by worker 2.
    let holder = Arc::new(AtomicU8::new(1));
    let fold_of = |worker: u8| {
        let holder = holder.clone();
        UsageFold::start_where(&client, 2, ledger.clone(), Arc::new(move |_| holder.load(Ordering::SeqCst) == worker))
    };
    let (first, second) = (fold_of(1), fold_of(2));
    let sessions: Vec<SessionRef> = (0..4).map(|i| SessionRef::new("a", format!("s{i}")).unwrap()).collect();
    let mut last = vec![0; sessions.len()];
    for (i, s) in sessions.iter().enumerate() {
        last[i] = answer(&log, s, last[i], 10, now).await;
    }
    assert_eq!(used(&ledger, "a", day, 44).await, 44);

    // The partitions move: the first worker's folds stop (it is gone, as after a hand-over), the second's
    // count what follows.
    holder.store(2, Ordering::SeqCst);
    drop(first);
    for (i, s) in sessions.iter().enumerate() {
        last[i] = answer(&log, s, last[i], 100, now).await;
    }
    assert_eq!(used(&ledger, "a", day, 44 + 404).await, 44 + 404, "the new holder counted each message once");
    let store = jetstream::new(client.clone()).get_key_value(USAGE_BUCKET).await.unwrap();
    caught_up(&client, &store).await;
    assert_eq!(ledger.tenant_usage("a", day).await.unwrap().used_on(day), 448);
    drop(second);
}
