//! `turnstile`: the one binary. `turnstile dev` runs gateway + worker in one process; `turnstile gateway`
//! and `turnstile worker` are the two halves of a cluster; every other command is a client of the public
//! gRPC API.

mod acp;
mod agents;
mod args;
mod chat;
mod client;
mod demo;
mod eval;
mod export;
mod json;
mod memory;
mod pid_file;
mod render;
mod schedules;
mod security;
mod tls_hint;
mod transcript;
mod watch;
mod webhooks;

use std::process::ExitCode;

use anyhow::Result;
use turnstile_model::GoalAction;
use turnstile_node::config::Overrides;
use turnstile_node::signal::shutdown_signal;

use crate::args::{
    AgentCmd, Cli, Cmd, DeliverArgs, DevArgs, GatewayArgs, GoalCmd, MemoryCmd, ScheduleCmd, WebhookCmd, WorkerArgs,
};
use crate::client::{Client, Delivery, Preset};
use crate::watch::WatchOpts;

/// mimalloc, not glibc's malloc: with a million parked sessions in the heap, glibc's bin sorting and
/// consolidation put 25-30 ms p99 stalls on followups that mimalloc's free lists per page do not
/// (docs/decisions/0197-mimalloc.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The process's role in the default OTLP service name (`turnstile-<role>`).
fn role(cmd: &Cmd) -> &'static str {
    match cmd {
        Cmd::Dev(_) => "dev",
        Cmd::Gateway(_) => "gateway",
        Cmd::Worker(_) => "worker",
        _ => "cli",
    }
}

async fn deliver(client: &mut Client, preset: Preset, d: DeliverArgs) -> Result<()> {
    client::check_session(&client.tenant, &d.session)?;
    let (id, reply) = client::deliver(client, preset, &Delivery::from(d)).await?;
    client.print(&reply, &[("id", id.as_str().into())], |reply| client::accepted_line(&id, reply))
}

/// `turnstile dev`: the node's dev role, the demo beside it, until Ctrl-C or SIGTERM.
async fn run_dev(a: DevArgs) -> Result<()> {
    if a.demo && (a.auth.options().is_enabled() || a.tls.options().is_some()) {
        anyhow::bail!("--demo talks to the server without a token or TLS; drop --demo or the auth/TLS flags");
    }
    let flags = Overrides { partitions: a.partitions, replicas: a.replicas, ..Overrides::default() };
    let pid_file = a.serve.pid_file.clone();
    let serving = a.serve.serving(a.listen, a.tls.options(), &flags)?;
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
    until_stopped(pid_file, node.run_until(shutdown_signal())).await
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
    let flags = Overrides { route_deadline_ms: a.route_deadline_ms, ..a.member.layout.overrides() };
    let member = a.member.member(a.listen, &a.security, &flags)?;
    let options = turnstile_node::gateway::Options {
        serving: member.serving,
        nats: member.nats,
        auth: a.auth.options(),
        cluster_tls: member.cluster_tls,
    };
    let node = turnstile_node::gateway::start(options).await?;
    until_stopped(member.pid_file, node.run_until(shutdown_signal())).await
}

/// `turnstile worker`, until Ctrl-C or SIGTERM (which drains it and releases its leases).
async fn run_worker(a: WorkerArgs) -> Result<()> {
    let flags = a.overrides();
    let member = a.member.member(a.listen, &a.security, &flags)?;
    let options = turnstile_node::worker::Options {
        serving: member.serving,
        nats: member.nats,
        advertise: a.advertise,
        id: a.id,
        cluster_tls: member.cluster_tls,
    };
    let node = turnstile_node::worker::start(options).await?;
    until_stopped(member.pid_file, node.run_until(shutdown_signal())).await
}

/// Runs a started node (`run`) to its end, with its `--pid-file` written while it serves.
async fn until_stopped(
    pid_file: Option<std::path::PathBuf>,
    run: impl Future<Output = Result<(), turnstile_node::NodeError>>,
) -> Result<()> {
    let _pid_file = pid_file.as_deref().map(pid_file::PidFile::write).transpose()?;
    Ok(run.await?)
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
    let connected = Client::connect_with_ca(&g.addr, g.token.as_deref(), &tenant, g.ca.as_deref()).await;
    let mut c = tls_hint::explain(&g.addr, connected).await?;
    c.json = g.json;
    let result = client_command(&mut c, cmd).await;
    tls_hint::explain(&g.addr, result).await
}

