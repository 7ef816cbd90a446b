//! Followup latency through the gateway against one raw JetStream append, interleaved on one server, with
//! two more measurements per round that split the followup by hop: the same followup on a session that is
//! already loaded (no session load), a `WhenIdle` of an idle loaded session (the gRPC call, the gateway
//! and the session's driver, with no journal IO at all), and a gRPC health check on the same server and
//! connection (the gRPC call alone: the floor under every call).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::StorageType};
use prost::Message as _;
use serde::Serialize;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::session_event::Payload;

use crate::stats::Percentiles;

#[derive(Clone, Debug)]
pub struct LatencyOpts {
    pub iterations: usize,
    pub warmup: usize,
    pub text: String,
    /// Bound on the whole phase.
    pub max_time: Duration,
}

#[derive(Debug, Serialize)]
pub struct LatencyReport {
    pub iterations: usize,
    pub warmup: usize,
    /// Bytes of the raw message body (an encoded `SessionEvent` of the followup's splice).
    pub raw_body_bytes: usize,
    pub raw_stream: String,
    pub followup: Percentiles,
    pub raw: Percentiles,
    /// A followup on the same session once its first turn is over: the session is loaded (or parked in
    /// memory), so no load round trip; fresh − warm is the session load.
    pub followup_warm: Percentiles,
    /// `WhenIdle` of that idle session: client → gateway → the session's driver and back, no journal IO;
    /// warm − this is the driver's append group and the work around it.
    pub driver_roundtrip: Percentiles,
    /// `grpc.health.v1.Health/Check` on the same channel: the gRPC hop alone (HTTP/2 on loopback, the
    /// server's tower stack, no Turnstile work); `driver_roundtrip` − this is the gateway and the driver.
    pub grpc_floor: Percentiles,
    /// followup / raw per percentile.
    pub ratio_p50: f64,
    pub ratio_p90: f64,
    pub ratio_p99: f64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn text_message(id: String, text: &str) -> pb::UserMessage {
    pb::UserMessage {
        id,
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock { text: text.to_owned() })),
        }],
        source: Some(pb::MessageSource { kind: Some(pb::message_source::Kind::User(pb::UserSource {})) }),
    }
}

/// What the idle followup's first append stores: `agent/inbox/spliced {next-turn, 0, 0, [message], wake}`.
pub fn splice_event(session: &pb::SessionRef, message: pb::UserMessage) -> pb::SessionEvent {
    pb::SessionEvent {
        session: Some(session.clone()),
        seq: 1,
        time_unix_ms: now_ms(),
        epoch: 1,
        r#type: "agent/inbox/spliced".into(),
        ignorable: false,
        // As the journal writes it (SPEC §18 event format 1).
        format: 1,
        payload: Some(Payload::InboxSpliced(pb::InboxSpliced {
            target: pb::Target::NextTurn.into(),
            start: 0,
            removed_count: 0,
            inserted: vec![message],
            outcome: pb::SpliceOutcome::None.into(),
            wake: true,
            requested_target: pb::Target::Unspecified.into(),
            deadline: None,
        })),
    }
}

/// Creates a scratch stream `TURNSTILE_BENCH_<kind>_<run>` beside the event streams, with the same storage
/// (file, `replicas`: 1 on one server, 3 on a cluster's R3 streams), on subjects `bench.<kind>.<run>.>`:
/// its context, name and subject prefix.
pub async fn scratch_stream(
    client: async_nats::Client,
    kind: &str,
    run: &str,
    replicas: usize,
) -> Result<(jetstream::Context, String, String)> {
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_secs(30));
    let name = format!("TURNSTILE_BENCH_{kind}_{run}");
    let prefix = format!("bench.{}.{run}", kind.to_lowercase());
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .with_context(|| format!("creating the scratch stream {name}"))?;
    Ok((js, name, prefix))
}

/// A scratch stream beside the event streams, with the same storage (file, R1 or R3), removed at the end.
pub struct RawStream {
    js: jetstream::Context,
    name: String,
    prefix: String,
}

impl RawStream {
    pub async fn create(client: async_nats::Client, kind: &str, run: &str, replicas: usize) -> Result<Self> {
        let (js, name, prefix) = scratch_stream(client, kind, run, replicas).await?;
        Ok(Self { js, name, prefix })
    }

    /// One conditional append as the journal makes it for a single event: a fresh subject, expected last
    /// subject sequence 0, the Turnstile headers; timed until the ack.
    pub async fn append(&self, i: usize, body: Vec<u8>) -> Result<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("Turnstile-Type", "agent/inbox/spliced");
        headers.insert("Turnstile-Seq", "1");
        headers.insert("Turnstile-Epoch", "1");
        headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
        let subject = format!("{}.{i}", self.prefix);
        let started = Instant::now();
        self.js.publish_with_headers(subject, headers, body.into()).await?.await?;
        Ok(started.elapsed())
    }

    pub async fn delete(self) {
        if let Err(e) = self.js.delete_stream(&self.name).await {
            eprintln!("warning: could not delete the scratch stream {}: {e}", self.name);
        }
    }
}

