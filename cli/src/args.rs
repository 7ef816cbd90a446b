//! The command line: every command and flag of `turnstile` (clap derive). The server roles' flags are in
//! [`server`], those of the commands on one session in [`session`]; [`values`] parses the values the
//! client commands take (`--source`, `--cause`, `--inject-mode`, `--target`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The address client commands use by default: a `turnstile dev` or gateway on its default `--listen`.
pub(crate) const DEFAULT_ADDR: &str = turnstile_node::dev::DEFAULT_URL;

/// How the servers report where they listen (docs/TESTING.md, docs/decisions/0007-bound-addresses.md).
pub(crate) const BOUND_ADDRESSES_HELP: &str = "\
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
#[command(name = "turnstile", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TURNSTILE_COMMIT"), ")"), about = "Turnstile: long-lived AI-agent sessions", propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Args, Debug)]
pub(crate) struct Global {
    /// Gateway URL of client commands.
    #[arg(long, global = true, env = "TURNSTILE_ADDR", hide_env_values = true, default_value = DEFAULT_ADDR)]
    pub(crate) addr: String,
    /// Bearer token sent as `authorization: Bearer <token>`.
    #[arg(long, global = true, env = "TURNSTILE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Tenant of the sessions named on the command line (default: the token's tenant with --token, else
    /// `default`).
    #[arg(long, global = true)]
    pub(crate) tenant: Option<String>,
    /// PEM CA that signed the gateway's certificate, for `https://` addresses.
    #[arg(long, global = true, env = "TURNSTILE_CA", value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// Print each reply (each Watch item) as one line of JSON in the protobuf JSON mapping, as grpcurl and
    /// protobuf libraries print the same message; deliveries add the MessageId they sent as `id`.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
    Inbox(SessionArg),
    /// Show a session's status, last seq and turn, epoch and owner.
    Session(SessionArg),
    /// Show a session's conversation, oldest first: user messages (how they were delivered), replies,
    /// tool calls, decisions and results, and turn ends with their token usage, each with its seq.
    Transcript(SessionArg),
    /// List sessions (of --tenant, or every tenant with --all-tenants), filtered by status, agent, parent
    /// and labels, by id or newest activity first.
    #[command(visible_alias = "sessions")]
    List(ListArgs),
    /// Deliver a message on a schedule: once (--at) or by a cron pattern (--cron) in a time zone.
    #[command(subcommand)]
    Schedule(ScheduleCmd),
    /// Set (KEY=VALUE) and remove (-KEY) a session's labels.
    Label(LabelArgs),
    /// Agents of the tenant as versioned objects: put (from a TOML or JSON file), get, list, versions,
    /// delete, and migrate sessions to a version (SPEC §20).
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Wait until the session is idle with no latched wake.
    WaitIdle(WaitIdleArgs),
    /// Stream a session's events: history after --after, caught-up, then the live tail.
    Watch(WatchArgs),
    /// Delete a session: cancel a running turn (cause disposed), then remove its log, snapshots and
    /// dedup state; the id may then be used again for a new session.
    Delete(SessionArg),
    /// Show the tenant's (--tenant, or the token's) model token usage per model, counted cluster-wide,
    /// with its daily token budget.
    Usage(UsageArgs),
    /// Export sessions of --tenant (all of them, or the ones named) with their whole logs, to --out or
    /// stdout; an administrator's token when auth is on (SPEC §18).
    Export(ExportArgs),
    /// Import an export (from FILE or stdin) into this cluster, keeping every seq, time and MessageId;
    /// an administrator's token when auth is on (SPEC §18).
    Import(ImportArgs),
    /// Talk to a session from the terminal: each line is a followup (a steer while the agent runs), the
    /// reply streams as it is written, Ctrl-C stops a running turn (keeping the inbox).
    Chat(SessionArg),
    /// Be an editor's agent over the Agent Client Protocol (JSON-RPC on stdin and stdout; Zed and other ACP
    /// editors spawn it): session/new, session/load (the whole history replayed), session/prompt,
    /// session/cancel, and approvals as session/request_permission.
    Acp(AcpArgs),
    /// Print a shell completion script: `source <(turnstile completions bash)`, or save it where your shell
    /// loads completions (zsh: a `_turnstile` file on `$fpath`; fish: `~/.config/fish/completions/`).
    Completions(CompletionsArgs),
    /// Register, list and delete the tenant's webhooks: POSTs of its sessions' durable events (SPEC §21).
    #[command(subcommand)]
    Webhook(WebhookCmd),
    /// Put, get, list, search and delete the tenant's memory: JSON documents in namespaces, by key, that
    /// agents reach with memory_get, memory_put and memory_search (SPEC §20).
    #[command(subcommand)]
    Memory(MemoryCmd),
    /// Rerun recorded turns (sessions by label or name, a turn range) on another agent version in scratch
    /// sessions, score each reply beside its recording, and print the table (or --json the report) (SPEC §20).
    Eval(Box<EvalArgs>),
}

