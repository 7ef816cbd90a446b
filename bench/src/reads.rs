//! `turnstile-bench reads`: reads of a long session (issue 11, decision 0020).
//!
//! Builds one session of `--events` durable events (default 100,000) on `turnstile dev --nats` through the
//! public API: out-of-turn injects (one `user/message` each, SPEC §11) from `--clients` concurrent
//! clients, with a whole scripted turn (followup → idle) every `--turn-every` injects, and a few queued
//! messages at the end so the inbox is not empty. A small session of `--small-events` is built the same way
//! as the anchor: a read that does not grow with history costs the same on both.
//!
//! Then, on the idle session (its owner's snapshots as they are: the last one at most `snapshot_every`
//! events behind), it times `Watch(after_seq, live = false)` from the call to its `caught_up` item when
//! resuming 10 and 1,000 events before the end and from seq 0, and `GetInbox` / `GetSession`. Each resume
//! checks it got exactly the events after its seq. It also reports the stored snapshot sizes (the owner's
//! full snapshot and the read snapshot) from the KV bucket, how far the owner archived each session
//! (decision 0181) with the archive and event streams' bytes, and the Watch from 0 again after purging
//! the session's archive: the log alone, the read as it was before the archive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use tonic::transport::Channel;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{InjectMode, SessionRef, WatchRequest};
use turnstile_tests::{Session, user_msg};

