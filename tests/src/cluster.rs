//! A real cluster on loopback: one nats-server with JetStream (or several clustered, with R3 streams:
//! [`ClusterOptions::nats_nodes`]), `turnstile worker` and `turnstile gateway` processes, and clients of
//! each gateway. Every process binds port 0 (`--listen 127.0.0.1:0 --http 127.0.0.1:0`) and the harness
//! reads the bound addresses back from its `--ready-file`.
//!
//! Workers are `w1`, `w2`, … (their ids are what `GetSession.owner` reports); index `i` in the methods is
//! 0-based (`worker(0)` is `w1`). The chaos handles are real signals: [`Cluster::kill9_worker`] (a crash),
//! [`Cluster::sigstop_worker`] / [`Cluster::sigcont_worker`] (a pause that keeps its sockets open), and
//! [`Cluster::sigterm_worker`] (a clean leave: drain, release, exit).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::{GetSessionRequest, SessionRef};

use crate::binary::turnstile_bin;
use crate::nats::{NatsCluster, NatsServer};
use crate::netns::NetNs;
use crate::ports::{TurnstileReady, read_turnstile_ready};
use crate::process::ChildProcess;
use crate::session::Session;
use crate::{DEFAULT_WAIT, HarnessError, new_session_ref, user_msg};

/// How a cluster is started.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub workers: usize,
    pub gateways: usize,
    /// Further arguments of every `turnstile worker` (e.g. `--lease-ttl-ms`).
    pub worker_args: Vec<String>,
    /// Further arguments of every `turnstile gateway`.
    pub gateway_args: Vec<String>,
    /// Further environment variables of every worker (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub worker_env: Vec<(String, String)>,
    /// Further environment variables of every gateway.
    pub gateway_env: Vec<(String, String)>,
    /// nats-servers: 1 (default) is a lone server; more are clustered on loopback, and then every worker
    /// and gateway gets all their URLs in `--nats` and `--replicas` min(nodes, 3).
    pub nats_nodes: usize,
    /// Worker `.0` runs inside the network namespace `.1` (it listens on the namespace's worker address and
    /// dials NATS over the namespace's own link, which [`NetNs::partition`] cuts); the nats-servers then
    /// listen on the namespace link's host end instead of loopback. Needs `nats_nodes` > 1.
    pub isolated_worker: Option<(usize, Arc<NetNs>)>,
    /// nats-server `.node` and worker `.worker` run together inside the namespace `.ns` (see
    /// `crate::netns`): the worker reaches that server locally, everything else crosses the namespace's
    /// "nats" link, which [`NetNs::partition`] cuts. Needs `isolated_worker` (the other servers listen on
    /// its namespace's host end, which `.ns` must route to) and `nats_nodes` > 1.
    pub isolated_node: Option<IsolatedNode>,
    /// The `turnstile` binary every process starts with (default: the harness's, `TURNSTILE_BIN`); see
    /// [`Cluster::set_bin`] for a rolling upgrade.
    pub bin: Option<PathBuf>,
    /// More lines for every nats-server's config file (e.g. `jetstream { sync_interval: always }`); not
    /// with `isolated_worker`.
    pub nats_config: String,
    /// `--replicas` of every worker and gateway on several nats-servers (default min(nodes, 3)): e.g. 1 for
    /// the same cluster with nothing replicated.
    pub replicas: Option<usize>,
}

impl ClusterOptions {
    pub fn new(workers: usize, gateways: usize) -> Self {
        Self {
            workers,
            gateways,
            worker_args: Vec::new(),
            gateway_args: Vec::new(),
            worker_env: Vec::new(),
            gateway_env: Vec::new(),
            nats_nodes: 1,
            isolated_worker: None,
            isolated_node: None,
            bin: None,
            nats_config: String::new(),
            replicas: None,
        }
    }
}

/// A nats-server and a worker that share a network namespace ([`ClusterOptions::isolated_node`]).
#[derive(Clone, Debug)]
pub struct IsolatedNode {
    /// The nats-server's index (0-based; not 0, which seeds the cluster).
    pub node: usize,
    /// The worker's index.
    pub worker: usize,
    pub ns: Arc<NetNs>,
}

