//! The flags of the server roles: `dev`, `serve`, `gateway` and `worker`, and the cluster layout they
//! share.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use turnstile_node::config::Overrides;
use turnstile_node::role::Serving;
use turnstile_node::tls::ServerTls;

use crate::security;

#[derive(Args, Debug)]
pub(crate) struct DevArgs {
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// Address to listen on (port 0 picks a free one, reported as `turnstile: listening grpc=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::dev::DEFAULT_LISTEN)]
    pub(crate) listen: String,
    /// Keep sessions on disk in DIR (default: in memory).
    #[arg(long, env = "TURNSTILE_DATA_DIR", conflicts_with = "nats")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Keep sessions in NATS JetStream at URL (e.g. nats://127.0.0.1:4222) instead of the embedded journal.
    #[arg(long, env = "TURNSTILE_NATS_URL", hide_env_values = true)]
    pub(crate) nats: Option<String>,
    /// JetStream event streams (partitions) to spread sessions over; part of the layout [default: the
    /// configuration's cluster.partitions, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "nats")]
    pub(crate) partitions: Option<u32>,
    /// Replicas of each JetStream event stream (1 for one server, 3 for a cluster) [default: the
    /// configuration's cluster.replicas, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5), requires = "nats")]
    pub(crate) replicas: Option<u32>,
    /// Run a short scripted tour on session `demo` once the server is up.
    #[arg(long)]
    pub(crate) demo: bool,
    #[command(flatten)]
    pub(crate) auth: security::AuthArgs,
    #[command(flatten)]
    pub(crate) tls: security::ServerTlsArgs,
    #[command(flatten)]
    pub(crate) nats_security: security::NatsSecurityArgs,
}

/// What every server role (`dev`, `gateway`, `worker`) takes first: its configuration file, its HTTP
/// endpoints and where it reports the addresses it bound. The worker words `--http` for its own endpoints.
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The configuration file (TOML; docs/CONFIGURATION.md): limits, cluster timings and layout, journal,
    /// models, MCP servers and agents. Flags given on the command line win over its keys.
    #[arg(long = "config", env = "TURNSTILE_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz` and the web console `/` (default
    /// 127.0.0.1:9090; port 0 picks a free one, reported as `turnstile: listening http=ADDR`).
    #[arg(long, env = "TURNSTILE_HTTP")]
    pub(crate) http: Option<String>,
    /// Once every listener is bound, write the bound addresses to FILE as one JSON object (see below).
    #[arg(long, value_name = "FILE")]
    pub(crate) ready_file: Option<PathBuf>,
    /// Once serving, write this process's id to FILE (removed at exit): `kill -HUP "$(cat FILE)"` reloads
    /// the auth file of this one server on a host that runs several.
    #[arg(long, env = "TURNSTILE_PID_FILE", value_name = "FILE")]
    pub(crate) pid_file: Option<PathBuf>,
}

impl ServeArgs {
    /// The configuration file (or the defaults) with `flags` over it.
    pub(crate) fn load(&self, flags: &Overrides) -> Result<turnstile_node::config::Loaded> {
        let mut loaded = turnstile_node::config::load(self.config.as_deref())?;
        flags.apply(&mut loaded.config)?;
        Ok(loaded)
    }

    /// How the role listens: these flags, its `--listen` and TLS, and the configuration with `flags` over it.
    pub(crate) fn serving(self, listen: String, tls: Option<ServerTls>, flags: &Overrides) -> Result<Serving> {
        let config = self.load(flags)?;
        Ok(Serving { listen, http: self.http, ready_file: self.ready_file, tls, config })
    }
}

/// Where the cluster's journal lives and how it is laid out; every gateway and worker of a cluster must
/// agree on it. The layout flags default to the configuration's `[cluster]` keys.
#[derive(Args, Debug)]
pub(crate) struct ClusterLayout {
    /// NATS JetStream URL(s) of the cluster (comma-separated for several servers).
    #[arg(long, env = "TURNSTILE_NATS_URL", hide_env_values = true)]
    pub(crate) nats: String,
    /// JetStream event streams (partitions) to spread sessions over; part of the layout [default: the
    /// configuration's cluster.partitions, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) partitions: Option<u32>,
    /// Replicas of each stream and KV bucket (1 for one server, 3 for a cluster) [default: the
    /// configuration's cluster.replicas, 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub(crate) replicas: Option<u32>,
    /// Virtual shards sessions are hashed to; part of the layout (at least --partitions) [default: the
    /// configuration's cluster.shards, 256].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) shards: Option<u32>,
}