use crate::servers::{self, Dev, Nats};
use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct ReadsArgs {
    /// Durable events of the long session.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Durable events of the small anchor session.
    #[arg(long, default_value_t = 1_000)]
    small_events: u64,
    /// Concurrent clients writing the injects.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// A whole turn (followup → idle) after this many injects.
    #[arg(long, default_value_t = 1_000)]
    turn_every: u64,
    /// Timed Watch resumes near the end (each kind: 10 back, 1,000 back) and GetInbox calls.
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// Timed Watch replays from seq 0.
    #[arg(long, default_value_t = 3)]
    from_zero_rounds: usize,
    /// Use this nats-server (loopback only) instead of starting one with the harness.
    #[arg(long)]
    nats: Option<String>,
    /// The `turnstile` binary to run as `turnstile dev --nats URL` (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<std::path::PathBuf>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// One session's read figures.
#[derive(Debug, Serialize)]
pub struct SessionReads {
    pub events: u64,
    /// Writing the session through the API.
    pub build_s: f64,
    /// Watch from the call to `caught_up`, resuming 10 events before the end.
    pub watch_10_back: Percentiles,
    /// The same, 1,000 events before the end (when the session has them).
    pub watch_1000_back: Option<Percentiles>,
    /// The same from seq 0 (the whole history streamed): the archive first where the owner wrote one.
    pub watch_from_0: Percentiles,
    /// The same from seq 0 after the session's archive was purged: the log alone, as before the archive
    /// (decision 0181).
    pub watch_from_0_log_only: Option<Percentiles>,
    /// The last seq the session's archive held when the reads began (0: none).
    pub archived_seq: u64,
    /// Bytes of the session's archive and of its log, as the streams store them.
    pub archive_bytes: u64,
    pub log_bytes: u64,
    pub get_inbox: Percentiles,
    pub get_session: Percentiles,
    /// Stored bytes of the owner's snapshot (`<tenant>.<id>`) and of the read snapshot (`<tenant>.<id>.read`).
    pub snapshot_bytes: Option<usize>,
    pub read_snapshot_bytes: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct ReadsReport {
    pub nproc: usize,
    pub cpu_model: String,
    pub nats_server_version: String,
    pub turnstile_bin: String,
    /// p50 of Watch → caught-up resuming 10 events before the end of the long session.
    pub watch_caught_up_100k_ms: f64,
    pub watch_caught_up_100k_1000_back_ms: f64,
    pub watch_caught_up_100k_from_0_ms: f64,
    /// The same read with the long session's archive purged first (the log alone).
    pub watch_caught_up_100k_from_0_log_only_ms: f64,
    /// p50 of GetInbox on the long session.
    pub get_inbox_ms: f64,
    pub long: SessionReads,
    pub small: SessionReads,
}

pub async fn run(args: ReadsArgs) -> Result<()> {
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);
    let nats = Nats::start_or_use(args.nats.as_deref()).await?;
    let nats_url = nats.url();
    let nats_client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(&nats_url)
        .await
        .with_context(|| format!("connecting to {nats_url}"))?;
    let dev = Dev::start(&bin, Some(&nats_url), &[]).await?;
    eprintln!("nats-server {nats_url}, turnstile dev {} ({})", dev.url(), bin.display());
    let outcome = measure(&args, &dev, &nats_client).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}", dev.log_tail());
    }
    dev.stop().await;
    drop(nats);
    let (small, long) = outcome?;
    let report = ReadsReport {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        nats_server_version: nats_client.server_info().version,
        turnstile_bin: bin.display().to_string(),
        watch_caught_up_100k_ms: long.watch_10_back.p50_ms,
        watch_caught_up_100k_1000_back_ms: long.watch_1000_back.map_or(0.0, |p| p.p50_ms),
        watch_caught_up_100k_from_0_ms: long.watch_from_0.p50_ms,
        watch_caught_up_100k_from_0_log_only_ms: long.watch_from_0_log_only.as_ref().map_or(0.0, |p| p.p50_ms),
        get_inbox_ms: long.get_inbox.p50_ms,
        long,
        small,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

async fn measure(args: &ReadsArgs, dev: &Dev, nats: &async_nats::Client) -> Result<(SessionReads, SessionReads)> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mut clients = Vec::with_capacity(args.clients.max(1));
    for _ in 0..args.clients.max(1) {
        clients.push(servers::connect(&dev.url()).await?);
    }
    let kv = async_nats::jetstream::new(nats.clone())
        .get_key_value("turnstile_snapshots")
        .await
        .context("the snapshot bucket (turnstile dev --nats creates it)")?;
    let mut out = Vec::new();
    for (name, events) in [("small", args.small_events), ("long", args.events)] {
        let session = SessionRef { tenant: "bench".into(), id: format!("reads-{name}-{run}") };
        eprintln!("reads: writing {events} events into {}/{} ...", session.tenant, session.id);
        let started = Instant::now();
        let last = build(args, &clients, &session, events).await?;
        let build_s = started.elapsed().as_secs_f64();
        eprintln!("reads: {last} events in {build_s:.1} s; timing reads ...");
        let archive = Archive::of(nats, &session);
        let (archived_seq, archive_bytes, log_bytes) = archive.measure().await?;
        eprintln!("reads: archived through seq {archived_seq} ({archive_bytes} B; the log {log_bytes} B)");
        let mut reads = time_reads(args, &clients[0], &session, last).await?;
        if archived_seq > 0 {
            archive.purge().await?;
            let mut log_only = Vec::new();
            for _ in 0..args.from_zero_rounds.max(1) {
                log_only.push(caught_up(&clients[0], &session, 0, last).await?);
            }
            reads.watch_from_0_log_only = Some(Percentiles::of(&log_only));
        }
        (reads.build_s, reads.archived_seq, reads.archive_bytes, reads.log_bytes) =
            (build_s, archived_seq, archive_bytes, log_bytes);
        let size = |key: String| {
            let kv = kv.clone();
            async move { kv.get(key).await.ok().flatten().map(|b| b.len()) }
        };
        reads.snapshot_bytes = size(format!("{}.{}", session.tenant, session.id)).await;
        reads.read_snapshot_bytes = size(format!("{}.{}.read", session.tenant, session.id)).await;
        out.push(reads);
    }
    let long = out.pop().context("two sessions measured")?;
    let small = out.pop().context("two sessions measured")?;
    Ok((small, long))
}

/// A session's history archive and log in NATS (decision 0181), seen from outside by their documented
/// names (docs/SUBJECTS.md), as an operator would. `turnstile dev --nats` keeps one partition: stream 0.
struct Archive {
    js: async_nats::jetstream::Context,
    subject: String,
}

impl Archive {
    fn of(nats: &async_nats::Client, session: &SessionRef) -> Self {
        let subject = format!("turnstile.archive.0.{}.{}", session.tenant, session.id);
        Self { js: async_nats::jetstream::new(nats.clone()), subject }
    }

    async fn streams(&self) -> Result<(async_nats::jetstream::stream::Stream, async_nats::jetstream::stream::Stream)> {
        let archive = self.js.get_stream("TURNSTILE_ARCHIVE_0").await.context("the archive stream")?;
        let log = self.js.get_stream("TURNSTILE_EVENTS_0").await.context("the event stream")?;
        Ok((archive, log))
    }

