//! A steer into a running turn → its `user/message` at the next step (issue 11 part 5; SPEC §3, §4).
//!
//! A steer enters at the next model-step boundary: nothing interrupts the step that runs when it arrives.
//! So each round makes the running step end at a known point soon after the steer, with a 0 ms model:
//! a followup `[[tool:sleep MS]] go` opens a turn whose first step calls the built-in `sleep` tool; once a
//! Watch of the session has the durable `tool/call`, the steer is sent (it lands while the tool sleeps);
//! the sleep ends, the step ends, and the next proposal claims the steer and writes `step/start` + its
//! `user/message` (step 2). The scripted model answers at once, so nothing else waits.
//!
//! Per round, all instants taken on this process's clock:
//! - `ack`: the Steer call's reply arrived;
//! - `boundary`: the Watch received the step's `tool/result` (the tool returned: the step's work is over);
//! - `message`: the Watch received the `user/message` carrying the steer's id.
//!
//! The figure (`steer_to_message_*`) is `message − max(ack, boundary)`: from the later of "the steer is
//! accepted" and "the running step has done its work" to the steer's `user/message` at a watcher. It is
//! what a steer costs on top of the step it waits for, i.e. ack → user/message of a steer that arrives
//! just as the step ends. `ack → message` (raw, includes the rest of the sleep) is reported beside it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::sync::mpsc;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::watch_item::Item;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