#[derive(Subcommand, Debug)]
pub(crate) enum MemoryCmd {
    /// Write a JSON document at a key (replacing what was there).
    Put(MemoryPutArgs),
    /// Print the document at a key.
    Get(MemoryKeyArgs),
    /// List documents, one a line, in namespace then key order.
    List(MemoryListArgs),
    /// The documents that best match some words, best first, with their scores.
    Search(MemorySearchArgs),
    /// Delete the document at a key.
    Delete(MemoryKeyArgs),
}

#[derive(Args, Debug)]
pub(crate) struct MemoryPutArgs {
    #[command(flatten)]
    pub(crate) at: MemoryKeyArgs,
    /// The JSON document (`-` or absent: read from stdin).
    pub(crate) document: Option<String>,
}

/// Where a document is: `NAMESPACE KEY`.
#[derive(Args, Debug)]
pub(crate) struct MemoryKeyArgs {
    pub(crate) namespace: String,
    pub(crate) key: String,
}

#[derive(Args, Debug)]
pub(crate) struct MemoryListArgs {
    /// One namespace (default: all of the tenant's).
    pub(crate) namespace: Option<String>,
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    pub(crate) prefix: String,
}

#[derive(Args, Debug)]
pub(crate) struct MemorySearchArgs {
    /// The words to look for.
    #[arg(required = true)]
    pub(crate) query: Vec<String>,
    /// A namespace to search; repeat for more (default: all of the tenant's).
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    pub(crate) namespaces: Vec<String>,
    /// How many results (default 10, at most 100).
    #[arg(long, default_value_t = 0)]
    pub(crate) limit: u32,
}

#[derive(Subcommand, Debug)]
pub(crate) enum WebhookCmd {
    /// Register a webhook; prints its signing secret, which is shown this once.
    Create(WebhookCreateArgs),
    /// List the tenant's webhooks (without their secrets).
    List,
    /// Delete a webhook by id: no POST starts after it.
    Delete(WebhookDeleteArgs),
}

#[derive(Args, Debug)]
pub(crate) struct WebhookCreateArgs {
    /// Where to POST: an http:// or https:// URL (internal addresses only if the operator allows them).
    pub(crate) url: String,
    /// A durable event type to deliver; repeat for more (default turn/end).
    #[arg(long = "event", value_name = "TYPE", default_value = "turn/end")]
    pub(crate) events: Vec<String>,
    /// Only sessions whose labels match (`k=v`, `k!=v`, `k`, `!k` joined by commas).
    #[arg(long, value_name = "SELECTOR", default_value = "")]
    pub(crate) label: String,
    /// How long an event is retried before it is given up on (default 24 h).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_age_ms: u64,
}

