//! `turnstile-bench tools`: what Turnstile adds to one tool call, per kind of tool, against calling the
//! same tool directly, in the same run.
//!
//! The run starts the release `turnstile dev --config FILE` whose default agent lists the built-ins `sleep`
//! (a calibration) and `echo`, the client tool `lookup`, and the `echo` tool of `@modelcontextprotocol/server-everything` over stdio (`MCP_EVERYTHING_BIN`, as the
//! tests use it). Each round sends one followup per kind to a fresh session whose scripted model calls the
//! tool once (`[[tool:NAME ARGS]]`; the client tool `lookup` is served by an executor over `ServeTools` in
//! this process), and a live `Watch` opened before the followup timestamps the durable
//! `tool/call` and `tool/result` as they arrive: **through Turnstile** is the time between the two (the
//! dispatch, the call, the durable append of the result and its delivery; the append of `tool/call` and the
//! watch delivery lag are on both ends and cancel out). **Direct** is the same call made by a client in
//! this process: nothing for the built-in (it is an in-process function call inside the worker), one MCP
//! `tools/call` round trip over the bench's own rmcp stdio client to another instance of the same server for
//! MCP. The added latency is the difference of the medians.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde::Serialize;
use tonic::transport::Channel;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::session_event::Payload as Durable;
use turnstile_proto::v1::watch_item::Item;

use turnstile_tests::msg::TEST_TENANT;
use turnstile_tests::tool_executor;

use crate::latency::text_message;
use crate::servers;
use crate::stats::Percentiles;

#[derive(Args, Debug, Clone)]
pub struct ToolsArgs {
    /// Measured rounds (one call of each kind each).
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Rounds run first and dropped (process start-up, connections, caches).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// The `turnstile` binary (default: <target>/release/turnstile).
    #[arg(long, env = "TURNSTILE_BIN")]
    turnstile_bin: Option<PathBuf>,
    /// The server-everything launcher.
    #[arg(long, env = "MCP_EVERYTHING_BIN")]
    mcp_everything_bin: PathBuf,
    /// Extra arguments for `turnstile dev` (repeatable), e.g. `--dev-arg=--nats --dev-arg=URL`.
    #[arg(long = "dev-arg", allow_hyphen_values = true)]
    dev_args: Vec<String>,
    /// One JSON object on stdout instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// One kind of tool, as the agent's scripted model calls it.
struct Kind {
    name: &'static str,
    /// The followup text: one call of the tool.
    prompt: &'static str,
    direct: Direct,
}

/// What calling the tool directly costs.
#[derive(Clone, Copy, PartialEq)]
enum Direct {
    /// A function call inside the worker: nothing measurable.
    InProcess,
    /// Known in advance (the calibration `sleep`).
    Fixed(Duration),
    /// One `tools/call` of the bench's own MCP client.
    Mcp,
}

const KINDS: [Kind; 4] = [
    // Calibration: the interval must come out at the sleep plus what the others add.
    Kind {
        name: "built-in sleep 20 (calibration)",
        prompt: "[[tool:sleep 20]] go",
        direct: Direct::Fixed(Duration::from_millis(20)),
    },
    Kind { name: "built-in echo", prompt: "[[tool:echo bench]] go", direct: Direct::InProcess },
    Kind {
        name: "MCP everything__echo (stdio)",
        prompt: "[[tool:everything__echo {\"message\": \"bench\"}]] go",
        direct: Direct::Mcp,
    },
    // The executor answers from its `ServeTools` stream in this process: the direct call is its answer
    // function, nothing measurable.
    Kind {
        name: "client lookup (ServeTools executor)",
        prompt: "[[tool:lookup {\"q\":\"bench\"}]] go",
        direct: Direct::InProcess,
    },
];

#[derive(Debug, Serialize)]
pub struct KindReport {
    pub kind: String,
    /// `tool/call` → `tool/result` as a Watch client sees them.
    pub through_turnstile: Percentiles,
    /// The same call made directly (none for an in-process built-in).
    pub direct: Option<Percentiles>,
    /// Median through Turnstile − median direct.
    pub added_p50_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct ToolsReport {
    pub nproc: usize,
    pub cpu_model: String,
    pub turnstile_bin: String,
    pub dev_args: Vec<String>,
    pub runs: usize,
    pub warmup: usize,
    pub kinds: Vec<KindReport>,
}

fn config_toml(everything: &std::path::Path) -> String {
    let quote = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    format!(
        "default_agent = \"bench\"\n\n[mcp.everything]\ncommand = {}\nargs = [\"stdio\"]\n\n\
         [agents.bench]\ntools = [\"echo\", \"sleep\", \"mcp:everything/echo\", \"client:lookup\"]\n",
        quote(&everything.display().to_string()),
    )
}

pub async fn run(args: ToolsArgs) -> Result<()> {
    let bin = args.turnstile_bin.clone().unwrap_or_else(servers::default_turnstile_bin);
    let scratch = tempfile::Builder::new().prefix("turnstile-bench-tools-").tempdir()?;
    let config = scratch.path().join("turnstile.toml");
    std::fs::write(&config, config_toml(&args.mcp_everything_bin))?;
    let mut dev_args = vec!["--config".to_owned(), config.display().to_string()];
    dev_args.extend(args.dev_args.iter().cloned());
    let dev = servers::Dev::start(&bin, None, &dev_args).await?;
    eprintln!("turnstile dev {} ({})", dev.url(), bin.display());
    let outcome = measure(&args, dev.channel()).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}", dev.log_tail());
    }
    dev.stop().await;
    let (through, direct_mcp) = outcome?;

