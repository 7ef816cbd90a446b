//! `turnstile-bench model`: a real model's time to first token and streaming rate, (a) straight from
//! llama-server's OpenAI-compatible endpoint and (b) through Turnstile, with the same prompt in the same
//! run.
//!
//! The run starts llama-server on SmolLM2-135M-Instruct with the harness ([`LlamaServer`]: greedy,
//! `-t 1` unless `--threads`, one slot) and the release `turnstile dev --config FILE` (embedded journal unless `--dev-arg`
//! says otherwise) whose default agent runs an `openai` model on that server with the same system prompt
//! and `max_tokens`. Then, after `--warmup` rounds that are dropped, `--runs` rounds, each one request
//! of each kind (which goes first alternates):
//!
//! - **direct**: one streaming `POST /v1/chat/completions` (system + prompt, `max_tokens`,
//!   `stream_options.include_usage`, exactly what Turnstile's provider sends); time to first token = from
//!   just before connecting to the first SSE chunk with text;
//! - **turnstile**: a fresh session, a live `Watch` on it (open before the followup, so nothing is missed),
//!   then `Followup`; time to first token = from just before the `Followup` call to the first live
//!   `assistant/delta` on the Watch; the run ends at the durable `assistant/message`.
//!
//! Streaming rate is deltas per second between the first and the last delta ((n − 1) / (t_last −
//! t_first)): llama-server sends one SSE chunk per generated token and Turnstile forwards each as one
//! `assistant/delta`, so on both paths this is tokens per second as the client sees them. The direct path
//! also reports llama-server's own decode rate (`timings.predicted_per_second`). Every answer ought to be
//! the same text (same request, greedy decoding): the report says whether they were.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde::Serialize;
use tonic::transport::Channel;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::live_event::Payload as Live;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;
use turnstile_tests::llama::{LlamaOptions, LlamaServer, SMOLLM2_MODEL, chat_body, llama_paths, stream_chat};

use crate::latency::text_message;
use crate::servers;
use crate::stats::Spread;

const DEFAULT_SYSTEM: &str = "You are a helpful assistant.";
const DEFAULT_PROMPT: &str = "Write a short paragraph about the history of the bicycle.";

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Measured rounds (one direct request and one Turnstile followup each).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Rounds run first and dropped (model load, prompt cache, connections).
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// `max_tokens` of every request (the Turnstile model's `max_tokens`).
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// The user prompt of every request.
    #[arg(long, default_value = DEFAULT_PROMPT)]
    prompt: String,
    /// The system prompt (the Turnstile agent's `system`).
    #[arg(long, default_value = DEFAULT_SYSTEM)]
    system: String,
    /// llama-server's `-t` (the harness's default: one thread, robust beside other processes).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Extra arguments for llama-server (repeatable), e.g. `--llama-arg=--no-cache-prompt`.
    #[arg(long = "llama-arg", allow_hyphen_values = true)]
    llama_args: Vec<String>,
    /// The `turnstile` binary to run as `turnstile dev --config FILE` (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<PathBuf>,
    /// Extra arguments for `turnstile dev` (repeatable), e.g. `--dev-arg=--nats --dev-arg=nats://…`.
    #[arg(long = "dev-arg", allow_hyphen_values = true)]
    dev_args: Vec<String>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// One request as the client saw it.
#[derive(Clone, Debug)]
struct Sample {
    ttft: Duration,
    /// Time of the first and the last text delta, from the start of the request.
    first: Duration,
    last: Duration,
    deltas: usize,
    /// To the last chunk (direct) or the durable `assistant/message` (Turnstile).
    total: Duration,
    text: String,
    /// llama-server's `timings.predicted_per_second` (direct only).
    server_tokens_per_s: Option<f64>,
    /// `usage.completion_tokens` (direct only).
    completion_tokens: Option<u64>,
}

impl Sample {
    fn deltas_per_s(&self) -> Option<f64> {
        let span = self.last.saturating_sub(self.first).as_secs_f64();
        (self.deltas >= 2 && span > 0.0).then(|| (self.deltas - 1) as f64 / span)
    }
}

