//! `turnstile`: the one binary. `turnstile dev` runs gateway + worker in one process; `turnstile gateway`
//! and `turnstile worker` are the two halves of a cluster; every other command is a client of the public
//! gRPC API.

mod chat;
mod client;
mod demo;
mod json;
mod render;
mod security;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use turnstile_model::GoalAction;
use turnstile_node::config::{Loaded, Overrides};
use turnstile_node::role::Serving;
use turnstile_node::signal::shutdown_signal;

use crate::client::{CauseArg, Client, Delivery, InjectModeArg, Preset, SourceArg, TargetArg, WatchOpts};

/// The address client commands use by default: a `turnstile dev` or gateway on its default `--listen`.
pub const DEFAULT_ADDR: &str = turnstile_node::dev::DEFAULT_URL;

/// How the servers report where they listen (docs/TESTING.md, docs/decisions/0007-bound-addresses.md).
const BOUND_ADDRESSES_HELP: &str = "\
Bound addresses: once every listener is bound, and before serving, the server prints one line per listener
on stdout, `turnstile: listening NAME=ADDR`, with NAME `grpc` (the public API of dev and gateway), `worker`
(the internal API of a worker) or `http` (/metrics, /healthz, /readyz; absent when not served) and ADDR the
bound address (`127.0.0.1:40123`, `[::1]:40123`), so port 0 in --listen/--http is usable from scripts:
  turnstile dev --listen 127.0.0.1:0 --http 127.0.0.1:0
  turnstile: listening grpc=127.0.0.1:40123
  turnstile: listening http=127.0.0.1:40124
