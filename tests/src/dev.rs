//! `turnstile dev`: gateway and worker in one process, on the embedded journal or (`--nats`) on JetStream.
//!
//! [`Backend`] names the journal a test runs on; [`crate::backend_tests!`] runs each scenario on both.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::{GetSessionRequest, SessionRef};

use crate::HarnessError;
use crate::binary::turnstile_bin;
use crate::nats::NatsServer;
use crate::ports::read_turnstile_ready;
use crate::process::ChildProcess;
use crate::session::Session;

/// How a dev server is started.
#[derive(Clone, Debug)]
pub struct DevOptions {
    /// `--data-dir`: keep sessions on disk (and find them again after a restart).
    pub data_dir: Option<PathBuf>,
    /// `--nats URL`: keep sessions in JetStream (and find them again after a restart).
    pub nats_url: Option<String>,
    /// Further arguments after the harness's own `dev --listen 127.0.0.1:0 --http 127.0.0.1:0 --ready-file
    /// FILE`.
    pub extra_args: Vec<String>,
    /// Environment variables set for the process (e.g. `TURNSTILE_CONFIG`).
    pub env: Vec<(String, String)>,
    /// Bound on the wait for the bound addresses and then the first successful gRPC call.
    pub startup_timeout: Duration,
    /// The server speaks TLS (`--tls-cert/--tls-key` in `extra_args`): the harness dials
    /// `https://localhost:PORT` trusting this PEM CA.
    pub tls_ca: Option<PathBuf>,
}

impl Default for DevOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            nats_url: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            tls_ca: None,
        }
    }
}

impl DevOptions {
    /// For a test that reads the server's RSS as what it holds. mimalloc (decision 0197) keeps freed pages
    /// for a while before it returns them to the system, so RSS would also count memory already freed;
    /// told to return them at once, RSS follows what is live.
    pub fn measuring_memory() -> Self {
        Self { env: vec![("MIMALLOC_PURGE_DELAY".to_owned(), "0".to_owned())], ..Self::default() }
    }

    pub fn data_dir(dir: impl Into<PathBuf>) -> Self {
        Self { data_dir: Some(dir.into()), ..Self::default() }
    }

    /// On the JetStream journal of the nats-server at `url`.
    pub fn nats(url: impl Into<String>) -> Self {
        Self { nats_url: Some(url.into()), ..Self::default() }
    }
}

/// The journal a `turnstile dev` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The embedded journal, in memory.
    Embedded,
    /// JetStream on a nats-server of its own ([`NatsServer::start`]), owned by the [`DevServer`].
    Nats,
}

impl Backend {
    /// Both, in the order [`crate::backend_tests!`] runs them.
    pub const ALL: [Backend; 2] = [Backend::Embedded, Backend::Nats];

    /// A fresh `turnstile dev` on this backend (for [`Backend::Nats`], with a fresh nats-server that lives
    /// and dies with the returned server).
    pub async fn start_dev(self) -> Result<DevServer, HarnessError> {
        self.start_dev_with(DevOptions::default()).await
    }

    /// [`Backend::start_dev`] with `options` (their `nats_url` is this backend's).
    pub async fn start_dev_with(self, options: DevOptions) -> Result<DevServer, HarnessError> {
        match self {
            Backend::Embedded => DevServer::start_with(DevOptions { nats_url: None, ..options }).await,
            Backend::Nats => {
                let nats = NatsServer::start().await?;
                let mut server = DevServer::start_with(DevOptions { nats_url: Some(nats.url()), ..options }).await?;
                server.nats = Some(nats);
                Ok(server)
            }
        }
    }
}

/// Runs each named `async fn NAME(backend: Backend)` of the calling test file as two tests,
/// `embedded::NAME` and `nats::NAME`.
///
/// ```ignore
/// async fn s01_idle_followup(backend: Backend) { let server = backend.start_dev().await.unwrap(); ... }
/// turnstile_tests::backend_tests!(s01_idle_followup, s02_three_followups);
/// ```
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),+ $(,)?) => {
        mod embedded {
            $(
                #[::tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::Embedded).await;
                }
            )+
        }
        mod nats {
            $(
                #[::tokio::test]
                async fn $name() {
                    super::$name($crate::Backend::Nats).await;
                }
            )+
        }
    };
}

/// A running `turnstile dev` on loopback ports it picked itself (port 0, read back from its `--ready-file`).
/// Dropping it kills the process.
#[derive(Debug)]
pub struct DevServer {
    process: ChildProcess,
    addr: SocketAddr,
    channel: Channel,
    http_addr: Option<SocketAddr>,
    /// Dialled over TLS ([`DevOptions::tls_ca`]).
    tls: bool,
    // Holds the log file; removed with the server.
    _scratch: TempDir,
    // The nats-server of a [`Backend::Nats`] server; declared after `process` so it outlives it.
    nats: Option<NatsServer>,
}

