//! `turnstile-bench search`: `ListSessions` with a label selector over many sessions of one tenant on
//! `turnstile dev --nats` (SPEC §16, decision 0069).
//!
//! Creates `--sessions` sessions (default 100,000) in one tenant through the public API, each by one
//! `SetLabels` (`team = t<i mod 10>`, `shard = s<i mod 100>`: its first event), from `--clients` concurrent
//! clients. Once the gateway's index shows them all, it times pages of 100: by id with `team=t3` (one session
//! in ten matches), newest first with `team=t2,shard=s42` (one in a hundred), and by id with a selector
//! nothing matches (the whole tenant walked), each checked to hold only matches; and the first page's token
//! followed to the second page.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use turnstile_proto::v1::{ListSessionsRequest, SessionOrder, SessionRef, SetLabelsRequest};

use crate::servers::{self, Dev};
use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct SearchArgs {
    /// Sessions of the tenant.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Concurrent clients creating them.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Timed pages of each kind.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
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

#[derive(Debug, Serialize)]
pub struct SearchReport {
    pub nproc: usize,
    pub cpu_model: String,
    pub turnstile_bin: String,
    pub sessions: usize,
    /// Creating the sessions (one SetLabels each).
    pub build_s: f64,
    /// Page of 100, by id, `team=t3`.
    pub page_by_id_1_in_10: Percentiles,
    /// Page of 100, newest first, `team=t2,shard=s42` (`--sessions` / 100 match).
    pub page_by_activity_1_in_100: Percentiles,
    /// The page after the first one (by id, `team=t3`), from its token.
    pub second_page_by_id: Percentiles,
    /// A selector nothing matches: the whole tenant walked, an empty page.
    pub page_no_match: Percentiles,
}

pub async fn run(args: SearchArgs) -> Result<()> {
    let (bin, nats, json) = (args.turnstile_bin.clone(), args.nats.as_deref(), args.json);
    servers::report_on_dev_nats(
        bin,
        nats,
        json,
        async |dev| measure(&args, dev).await,
        |r| &mut r.turnstile_bin,
        markdown,
    )
    .await
}

async fn measure(args: &SearchArgs, dev: &Dev) -> Result<SearchReport> {
    let tenant = format!("search{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let mut client = servers::connect(&dev.url()).await?;
        let (next, tenant, total) = (next.clone(), tenant.clone(), args.sessions);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                if i > 0 && i % 10_000 == 0 {
                    eprintln!("search: {i} sessions");
                }
                let labels = HashMap::from([
                    ("team".to_owned(), format!("t{}", i % 10)),
                    ("shard".to_owned(), format!("s{}", i % 100)),
                ]);
                let request = SetLabelsRequest {
                    session: Some(SessionRef { tenant: tenant.clone(), id: format!("s-{i:06}") }),
                    labels,
                    remove_keys: vec![],
                };
                client.set_labels(request).await.with_context(|| format!("SetLabels on session {i}"))?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let build_s = started.elapsed().as_secs_f64();
    let mut client = servers::connect(&dev.url()).await?;
    let page = |selector: &str, order: SessionOrder| ListSessionsRequest {
        tenant: tenant.clone(),
        page_size: 100,
        label_selector: selector.into(),
        order_by: order.into(),
        ..Default::default()
    };
    // The index follows the writes: wait until the last session is listed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let last_team = format!("team=t{},shard=s{}", (args.sessions - 1) % 10, (args.sessions - 1) % 100);
    loop {
        let reply = client.list_sessions(page(&last_team, SessionOrder::LastActivity)).await?.into_inner();
        if reply
            .sessions
            .iter()
            .any(|s| s.session.as_ref().is_some_and(|r| r.id == format!("s-{:06}", args.sessions - 1)))
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the index did not show session {} within 60 s", args.sessions - 1);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let timed = |samples: &mut Vec<Duration>, elapsed: Duration| samples.push(elapsed);
    let (mut by_id, mut by_activity, mut second, mut none) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let t = Instant::now();
        let reply = client.list_sessions(page("team=t3", SessionOrder::Id)).await?.into_inner();
        timed(&mut by_id, t.elapsed());
        check(&reply.sessions, "team", "t3", 100.min(args.sessions / 10))?;
        let t = Instant::now();
        let next = client
            .list_sessions(ListSessionsRequest {
                page_token: reply.next_page_token.clone(),
                ..page("team=t3", SessionOrder::Id)
            })
            .await?
            .into_inner();
        timed(&mut second, t.elapsed());
        check(&next.sessions, "team", "t3", 100.min((args.sessions / 10).saturating_sub(100)))?;
        let t = Instant::now();
        let reply = client.list_sessions(page("team=t2,shard=s42", SessionOrder::LastActivity)).await?.into_inner();
        timed(&mut by_activity, t.elapsed());
        check(&reply.sessions, "shard", "s42", 100.min(args.sessions / 100))?;
        if round % 4 == 0 {
            let t = Instant::now();
            let reply = client.list_sessions(page("team=nobody", SessionOrder::Id)).await?.into_inner();
            timed(&mut none, t.elapsed());
            if !reply.sessions.is_empty() {
                bail!("a selector nothing matches listed {} sessions", reply.sessions.len());
            }
        }
    }
    Ok(SearchReport {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        turnstile_bin: String::new(),
        sessions: args.sessions,
        build_s,
        page_by_id_1_in_10: Percentiles::of(&by_id),
        page_by_activity_1_in_100: Percentiles::of(&by_activity),
        second_page_by_id: Percentiles::of(&second),
        page_no_match: Percentiles::of(&none),
    })
}

/// A page holds `want` sessions, each labeled `key = value`.
fn check(sessions: &[turnstile_proto::v1::SessionInfo], key: &str, value: &str, want: usize) -> Result<()> {
    if sessions.len() != want {
        bail!("a page held {} sessions, not {want}", sessions.len());
    }
    if let Some(bad) = sessions.iter().find(|s| s.labels.get(key).map(String::as_str) != Some(value)) {
        bail!("session {:?} does not match {key}={value}: {:?}", bad.session, bad.labels);
    }
    Ok(())
}

fn markdown(r: &SearchReport) -> String {
    let row = |name: &str, p: &Percentiles| {
        format!("| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |\n", p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms)
    };
    let mut out = format!(
        "### ListSessions over {} sessions of one tenant ({} cores, {})\n\nBuilt in {:.1} s (one SetLabels each).\n\n\
         | page of 100 | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n",
        r.sessions, r.nproc, r.cpu_model, r.build_s
    );
    out.push_str(&row("by id, `team=t3` (1 in 10)", &r.page_by_id_1_in_10));
    out.push_str(&row("second page by id, from the token", &r.second_page_by_id));
    out.push_str(&row("newest first, `team=t2,shard=s42` (1 in 100)", &r.page_by_activity_1_in_100));
    out.push_str(&row("by id, no match (whole tenant walked)", &r.page_no_match));
    out
}