    /// The last seq the archive holds (its last chunk's `Turnstile-Last-Seq`) and the bytes of the
    /// archive and event streams.
    async fn measure(&self) -> Result<(u64, u64, u64)> {
        let (mut archive, mut log) = self.streams().await?;
        let archived = match archive.get_last_raw_message_by_subject(&self.subject).await {
            Ok(m) => m.headers.get("Turnstile-Last-Seq").and_then(|v| v.as_str().parse().ok()).unwrap_or(0),
            Err(_) => 0,
        };
        // The bench's two sessions are the streams' only content: the small one's bytes are in both.
        let archive_bytes = archive.info().await.context("archive stream info")?.state.bytes;
        let log_bytes = log.info().await.context("event stream info")?.state.bytes;
        Ok((archived, archive_bytes, log_bytes))
    }

    async fn purge(&self) -> Result<()> {
        let (archive, _) = self.streams().await?;
        archive.purge().filter(self.subject.clone()).await.context("purging the archive")?;
        Ok(())
    }
}

/// Writes `events` events (a few more: the last turn and the queued messages finish whole); returns the
/// session's last seq.
async fn build(args: &ReadsArgs, clients: &[AgentClient<Channel>], session: &SessionRef, events: u64) -> Result<u64> {
    let s = Session::with_ref(clients[0].clone(), session.clone());
    s.configure("scripted", InjectMode::OutOfTurn).await.context("configure out-of-turn injects")?;
    let next_id = Arc::new(AtomicU64::new(0));
    let mut last = 1;
    while last + 10 < events {
        // One round: up to `turn_every` injects from all clients at once, then one whole turn.
        let round = args.turn_every.min(events.saturating_sub(last + 10)).max(1);
        let end = next_id.load(Ordering::Relaxed) + round;
        let mut tasks = Vec::new();
        for client in clients {
            let (s, next_id) = (Session::with_ref(client.clone(), session.clone()), next_id.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = next_id.fetch_add(1, Ordering::Relaxed);
                    if n >= end {
                        return Ok::<_, tonic::Status>(());
                    }
                    s.inject(user_msg(&format!("i{n}"), &format!("note {n}"))).await?;
                }
            }));
        }
        for task in tasks {
            task.await?.context("inject")?;
        }
        next_id.store(end, Ordering::Relaxed);
        s.followup(user_msg(&format!("f{end}"), "hello")).await.context("followup")?;
        last = s.when_idle().await.context("when_idle")?.last_seq;
    }
    for i in 0..3 {
        s.queue(user_msg(&format!("q{i}"), "later")).await.context("queue")?;
    }
    Ok(s.info().await?.last_seq)
}

/// Watch(after_seq, live = false) from the call to `caught_up`; checks the events in between.
async fn caught_up(client: &AgentClient<Channel>, session: &SessionRef, after_seq: u64, last: u64) -> Result<Duration> {
    let started = Instant::now();
    let req = WatchRequest { session: Some(session.clone()), after_seq, live: false, resume: None };
    let mut stream = client.clone().watch(req).await?.into_inner();
    let mut next = after_seq + 1;
    while let Some(item) = stream.message().await? {
        match item.item {
            Some(Item::Event(e)) => {
                if e.seq != next {
                    bail!("watch after {after_seq}: got seq {} where {next} was due", e.seq);
                }
                next += 1;
            }
            Some(Item::CaughtUp(c)) => {
                let took = started.elapsed();
                if c.seq != last || next != last + 1 {
                    bail!(
                        "watch after {after_seq}: caught up at {} after seq {}, the log ends at {last}",
                        c.seq,
                        next - 1
                    );
                }
                return Ok(took);
            }
            _ => {}
        }
    }
    bail!("watch after {after_seq} ended before caught_up")
}