--ready-file PATH writes the same as one JSON object, replaced atomically:
  {\"pid\":4242,\"grpc\":\"127.0.0.1:40123\",\"http\":\"127.0.0.1:40124\"}
(a worker adds \"id\" and \"advertise\", the address in its heartbeat and shard leases).";

#[derive(Parser, Debug)]
#[command(name = "turnstile", version, about = "Turnstile: long-lived AI-agent sessions", propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args, Debug)]
struct Global {
    /// Gateway URL of client commands.
    #[arg(long, global = true, env = "TURNSTILE_ADDR", hide_env_values = true, default_value = DEFAULT_ADDR)]
    addr: String,
    /// Bearer token sent as `authorization: Bearer <token>`.
    #[arg(long, global = true, env = "TURNSTILE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Tenant of the sessions named on the command line (default: the token's tenant with --token, else
    /// `default`).
    #[arg(long, global = true)]
    tenant: Option<String>,
    /// PEM CA that signed the gateway's certificate, for `https://` addresses.
    #[arg(long, global = true, env = "TURNSTILE_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Print each reply (each Watch item) as one line of JSON in the protobuf JSON mapping, as grpcurl and
    /// protobuf libraries print the same message; deliveries add the MessageId they sent as `id`.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run gateway + worker in one process on the embedded journal (or on JetStream with --nats).
    #[command(after_help = BOUND_ADDRESSES_HELP)]
    Dev(DevArgs),
    /// Run a cluster gateway: the public API, routing commands to shard owners (JetStream at --nats).
    #[command(after_help = BOUND_ADDRESSES_HELP)]
    Gateway(GatewayArgs),
    /// Run a cluster worker: takes shard leases and serves their sessions to gateways (JetStream at --nats).
    #[command(after_help = BOUND_ADDRESSES_HELP)]
    Worker(WorkerArgs),
    /// Deliver a new turn that starts the agent if idle (next-turn, wakeup).
    Followup(DeliverArgs),
    /// Deliver a new turn that waits for a later waking delivery (next-turn, no wakeup).
    Queue(DeliverArgs),
    /// Deliver input for the running turn's next step; opens a turn when idle (next-step, wakeup).
    Steer(SteerArgs),
    /// Deliver model-visible context that never runs the model by itself (next-step, no wakeup).
    Inject(DeliverArgs),
    /// Cancel the active turn keeping the inbox, then run this message next.
    Interrupt(DeliverArgs),
    /// The delivery primitive with explicit routing.
    Send(SendArgs),
    /// Cancel the active turn and, unless --keep-inbox, clear the inbox.
    Cancel(CancelArgs),
    /// Replace a pending message (keeps its id unless --new-id).
    Replace(ReplaceArgs),
    /// Remove a pending message.
    Remove(RemoveArgs),
    /// Splice one pending list: delete N at START and insert one message per TEXT.
    Splice(SpliceArgs),
    /// Remove every pending message.
    Clear(SessionArg),
    /// Choose the session's agent (and inject mode) from the next turn on; only while idle.
    Configure(ConfigureArgs),
    /// Approve or deny a tool call awaiting approval (`watch` shows its call id).
    Decide(DecideArgs),
    /// Give the session a goal it works toward over several rounds, or pause, resume or clear it.
    #[command(subcommand)]
    Goal(GoalCmd),
    /// Summarize the session's finished turns; later model requests carry the summary instead (idle only).
    Compact(SessionArg),
    /// Copy a session's transcript through turn --at-turn into a new session that goes on from there.
    Fork(ForkArgs),
    /// Inject another session's transcript (as text, source `session`) into this one as context.
    Reference(ReferenceArgs),
    /// Show the pending messages.
    Inbox(ShowArgs),
    /// Show a session's status, last seq and turn, epoch and owner.
    Session(ShowArgs),
    /// List sessions (of --tenant, or every tenant with --all-tenants).
    List(ListArgs),
    /// Wait until the session is idle with no latched wake.
    WaitIdle(WaitIdleArgs),
    /// Stream a session's events: history after --after, caught-up, then the live tail.
    Watch(WatchArgs),
    /// Delete a session: cancel a running turn (cause disposed), then remove its log, snapshots and
    /// dedup state; the id may then be used again for a new session.
    Delete(SessionArg),
    /// Talk to a session from the terminal: each line is a followup (a steer while the agent runs), the
    /// reply streams as it is written, Ctrl-C stops a running turn (keeping the inbox).
    Chat(SessionArg),
    /// Print a shell completion script: `source <(turnstile completions bash)`, or save it where your shell
    /// loads completions (zsh: a `_turnstile` file on `$fpath`; fish: `~/.config/fish/completions/`).
    Completions(CompletionsArgs),
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
struct DevArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz` and the web console `/` (default
    /// 127.0.0.1:9090; port 0 picks a free one, reported as `turnstile: listening http=ADDR`).
    #[arg(long, env = "TURNSTILE_HTTP")]
    http: Option<String>,
    /// Once every listener is bound, write the bound addresses to FILE as one JSON object (see below).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free one, reported as `turnstile: listening grpc=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::dev::DEFAULT_LISTEN)]
    listen: String,
    /// Keep sessions on disk in DIR (default: in memory).
    #[arg(long, env = "TURNSTILE_DATA_DIR", conflicts_with = "nats")]
    data_dir: Option<PathBuf>,
    /// Keep sessions in NATS JetStream at URL (e.g. nats://127.0.0.1:4222) instead of the embedded journal.
    #[arg(long, env = "TURNSTILE_NATS_URL", hide_env_values = true)]
    nats: Option<String>,
    /// JetStream event streams (partitions) to spread sessions over; part of the layout [default: the
    /// configuration's cluster.partitions, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "nats")]
    partitions: Option<u32>,
    /// Replicas of each JetStream event stream (1 for one server, 3 for a cluster) [default: the
    /// configuration's cluster.replicas, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5), requires = "nats")]
    replicas: Option<u32>,
    /// Run a short scripted tour on session `demo` once the server is up.
    #[arg(long)]
    demo: bool,
    #[command(flatten)]
    auth: security::AuthArgs,
    #[command(flatten)]
    tls: security::ServerTlsArgs,
    #[command(flatten)]
    nats_security: security::NatsSecurityArgs,
}

/// `--config FILE` of the servers.
#[derive(Args, Debug)]
struct ConfigArg {
    /// The configuration file (TOML; docs/CONFIGURATION.md): limits, cluster timings and layout, journal,
    /// models, MCP servers and agents. Flags given on the command line win over its keys.
    #[arg(long = "config", env = "TURNSTILE_CONFIG", value_name = "FILE")]
    path: Option<PathBuf>,
}

impl ConfigArg {
    /// The file (or the defaults) with `flags` over it.
    fn load(&self, flags: &Overrides) -> Result<Loaded> {
        let mut loaded = turnstile_node::config::load(self.path.as_deref())?;
        flags.apply(&mut loaded.config)?;
        Ok(loaded)
    }
}