impl DevServer {
    /// Starts an in-memory dev server.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(DevOptions::default()).await
    }

    pub async fn start_with(opts: DevOptions) -> Result<Self, HarnessError> {
        let bin = tokio::task::spawn_blocking(turnstile_bin)
            .await
            .map_err(|e| HarnessError::Build(format!("build task failed: {e}")))??;
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-dev-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a scratch dir", e))?;
        let ready_file = scratch.path().join("ready.json");
        let mut command = Command::new(bin);
        command.arg("dev").args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ready-file"]).arg(&ready_file);
        if let Some(dir) = &opts.data_dir {
            command.arg("--data-dir").arg(dir);
        }
        if let Some(url) = &opts.nats_url {
            command.arg("--nats").arg(url);
        }
        command.args(&opts.extra_args);
        command.envs(opts.env.iter().map(|(k, v)| (k, v)));
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        command.env("NO_COLOR", "1");
        let log_path = scratch.path().join("turnstile-dev.log");
        let started = tokio::time::Instant::now();
        let mut process = ChildProcess::spawn("turnstile dev", command, &log_path)?;
        let (addr, http_addr) = process
            .wait_for("its --ready-file", opts.startup_timeout, |pid| {
                read_turnstile_ready(&ready_file, pid).and_then(|r| Some((r.grpc?, r.http)))
            })
            .await?;
        process.set_name(format!("turnstile dev on {addr}"));
        let endpoint = endpoint(addr, opts.tls_ca.as_deref())?;
        let left = opts.startup_timeout.saturating_sub(started.elapsed());
        let channel = wait_ready(&mut process, endpoint, left).await?;
        Ok(Self { process, addr, channel, http_addr, tls: opts.tls_ca.is_some(), _scratch: scratch, nats: None })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None` only if the server did not serve them).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// `http://127.0.0.1:PORT` (`https://localhost:PORT` over TLS), as the CLI's `--addr` takes it.
    pub fn url(&self) -> String {
        if self.tls { format!("https://localhost:{}", self.addr.port()) } else { format!("http://{}", self.addr) }
    }

    pub fn client(&self) -> AgentClient<Channel> {
        AgentClient::new(self.channel.clone())
    }

    /// A fresh session (unique id) on this server.
    pub fn session(&self) -> Session {
        Session::new(self.client())
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The process id, while it runs (e.g. to read its memory from `/proc/PID/status`).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The server process's resident set now, in bytes (`None` once it is gone).
    pub fn rss_bytes(&self) -> Option<u64> {
        self.process.rss_bytes()
    }

    /// The value of the unlabelled series `name` on its `/metrics` now (`None` while it cannot be read or
    /// has no such series).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (status, body) = crate::nats::http_get(self.http_addr?, "/metrics").await?;
        if status != 200 {
            return None;
        }
        body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The nats-server this server owns ([`Backend::Nats`]), if any.
    /// Keeps `nats` alive as long as this server (the server runs on it).
    pub fn own_nats(&mut self, nats: NatsServer) {
        self.nats = Some(nats);
    }

    pub fn nats(&self) -> Option<&NatsServer> {
        self.nats.as_ref()
    }

    pub fn nats_mut(&mut self) -> Option<&mut NatsServer> {
        self.nats.as_mut()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// SIGHUP: the server reads its auth files again.
    pub fn hangup(&self) -> Result<(), HarnessError> {
        self.process.signal("HUP")
    }

    /// SIGTERM, without waiting: see [`DevServer::exited`].
    pub fn terminate(&self) -> Result<(), HarnessError> {
        self.process.signal("TERM")
    }

    /// `Some(status)` once the process has exited (it is then reaped).
    pub fn exited(&mut self) -> Option<String> {
        self.process.exited()
    }

    /// SIGKILL: the crash case. Nothing is flushed or shut down gracefully.
    pub fn kill(mut self) {
        self.process.kill();
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

/// The endpoint of a dev server on `addr`; with `tls_ca`, TLS to `localhost` trusting that CA.
fn endpoint(addr: SocketAddr, tls_ca: Option<&Path>) -> Result<Endpoint, HarnessError> {
    let Some(ca) = tls_ca else {
        return Ok(Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(Duration::from_secs(2)));
    };
    let pem = std::fs::read(ca).map_err(|e| HarnessError::io(format!("reading the CA {}", ca.display()), e))?;
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name("localhost");
    Ok(Endpoint::from_shared(format!("https://{addr}"))?.connect_timeout(Duration::from_secs(2)).tls_config(tls)?)
}

/// Waits until a gRPC call gets an answer from the application (any answer but UNAVAILABLE / transport
/// failure: NOT_FOUND for an unknown session is what a ready server says).
async fn wait_ready(
    process: &mut ChildProcess,
    endpoint: Endpoint,
    timeout: Duration,
) -> Result<Channel, HarnessError> {
    let probe = SessionRef { tenant: "harness".into(), id: "readiness-probe".into() };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(e) = process.exited_error() {
            return Err(e);
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
                waited: timeout,
                log_tail: process.log_tail(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