#[derive(Debug, Serialize)]
pub struct PathReport {
    pub runs: usize,
    pub ttft_ms: Spread,
    pub deltas_per_s: Spread,
    pub total_ms: Spread,
    pub deltas: Spread,
    /// llama-server's own decode rate (direct only).
    pub server_tokens_per_s: Option<Spread>,
    /// `usage.completion_tokens` (direct only).
    pub completion_tokens: Option<Spread>,
}

#[derive(Debug, Serialize)]
pub struct ModelReport {
    pub nproc: usize,
    pub cpu_model: String,
    pub llama_server_version: String,
    pub model_file: String,
    pub turnstile_bin: String,
    pub dev_args: Vec<String>,
    pub llama_threads: u32,
    pub llama_args: Vec<String>,
    pub system: String,
    pub prompt: String,
    pub max_tokens: u32,
    pub warmup: usize,
    pub direct: PathReport,
    pub turnstile: PathReport,
    /// Whether every answer of both paths had the same text.
    pub identical_texts: bool,
    /// The first direct answer.
    pub sample_text: String,
}

fn report_of(samples: &[Sample]) -> PathReport {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let collect = |f: &dyn Fn(&Sample) -> Option<f64>| Spread::of(&samples.iter().filter_map(f).collect::<Vec<_>>());
    let optional = |f: &dyn Fn(&Sample) -> Option<f64>| {
        let spread = collect(f);
        (spread.count > 0).then_some(spread)
    };
    PathReport {
        runs: samples.len(),
        ttft_ms: collect(&|s| Some(ms(s.ttft))),
        deltas_per_s: collect(&Sample::deltas_per_s),
        total_ms: collect(&|s| Some(ms(s.total))),
        deltas: collect(&|s| Some(s.deltas as f64)),
        server_tokens_per_s: optional(&|s| s.server_tokens_per_s),
        completion_tokens: optional(&|s| s.completion_tokens.map(|n| n as f64)),
    }
}

pub async fn run(args: ModelArgs) -> Result<()> {
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);
    let (llama_bin, model_file) = llama_paths();
    let opts = LlamaOptions { threads: args.threads, extra_args: args.llama_args.clone() };
    let mut llama = LlamaServer::start_with(opts).await.context("starting llama-server with the harness")?;

    let scratch = tempfile::Builder::new().prefix("turnstile-bench-model-").tempdir()?;
    let config = scratch.path().join("turnstile.toml");
    std::fs::write(&config, config_toml(&llama.base_url(), &args.system, args.max_tokens))?;
    let mut dev_args = vec!["--config".to_owned(), config.display().to_string()];
    dev_args.extend(args.dev_args.iter().cloned());
    let dev = servers::Dev::start(&bin, None, &dev_args).await?;
    eprintln!("llama-server {}, turnstile dev {} ({})", llama.addr(), dev.url(), bin.display());

    let outcome = measure(&args, &llama, dev.channel()).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}\nllama-server log tail:\n{}", dev.log_tail(), llama.log_tail());
    }
    dev.stop().await;
    // A server that died mid-run is reported as such, not as the refused connection that followed.
    if let (Err(_), Some(died)) = (&outcome, llama.died()) {
        return Err(died.into());
    }
    let (direct, through) = outcome?;
    drop(llama);

    let sample_text = direct.first().map(|s| s.text.clone()).unwrap_or_default();
    let identical_texts = direct.iter().chain(&through).all(|s| s.text == sample_text);
    let report = ModelReport {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        llama_server_version: llama_version(&llama_bin),
        model_file: model_file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        turnstile_bin: bin.display().to_string(),
        dev_args: args.dev_args.clone(),
        llama_threads: args.threads,
        llama_args: args.llama_args.clone(),
        system: args.system.clone(),
        prompt: args.prompt.clone(),
        max_tokens: args.max_tokens,
        warmup: args.warmup,
        direct: report_of(&direct),
        turnstile: report_of(&through),
        identical_texts,
        sample_text,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

/// The configuration of docs/CONFIGURATION.md: one `openai` model on the server, the default agent on it.
fn config_toml(base_url: &str, system: &str, max_tokens: u32) -> String {
    // TOML basic strings take JSON's escapes for quotes, backslashes and control characters.
    let quote = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    format!(
        "default_agent = \"bench\"\n\n[models.local]\nprovider = \"openai\"\nbase_url = {}\nmodel = {}\n\
         max_tokens = {max_tokens}\nretries = 0\n\n[agents.bench]\nmodel = \"local\"\nsystem = {}\n",
        quote(base_url),
        quote(SMOLLM2_MODEL),
        quote(system),
    )
}

fn llama_version(bin: &std::path::Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            text.lines().find_map(|l| l.strip_prefix("version:").map(|v| v.trim().to_owned()))
        })
        .unwrap_or_else(|| "unknown".into())
}