/// Where the cluster's journal lives and how it is laid out; every gateway and worker of a cluster must
/// agree on it. The layout flags default to the configuration's `[cluster]` keys.
#[derive(Args, Debug)]
struct ClusterLayout {
    /// NATS JetStream URL(s) of the cluster (comma-separated for several servers).
    #[arg(long, env = "TURNSTILE_NATS_URL", hide_env_values = true)]
    nats: String,
    /// JetStream event streams (partitions) to spread sessions over; part of the layout [default: the
    /// configuration's cluster.partitions, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    partitions: Option<u32>,
    /// Replicas of each stream and KV bucket (1 for one server, 3 for a cluster) [default: the
    /// configuration's cluster.replicas, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
    replicas: Option<u32>,
    /// Virtual shards sessions are hashed to; part of the layout (at least --partitions) [default: the
    /// configuration's cluster.shards, 256].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    shards: Option<u32>,
}

impl ClusterLayout {
    fn overrides(&self) -> Overrides {
        Overrides { partitions: self.partitions, replicas: self.replicas, shards: self.shards, ..Overrides::default() }
    }
}

#[derive(Args, Debug)]
struct GatewayArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz` and the web console `/` (default
    /// 127.0.0.1:9090; port 0 picks a free one, reported as `turnstile: listening http=ADDR`).
    #[arg(long, env = "TURNSTILE_HTTP")]
    http: Option<String>,
    /// Once every listener is bound, write the bound addresses to FILE as one JSON object (see below).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    layout: ClusterLayout,
    /// Address of the public API (port 0 picks a free one, reported as `turnstile: listening grpc=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::dev::DEFAULT_LISTEN)]
    listen: String,
    /// How long a command may wait for a shard owner (while shards move) before UNAVAILABLE [default: the
    /// configuration's cluster.route_deadline_ms, 10000].
    #[arg(long)]
    route_deadline_ms: Option<u64>,
    #[command(flatten)]
    auth: security::AuthArgs,
    #[command(flatten)]
    tls: security::ServerTlsArgs,
    #[command(flatten)]
    cluster_tls: security::ClusterTlsArgs,
    #[command(flatten)]
    nats_security: security::NatsSecurityArgs,
}

#[derive(Args, Debug)]
struct WorkerArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Address of the HTTP endpoints `/metrics`, `/healthz` and `/readyz` (default 127.0.0.1:9090; port 0
    /// picks a free one, reported as `turnstile: listening http=ADDR`).
    #[arg(long, env = "TURNSTILE_HTTP")]
    http: Option<String>,
    /// Once every listener is bound, write the bound addresses to FILE as one JSON object (see below).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    layout: ClusterLayout,
    /// Address of the internal worker API (port 0 picks a free one, reported as `turnstile: listening
    /// worker=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::worker::DEFAULT_LISTEN)]
    listen: String,
    /// Address gateways dial to reach this worker, put in its heartbeat and shard leases (default: the
    /// bound --listen address, with the port the kernel picked for port 0).
    #[arg(long, env = "TURNSTILE_ADVERTISE")]
    advertise: Option<String>,
    /// Unique worker id, reported as the session owner (default: worker-<advertised address>).
    #[arg(long, env = "TURNSTILE_WORKER_ID")]
    id: Option<String>,
    /// How long a shard lease lasts without renewal: the failover time after a crash [default: the
    /// configuration's cluster.lease_ttl_ms, 1500].
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..))]
    lease_ttl_ms: Option<u64>,
    /// How often leases are renewed and fair shares recomputed (well below --lease-ttl-ms) [default: the
    /// configuration's cluster.renew_ms, 400].
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
    renew_ms: Option<u64>,
    /// How long running steps may take to finish when shards are handed over or at SIGTERM [default: the
    /// configuration's cluster.drain_timeout_ms, 10000].
    #[arg(long)]
    drain_timeout_ms: Option<u64>,
    #[command(flatten)]
    tls: security::ServerTlsArgs,
    // How this worker dials other workers for `spawn_agent`'s child sessions, as a gateway does.
    #[command(flatten)]
    cluster_tls: security::ClusterTlsArgs,
    #[command(flatten)]
    nats_security: security::NatsSecurityArgs,
}