pub async fn run(
    channel: Channel,
    nats: async_nats::Client,
    run_id: &str,
    opts: &LatencyOpts,
) -> Result<LatencyReport> {
    let mut client = AgentClient::new(channel.clone());
    let mut health = HealthClient::new(channel);
    let raw = RawStream::create(nats, "RAW", run_id, 1).await?;
    let result = interleave(&mut client, &mut health, &raw, run_id, opts).await;
    let name = raw.name.clone();
    raw.delete().await;
    let Rounds { followups, raws, warm, roundtrips, floors, body_len: raw_body_bytes } = result?;
    let followup = Percentiles::of(&followups);
    let rawp = Percentiles::of(&raws);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(LatencyReport {
        iterations: followups.len(),
        warmup: opts.warmup,
        raw_body_bytes,
        raw_stream: name,
        ratio_p50: ratio(followup.p50_ms, rawp.p50_ms),
        ratio_p90: ratio(followup.p90_ms, rawp.p90_ms),
        ratio_p99: ratio(followup.p99_ms, rawp.p99_ms),
        followup,
        raw: rawp,
        followup_warm: Percentiles::of(&warm),
        driver_roundtrip: Percentiles::of(&roundtrips),
        grpc_floor: Percentiles::of(&floors),
    })
}

/// What the rounds measured, each in round order.
struct Rounds {
    followups: Vec<Duration>,
    raws: Vec<Duration>,
    warm: Vec<Duration>,
    roundtrips: Vec<Duration>,
    floors: Vec<Duration>,
    body_len: usize,
}

async fn when_idle(client: &mut AgentClient<Channel>, session: &pb::SessionRef) -> Result<()> {
    client
        .when_idle(pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms: 10_000 })
        .await
        .with_context(|| format!("waiting for {} to be idle", session.id))?;
    Ok(())
}

/// a, then (untimed) wait until that session is idle again so its turn does not run under the next
/// measurement, then c (`WhenIdle` of the idle session), d (a second followup on it) and its wait, then e
/// (a health check), then b; warm-up rounds are measured the same way and dropped.
async fn interleave(
    client: &mut AgentClient<Channel>,
    health: &mut HealthClient<Channel>,
    raw: &RawStream,
    run_id: &str,
    opts: &LatencyOpts,
) -> Result<Rounds> {
    let deadline = Instant::now() + opts.max_time;
    let total = opts.warmup + opts.iterations;
    let mut followups = Vec::with_capacity(opts.iterations);
    let mut raws = Vec::with_capacity(opts.iterations);
    let mut warm = Vec::with_capacity(opts.iterations);
    let mut roundtrips = Vec::with_capacity(opts.iterations);
    let mut floors = Vec::with_capacity(opts.iterations);
    let mut body_len = 0;
    for i in 0..total {
        if Instant::now() >= deadline {
            eprintln!("latency phase stopped at its time bound ({:?}) after {i} of {total} rounds", opts.max_time);
            break;
        }
        let session = pb::SessionRef { tenant: "bench".into(), id: format!("lat-{run_id}-{i}") };
        let message = text_message(format!("m-{run_id}-{i}"), &opts.text);

        // (a) idle followup on a fresh session.
        let request =
            pb::DeliverRequest { session: Some(session.clone()), message: Some(message.clone()), output_schema: None };
        let started = Instant::now();
        let reply = client.followup(request).await.with_context(|| format!("followup {i} on {}", session.id))?;
        let a = started.elapsed();
        if reply.get_ref().turn != Some(1) {
            bail!("followup {i} on fresh session {} did not open turn 1: {:?}", session.id, reply.get_ref());
        }
        when_idle(client, &session).await?;

        // (c) the driver's round trip with no journal IO: WhenIdle of the idle, loaded session.
        let started = Instant::now();
        when_idle(client, &session).await?;
        let c = started.elapsed();

        // (d) a followup on the loaded session: no session load.
        let second = text_message(format!("m-{run_id}-{i}-warm"), &opts.text);
        let request = pb::DeliverRequest { session: Some(session.clone()), message: Some(second), output_schema: None };
        let started = Instant::now();
        let reply = client.followup(request).await.with_context(|| format!("second followup on {}", session.id))?;
        let d = started.elapsed();
        if reply.get_ref().turn != Some(2) {
            bail!("the second followup on {} did not open turn 2: {:?}", session.id, reply.get_ref());
        }
        when_idle(client, &session).await?;

        // (e) the gRPC hop alone.
        let started = Instant::now();
        health.check(HealthCheckRequest { service: String::new() }).await.context("health check")?;
        let e = started.elapsed();

        // (b) the same splice's bytes as one raw conditional append.
        let body = splice_event(&session, message).encode_to_vec();
        body_len = body.len();
        let b = raw.append(i, body).await.with_context(|| format!("raw append {i}"))?;

        if i >= opts.warmup {
            followups.push(a);
            raws.push(b);
            roundtrips.push(c);
            warm.push(d);
            floors.push(e);
        }
    }
    Ok(Rounds { followups, raws, warm, roundtrips, floors, body_len })
}