/// One server process of the cluster.
#[derive(Debug)]
struct Node {
    process: ChildProcess,
    /// The bound address of its gRPC API (public for a gateway, internal for a worker).
    addr: SocketAddr,
    /// Its `/metrics` endpoint.
    http: Option<SocketAddr>,
    /// Arguments after `--nats …` (see [`Cluster::args`]).
    extra: Vec<String>,
}

/// A spawned server that has not reported its bound addresses yet.
#[derive(Debug)]
struct Starting {
    process: ChildProcess,
    ready_file: PathBuf,
    extra: Vec<String>,
}

impl Starting {
    /// Waits (bounded) for the `--ready-file` and takes the address `pick` chooses from it.
    async fn bound(mut self, pick: fn(&TurnstileReady) -> Option<SocketAddr>) -> Result<Node, HarnessError> {
        let ready_file = self.ready_file;
        let (addr, http) = self
            .process
            .wait_for("its --ready-file", DEFAULT_WAIT, |pid| {
                read_turnstile_ready(&ready_file, pid).and_then(|r| Some((pick(&r)?, r.http)))
            })
            .await?;
        let name = format!("{} on {addr}", self.process.name());
        self.process.set_name(name);
        Ok(Node { process: self.process, addr, http, extra: self.extra })
    }
}

fn worker_addr(ready: &TurnstileReady) -> Option<SocketAddr> {
    ready.worker
}

fn gateway_addr(ready: &TurnstileReady) -> Option<SocketAddr> {
    ready.grpc
}

/// A running cluster. Dropping it kills every process (the nats-server last).
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    workers: Vec<Node>,
    gateways: Vec<(Node, Channel)>,
    worker_env: Vec<(String, String)>,
    gateway_env: Vec<(String, String)>,
    // Log files; removed with the cluster.
    scratch: TempDir,
    // Declared late so it outlives the processes that use it.
    nats: NatsCluster,
    // The namespace of an isolated worker, if any; last, so it goes after every process that used it.
    isolated: Option<(usize, Arc<NetNs>)>,
    isolated_node: Option<IsolatedNode>,
    /// [`ClusterOptions::replicas`].
    replicas: Option<usize>,
}

impl Cluster {
    /// `workers` workers and `gateways` gateways on a fresh nats-server; returns once a followup through
    /// every gateway has been accepted (so shard leases are taken and routing works).
    pub async fn start(workers: usize, gateways: usize) -> Result<Self, HarnessError> {
        Self::start_with(ClusterOptions::new(workers, gateways)).await
    }