#[derive(Args, Debug)]
struct MessageArgs {
    /// MessageId (default: a fresh UUID v4; reuse one to retry safely).
    #[arg(long)]
    id: Option<String>,
    /// user | plugin[:NAME[:FORM]] | goal:ID:REV:ROUND | tool:CALL_ID | model:PROVIDER:MODEL
    /// (default: the server's, `user`, or `plugin` for inject).
    #[arg(long)]
    source: Option<SourceArg>,
}

#[derive(Args, Debug)]
struct DeliverArgs {
    session: String,
    /// Message text; several words are joined by spaces.
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
    #[command(flatten)]
    message: MessageArgs,
}

#[derive(Args, Debug)]
struct SteerArgs {
    #[command(flatten)]
    delivery: DeliverArgs,
    /// Refuse unless the session is running this turn.
    #[arg(long)]
    expected_turn: Option<u64>,
    /// If the steer is still pending this many milliseconds after it was accepted, apply --on-deadline.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// interrupt (cancel the turn and run the steer next, the default) | drop (remove the steer).
    #[arg(long, requires = "deadline_ms")]
    on_deadline: Option<OnDeadlineArg>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum OnDeadlineArg {
    Interrupt,
    Drop,
}

impl From<OnDeadlineArg> for turnstile_model::OnDeadline {
    fn from(arg: OnDeadlineArg) -> Self {
        match arg {
            OnDeadlineArg::Interrupt => Self::Interrupt,
            OnDeadlineArg::Drop => Self::Drop,
        }
    }
}

#[derive(Args, Debug)]
struct SendArgs {
    #[command(flatten)]
    delivery: DeliverArgs,
    /// next-turn | next-step
    #[arg(long)]
    target: TargetArg,
    /// Start the agent if it is idle.
    #[arg(long)]
    wakeup: bool,
}

#[derive(Args, Debug)]
struct CancelArgs {
    session: String,
    /// Keep pending messages (they park until the next waking delivery).
    #[arg(long)]
    keep_inbox: bool,
    /// user | parent | hook:REASON | disposed
    #[arg(long, default_value = "user")]
    cause: CauseArg,
}

#[derive(Args, Debug)]
struct ReplaceArgs {
    session: String,
    /// The pending message to replace.
    id: String,
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
    /// Id of the replacement (default: the same id).
    #[arg(long)]
    new_id: Option<String>,
    #[arg(long)]
    source: Option<SourceArg>,
}

#[derive(Args, Debug)]
struct RemoveArgs {
    session: String,
    id: String,
}

#[derive(Args, Debug)]
struct SpliceArgs {
    session: String,
    /// next-turn | next-step
    #[arg(long)]
    target: TargetArg,
    #[arg(long)]
    start: u32,
    #[arg(long)]
    delete: u32,
    /// One inserted message per TEXT (quote texts with spaces); ids are minted.
    text: Vec<String>,
    #[arg(long)]
    source: Option<SourceArg>,
}

#[derive(Args, Debug)]
struct ConfigureArgs {
    session: String,
    /// One of the agents of the server's configuration (`scripted` without one).
    #[arg(long)]
    agent: String,
    /// pending | out-of-turn: what an inject to an idle session does (SPEC §11).
    #[arg(long, default_value = "pending")]
    inject_mode: InjectModeArg,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("verdict").required(true).args(["approve", "deny"]))]
struct DecideArgs {
    session: String,
    /// The call id of the `tool/call` event marked AWAITING APPROVAL.
    call_id: String,
    /// Run the tool.
    #[arg(long)]
    approve: bool,
    /// Do not run it: the model gets the error result `denied: REASON`.
    #[arg(long)]
    deny: bool,
    /// Why (recorded in `tool/decision`; the model sees it on a denial).
    #[arg(long, default_value = "")]
    reason: String,
}

#[derive(Args, Debug)]
struct ReferenceArgs {
    /// The session that gets the reference.
    session: String,
    /// The session whose transcript is referenced (same tenant).
    from_session: String,
    /// The last turn of FROM_SESSION to include (a finished turn); default all of it.
    #[arg(long)]
    upto_turn: Option<u64>,
    /// The injected message's id (default: a new UUID).
    #[arg(long)]
    id: Option<String>,
}

#[derive(Args, Debug)]
struct ForkArgs {
    /// The source session.
    session: String,
    /// The source's last turn to copy (a finished turn, from 1).
    #[arg(long)]
    at_turn: u64,
    /// The new session's id (in the same tenant; it must have no events).
    #[arg(long = "new")]
    new_session: String,
}

