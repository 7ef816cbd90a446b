//! Watch fan-out (issue 11 part 5): `watchers` live Watch streams of one session, then `rounds` followups
//! whose scripted turn streams its reply; for each watcher and round, the time from sending the followup
//! to that watcher's first `assistant/delta` of the round's turn. The anchor is the same with one watcher,
//! same run, same session: what 1,000 watchers add is the difference. The server's JetStream consumer
//! count is sampled while the watchers are attached: the gateway's watchers of one session share one
//! (decision 0039).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::sync::mpsc;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as LivePayload;
use turnstile_proto::v1::watch_item::Item;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

#[derive(Debug, Serialize)]
pub struct FanoutReport {
    pub watchers: usize,
    pub rounds: usize,
    /// Followup sent → each watcher's first delta of the turn, over every watcher and round.
    pub delta: Percentiles,
    /// The same with one watcher (the anchor).
    pub delta_one_watcher: Percentiles,
    /// Watchers that missed a round's delta within the wait (0 expected).
    pub missed: usize,
    /// JetStream consumers on the server (the account's count), the most seen while the watchers were
    /// attached: sampled once they had opened and after each round. `None` when the server did not
    /// answer.
    pub consumers_with_watchers: Option<usize>,
    /// The same with the one watcher of the anchor.
    pub consumers_with_one_watcher: Option<usize>,
}

/// When each round's followup was sent, by the turn it opens.
type Sent = Arc<Mutex<HashMap<u64, Instant>>>;

pub async fn run(
    gateway_url: &str,
    nats: async_nats::Client,
    run_id: &str,
    watchers: usize,
    rounds: usize,
) -> Result<FanoutReport> {
    let session = pb::SessionRef { tenant: "bench".into(), id: format!("fanout-{run_id}") };
    let client = servers::connect(gateway_url).await?;
    let js = async_nats::jetstream::new(nats);
    // Each round opens the next turn of the fresh session.
    let mut next_turn = 1;
    let sent: Sent = Arc::default();
    let one = measure(gateway_url, &client, &js, &session, &sent, 1, rounds, &mut next_turn, run_id).await?;
    let many = measure(gateway_url, &client, &js, &session, &sent, watchers, rounds, &mut next_turn, run_id).await?;
    Ok(FanoutReport {
        watchers,
        rounds,
        delta: Percentiles::of(&many.delays),
        delta_one_watcher: Percentiles::of(&one.delays),
        missed: one.missed + many.missed,
        consumers_with_watchers: many.consumers,
        consumers_with_one_watcher: one.consumers,
    })
}

/// One `measure` pass.
struct Measured {
    delays: Vec<Duration>,
    missed: usize,
    consumers: Option<usize>,
}

/// The server's JetStream consumers now (every stream of the account), `None` if it does not answer.
async fn consumers(js: &async_nats::jetstream::Context) -> Option<usize> {
    js.query_account().await.ok().map(|a| a.consumers)
}

/// `rounds` followups watched by `watchers` streams; every watcher's delay of every round, the misses and
/// the most consumers seen.
#[allow(clippy::too_many_arguments)]
async fn measure(
    gateway_url: &str,
    client: &pb::agent_client::AgentClient<tonic::transport::Channel>,
    js: &async_nats::jetstream::Context,
    session: &pb::SessionRef,
    sent: &Sent,
    watchers: usize,
    rounds: usize,
    next_turn: &mut u64,
    run_id: &str,
) -> Result<Measured> {
    let gateway = client.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Duration)>();
    let mut tasks = AbortOnDrop(Vec::with_capacity(watchers));
    // One connection per 100 streams (HTTP/2 stream limits); each watcher resumes at the log's end.
    let mut channels = Vec::new();
    let last = last_seq(client, session).await?;
    for w in 0..watchers {
        if w % 100 == 0 {
            channels.push(servers::connect(gateway_url).await?);
        }
        let mut watcher = channels.last().cloned().unwrap_or_else(|| gateway.clone());
        let request = pb::WatchRequest { session: Some(session.clone()), after_seq: last, live: true, resume: None };
        let mut stream = watcher.watch(request).await.context("opening a watcher")?.into_inner();
        let (tx, sent) = (tx.clone(), sent.clone());
        tasks.0.push(tokio::spawn(async move {
            let mut seen = std::collections::HashSet::new();
            while let Ok(Some(item)) = stream.message().await {
                if let Some(Item::Live(pb::LiveEvent { payload: Some(LivePayload::AssistantDelta(d)), .. })) = item.item
                    && seen.insert(d.turn)
                {
                    let at = sent.lock().unwrap_or_else(PoisonError::into_inner).get(&d.turn).copied();
                    if let Some(at) = at {
                        let _ = tx.send((d.turn, at.elapsed()));
                    }
                }
            }
        }));
    }
    drop(tx);
    // Every watcher is subscribed once its caught-up came; give the streams a moment to open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut most = consumers(js).await;
    let mut delays = Vec::with_capacity(watchers * rounds);
    let mut missed = 0;
    let mut s = client.clone();
    for r in 0..rounds {
        let turn = *next_turn;
        *next_turn += 1;
        sent.lock().unwrap_or_else(PoisonError::into_inner).insert(turn, Instant::now());
        let message = text_message(format!("fan-{run_id}-{turn}"), "a reply streamed to every watcher");
        let reply = s
            .followup(pb::DeliverRequest {
                session: Some(session.clone()),
                message: Some(message),
                output_schema: None,
            })
            .await
            .with_context(|| format!("fan-out followup {r}"))?;
        if reply.get_ref().turn != Some(turn) {
            bail!("fan-out followup {r} opened turn {:?}, not {turn}", reply.get_ref().turn);
        }
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while got < watchers {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((t, d))) if t == turn => {
                    delays.push(d);
                    got += 1;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        missed += watchers - got;
        s.when_idle(pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms: 30_000 })
            .await
            .context("waiting for the fan-out session to be idle")?;
        most = most.max(consumers(js).await);
    }
    drop(tasks);
    Ok(Measured { delays, missed, consumers: most })
}

/// The watcher tasks, stopped (their streams and the server's consumers closed) however the phase ends.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

async fn last_seq(
    client: &pb::agent_client::AgentClient<tonic::transport::Channel>,
    session: &pb::SessionRef,
) -> Result<u64> {
    match client.clone().get_session(pb::GetSessionRequest { session: Some(session.clone()) }).await {
        Ok(info) => Ok(info.get_ref().last_seq),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(0),
        Err(status) => Err(status).context("GetSession of the fan-out session"),
    }
}