    pub async fn start_with(opts: ClusterOptions) -> Result<Self, HarnessError> {
        let bin = match &opts.bin {
            Some(bin) => bin.clone(),
            None => tokio::task::spawn_blocking(turnstile_bin)
                .await
                .map_err(|e| HarnessError::Build(format!("build task failed: {e}")))??,
        };
        let nats = match &opts.isolated_worker {
            Some((_, ns)) => {
                let inner = opts.isolated_node.as_ref().map(|n| (n.node, n.ns.clone()));
                NatsCluster::start_on(opts.nats_nodes.max(2), ns.nats_host(), inner).await?
            }
            None => NatsCluster::start_with_config(opts.nats_nodes.max(1), &opts.nats_config).await?,
        };
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-cluster-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a scratch dir", e))?;
        let (worker_env, gateway_env) = (opts.worker_env.clone(), opts.gateway_env.clone());
        let isolated = opts.isolated_worker.clone();
        // Without the first namespace the servers listen on loopback, which no namespace reaches.
        let isolated_node = opts.isolated_node.clone().filter(|_| isolated.is_some());
        let mut cluster = Self {
            bin,
            workers: Vec::new(),
            gateways: Vec::new(),
            worker_env,
            gateway_env,
            scratch,
            nats,
            isolated,
            isolated_node,
            replicas: opts.replicas,
        };
        // Every process first, so they start side by side; then what each reports.
        let workers = (0..opts.workers)
            .map(|i| cluster.spawn_worker(i, opts.worker_args.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let gateways = (0..opts.gateways)
            .map(|i| cluster.spawn_gateway(i, opts.gateway_args.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        for worker in workers {
            let node = worker.bound(worker_addr).await?;
            cluster.workers.push(node);
        }
        for gateway in gateways {
            let node = gateway.bound(gateway_addr).await?;
            let channel = wait_gateway(&mut cluster.workers, node.addr, &node.process).await?;
            cluster.gateways.push((node, channel));
        }
        for g in 0..cluster.gateways.len() {
            cluster.wait_routing(g).await?;
        }
        cluster.wait_balanced().await?;
        Ok(cluster)
    }

    /// Waits (bounded) until the shards are settled: every virtual shard is owned and no worker holds
    /// more than its fair share, read from each worker's `turnstile_shards_owned` gauge. Until then
    /// shards still move at start-up, and a turn that is running when its shard moves is (correctly)
    /// interrupted and resumed by the new owner, which tests that count events must not meet by chance.
    pub async fn wait_balanced(&self) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        let live = self.workers.len();
        if live == 0 {
            return Ok(());
        }
        // The workers' `--shards`, else the default.
        let shards = self.workers[0]
            .extra
            .windows(2)
            .find(|w| w[0] == "--shards")
            .and_then(|w| w[1].parse::<u64>().ok())
            .unwrap_or(DEFAULT_SHARDS);
        let fair = shards.div_ceil(live as u64);
        loop {
            let mut owned = Vec::with_capacity(live);
            for worker in &self.workers {
                owned.push(match worker.http {
                    Some(http) => shards_owned(http).await,
                    None => None,
                });
            }
            let counts: Option<Vec<u64>> = owned.into_iter().collect();
            if let Some(counts) = &counts
                && counts.iter().sum::<u64>() == shards
                && counts.iter().all(|c| *c <= fair)
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("shards to settle (owned per worker: {counts:?}, fair share {fair})"),
                    waited: DEFAULT_WAIT,
                    log_tail: self.logs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn common_args(&self) -> Vec<String> {
        if self.nats.len() == 1 {
            return vec!["--nats".into(), self.nats.node(0).url()];
        }
        vec!["--nats".into(), self.nats.urls(), "--replicas".into(), self.replicas().to_string()]
    }

    /// The replicas of every stream and bucket the workers create: 1 on a lone nats-server, else
    /// [`ClusterOptions::replicas`] or min(nodes, 3).
    pub fn replicas(&self) -> usize {
        if self.nats.len() == 1 {
            return 1;
        }
        self.replicas.unwrap_or(self.nats.len().min(3))
    }

    fn spawn_worker(&self, i: usize, extra: Vec<String>) -> Result<Starting, HarnessError> {
        let id = worker_id(i);
        let netns = self
            .isolated
            .as_ref()
            .filter(|(w, _)| *w == i)
            .map(|(_, ns)| ns.as_ref())
            .or_else(|| self.isolated_node.as_ref().filter(|n| n.worker == i).map(|n| n.ns.as_ref()));
        let name = match netns {
            Some(ns) => format!("turnstile worker {id} (in netns {})", ns.name()),
            None => format!("turnstile worker {id}"),
        };
        self.spawn(&name, "worker", Some(&id), extra, &self.worker_env, &format!("worker-{id}"), netns)
    }

    fn spawn_gateway(&self, i: usize, extra: Vec<String>) -> Result<Starting, HarnessError> {
        let name = format!("turnstile gateway {i}");
        self.spawn(&name, "gateway", None, extra, &self.gateway_env, &format!("gateway-{i}"), None)
    }

    /// Spawns `turnstile ROLE --nats … --listen 127.0.0.1:0 --http 127.0.0.1:0 --ready-file FILE.ready.json
    /// [--id ID] EXTRA…` with its log in `FILE.log`. The NATS URLs are the current ones (a restarted
    /// nats-server member has a new one); the ready file is removed first (it may be there from the
    /// process this one restarts). With `netns` the process runs inside that namespace and listens on its
    /// worker address instead of loopback.
    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &self,
        name: &str,
        role: &str,
        id: Option<&str>,
        extra: Vec<String>,
        env: &[(String, String)],
        file: &str,
        netns: Option<&NetNs>,
    ) -> Result<Starting, HarnessError> {
        let ready_file = self.scratch.path().join(format!("{file}.ready.json"));
        match std::fs::remove_file(&ready_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(HarnessError::io(format!("removing {}", ready_file.display()), e));
            }
            _ => {}
        }
        let (mut command, host) = match netns {
            Some(ns) => (ns.command(&self.bin), ns.worker_host().to_string()),
            None => (Command::new(&self.bin), "127.0.0.1".to_owned()),
        };
        command.arg(role).args(self.common_args());
        let (listen, http) = (format!("{host}:0"), format!("{host}:0"));
        command.args(["--listen", &listen, "--http", &http, "--ready-file"]).arg(&ready_file);
        if let Some(id) = id {
            command.args(["--id", id]);
        }
        command.args(&extra).envs(env.iter().map(|(k, v)| (k, v)));
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        command.env("NO_COLOR", "1");
        let process = ChildProcess::spawn(name, command, &self.scratch.path().join(format!("{file}.log")))?;
        Ok(Starting { process, ready_file, extra })
    }

    /// Waits until a followup through gateway `g` is accepted (some worker owns the probe's shard).
    async fn wait_routing(&mut self, g: usize) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        let probe =
            Session::with_ref(self.client(g), SessionRef { tenant: "harness".into(), id: format!("ready-{g}") });
        loop {
            match probe.followup(user_msg("ready", "ready?")).await {
                Ok(_) => return Ok(()),
                Err(status) if status.code() == Code::Unavailable => {}
                Err(status) => return Err(HarnessError::Status(status)),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("routing through gateway {g}"),
                    waited: DEFAULT_WAIT,
                    log_tail: self.logs(),
                });
            }
        }
    }