#[derive(Subcommand, Debug)]
enum GoalCmd {
    /// Start a goal (rounds begin once the session is idle with nothing pending); on a session whose goal
    /// is active or paused, revise it (revision + 1, round 0).
    Set(GoalSetArgs),
    /// Let the running round finish and start no other.
    Pause(GoalUpdateArgs),
    /// Continue a paused goal from the round it stopped at.
    Resume(GoalUpdateArgs),
    /// End the goal; no further rounds.
    Clear(GoalUpdateArgs),
}

#[derive(Args, Debug)]
struct GoalSetArgs {
    session: String,
    /// Continuation rounds the goal may run (1..=the server's limits.max_goal_rounds, default cap 100).
    #[arg(long)]
    max_rounds: u32,
    /// What to work toward (words are joined with spaces).
    #[arg(required = true)]
    objective: Vec<String>,
}

#[derive(Args, Debug)]
struct GoalUpdateArgs {
    session: String,
    /// The goal's id (default: the session's current goal, read with GetSession).
    #[arg(long)]
    goal_id: Option<String>,
}

#[derive(Args, Debug)]
struct SessionArg {
    session: String,
}

#[derive(Args, Debug)]
struct ShowArgs {
    session: String,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Every tenant's sessions, not only --tenant's.
    #[arg(long, conflicts_with = "parent")]
    all_tenants: bool,
    /// Only the child sessions that this session's `spawn_agent` calls created.
    #[arg(long, value_name = "SESSION")]
    parent: Option<String>,
}

#[derive(Args, Debug)]
struct WaitIdleArgs {
    session: String,
    /// 0 means the server's default (30 s).
    #[arg(long, default_value_t = 0)]
    timeout_ms: u64,
}

#[derive(Args, Debug)]
struct WatchArgs {
    session: String,
    /// Only durable events with a seq above this (your last seen seq, to resume).
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// Leave out live events.
    #[arg(long)]
    no_live: bool,
    /// Exit once the session is idle with no latched wake: at caught-up when it is already idle, else at
    /// the next durable `agent/status idle` that `WhenIdle` confirms.
    #[arg(long)]
    until_idle: bool,
}

/// The process's role in the default OTLP service name (`turnstile-<role>`).
fn role(cmd: &Cmd) -> &'static str {
    match cmd {
        Cmd::Dev(_) => "dev",
        Cmd::Gateway(_) => "gateway",
        Cmd::Worker(_) => "worker",
        _ => "cli",
    }
}

fn delivery(d: DeliverArgs) -> Delivery {
    Delivery { session: d.session, text: d.text.join(" "), id: d.message.id, source: d.message.source.map(|s| s.0) }
}

async fn deliver(client: &mut Client, preset: Preset, d: DeliverArgs) -> Result<()> {
    client::check_session(&client.tenant, &d.session)?;
    let (id, reply) = client::deliver(client, preset, &delivery(d)).await?;
    client.print(&reply, &[("id", id.as_str().into())], |reply| client::accepted_line(&id, reply))
}

/// `turnstile dev`: the node's dev role, the demo beside it, until Ctrl-C or SIGTERM.
async fn run_dev(a: DevArgs) -> Result<()> {
    if a.demo && (a.auth.options().is_enabled() || a.tls.options().is_some()) {
        anyhow::bail!("--demo talks to the server without a token or TLS; drop --demo or the auth/TLS flags");
    }
    let flags = Overrides { partitions: a.partitions, replicas: a.replicas, ..Overrides::default() };
    let serving = Serving {
        listen: a.listen,
        http: a.http,
        ready_file: a.ready_file,
        tls: a.tls.options(),
        config: a.config.load(&flags)?,
    };
    let options = turnstile_node::dev::Options {
        serving,
        data_dir: a.data_dir,
        nats: a.nats.map(|url| a.nats_security.nats(url)),
        auth: a.auth.options(),
    };
    let node = turnstile_node::dev::start(options).await?;
    if a.demo {
        let url = node.url().to_owned();
        tokio::spawn(async move {
            if let Err(e) = demo::run(&url).await {
                eprintln!("demo failed: {e:#}");
            }
        });
    }
    Ok(node.run_until(shutdown_signal()).await?)
}

