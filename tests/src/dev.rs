//! `turnstile dev`: gateway and worker in one process on the embedded journal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::{GetSessionRequest, SessionRef};

use crate::HarnessError;
use crate::binary::turnstile_bin;
use crate::ports::free_loopback_addr;
use crate::process::ChildProcess;
use crate::session::Session;

/// How a dev server is started.
#[derive(Clone, Debug)]
pub struct DevOptions {
    /// `--data-dir`: keep sessions on disk (and find them again after a restart).
    pub data_dir: Option<PathBuf>,
    /// Further arguments after `dev --listen ADDR`.
    pub extra_args: Vec<String>,
    /// Bound on the wait for the first successful gRPC call.
    pub startup_timeout: Duration,
}

impl Default for DevOptions {
    fn default() -> Self {
        Self { data_dir: None, extra_args: Vec::new(), startup_timeout: Duration::from_secs(30) }
    }
}

impl DevOptions {
    pub fn data_dir(dir: impl Into<PathBuf>) -> Self {
        Self { data_dir: Some(dir.into()), ..Self::default() }
    }
}

/// A running `turnstile dev` on a free loopback port. Dropping it kills the process.
#[derive(Debug)]
pub struct DevServer {
    process: ChildProcess,
    addr: SocketAddr,
    channel: Channel,
    // Holds the log file; removed with the server.
    _scratch: TempDir,
}

/// Attempts when the child exits before serving (most likely: another process took the free port).
const START_ATTEMPTS: usize = 3;

impl DevServer {
    /// Starts an in-memory dev server.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(DevOptions::default()).await
    }

    pub async fn start_with(opts: DevOptions) -> Result<Self, HarnessError> {
        let bin = tokio::task::spawn_blocking(turnstile_bin)
            .await
            .map_err(|e| HarnessError::Build(format!("build task failed: {e}")))??;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&bin, &opts).await {
                Ok(server) => return Ok(server),
                Err(e @ HarnessError::Exited { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Build("no start attempt was made".into())))
    }

    async fn try_start(bin: &Path, opts: &DevOptions) -> Result<Self, HarnessError> {
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-dev-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a scratch dir", e))?;
        let addr = free_loopback_addr()?;
        let mut command = Command::new(bin);
        command.arg("dev").arg("--listen").arg(addr.to_string());
        if let Some(dir) = &opts.data_dir {
            command.arg("--data-dir").arg(dir);
        }
        command.args(&opts.extra_args);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        command.env("NO_COLOR", "1");
        let log_path = scratch.path().join("turnstile-dev.log");
        let mut process = ChildProcess::spawn(format!("turnstile dev on {addr}"), command, &log_path)?;
        let channel = wait_ready(&mut process, addr, opts.startup_timeout).await?;
        Ok(Self { process, addr, channel, _scratch: scratch })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, as the CLI's `--addr` takes it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
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

/// Waits until a gRPC call gets an answer from the application (any answer but UNAVAILABLE / transport
/// failure: NOT_FOUND for an unknown session is what a ready server says).
async fn wait_ready(process: &mut ChildProcess, addr: SocketAddr, timeout: Duration) -> Result<Channel, HarnessError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(Duration::from_secs(2));
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