    /// The (first) nats-server.
    pub fn nats(&self) -> &NatsServer {
        self.nats.node(0)
    }

    /// Every nats-server (one unless [`ClusterOptions::nats_nodes`] asked for more).
    pub fn nats_cluster(&self) -> &NatsCluster {
        &self.nats
    }

    /// What the processes got as `--nats` (one URL, or every member's, comma-separated).
    pub fn nats_url(&self) -> String {
        if self.nats.len() == 1 { self.nats.node(0).url() } else { self.nats.urls() }
    }

    /// SIGKILL nats-server `i` (0-based; `n1` is 0).
    pub fn kill9_nats(&mut self, i: usize) {
        self.nats.kill(i);
    }

    /// SIGTERM nats-server `i` and wait for it to exit: a clean stop, in which it hands the leaderships it
    /// holds to the other members first (a kill -9 leaves them to an election).
    pub async fn sigterm_nats(&mut self, i: usize) {
        self.nats.node_mut(i).stop().await;
    }

    /// Starts nats-server `i` again on its store dir (new ports; the others and the clients learn them
    /// from the cluster) and waits until it is healthy.
    pub async fn restart_nats(&mut self, i: usize) -> Result<(), HarnessError> {
        self.nats.restart(i).await
    }

    /// The namespace of the isolated worker and its index, when the cluster has one.
    pub fn isolated_worker(&self) -> Option<(usize, &NetNs)> {
        self.isolated.as_ref().map(|(w, ns)| (*w, ns.as_ref()))
    }

    /// The nats-server and worker that share a namespace, when the cluster has them.
    pub fn isolated_node(&self) -> Option<&IsolatedNode> {
        self.isolated_node.as_ref()
    }

    /// Whether worker `i`'s `/readyz` answers 200 (it holds its share of the shards, decision 0160); `None`
    /// while it cannot be asked.
    pub async fn worker_ready(&self, i: usize) -> Option<bool> {
        let (status, _) = crate::nats::http_get(self.workers[i].http?, "/readyz").await?;
        Some(status == 200)
    }

    /// Worker `i`'s `turnstile_shards_owned` gauge, `None` while it cannot be read.
    pub async fn shards_owned_by(&self, i: usize) -> Option<u64> {
        shards_owned(self.workers[i].http?).await
    }

    /// The channel to gateway `g` (new after [`Cluster::restart_gateway`]).
    pub fn gateway_channel(&self, g: usize) -> Channel {
        self.gateways[g].1.clone()
    }

    /// SIGKILL gateway `g`.
    pub fn kill9_gateway(&mut self, g: usize) {
        self.gateways[g].0.process.kill();
    }

    /// SIGSTOP (`"-STOP"`) or SIGCONT (`"-CONT"`) gateway `g`.
    pub fn signal_gateway(&self, g: usize, signal: &str) {
        if let Some(pid) = self.gateways[g].0.process.pid() {
            let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
        }
    }