/// `turnstile completions SHELL`: the script on stdout. Generated into memory first: clap_complete panics
/// on a write error, and `turnstile completions bash | head` closing the pipe is not one.
fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "turnstile", &mut script);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &script)?;
    Ok(())
}

/// `turnstile gateway`, until Ctrl-C or SIGTERM.
async fn run_gateway(a: GatewayArgs) -> Result<()> {
    let flags = Overrides { route_deadline_ms: a.route_deadline_ms, ..a.layout.overrides() };
    let serving = Serving {
        listen: a.listen,
        http: a.http,
        ready_file: a.ready_file,
        tls: a.tls.options(),
        config: a.config.load(&flags)?,
    };
    let options = turnstile_node::gateway::Options {
        serving,
        nats: a.nats_security.nats(a.layout.nats),
        auth: a.auth.options(),
        cluster_tls: a.cluster_tls.options(),
    };
    let node = turnstile_node::gateway::start(options).await?;
    Ok(node.run_until(shutdown_signal()).await?)
}

/// `turnstile worker`, until Ctrl-C or SIGTERM (which drains it and releases its leases).
async fn run_worker(a: WorkerArgs) -> Result<()> {
    let flags = Overrides {
        lease_ttl_ms: a.lease_ttl_ms,
        renew_ms: a.renew_ms,
        drain_timeout_ms: a.drain_timeout_ms,
        ..a.layout.overrides()
    };
    let serving = Serving {
        listen: a.listen,
        http: a.http,
        ready_file: a.ready_file,
        tls: a.tls.options(),
        config: a.config.load(&flags)?,
    };
    let options = turnstile_node::worker::Options {
        serving,
        nats: a.nats_security.nats(a.layout.nats),
        advertise: a.advertise,
        id: a.id,
        cluster_tls: a.cluster_tls.options(),
    };
    let node = turnstile_node::worker::start(options).await?;
    Ok(node.run_until(shutdown_signal()).await?)
}

async fn run(cli: Cli) -> Result<()> {
    let g = cli.global;
    let cmd = match cli.command {
        Cmd::Dev(a) => return run_dev(a).await,
        Cmd::Gateway(a) => return run_gateway(a).await,
        Cmd::Worker(a) => return run_worker(a).await,
        Cmd::Completions(a) => return completions(a.shell),
        client_command => client_command,
    };
    // With a token the server knows the tenant: an empty one in requests means "mine".
    let tenant = g.tenant.unwrap_or_else(|| if g.token.is_some() { String::new() } else { "default".to_owned() });
    let mut c = Client::connect_with_ca(&g.addr, g.token.as_deref(), &tenant, g.ca.as_deref()).await?;
    c.json = g.json;
    let c = &mut c;
    match cmd {
        Cmd::Dev(_) | Cmd::Gateway(_) | Cmd::Worker(_) | Cmd::Completions(_) => Ok(()),
        Cmd::Followup(d) => deliver(c, Preset::Followup, d).await,
        Cmd::Queue(d) => deliver(c, Preset::Queue, d).await,
        Cmd::Inject(d) => deliver(c, Preset::Inject, d).await,
        Cmd::Interrupt(d) => deliver(c, Preset::Interrupt, d).await,
        Cmd::Steer(s) => {
            let preset = Preset::Steer {
                expected_turn: s.expected_turn,
                deadline_ms: s.deadline_ms,
                on_deadline: s.on_deadline.map(Into::into),
            };
            deliver(c, preset, s.delivery).await
        }
        Cmd::Send(s) => deliver(c, Preset::Send { target: s.target.0, wakeup: s.wakeup }, s.delivery).await,
        Cmd::Cancel(a) => client::cancel(c, &a.session, a.cause.0, a.keep_inbox).await,
        Cmd::Replace(a) => {
            let source = a.source.map(|s| s.0);
            client::replace(c, &a.session, &a.id, &a.text.join(" "), a.new_id.as_deref(), source.as_ref()).await
        }
        Cmd::Remove(a) => client::remove(c, &a.session, &a.id).await,
        Cmd::Splice(a) => {
            let source = a.source.map(|s| s.0);
            client::splice(c, &a.session, a.target.0, a.start, a.delete, &a.text, source.as_ref()).await
        }
        Cmd::Clear(a) => client::clear(c, &a.session).await,
        Cmd::Configure(a) => client::configure(c, &a.session, &a.agent, a.inject_mode.0).await,
        Cmd::Decide(a) => client::decide(c, &a.session, &a.call_id, a.approve, &a.reason).await,
        Cmd::Compact(a) => client::compact(c, &a.session).await,
        Cmd::Fork(a) => client::fork(c, &a.session, a.at_turn, &a.new_session).await,
        Cmd::Reference(a) => client::reference(c, &a.session, &a.from_session, a.upto_turn, a.id).await,
        Cmd::Goal(GoalCmd::Set(a)) => client::set_goal(c, &a.session, &a.objective.join(" "), a.max_rounds).await,
        Cmd::Goal(GoalCmd::Pause(a)) => client::update_goal(c, &a.session, a.goal_id, GoalAction::Pause).await,
        Cmd::Goal(GoalCmd::Resume(a)) => client::update_goal(c, &a.session, a.goal_id, GoalAction::Resume).await,
        Cmd::Goal(GoalCmd::Clear(a)) => client::update_goal(c, &a.session, a.goal_id, GoalAction::Clear).await,
        Cmd::Inbox(a) => client::inbox(c, &a.session).await,
        Cmd::Session(a) => client::show_session(c, &a.session).await,
        Cmd::List(a) => client::list(c, a.all_tenants, a.parent.unwrap_or_default()).await,
        Cmd::WaitIdle(a) => client::wait_idle(c, &a.session, a.timeout_ms).await,
        Cmd::Chat(a) => chat::run(c, &a.session).await,
        Cmd::Watch(a) => {
            let opts = WatchOpts { after: a.after, live: !a.no_live, until_idle: a.until_idle };
            let mut out = std::io::stdout();
            client::watch(c, &a.session, &opts, &mut out, |_| {}).await
        }
        Cmd::Delete(a) => client::delete(c, &a.session).await,
    }
}