#[derive(Args, Debug)]
pub(crate) struct WebhookDeleteArgs {
    pub(crate) id: String,
}

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub(crate) shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(crate) struct AcpArgs {
    /// The agent profile new sessions run (default: the server's default agent).
    #[arg(long, value_name = "NAME")]
    pub(crate) agent: Option<String>,
    /// Open this session on session/new instead of a new one.
    #[arg(long, value_name = "ID")]
    pub(crate) session: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// Sessions of --tenant to export; none: every session of it.
    pub(crate) sessions: Vec<String>,
    /// Write the export here (written as FILE.partial, renamed when complete); `-` or absent: stdout.
    #[arg(long, short, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ImportArgs {
    /// The export to read; `-` or absent: stdin.
    pub(crate) file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    /// Every tenant's sessions, not only --tenant's.
    #[arg(long, conflicts_with = "parent")]
    pub(crate) all_tenants: bool,
    /// Only the child sessions that this session's `spawn_agent` calls created.
    #[arg(long, value_name = "SESSION")]
    pub(crate) parent: Option<String>,
    /// Only sessions with this status: idle or running.
    #[arg(long)]
    pub(crate) status: Option<String>,
    /// Only sessions running this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// A label selector: k=v, k!=v, k, !k joined by commas.
    #[arg(long, value_name = "SELECTOR")]
    pub(crate) label: Option<String>,
    /// Newest last activity first (default: by id).
    #[arg(long)]
    pub(crate) recent: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AgentCmd {
    /// Put NAME from FILE (the keys of an [agents.NAME] table, TOML or a JSON object; - for stdin): a new
    /// version when it changed.
    Put(AgentPutArgs),
    /// Show agent NAME (its newest version, or VERSION).
    Get(AgentGetArgs),
    /// List the agents the tenant's sessions may run.
    List,
    /// List every version of agent NAME.
    Versions(AgentNameArg),
    /// Delete agent NAME: no new session may use it; its sessions keep their version.
    Delete(AgentNameArg),
    /// Move sessions running AGENT (those named, or those --label selects) to version --to from their
    /// next turn.
    Migrate(AgentMigrateArgs),
}

#[derive(Args, Debug)]
pub(crate) struct AgentPutArgs {
    pub(crate) name: String,
    pub(crate) file: String,
}

#[derive(Args, Debug)]
pub(crate) struct AgentGetArgs {
    pub(crate) name: String,
    /// A version (default: the newest). Not `version`: clap's `--version` holds that name.
    #[arg(default_value_t = 0, value_name = "VERSION")]
    pub(crate) number: u64,
}

#[derive(Args, Debug)]
pub(crate) struct AgentNameArg {
    pub(crate) name: String,
}

#[derive(Args, Debug)]
pub(crate) struct AgentMigrateArgs {
    pub(crate) agent: String,
    /// The version to move to (0: the newest).
    #[arg(long, default_value_t = 0)]
    pub(crate) to: u64,
    /// A label selector (k=v,k!=v,k,!k) choosing the sessions, instead of naming them.
    #[arg(long, conflicts_with = "sessions")]
    pub(crate) label: Option<String>,
    pub(crate) sessions: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ScheduleCmd {
    /// Create a schedule on SESSION (the same id with the same content is a retry).
    Create(ScheduleCreateArgs),
    /// List the schedules of SESSION, or of every session of --tenant when SESSION is left out.
    List(ScheduleListArgs),
    /// Delete a schedule.
    Delete(ScheduleDeleteArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ScheduleCreateArgs {
    pub(crate) session: String,
    /// The schedule's id: 1-100 characters of A-Z a-z 0-9 - _.
    pub(crate) schedule_id: String,
    /// Once at this time: Unix milliseconds, or +DURATION from now (+90s, +5m, +2h).
    #[arg(long, conflicts_with = "cron", required_unless_present = "cron")]
    pub(crate) at: Option<String>,
    /// A 5-field cron pattern: "minute hour day-of-month month day-of-week" (e.g. "0 9 * * MON-FRI").
    #[arg(long)]
    pub(crate) cron: Option<String>,
    /// The IANA time zone of --cron (default UTC).
    #[arg(long, requires = "cron")]
    pub(crate) time_zone: Option<String>,
    /// followup (default), queue, steer or inject.
    #[arg(long, default_value = "followup")]
    pub(crate) preset: String,
    /// No firing after this Unix time in ms.
    #[arg(long)]
    pub(crate) not_after: Option<u64>,
    /// How late a missed firing may still be delivered when a new owner catches up (default 60000 ms).
    #[arg(long, default_value_t = 0)]
    pub(crate) catchup_ms: u64,
    /// The message each firing delivers (words are joined with spaces).
    #[arg(required = true)]
    pub(crate) text: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ScheduleListArgs {
    pub(crate) session: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ScheduleDeleteArgs {
    pub(crate) session: String,
    pub(crate) schedule_id: String,
}

#[derive(Args, Debug)]
pub(crate) struct LabelArgs {
    pub(crate) session: String,
    /// KEY=VALUE sets a label, -KEY removes one.
    #[arg(required = true, allow_hyphen_values = true)]
    pub(crate) changes: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct UsageArgs {
    /// Count the last N UTC days, today included; 0 counts every day kept (400).
    #[arg(long, default_value_t = 1)]
    pub(crate) days: u64,
}

#[derive(Args, Debug)]
pub(crate) struct WaitIdleArgs {
    pub(crate) session: String,
    /// 0 means the server's default (30 s).
    #[arg(long, default_value_t = 0)]
    pub(crate) timeout_ms: u64,
}

#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    pub(crate) session: String,
    /// Only durable events with a seq above this (your last seen seq, to resume).
    #[arg(long, default_value_t = 0)]
    pub(crate) after: u64,
    /// Leave out live events.
    #[arg(long)]
    pub(crate) no_live: bool,
    /// Exit once the session is idle with no latched wake: at caught-up when it is already idle, else at
    /// the next durable `agent/status idle` that `WhenIdle` confirms.
    #[arg(long)]
    pub(crate) until_idle: bool,
    /// How long to keep reopening a lost stream (a gateway restart, a dropped connection), in ms; a reply
    /// that was streaming goes on from the byte it stopped at. 0: exit when the stream breaks.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) reconnect_ms: u64,
}

mod eval;
mod server;
mod session;
mod values;

pub(crate) use eval::{EvalArgs, ScorerKind, TurnRange};

pub(crate) use server::{DevArgs, GatewayArgs, WorkerArgs};
pub(crate) use session::{
    CancelArgs, ConfigureArgs, DecideArgs, DeliverArgs, ForkArgs, GoalCmd, ReferenceArgs, RemoveArgs, ReplaceArgs,
    SendArgs, SessionArg, SpliceArgs, SteerArgs,
};

#[cfg(test)]
mod tests;