async fn measure(args: &ModelArgs, llama: &LlamaServer, channel: Channel) -> Result<(Vec<Sample>, Vec<Sample>)> {
    let body = chat_body(&args.system, &args.prompt, args.max_tokens);
    let client = AgentClient::new(channel);
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    let rounds = args.warmup + args.runs;
    eprintln!("model: {} rounds + {} warm-up, max_tokens {} ...", args.runs, args.warmup, args.max_tokens);
    for round in 0..rounds {
        // Alternate which path goes first, so neither always runs right after the other's decode.
        let (a, b) = if round % 2 == 0 {
            let a = direct_once(llama, &body).await?;
            let b = turnstile_once(client.clone(), &run_id, round, &args.prompt).await?;
            (a, b)
        } else {
            let b = turnstile_once(client.clone(), &run_id, round, &args.prompt).await?;
            let a = direct_once(llama, &body).await?;
            (a, b)
        };
        if round >= args.warmup {
            direct.push(a);
            through.push(b);
        }
    }
    Ok((direct, through))
}

async fn direct_once(llama: &LlamaServer, body: &serde_json::Value) -> Result<Sample> {
    let answer = stream_chat(llama.addr(), body).await?;
    let (Some(first), Some(last)) = (answer.deltas.first(), answer.deltas.last()) else {
        bail!("llama-server answered no text: {answer:?}");
    };
    Ok(Sample {
        ttft: first.0,
        first: first.0,
        last: last.0,
        deltas: answer.deltas.len(),
        total: answer.elapsed,
        text: answer.text(),
        server_tokens_per_s: answer.server_tokens_per_s,
        completion_tokens: answer.usage.map(|u| u.completion_tokens),
    })
}

/// Bound on one Turnstile round (the watch, the followup, the whole answer).
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

async fn turnstile_once(client: AgentClient<Channel>, run_id: &str, round: usize, prompt: &str) -> Result<Sample> {
    tokio::time::timeout(ROUND_TIMEOUT, turnstile_unbounded(client, run_id, round, prompt))
        .await
        .with_context(|| format!("a Turnstile round took over {ROUND_TIMEOUT:?}"))?
}

async fn turnstile_unbounded(
    mut client: AgentClient<Channel>,
    run_id: &str,
    round: usize,
    prompt: &str,
) -> Result<Sample> {
    let session = pb::SessionRef { tenant: "bench".into(), id: format!("model-{run_id}-{round}") };
    let watch = pb::WatchRequest { session: Some(session.clone()), after_seq: 0, live: true, resume: None };
    let mut stream = client.watch(watch).await?.into_inner();
    loop {
        match stream.message().await? {
            Some(pb::WatchItem { item: Some(Item::CaughtUp(_)) }) => break,
            Some(_) => {}
            None => bail!("the watch ended before caught_up"),
        }
    }
    let start = Instant::now();
    let message = text_message(format!("m{round}"), prompt);
    client.followup(pb::DeliverRequest { session: Some(session), message: Some(message), output_schema: None }).await?;
    let mut deltas: Vec<(Duration, String)> = Vec::new();
    loop {
        let Some(item) = stream.message().await? else { bail!("the watch ended before the answer") };
        let at = start.elapsed();
        match item.item {
            Some(Item::Live(pb::LiveEvent { payload: Some(Live::AssistantDelta(d)), .. })) if !d.text.is_empty() => {
                deltas.push((at, d.text));
            }
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::AssistantMessage(m)), .. })) => {
                let (Some(first), Some(last)) = (deltas.first(), deltas.last()) else {
                    bail!("assistant/message {:?} came without live deltas", m.text);
                };
                return Ok(Sample {
                    ttft: first.0,
                    first: first.0,
                    last: last.0,
                    deltas: deltas.len(),
                    total: at,
                    text: m.text,
                    server_tokens_per_s: None,
                    completion_tokens: None,
                });
            }
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::TurnEnd(end)), .. })) => {
                bail!("the turn ended before an assistant/message: {end:?}");
            }
            _ => {}
        }
    }
}