/// `NOT_FOUND` for `Code::NotFound`: the canonical gRPC name, stable for scripts.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `error: <gRPC code>: <message>` for a status, else the error chain.
fn error_line(err: &anyhow::Error) -> String {
    match err.chain().find_map(|e| e.downcast_ref::<tonic::Status>()) {
        Some(status) => format!("error: {}: {}", code_name(status.code()), status.message()),
        None => format!("error: {err:#}"),
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = turnstile_node::telemetry::init(role(&cli.command));
    let result = run(cli).await;
    // Flush queued spans before the runtime goes away (short runs would lose them otherwise).
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `turnstile watch s1 | head` closing the pipe is a normal way to stop reading.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{}", error_line(&err));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn statuses_print_their_canonical_code_and_message() {
        let err = anyhow::Error::new(tonic::Status::not_found("session default/x does not exist"));
        assert_eq!(error_line(&err), "error: NOT_FOUND: session default/x does not exist");
        let err = anyhow::anyhow!("plain failure");
        assert_eq!(error_line(&err), "error: plain failure");
    }

    #[test]
    fn dev_takes_nats_with_its_layout() {
        let cli = Cli::try_parse_from(["turnstile", "dev"]).unwrap();
        let Cmd::Dev(a) = cli.command else { panic!("not dev") };
        assert_eq!((a.nats, a.partitions, a.replicas, a.config.path), (None, None, None, None));
        let cli = Cli::try_parse_from([
            "turnstile",
            "dev",
            "--nats",
            "nats://h:4222",
            "--partitions",
            "4",
            "--replicas",
            "3",
        ])
        .unwrap();
        let Cmd::Dev(a) = cli.command else { panic!("not dev") };
        assert_eq!((a.nats.as_deref(), a.partitions, a.replicas), (Some("nats://h:4222"), Some(4), Some(3)));
        assert!(Cli::try_parse_from(["turnstile", "dev", "--partitions", "2"]).is_err(), "layout without --nats");
        assert!(Cli::try_parse_from(["turnstile", "dev", "--nats", "nats://h", "--partitions", "0"]).is_err());
        assert!(Cli::try_parse_from(["turnstile", "dev", "--nats", "nats://h", "--data-dir", "d"]).is_err());
    }

    #[test]
    fn gateway_takes_the_cluster_layout() {
        let cli = Cli::try_parse_from(["turnstile", "gateway", "--nats", "nats://h:4222"]).unwrap();
        let Cmd::Gateway(a) = cli.command else { panic!("not gateway") };
        assert_eq!((a.layout.partitions, a.layout.replicas, a.layout.shards), (None, None, None));
        assert_eq!((a.listen.as_str(), a.route_deadline_ms), ("127.0.0.1:7400", None));
        let cli = Cli::try_parse_from([
            "turnstile",
            "gateway",
            "--nats",
            "nats://h:4222",
            "--listen",
            "127.0.0.1:7401",
            "--replicas",
            "3",
            "--shards",
            "64",
        ])
        .unwrap();
        let Cmd::Gateway(a) = cli.command else { panic!("not gateway") };
        assert_eq!((a.listen.as_str(), a.layout.replicas, a.layout.shards), ("127.0.0.1:7401", Some(3), Some(64)));
    }

    #[test]
    fn worker_takes_its_identity_and_lease_timing() {
        let cli = Cli::try_parse_from([
            "turnstile",
            "worker",
            "--nats",
            "nats://h:4222",
            "--listen",
            "127.0.0.1:0",
            "--advertise",
            "10.0.0.5:7501",
            "--id",
            "w1",
            "--lease-ttl-ms",
            "3000",
            "--renew-ms",
            "500",
        ])
        .unwrap();
        let Cmd::Worker(a) = cli.command else { panic!("not worker") };
        assert_eq!((a.id.as_deref(), a.advertise.as_deref()), (Some("w1"), Some("10.0.0.5:7501")));
        assert_eq!(
            (a.lease_ttl_ms, a.renew_ms, a.drain_timeout_ms, a.layout.shards),
            (Some(3000), Some(500), None, None)
        );
        let flags = Overrides { lease_ttl_ms: a.lease_ttl_ms, renew_ms: a.renew_ms, ..a.layout.overrides() };
        let loaded = a.config.load(&flags).unwrap();
        assert_eq!((loaded.config.cluster.lease_ttl_ms, loaded.config.cluster.renew_ms), (3000, 500));
    }

    #[test]
    fn the_servers_take_a_configuration_file() {
        for role in ["dev", "gateway", "worker"] {
            let mut args = vec!["turnstile", role, "--config", "t.toml"];
            if role != "dev" {
                args.extend(["--nats", "nats://h:4222"]);
            }
            let cli = Cli::try_parse_from(args).unwrap();
            let path = match cli.command {
                Cmd::Dev(a) => a.config.path,
                Cmd::Gateway(a) => a.config.path,
                Cmd::Worker(a) => a.config.path,
                _ => panic!("not a server"),
            };
            assert_eq!(path.as_deref(), Some(std::path::Path::new("t.toml")), "{role}");
        }
        assert!(Cli::try_parse_from(["turnstile", "followup", "--config", "t.toml", "s1", "x"]).is_err());
    }

    #[test]
    fn the_renewal_flags_are_checked_against_each_other() {
        let cli = Cli::try_parse_from([
            "turnstile",
            "worker",
            "--nats",
            "nats://h:4222",
            "--lease-ttl-ms",
            "400",
            "--renew-ms",
            "500",
        ])
        .unwrap();
        let Cmd::Worker(a) = cli.command else { panic!("not worker") };
        let flags = Overrides { lease_ttl_ms: a.lease_ttl_ms, renew_ms: a.renew_ms, ..a.layout.overrides() };
        let err = a.config.load(&flags).unwrap_err();
        assert_eq!(
            error_line(&err),
            "error: --renew-ms 500 must be below --lease-ttl-ms 400, or leases lapse between renewals; try a third of it"
        );
    }

    #[test]
    fn delivery_words_are_joined_and_options_parse() {
        let cli = Cli::try_parse_from([
            "turnstile",
            "--tenant",
            "acme",
            "steer",
            "s1",
            "hello",
            "there",
            "--expected-turn",
            "3",
            "--id",
            "m1",
            "--source",
            "plugin:mem",
        ])
        .unwrap();
        assert_eq!(cli.global.tenant.as_deref(), Some("acme"));
        let Cmd::Steer(s) = cli.command else { panic!("not steer") };
        assert_eq!(s.expected_turn, Some(3));
        let d = delivery(s.delivery);
        assert_eq!(d.text, "hello there");
        assert_eq!(d.id.as_deref(), Some("m1"));
        assert!(Cli::try_parse_from(["turnstile", "send", "s1", "x", "--target", "sideways"]).is_err());
        assert!(Cli::try_parse_from(["turnstile", "followup", "s1"]).is_err());
    }
}