impl ClusterLayout {
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides { partitions: self.partitions, replicas: self.replicas, shards: self.shards, ..Overrides::default() }
    }
}

/// What a cluster member (`gateway`, `worker`) takes first: what every server role takes, then where the
/// cluster's journal is and how it is laid out.
#[derive(Args, Debug)]
pub(crate) struct MemberArgs {
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    #[command(flatten)]
    pub(crate) layout: ClusterLayout,
}

impl MemberArgs {
    /// The member these flags, its `--listen` and its TLS start, with `flags` over the configuration.
    pub(crate) fn member(
        self,
        listen: String,
        security: &security::MemberSecurityArgs,
        flags: &Overrides,
    ) -> Result<Member> {
        let pid_file = self.serve.pid_file.clone();
        let serving = self.serve.serving(listen, security.tls.options(), flags)?;
        let nats = security.nats_security.nats(self.layout.nats);
        Ok(Member { serving, nats, cluster_tls: security.cluster_tls.options(), pid_file })
    }
}

/// What a cluster member starts from the flags both have: how it serves, how it reaches NATS and the
/// workers, and its `--pid-file`.
pub(crate) struct Member {
    pub(crate) serving: Serving,
    pub(crate) nats: turnstile_node::NatsOptions,
    pub(crate) cluster_tls: Option<turnstile_node::tls::ClusterTls>,
    pub(crate) pid_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct GatewayArgs {
    #[command(flatten)]
    pub(crate) member: MemberArgs,
    /// Address of the public API (port 0 picks a free one, reported as `turnstile: listening grpc=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::dev::DEFAULT_LISTEN)]
    pub(crate) listen: String,
    /// How long a command may wait for a shard owner (while shards move) before UNAVAILABLE [default: the
    /// configuration's cluster.route_deadline_ms, 10000].
    #[arg(long)]
    pub(crate) route_deadline_ms: Option<u64>,
    #[command(flatten)]
    pub(crate) auth: security::AuthArgs,
    #[command(flatten)]
    pub(crate) security: security::MemberSecurityArgs,
}

/// A worker serves no console: its `--http` help says so.
const WORKER_HTTP_HELP: &str = "Address of the HTTP endpoints `/metrics`, `/healthz` and `/readyz` (default \
127.0.0.1:9090; port 0 picks a free one, reported as `turnstile: listening http=ADDR`)";

#[derive(Args, Debug)]
#[command(mut_arg("http", |http| http.help(WORKER_HTTP_HELP)))]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    pub(crate) member: MemberArgs,
    /// Address of the internal worker API (port 0 picks a free one, reported as `turnstile: listening
    /// worker=ADDR`).
    #[arg(long, env = "TURNSTILE_LISTEN", default_value = turnstile_node::worker::DEFAULT_LISTEN)]
    pub(crate) listen: String,
    /// Address gateways dial to reach this worker, put in its heartbeat and shard leases (default: the
    /// bound --listen address, with the port the kernel picked for port 0).
    #[arg(long, env = "TURNSTILE_ADVERTISE")]
    pub(crate) advertise: Option<String>,
    /// Unique worker id, reported as the session owner (default: worker-<advertised address>).
    #[arg(long, env = "TURNSTILE_WORKER_ID")]
    pub(crate) id: Option<String>,
    /// How long a shard lease lasts without renewal: the failover time after a crash [default: the
    /// configuration's cluster.lease_ttl_ms, 1500].
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..))]
    pub(crate) lease_ttl_ms: Option<u64>,
    /// How often leases are renewed and fair shares recomputed (well below --lease-ttl-ms) [default: the
    /// configuration's cluster.renew_ms, 400].
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) renew_ms: Option<u64>,
    /// How long running steps may take to finish when shards are handed over or at SIGTERM [default: the
    /// configuration's cluster.drain_timeout_ms, 10000].
    #[arg(long)]
    pub(crate) drain_timeout_ms: Option<u64>,
    // Its `cluster_tls` is how this worker dials other workers for `spawn_agent`'s child sessions, as a
    // gateway does.
    #[command(flatten)]
    pub(crate) security: security::MemberSecurityArgs,
}

impl WorkerArgs {
    /// The layout and lease timing flags, over the configuration's `[cluster]` keys.
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            lease_ttl_ms: self.lease_ttl_ms,
            renew_ms: self.renew_ms,
            drain_timeout_ms: self.drain_timeout_ms,
            ..self.member.layout.overrides()
        }
    }
}