    /// SIGTERM gateway `g` and wait for it to exit; SIGKILL after `grace`.
    pub async fn sigterm_gateway(&mut self, g: usize, grace: Duration) {
        self.gateways[g].0.process.stop(grace).await;
    }

    /// Starts gateway `g` again after a kill or stop: the same arguments, a new port (see
    /// [`Cluster::gateway_channel`]). Returns once it answers.
    pub async fn restart_gateway(&mut self, g: usize) -> Result<(), HarnessError> {
        self.gateways[g].0.process.kill();
        let extra = self.gateways[g].0.extra.clone();
        let node = self.spawn_gateway(g, extra)?.bound(gateway_addr).await?;
        let channel = wait_gateway(&mut self.workers, node.addr, &node.process).await?;
        self.gateways[g] = (node, channel);
        Ok(())
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    pub fn gateways(&self) -> usize {
        self.gateways.len()
    }

    /// A client of gateway `g`.
    pub fn client(&self, g: usize) -> AgentClient<Channel> {
        AgentClient::new(self.gateways[g].1.clone())
    }

    /// Processes started or restarted from now on run `bin` (a rolling upgrade: restart them one by one).
    pub fn set_bin(&mut self, bin: PathBuf) {
        self.bin = bin;
    }

    /// The ops HTTP listener (`/metrics`, `/healthz`, `/readyz`) of gateway `g`.
    pub fn gateway_http(&self, g: usize) -> Option<SocketAddr> {
        self.gateways[g].0.http
    }

    /// The ops HTTP listener of worker `i`.
    pub fn worker_http(&self, i: usize) -> Option<SocketAddr> {
        self.workers[i].http
    }

    /// `http://127.0.0.1:PORT` of gateway `g`, as the CLI's `--addr` takes it.
    pub fn gateway_url(&self, g: usize) -> String {
        format!("http://{}", self.gateways[g].0.addr)
    }

    /// A fresh session (unique id) through gateway `g`.
    pub fn session(&self, g: usize) -> Session {
        Session::new(self.client(g))
    }

    /// The same session through gateway `g`.
    pub fn session_via(&self, g: usize, session: &Session) -> Session {
        Session::with_ref(self.client(g), session.reference())
    }

    /// A fresh session reference.
    pub fn new_session_ref() -> SessionRef {
        new_session_ref()
    }

    /// The id of worker `i` (`w1` for 0).
    pub fn worker_id(&self, i: usize) -> String {
        worker_id(i)
    }

    /// The index of the worker with id `id`.
    pub fn worker_index(&self, id: &str) -> Option<usize> {
        (0..self.workers.len()).find(|i| worker_id(*i) == id)
    }

    /// The address worker `i` bound (its internal API), as it reported it; new after a restart.
    pub fn worker_addr(&self, i: usize) -> SocketAddr {
        self.workers[i].addr
    }

    pub fn worker_log(&self, i: usize) -> &Path {
        self.workers[i].process.log_path()
    }

    /// SIGKILL worker `i`: the crash case.
    pub fn kill9_worker(&mut self, i: usize) {
        self.workers[i].process.kill();
    }

    /// SIGSTOP worker `i`: it stops renewing and answering but keeps its sockets.
    pub fn sigstop_worker(&self, i: usize) {
        self.signal_worker(i, "-STOP");
    }

    pub fn sigcont_worker(&self, i: usize) {
        self.signal_worker(i, "-CONT");
    }

    fn signal_worker(&self, i: usize, signal: &str) {
        if let Some(pid) = self.workers[i].process.pid() {
            // std has no signals; `kill(1)` is everywhere the suite runs.
            let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
        }
    }

    /// SIGTERM worker `i` and wait for it to exit (it drains and releases its shards first); SIGKILL
    /// after `grace`.
    pub async fn sigterm_worker(&mut self, i: usize, grace: Duration) {
        self.workers[i].process.stop(grace).await;
    }

    /// Starts worker `i` again after a kill or stop: the same id and arguments, a new port (which it
    /// advertises in its heartbeat and leases, so gateways find it there). Returns once it listens.
    pub async fn restart_worker(&mut self, i: usize) -> Result<(), HarnessError> {
        // The old process is gone; make sure before its ready file is removed and reused.
        self.workers[i].process.kill();
        let extra = self.workers[i].extra.clone();
        let starting = self.spawn_worker(i, extra)?;
        self.workers[i] = starting.bound(worker_addr).await?;
        Ok(())
    }

    /// Every running process of the cluster (workers, gateways, nats-servers) with its role, name and
    /// pid: what a benchmark reads per-process CPU time of.
    pub fn processes(&self) -> Vec<ClusterProcess> {
        let workers = self.workers.iter().enumerate().map(|(i, w)| (Role::Worker, worker_id(i), w.process.pid()));
        let gateways =
            self.gateways.iter().enumerate().map(|(g, (node, _))| (Role::Gateway, format!("g{g}"), node.process.pid()));
        let nats = (0..self.nats.len()).map(|i| {
            let node = self.nats.node(i);
            (Role::Nats, node.name().map_or_else(|| format!("n{}", i + 1), str::to_owned), node.pid())
        });
        workers
            .chain(gateways)
            .chain(nats)
            .filter_map(|(role, name, pid)| Some(ClusterProcess { role, name, pid: pid? }))
            .collect()
    }

    /// Copies every process's whole log (workers, gateways, nats-servers) into `dir`, for a failure to be
    /// studied after the cluster (and its scratch dir) is gone.
    pub fn save_logs(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(self.scratch.path())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "log")
                && let Some(name) = path.file_name()
            {
                std::fs::copy(&path, dir.join(name))?;
            }
        }
        for i in 0..self.nats.len() {
            let node = self.nats.node(i);
            let name = node.name().map_or_else(|| format!("n{}", i + 1), str::to_owned);
            std::fs::copy(node.log_file(), dir.join(format!("nats-{name}.log")))?;
        }
        Ok(())
    }

    /// The log tails of every process, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, w) in self.workers.iter().enumerate() {
            out.push_str(&format!("--- worker {}\n{}\n", worker_id(i), w.process.log_tail()));
        }
        for (g, (node, _)) in self.gateways.iter().enumerate() {
            out.push_str(&format!("--- gateway {g}\n{}\n", node.process.log_tail()));
        }
        if self.nats.len() > 1 {
            out.push_str(&self.nats.log_tails());
        }
        out
    }
}