async fn time_reads(
    args: &ReadsArgs,
    client: &AgentClient<Channel>,
    session: &SessionRef,
    last: u64,
) -> Result<SessionReads> {
    let s = Session::with_ref(client.clone(), session.clone());
    // One untimed read of each kind first (connections, the gateway's first look at the session).
    let _ = caught_up(client, session, last.saturating_sub(10), last).await?;
    s.inbox().await?;
    let rounds = args.rounds.max(1);
    let mut back_10 = Vec::new();
    let mut back_1000 = Vec::new();
    for _ in 0..rounds {
        back_10.push(caught_up(client, session, last.saturating_sub(10), last).await?);
        if last > 1_000 {
            back_1000.push(caught_up(client, session, last - 1_000, last).await?);
        }
    }
    let mut from_0 = Vec::new();
    for _ in 0..args.from_zero_rounds.max(1) {
        from_0.push(caught_up(client, session, 0, last).await?);
    }
    let (mut inbox, mut info) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let snapshot = s.inbox().await?;
        inbox.push(started.elapsed());
        if snapshot.seq != last || snapshot.next_turn.len() != 3 {
            bail!("GetInbox answered seq {} with {} next-turn messages", snapshot.seq, snapshot.next_turn.len());
        }
        let started = Instant::now();
        s.info().await?;
        info.push(started.elapsed());
    }
    Ok(SessionReads {
        events: last,
        build_s: 0.0,
        watch_10_back: Percentiles::of(&back_10),
        watch_1000_back: (!back_1000.is_empty()).then(|| Percentiles::of(&back_1000)),
        watch_from_0: Percentiles::of(&from_0),
        watch_from_0_log_only: None,
        archived_seq: 0,
        archive_bytes: 0,
        log_bytes: 0,
        get_inbox: Percentiles::of(&inbox),
        get_session: Percentiles::of(&info),
        snapshot_bytes: None,
        read_snapshot_bytes: None,
    })
}

fn markdown(r: &ReadsReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Reads of a long session ({} cores, {}, nats-server {}, `turnstile dev --nats`, {})\n",
        r.nproc, r.cpu_model, r.nats_server_version, r.turnstile_bin
    );
    let _ = writeln!(out, "| read (p50 / p99) | {} events | {} events |", r.small.events, r.long.events);
    let _ = writeln!(out, "|---|---:|---:|");
    let cell = |p: &Percentiles| format!("{:.2} / {:.2} ms", p.p50_ms, p.p99_ms);
    let opt = |p: &Option<Percentiles>| p.as_ref().map_or_else(|| "—".to_owned(), cell);
    let _ = writeln!(
        out,
        "| Watch → caught-up, 10 back | {} | {} |",
        cell(&r.small.watch_10_back),
        cell(&r.long.watch_10_back)
    );
    let _ = writeln!(
        out,
        "| Watch → caught-up, 1,000 back | {} | {} |",
        opt(&r.small.watch_1000_back),
        opt(&r.long.watch_1000_back)
    );
    let _ = writeln!(
        out,
        "| Watch → caught-up, from 0 | {} | {} |",
        cell(&r.small.watch_from_0),
        cell(&r.long.watch_from_0)
    );
    let _ = writeln!(
        out,
        "| Watch → caught-up, from 0, archive purged (the log alone) | {} | {} |",
        opt(&r.small.watch_from_0_log_only),
        opt(&r.long.watch_from_0_log_only)
    );
    let _ = writeln!(
        out,
        "| archived through seq; archive / log bytes | {}; {} / {} B | {}; {} / {} B |",
        r.small.archived_seq,
        r.small.archive_bytes,
        r.small.log_bytes,
        r.long.archived_seq,
        r.long.archive_bytes,
        r.long.log_bytes
    );
    let _ = writeln!(out, "| GetInbox | {} | {} |", cell(&r.small.get_inbox), cell(&r.long.get_inbox));
    let _ = writeln!(out, "| GetSession | {} | {} |", cell(&r.small.get_session), cell(&r.long.get_session));
    let bytes = |b: Option<usize>| b.map_or_else(|| "none".to_owned(), |b| format!("{b} B"));
    let _ = writeln!(
        out,
        "| snapshot / read snapshot | {} / {} | {} / {} |",
        bytes(r.small.snapshot_bytes),
        bytes(r.small.read_snapshot_bytes),
        bytes(r.long.snapshot_bytes),
        bytes(r.long.read_snapshot_bytes)
    );
    let _ = writeln!(out, "| writing the session | {:.1} s | {:.1} s |", r.small.build_s, r.long.build_s);
    out
}