#[derive(Clone, Debug)]
pub struct SteerOpts {
    pub rounds: usize,
    pub warmup: usize,
    /// The running step's tool sleep, ms: long enough for the steer's ack to come back inside it.
    pub sleep_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct SteerReport {
    pub rounds: usize,
    pub warmup: usize,
    pub sleep_ms: u64,
    /// Rounds whose steer was acknowledged before the step's tool result reached the watcher (the steer
    /// landed in the running step, as intended), and whose user/message is turn 1 step 2.
    pub landed_in_running_step: usize,
    /// max(Steer ack, the step's `tool/result` at the watcher) → the steer's `user/message` at the watcher.
    pub steer_to_message: Percentiles,
    /// Steer ack → its `user/message` at the watcher (includes the rest of the tool's sleep).
    pub ack_to_message: Percentiles,
    /// The Steer call itself (sent → acknowledged).
    pub steer_call: Percentiles,
    /// The durable event types the watcher received between the `tool/result` and the steer's
    /// `user/message` in the first measured round: what the boundary writes.
    pub boundary_events: Vec<String>,
}

/// A durable event as the watcher received it.
struct Seen {
    at: Instant,
    event: pb::SessionEvent,
}

pub async fn run(gateway_url: &str, run_id: &str, opts: &SteerOpts) -> Result<SteerReport> {
    let mut client = servers::connect(gateway_url).await?;
    let watch_client = servers::connect(gateway_url).await?;
    let mut to_message = Vec::with_capacity(opts.rounds);
    let mut ack_to_message = Vec::with_capacity(opts.rounds);
    let mut calls = Vec::with_capacity(opts.rounds);
    let mut landed = 0;
    let mut boundary_events = Vec::new();
    for i in 0..opts.warmup + opts.rounds {
        let session = pb::SessionRef { tenant: "bench".into(), id: format!("steer-{run_id}-{i}") };
        let round = round(&mut client, watch_client.clone(), &session, run_id, i, opts.sleep_ms)
            .await
            .with_context(|| format!("steer round {i} on {}", session.id))?;
        if i < opts.warmup {
            continue;
        }
        to_message.push(round.message.duration_since(round.ack.max(round.boundary)));
        ack_to_message.push(round.message.duration_since(round.ack));
        calls.push(round.call);
        landed += usize::from(round.landed);
        if boundary_events.is_empty() {
            boundary_events = round.between;
        }
    }
    Ok(SteerReport {
        rounds: opts.rounds,
        warmup: opts.warmup,
        sleep_ms: opts.sleep_ms,
        landed_in_running_step: landed,
        steer_to_message: Percentiles::of(&to_message),
        ack_to_message: Percentiles::of(&ack_to_message),
        steer_call: Percentiles::of(&calls),
        boundary_events,
    })
}

struct Round {
    ack: Instant,
    boundary: Instant,
    message: Instant,
    call: Duration,
    landed: bool,
    between: Vec<String>,
}

/// Bound on any one wait of a round.
const WAIT: Duration = Duration::from_secs(30);

async fn round(
    client: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
    mut watcher: pb::agent_client::AgentClient<tonic::transport::Channel>,
    session: &pb::SessionRef,
    run_id: &str,
    i: usize,
    sleep_ms: u64,
) -> Result<Round> {
    let request = pb::WatchRequest { session: Some(session.clone()), after_seq: 0, live: false, resume: None };
    let mut stream = watcher.watch(request).await.context("opening the Watch")?.into_inner();
    let (tx, mut rx) = mpsc::unbounded_channel::<Result<Seen, String>>();
    // The reader stamps each durable event as it arrives; it ends with the stream (passing on how it
    // ended) or when `rx` is dropped.
    let reader = tokio::spawn(async move {
        loop {
            let ended = match stream.message().await {
                Ok(Some(item)) => {
                    if let Some(Item::Event(event)) = item.item
                        && tx.send(Ok(Seen { at: Instant::now(), event })).is_err()
                    {
                        return;
                    }
                    continue;
                }
                Ok(None) => "the server ended it".to_owned(),
                Err(status) => format!("{:?}: {}", status.code(), status.message()),
            };
            let _ = tx.send(Err(ended));
            return;
        }
    });
    let _abort = AbortOnDrop(reader);

    let followup = text_message(format!("f-{run_id}-{i}"), &format!("[[tool:sleep {sleep_ms}]] go"));
    client
        .followup(pb::DeliverRequest { session: Some(session.clone()), message: Some(followup), output_schema: None })
        .await?;
    next_matching(&mut rx, |e| matches!(e.payload, Some(Payload::ToolCall(_)))).await.context("the tool/call")?;

    let steer_id = format!("s-{run_id}-{i}");
    let request = pb::SteerRequest {
        session: Some(session.clone()),
        message: Some(text_message(steer_id.clone(), "steer")),
        ..Default::default()
    };
    let sent = Instant::now();
    client.steer(request).await.context("the steer")?;
    let ack = Instant::now();

    let result = next_matching(&mut rx, |e| matches!(e.payload, Some(Payload::ToolResult(_))))
        .await
        .context("the tool/result")?;
    let mut between = Vec::new();
    let (message, landed) = loop {
        let seen = next(&mut rx).await.context("the steer's user/message")?;
        match &seen.event.payload {
            Some(Payload::UserMessage(m)) if m.message.as_ref().is_some_and(|m| m.id == steer_id) => {
                break (seen.at, m.turn == 1 && m.step == 2);
            }
            _ => between.push(seen.event.r#type.clone()),
        }
    };
    // Untimed: the turn's last step, so the next round starts on a quiet server.
    client
        .when_idle(pb::WhenIdleRequest { session: Some(session.clone()), timeout_ms: 10_000 })
        .await
        .context("waiting for the turn to end")?;
    Ok(Round { ack, boundary: result.at, message, call: ack - sent, landed: landed && ack < result.at, between })
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Result<Seen, String>>) -> Result<Seen> {
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Some(Ok(seen))) => Ok(seen),
        Ok(Some(Err(ended))) => bail!("the Watch stream ended: {ended}"),
        Ok(None) => bail!("the Watch stream ended"),
        Err(_) => bail!("nothing within {WAIT:?}"),
    }
}

async fn next_matching(
    rx: &mut mpsc::UnboundedReceiver<Result<Seen, String>>,
    wanted: impl Fn(&pb::SessionEvent) -> bool,
) -> Result<Seen> {
    loop {
        let seen = next(rx).await?;
        if wanted(&seen.event) {
            return Ok(seen);
        }
    }
}

/// Ends the Watch reader with the round, however the round ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