/// One client command over the connected client.
async fn client_command(c: &mut Client, cmd: Cmd) -> Result<()> {
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
        Cmd::Configure(a) => {
            let overrides = a.overrides();
            client::configure(c, &a.session, &a.agent, a.inject_mode.0, a.agent_version, &overrides).await
        }
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
        Cmd::Transcript(a) => transcript::transcript(c, &a.session).await,
        Cmd::List(a) => client::list(c, a).await,
        Cmd::Schedule(ScheduleCmd::Create(a)) => schedules::create(c, a).await,
        Cmd::Schedule(ScheduleCmd::List(a)) => schedules::list(c, a.session.as_deref()).await,
        Cmd::Schedule(ScheduleCmd::Delete(a)) => schedules::delete(c, &a.session, &a.schedule_id).await,
        Cmd::Label(a) => schedules::label(c, &a.session, &a.changes).await,
        Cmd::Agent(AgentCmd::Put(a)) => agents::put(c, a).await,
        Cmd::Agent(AgentCmd::Get(a)) => agents::get(c, &a.name, a.number).await,
        Cmd::Agent(AgentCmd::List) => agents::list(c).await,
        Cmd::Agent(AgentCmd::Versions(a)) => agents::versions(c, &a.name).await,
        Cmd::Agent(AgentCmd::Delete(a)) => agents::delete(c, &a.name).await,
        Cmd::Agent(AgentCmd::Migrate(a)) => agents::migrate(c, a).await,
        Cmd::WaitIdle(a) => client::wait_idle(c, &a.session, a.timeout_ms).await,
        Cmd::Usage(a) => client::usage(c, a.days).await,
        Cmd::Chat(a) => chat::run(c, &a.session).await,
        Cmd::Acp(a) => acp::run(c, a.agent, a.session).await,
        Cmd::Watch(a) => {
            let opts = WatchOpts {
                after: a.after,
                live: !a.no_live,
                until_idle: a.until_idle,
                reconnect_for: std::time::Duration::from_millis(a.reconnect_ms),
            };
            let mut out = std::io::stdout();
            watch::watch(c, &a.session, &opts, &mut out, |_| {}).await
        }
        Cmd::Delete(a) => client::delete(c, &a.session).await,
        Cmd::Export(a) => export::export(c, &a.sessions, a.out.as_deref()).await,
        Cmd::Import(a) => export::import(c, a.file.as_deref()).await,
        Cmd::Webhook(WebhookCmd::Create(a)) => webhooks::create(c, a).await,
        Cmd::Webhook(WebhookCmd::List) => webhooks::list(c).await,
        Cmd::Webhook(WebhookCmd::Delete(a)) => webhooks::delete(c, &a.id).await,
        Cmd::Memory(MemoryCmd::Put(a)) => memory::put(c, a).await,
        Cmd::Memory(MemoryCmd::Get(a)) => memory::get(c, a).await,
        Cmd::Memory(MemoryCmd::List(a)) => memory::list(c, a).await,
        Cmd::Memory(MemoryCmd::Search(a)) => memory::search(c, a).await,
        Cmd::Memory(MemoryCmd::Delete(a)) => memory::delete(c, a).await,
        Cmd::Eval(a) => eval::eval(c, *a).await,
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

/// The options of the client commands, global so they go before or after any command; the servers take
/// and ignore them.
const CLIENT_ONLY: [&str; 5] = ["addr", "token", "tenant", "ca", "json"];

/// The command line definition, with [`CLIENT_ONLY`] hidden from the servers' help (`turnstile gateway
/// --help` lists what a gateway uses).
fn cli_command() -> clap::Command {
    let mut command = <Cli as clap::CommandFactory>::command();
    // A subcommand that has an argument of a global's id keeps its own when clap copies the globals down
    // (at build time; changing the copies after that breaks clap's index of arguments).
    let hidden: Vec<clap::Arg> = command
        .get_arguments()
        .filter(|a| CLIENT_ONLY.contains(&a.get_id().as_str()))
        .map(|a| a.clone().global(false).hide(true))
        .collect();
    for server in ["dev", "gateway", "worker"] {
        command = command.mut_subcommand(server, |s| s.args(hidden.iter().cloned()));
    }
    command
}

fn parse_cli() -> Cli {
    let matches = cli_command().get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

#[tokio::main]
async fn main() -> ExitCode {
    turnstile_ops::set_build_info(turnstile_ops::BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("TURNSTILE_COMMIT"),
    });
    let cli = parse_cli();
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
    use super::*;

    #[test]
    fn the_servers_help_leaves_out_the_client_options_and_the_clients_keep_them() {
        let mut command = cli_command();
        command.build();
        for server in ["dev", "gateway", "worker"] {
            let help = command.find_subcommand_mut(server).unwrap().render_long_help().to_string();
            assert!(help.contains("--listen"), "{server}: {help}");
            for option in ["--addr", "--token", "--tenant", "--ca ", "--json"] {
                assert!(!help.contains(option), "turnstile {server} --help lists {option}:\n{help}");
            }
        }
        let help = command.find_subcommand_mut("followup").unwrap().render_long_help().to_string();
        assert!(help.contains("--addr") && help.contains("--token"), "{help}");
        // Still accepted anywhere, as before.
        assert!(cli_command().try_get_matches_from(["turnstile", "gateway", "--json", "--nats", "nats://x"]).is_ok());
    }

    /// Container deployments set files by environment variable (a patch changes one by name); every file
    /// option of the servers has one (`--ready-file` is for scripts and tests only).
    #[test]
    fn every_file_option_of_the_servers_has_an_environment_variable() {
        let command = cli_command();
        for server in ["dev", "gateway", "worker"] {
            let sub = command.find_subcommand(server).unwrap();
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "ready_file") {
                let takes_file = arg.get_value_names().is_some_and(|names| names.iter().any(|n| n == "FILE"));
                if takes_file {
                    assert!(
                        arg.get_env().is_some(),
                        "turnstile {server} --{} has no environment variable",
                        arg.get_id()
                    );
                }
            }
        }
        let gateway = command.find_subcommand("gateway").unwrap();
        let env =
            |id: &str| gateway.get_arguments().find(|a| a.get_id() == id).and_then(|a| a.get_env()).unwrap().to_owned();
        assert_eq!(env("cluster_tls_cert"), "TURNSTILE_CLUSTER_TLS_CERT");
        assert_eq!(env("cluster_tls_key"), "TURNSTILE_CLUSTER_TLS_KEY");
    }

    #[test]
    fn statuses_print_their_canonical_code_and_message() {
        let err = anyhow::Error::new(tonic::Status::not_found("session default/x does not exist"));
        assert_eq!(error_line(&err), "error: NOT_FOUND: session default/x does not exist");
        let err = anyhow::anyhow!("plain failure");
        assert_eq!(error_line(&err), "error: plain failure");
    }
}