fn markdown(r: &ModelReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "### Machine\n");
    let _ = writeln!(
        out,
        "{} cores ({}), llama-server {} on {} (`-t {} -np 1 --temp 0{}`), `turnstile dev --config` ({}{})\n",
        r.nproc,
        r.cpu_model,
        r.llama_server_version,
        r.model_file,
        r.llama_threads,
        r.llama_args.iter().map(|a| format!(" {a}")).collect::<String>(),
        r.turnstile_bin,
        r.dev_args.iter().map(|a| format!(" {a}")).collect::<String>(),
    );
    let _ = writeln!(
        out,
        "### Time to first token and streaming rate ({} rounds, {} warm-up, interleaved; max_tokens {})\n",
        r.direct.runs, r.warmup, r.max_tokens
    );
    let _ = writeln!(out, "Prompt {:?}, system {:?}.\n", r.prompt, r.system);
    let _ =
        writeln!(out, "| path | TTFT p50 | TTFT min – max | deltas/s p50 | deltas/s min – max | answer p50 | deltas |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, p) in [("llama-server direct (SSE)", &r.direct), ("Turnstile (Followup → Watch)", &r.turnstile)] {
        let _ = writeln!(
            out,
            "| {name} | {:.1} ms | {:.1} – {:.1} ms | {:.1} | {:.1} – {:.1} | {:.0} ms | {:.0} |",
            p.ttft_ms.p50,
            p.ttft_ms.min,
            p.ttft_ms.max,
            p.deltas_per_s.p50,
            p.deltas_per_s.min,
            p.deltas_per_s.max,
            p.total_ms.p50,
            p.deltas.p50,
        );
    }
    let _ = writeln!(
        out,
        "| Turnstile − direct (p50) | {:+.1} ms | | {:+.1} | | {:+.0} ms | |\n",
        r.turnstile.ttft_ms.p50 - r.direct.ttft_ms.p50,
        r.turnstile.deltas_per_s.p50 - r.direct.deltas_per_s.p50,
        r.turnstile.total_ms.p50 - r.direct.total_ms.p50,
    );
    if let (Some(tps), Some(tokens)) = (&r.direct.server_tokens_per_s, &r.direct.completion_tokens) {
        let _ = writeln!(
            out,
            "llama-server's own decode rate (`timings.predicted_per_second`): p50 {:.1} tokens/s (min {:.1}, max \
             {:.1}); completion tokens p50 {:.0}.\n",
            tps.p50, tps.min, tps.max, tokens.p50
        );
    }
    let _ = writeln!(
        out,
        "Identical answers on both paths in every round: {}. First answer: {:?}\n",
        if r.identical_texts { "yes" } else { "no" },
        r.sample_text
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_the_server_and_escapes_the_prompt() {
        let toml = config_toml("http://127.0.0.1:4242/v1", "Say \"hi\"\\n", 64);
        assert!(toml.contains("default_agent = \"bench\""), "{toml}");
        assert!(toml.contains("base_url = \"http://127.0.0.1:4242/v1\""), "{toml}");
        assert!(toml.contains("max_tokens = 64"), "{toml}");
        assert!(toml.contains(r#"system = "Say \"hi\"\\n""#), "{toml}");
    }

    #[test]
    fn deltas_per_second_between_first_and_last() {
        let sample = Sample {
            ttft: Duration::from_millis(100),
            first: Duration::from_millis(100),
            last: Duration::from_millis(600),
            deltas: 11,
            total: Duration::from_millis(610),
            text: String::new(),
            server_tokens_per_s: None,
            completion_tokens: None,
        };
        assert_eq!(sample.deltas_per_s(), Some(20.0));
        assert_eq!(Sample { deltas: 1, ..sample }.deltas_per_s(), None);
    }
}
