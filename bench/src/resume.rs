//! A watcher that reconnects mid-reply (SPEC §14, decision 0042): how soon the reply goes on.
//!
//! Each round: a followup whose scripted reply streams slowly (`[[delay:MS]]`, ten deltas); a watcher on
//! gateway A waits for the reply's third delta and goes away, having kept only the first (the others were
//! in flight when its connection broke); at once a new `Watch` on gateway B asks to resume after the last
//! seq and the byte offset it kept. Timed on this process's clock:
//! - `first_resumed_delta`: the new Watch call sent → its first delta of the step (the owner's output so
//!   far, sent right after `caught_up`);
//! - `caught_up`: the new Watch call sent → its `caught_up`, the anchor (what any reconnect costs).
//!
//! Each round also checks the bytes: the two watchers' deltas together are the reply, each byte once (a
//! round that breaks this fails the phase). On `turnstile dev` A and B are the same gateway; the cluster
//! phase runs it across its two gateways.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use serde::Serialize;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;

use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_tests::watch::position;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

/// The reply's `[[delay:MS]]` by default: 40 ms between deltas, so a reconnect lands mid-reply.
pub const DEFAULT_DELAY_MS: u64 = 400;

#[derive(Clone, Debug)]
pub struct ResumeOpts {
    pub rounds: usize,
    pub warmup: usize,
    /// The scripted reply's `[[delay:MS]]`: its ten deltas come `delay_ms / 10` apart.
    pub delay_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct ResumeReport {
    pub rounds: usize,
    pub warmup: usize,
    pub delay_ms: u64,
    /// Whether A and B were different gateways.
    pub across_gateways: bool,
    /// New Watch sent → its first resumed delta.
    pub first_resumed_delta: Percentiles,
    /// New Watch sent → its `caught_up` (the anchor).
    pub caught_up: Percentiles,
}

/// One delta as a watcher received it.
fn delta(item: &pb::WatchItem) -> Option<&pb::AssistantDelta> {
    match &item.item {
        Some(Item::Live(pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), .. })) => Some(d),
        _ => None,
    }
}

pub async fn run(url_a: &str, url_b: &str, run_id: &str, opts: &ResumeOpts) -> Result<ResumeReport> {
    let mut a = servers::connect(url_a).await?;
    let mut b = servers::connect(url_b).await?;
    let (mut first, mut caught) = (Vec::new(), Vec::new());
    for i in 0..opts.warmup + opts.rounds {
        let session = pb::SessionRef { tenant: "bench".into(), id: format!("resume-{run_id}-{i}") };
        let (to_delta, to_caught_up) = round(&mut a, &mut b, &session, opts.delay_ms, i)
            .await
            .with_context(|| format!("resume round {i} on {}", session.id))?;
        if i >= opts.warmup {
            first.push(to_delta);
            caught.push(to_caught_up);
        }
    }
    Ok(ResumeReport {
        rounds: opts.rounds,
        warmup: opts.warmup,
        delay_ms: opts.delay_ms,
        across_gateways: url_a != url_b,
        first_resumed_delta: Percentiles::of(&first),
        caught_up: Percentiles::of(&caught),
    })
}

async fn round(
    a: &mut AgentClient<tonic::transport::Channel>,
    b: &mut AgentClient<tonic::transport::Channel>,
    session: &pb::SessionRef,
    delay_ms: u64,
    i: usize,
) -> Result<(Duration, Duration)> {
    let watch = |after_seq, resume| pb::WatchRequest { session: Some(session.clone()), after_seq, live: true, resume };
    let mut first = a.watch(watch(0, None)).await?.into_inner();
    let text = format!("[[delay:{delay_ms}]] a reply of many words that streams slowly in ten pieces, round {i}");
    a.followup(pb::DeliverRequest {
        session: Some(session.clone()),
        message: Some(text_message(format!("m{i}"), &text)),
        output_schema: None,
    })
    .await?;
    let mut seen = Vec::new();
    while seen.iter().filter(|i| delta(i).is_some()).count() < 3 {
        let item = first.message().await?.context("the first watch ended")?;
        seen.push(item);
    }
    drop(first);
    // The client kept only the first delta (the next two were on their way when its connection broke), so
    // the owner holds output the client lacks: what the resumed Watch must send at once.
    let had: String = seen.iter().filter_map(delta).map(|d| d.text.as_str()).take(1).collect();
    let resume = pb::StreamResume { turn: 1, step: 1, text_offset: had.len() as u64, reasoning_offset: 0 };

    let sent = Instant::now();
    let mut second = b.watch(watch(position(&seen), Some(resume))).await?.into_inner();
    let (mut to_caught_up, mut to_delta) = (None, None);
    let mut rest = String::new();
    let reply = loop {
        let item = second.message().await?.context("the resumed watch ended")?;
        match &item.item {
            Some(Item::CaughtUp(_)) => to_caught_up = Some(sent.elapsed()),
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::AssistantMessage(m)), .. })) => {
                break m.text.clone();
            }
            _ => {}
        }
        if let Some(d) = delta(&item) {
            if to_delta.is_none() && d.offset != had.len() as u64 {
                bail!("the resumed stream started at offset {} where the client had {}", d.offset, had.len());
            }
            to_delta.get_or_insert_with(|| sent.elapsed());
            rest.push_str(&d.text);
        }
    };
    if had.clone() + &rest != reply {
        bail!("the deltas {had:?} + {rest:?} are not the reply {reply:?}");
    }
    let to_delta = to_delta.context("the resumed stream had no delta: the reply ended before it joined")?;
    Ok((to_delta, to_caught_up.context("no caught_up")?))
}