    let mut kinds = Vec::new();
    for (i, kind) in KINDS.iter().enumerate() {
        let through = Percentiles::of(&through[i]);
        let direct = match kind.direct {
            Direct::InProcess => None,
            Direct::Fixed(d) => Some(Percentiles::of(&[d])),
            Direct::Mcp => Some(Percentiles::of(&direct_mcp)),
        };
        let added_p50_ms = through.p50_ms - direct.map_or(0.0, |d| d.p50_ms);
        kinds.push(KindReport { kind: kind.name.to_owned(), through_turnstile: through, direct, added_p50_ms });
    }
    let report = ToolsReport {
        nproc: std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model: crate::cpu_model(),
        turnstile_bin: bin.display().to_string(),
        dev_args: args.dev_args.clone(),
        runs: args.runs,
        warmup: args.warmup,
        kinds,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

async fn measure(args: &ToolsArgs, channel: Channel) -> Result<(Vec<Vec<Duration>>, Vec<Duration>)> {
    let client = AgentClient::new(channel);
    // The client tool's executor, connected for the whole run (the harness's executor serves the tenant
    // `TEST_TENANT`, so the sessions use it too).
    let lookup = vec![tool_executor::tool("lookup", tool_executor::LOOKUP_SCHEMA)];
    let _executor =
        tool_executor::ToolExecutor::connect(client.clone(), None, lookup, tool_executor::answer_with("found", &[]))
            .await
            .map_err(|e| anyhow::anyhow!("registering the client tool: {e}"))?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let mcp = DirectMcp::start(&args.mcp_everything_bin).await?;
    let mut through: Vec<Vec<Duration>> = vec![Vec::new(); KINDS.len()];
    let mut direct = Vec::new();
    eprintln!("tools: {} rounds + {} warm-up ...", args.runs, args.warmup);
    for round in 0..args.warmup + args.runs {
        for (i, kind) in KINDS.iter().enumerate() {
            let session = pb::SessionRef { tenant: TEST_TENANT.into(), id: format!("tools-{run_id}-{round}-{i}") };
            let took = tokio::time::timeout(ROUND_TIMEOUT, one_call(client.clone(), session, kind.prompt))
                .await
                .with_context(|| format!("a {} round took over {ROUND_TIMEOUT:?}", kind.name))??;
            if round >= args.warmup {
                through[i].push(took);
            }
            if kind.direct == Direct::Mcp {
                // Right after the call through Turnstile, so both see the same machine load.
                let d = mcp.echo().await?;
                if round >= args.warmup {
                    direct.push(d);
                }
            }
        }
    }
    mcp.stop().await;
    Ok((through, direct))
}

const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

/// One followup whose model calls one tool: the time from the durable `tool/call` to its `tool/result`.
async fn one_call(mut client: AgentClient<Channel>, session: pb::SessionRef, prompt: &str) -> Result<Duration> {
    let watch = pb::WatchRequest { session: Some(session.clone()), after_seq: 0, live: true, resume: None };
    let mut stream = client.watch(watch).await?.into_inner();
    loop {
        match stream.message().await? {
            Some(pb::WatchItem { item: Some(Item::CaughtUp(_)) }) => break,
            Some(_) => {}
            None => bail!("the watch ended before caught_up"),
        }
    }
    let message = text_message("m1".to_owned(), prompt);
    client.followup(pb::DeliverRequest { session: Some(session), message: Some(message), output_schema: None }).await?;
    let mut called = None;
    loop {
        let Some(item) = stream.message().await? else { bail!("the watch ended before the tool result") };
        let at = Instant::now();
        match item.item {
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::ToolCall(_)), .. })) => called = Some(at),
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::ToolResult(r)), .. })) => {
                if let Some(error) = r.error {
                    bail!("the tool call failed: {error}");
                }
                let Some(called) = called else { bail!("tool/result before tool/call") };
                return Ok(at - called);
            }
            Some(Item::Event(pb::SessionEvent { payload: Some(Durable::TurnEnd(end)), .. })) => {
                bail!("the turn ended without a tool call: {end:?}");
            }
            _ => {}
        }
    }
}