/// What a process of a [`Cluster`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Worker,
    Gateway,
    Nats,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Gateway => "gateway",
            Self::Nats => "nats-server",
        }
    }
}

/// One running process of a [`Cluster`] ([`Cluster::processes`]).
#[derive(Clone, Debug)]
pub struct ClusterProcess {
    pub role: Role,
    /// `w1`…, `g0`…, `n1`… (a lone nats-server is `n1`).
    pub name: String,
    pub pid: u32,
}

fn worker_id(i: usize) -> String {
    format!("w{}", i + 1)
}

/// Waits until the gateway answers a read (NOT_FOUND for the probe is what a ready gateway says). Workers
/// are checked too: one that exits while the gateway starts is the likelier failure.
async fn wait_gateway(workers: &mut [Node], addr: SocketAddr, process: &ChildProcess) -> Result<Channel, HarnessError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(Duration::from_secs(2));
    let probe = SessionRef { tenant: "harness".into(), id: "readiness-probe".into() };
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    loop {
        for w in workers.iter_mut() {
            if let Some(e) = w.process.exited_error() {
                return Err(e);
            }
        }
        if let Ok(channel) = endpoint.connect().await {
            let mut client = AgentClient::new(channel.clone());
            match client.get_session(GetSessionRequest { session: Some(probe.clone()) }).await {
                Ok(_) => return Ok(channel),
                Err(status) if status.code() != Code::Unavailable && status.code() != Code::Unknown => {
                    return Ok(channel);
                }
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HarnessError::StartTimeout {
                what: process.name().to_owned(),
                waited: DEFAULT_WAIT,
                log_tail: process.log_tail(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The virtual shards of a worker started without `--shards`.
const DEFAULT_SHARDS: u64 = 256;

/// A worker's `turnstile_shards_owned` gauge, `None` while it cannot be read.
async fn shards_owned(http: SocketAddr) -> Option<u64> {
    let (status, body) = crate::nats::http_get(http, "/metrics").await?;
    if status != 200 {
        return None;
    }
    body.lines()
        .find_map(|line| line.strip_prefix("turnstile_shards_owned "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}
