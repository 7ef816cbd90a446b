//! `turnstile dev --demo`: a short scripted tour through the public API on session `demo`, printing its
//! watch stream.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;

use crate::client::{self, Client, Delivery, Preset};
use crate::watch::WatchOpts;

const SESSION: &str = "demo";

/// How long the printer may take to show the last event after the session went idle.
const DRAIN: Duration = Duration::from_secs(10);

async fn step(client: &mut Client, label: &str, preset: Preset, text: &str) -> Result<()> {
    let d = Delivery { session: SESSION.into(), text: text.into(), id: None, source: None };
    let (id, reply) = client::deliver(client, preset, &d).await.with_context(|| format!("demo {label}"))?;
    println!("   [demo] {label} {text:?}: {}", client::accepted_line(&id, &reply));
    Ok(())
}

async fn idle(client: &mut Client) -> Result<u64> {
    let info = client
        .api
        .when_idle(turnstile_proto::v1::WhenIdleRequest { session: Some(client.session(SESSION)), timeout_ms: 30_000 })
        .await
        .context("demo wait-idle")?
        .into_inner();
    Ok(info.last_seq)
}

pub async fn run(url: &str) -> Result<()> {
    let mut client = Client::connect(url, None, "default").await?;
    println!("\n-- demo: watching session {SESSION} (durable lines start with #seq, live ones with ~)");
    let (seen_tx, mut seen) = watch::channel(0u64);
    let mut watcher = client.clone();
    let printer = tokio::spawn(async move {
        let opts = WatchOpts { after: 0, live: true, until_idle: false, reconnect_for: Duration::from_secs(30) };
        let mut out = std::io::stdout();
        crate::watch::watch(&mut watcher, SESSION, &opts, &mut out, |seq| {
            seen_tx.send_replace(seq);
        })
        .await
    });
    // The watch starts with caught_up; wait for it so the tour's first events are not missed by the live tail.
    seen.changed().await.ok();

    step(&mut client, "followup", Preset::Followup, "hello").await?;
    idle(&mut client).await?;
    step(&mut client, "followup", Preset::Followup, "[[tool:sleep 1500]] working").await?;
    // Give the model time to call the tool, so the steer lands while it sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    step(
        &mut client,
        "steer",
        Preset::Steer { expected_turn: None, deadline_ms: None, on_deadline: None },
        "also mention the weather",
    )
    .await?;
    step(&mut client, "inject", Preset::Inject, "context: it is sunny").await?;
    step(&mut client, "queue", Preset::Queue, "and then say goodbye").await?;
    let last = idle(&mut client).await?;
    let drained = tokio::time::timeout(DRAIN, seen.wait_for(|s| *s >= last)).await;
    printer.abort();
    if drained.is_err() {
        println!("   [demo] the watch stream did not show seq {last} within {DRAIN:?}");
    }
    println!("-- demo done: session {SESSION} is idle at seq {last}; the server keeps serving\n");
    Ok(())
}