/// The bench's own MCP client on its own server-everything process: the direct path.
struct DirectMcp {
    service: rmcp::service::RunningService<rmcp::RoleClient, ()>,
}

impl DirectMcp {
    async fn start(bin: &std::path::Path) -> Result<Self> {
        let mut command = tokio::process::Command::new(bin);
        command.arg("stdio");
        let (transport, _stderr) = TokioChildProcess::builder(command)
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let service = ().serve(transport).await.context("MCP initialize")?;
        Ok(Self { service })
    }

    async fn echo(&self) -> Result<Duration> {
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = serde_json::json!({"message": "bench"}).as_object().cloned();
        let start = Instant::now();
        let result = self.service.peer().call_tool(params).await.context("tools/call echo")?;
        let took = start.elapsed();
        if result.is_error == Some(true) {
            bail!("echo failed: {result:?}");
        }
        Ok(took)
    }

    async fn stop(self) {
        let _ = self.service.cancel().await;
    }
}

fn markdown(r: &ToolsReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Tool calls: through Turnstile vs direct\n\n{} cores ({}), `turnstile dev --config` ({}), {} rounds after {} warm-up\n",
        r.nproc, r.cpu_model, r.turnstile_bin, r.runs, r.warmup
    );
    let _ = writeln!(out, "| kind | through Turnstile p50 / p90 | direct p50 / p90 | added p50 |");
    let _ = writeln!(out, "|---|---:|---:|---:|");
    for k in &r.kinds {
        let direct = k.direct.map_or("in-process call".to_owned(), |d| format!("{:.2} / {:.2} ms", d.p50_ms, d.p90_ms));
        let _ = writeln!(
            out,
            "| {} | {:.2} / {:.2} ms | {direct} | {:.2} ms |",
            k.kind, k.through_turnstile.p50_ms, k.through_turnstile.p90_ms, k.added_p50_ms
        );
    }
    out
}
