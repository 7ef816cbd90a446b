//! `turnstile-bench memory`: `PutMemory`, `GetMemory` and `SearchMemory` over many documents of one tenant
//! on `turnstile dev --nats` (SPEC §20, decision 0147).
//!
//! Writes `--documents` documents (default 100,000, the default `memory.max_documents_per_tenant`) into one
//! namespace from `--clients` concurrent clients, each `{"text": …}` of eight words from a vocabulary of
//! 2,000 plus a word of its own. Then times `--rounds` rounds of: a put over an existing key, a get of a
//! random key (checked to be that document), a search for two vocabulary words (checked to hold at most 10
//! hits) and a search for one document's own word (checked to find that document first).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use turnstile_proto::v1::{GetMemoryRequest, PutMemoryRequest, SearchMemoryRequest};

use crate::servers::{self, Dev};
use crate::stats::Percentiles;

/// The namespace the documents are written to.
const NAMESPACE: &str = "bench";
/// Words the documents are made of (besides each one's own).
const VOCABULARY: usize = 2_000;

#[derive(Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Documents of the tenant.
    #[arg(long, default_value_t = 100_000)]
    documents: usize,
    /// Concurrent clients writing them.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Timed rounds (a put, a get and two searches each).
    #[arg(long, default_value_t = 500)]
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
pub struct MemoryReport {
    pub nproc: usize,
    pub cpu_model: String,
    pub turnstile_bin: String,
    pub documents: usize,
    /// Writing the documents.
    pub build_s: f64,
    /// A put over an existing key.
    pub put: Percentiles,
    /// A get by key.
    pub get: Percentiles,
    /// A search for two vocabulary words (each in about 0.4% of the documents), 10 hits.
    pub search_common: Percentiles,
    /// A search for one document's own word.
    pub search_unique: Percentiles,
}

pub async fn run(args: MemoryArgs) -> Result<()> {
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

/// A small deterministic generator (the same documents on every run).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key(i: usize) -> String {
    format!("doc/{i:06}")
}

/// Document `i`, version `version`: eight vocabulary words and its own.
fn document(i: usize, version: u64) -> String {
    let words: Vec<String> = (0..8).map(|w| format!("w{}", mix((i as u64) << 8 | w) % VOCABULARY as u64)).collect();
    serde_json::json!({"text": format!("{} own{i}", words.join(" ")), "version": version}).to_string()
}

fn request(tenant: &str, i: usize, version: u64) -> PutMemoryRequest {
    PutMemoryRequest {
        tenant: tenant.to_owned(),
        namespace: NAMESPACE.into(),
        key: key(i),
        document: document(i, version),
    }
}

async fn measure(args: &MemoryArgs, dev: &Dev) -> Result<MemoryReport> {
    if args.documents == 0 {
        bail!("--documents must be at least 1");
    }
    let tenant = format!("memory{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.clients.max(1) {
        let mut client = servers::connect(&dev.url()).await?;
        let (next, tenant, total) = (next.clone(), tenant.clone(), args.documents);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                if i > 0 && i % 10_000 == 0 {
                    eprintln!("memory: {i} documents");
                }
                client.put_memory(request(&tenant, i, 0)).await.with_context(|| format!("PutMemory {i}"))?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let build_s = started.elapsed().as_secs_f64();
    let mut client = servers::connect(&dev.url()).await?;
    let (mut puts, mut gets, mut common, mut unique) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let pick = |round: usize, salt: u64| (mix(round as u64 * 4 + salt) % args.documents as u64) as usize;
    for round in 0..args.rounds {
        let i = pick(round, 1);
        let t = Instant::now();
        client.put_memory(request(&tenant, i, round as u64 + 1)).await?;
        puts.push(t.elapsed());

        let i = pick(round, 2);
        let t = Instant::now();
        let got = client
            .get_memory(GetMemoryRequest { tenant: tenant.clone(), namespace: NAMESPACE.into(), key: key(i) })
            .await?
            .into_inner();
        gets.push(t.elapsed());
        if got.key != key(i) || !got.document.contains(&format!("own{i}\"")) {
            bail!("GetMemory {} answered {:?}", key(i), got);
        }

        let query =
            format!("w{} w{}", mix(round as u64) % VOCABULARY as u64, mix(round as u64 + 7) % VOCABULARY as u64);
        let search = |query: String| SearchMemoryRequest {
            tenant: tenant.clone(),
            namespaces: vec![NAMESPACE.into()],
            query,
            limit: 10,
        };
        let t = Instant::now();
        let hits = client.search_memory(search(query.clone())).await?.into_inner().hits;
        common.push(t.elapsed());
        if hits.len() > 10 {
            bail!("SearchMemory {query:?} answered {} hits for a limit of 10", hits.len());
        }

        let i = pick(round, 3);
        let t = Instant::now();
        let hits = client.search_memory(search(format!("own{i}"))).await?.into_inner().hits;
        unique.push(t.elapsed());
        if hits.first().and_then(|h| h.document.as_ref()).map(|d| d.key.as_str()) != Some(key(i).as_str()) {
            bail!("SearchMemory own{i} did not find {} first", key(i));
        }
    }
    Ok(MemoryReport {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        turnstile_bin: String::new(),
        documents: args.documents,
        build_s,
        put: Percentiles::of(&puts),
        get: Percentiles::of(&gets),
        search_common: Percentiles::of(&common),
        search_unique: Percentiles::of(&unique),
    })
}

fn markdown(r: &MemoryReport) -> String {
    let row = |name: &str, p: &Percentiles| {
        format!("| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |\n", p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms)
    };
    let mut out = format!(
        "### Memory over {} documents of one tenant ({} cores, {})\n\nWritten in {:.1} s.\n\n\
         | call | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n",
        r.documents, r.nproc, r.cpu_model, r.build_s
    );
    out.push_str(&row("PutMemory over an existing key", &r.put));
    out.push_str(&row("GetMemory", &r.get));
    out.push_str(&row("SearchMemory, two common words, 10 hits", &r.search_common));
    out.push_str(&row("SearchMemory, one document's own word", &r.search_unique));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_the_same_on_every_run_and_hold_their_own_word() {
        assert_eq!(document(7, 0), document(7, 0));
        assert_ne!(document(7, 0), document(8, 0));
        let value: serde_json::Value = serde_json::from_str(&document(7, 3)).unwrap_or_default();
        assert!(value["text"].as_str().is_some_and(|t| t.ends_with(" own7") && t.split(' ').count() == 9));
    }
}
