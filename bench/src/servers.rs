//! The servers under test: a nats-server (the harness's [`NatsServer`], or one given by URL) and
//! `turnstile dev [--nats URL]` on a loopback port it picks itself (port 0, read back from `--ready-file`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tempfile::TempDir;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::{GetSessionRequest, SessionRef};
use turnstile_tests::nats::NatsServer;
use turnstile_tests::ports::read_turnstile_ready;
use turnstile_tests::process::ChildProcess;

/// The NATS server the run uses: started here (and stopped with the value) or given.
pub enum Nats {
    // Boxed: the harness server is large next to a URL.
    Started(Box<NatsServer>),
    Given(String),
}

impl Nats {
    pub async fn start_or_use(url: Option<&str>) -> Result<Self> {
        match url {
            Some(url) => {
                require_loopback(url)?;
                Ok(Self::Given(url.to_owned()))
            }
            None => {
                Ok(Self::Started(Box::new(NatsServer::start().await.context("starting nats-server with the harness")?)))
            }
        }
    }

    /// The server's process id when the bench started it (for its CPU time).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Self::Started(server) => server.pid(),
            Self::Given(_) => None,
        }
    }

    pub fn url(&self) -> String {
        match self {
            Self::Started(server) => server.url(),
            Self::Given(url) => url.clone(),
        }
    }
}

/// The benchmark talks to loopback servers only.
fn require_loopback(url: &str) -> Result<()> {
    for part in url.split(',') {
        let rest = part.trim().split_once("://").map_or(part.trim(), |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let host = if let Some(v6) = rest.strip_prefix('[') {
            v6.split(']').next().unwrap_or_default()
        } else {
            rest.split(':').next().unwrap_or_default()
        };
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            bail!("--nats {url}: {host} is not a loopback address; the benchmark only runs against 127.0.0.1/::1");
        }
    }
    Ok(())
}

/// The release binary in the workspace's target dir (the harness's own locator builds a debug binary).
pub fn default_turnstile_bin() -> PathBuf {
    turnstile_tests::binary::target_dir().join("release").join(format!("turnstile{}", std::env::consts::EXE_SUFFIX))
}

/// A running `turnstile dev` (with `--nats URL`, or on its embedded journal); dropping it kills the process.
pub struct Dev {
    process: ChildProcess,
    addr: SocketAddr,
    /// The `--http` listener (ops, console and the agent protocols).
    http: Option<SocketAddr>,
    channel: Channel,
    _scratch: TempDir,
}

const STARTUP: Duration = Duration::from_secs(30);

impl Dev {
    pub async fn start(bin: &Path, nats_url: Option<&str>, extra: &[String]) -> Result<Self> {
        if !bin.is_file() {
            bail!(
                "{} does not exist; build it with `cargo build --release -p turnstile-bench -p turnstile` \
                 or pass --turnstile-bin",
                bin.display()
            );
        }
        let scratch = tempfile::Builder::new().prefix("turnstile-bench-").tempdir()?;
        let ready_file = scratch.path().join("ready.json");
        let mut command = Command::new(bin);
        command.arg("dev");
        if let Some(url) = nats_url {
            command.arg("--nats").arg(url);
        }
        command.args(["--listen", "127.0.0.1:0", "--ready-file"]).arg(&ready_file);
        if !extra.iter().any(|a| a == "--http" || a.starts_with("--http=")) {
            // Not the default 127.0.0.1:9090, which another server on the machine may hold.
            command.args(["--http", "127.0.0.1:0"]);
        }
        command.args(extra);
        if std::env::var_os("RUST_LOG").is_none() {
            // Logging every request would measure the logger.
            command.env("RUST_LOG", "warn");
        }
        command.env("NO_COLOR", "1");
        let log = scratch.path().join("turnstile-dev.log");
        let mut process = ChildProcess::spawn("turnstile dev", command, &log)?;
        let addr = process
            .wait_for("its --ready-file", STARTUP, |pid| read_turnstile_ready(&ready_file, pid).and_then(|r| r.grpc))
            .await?;
        process.set_name(format!("turnstile dev on {addr}"));
        let http = process.pid().and_then(|pid| read_turnstile_ready(&ready_file, pid)).and_then(|r| r.http);
        let channel = wait_ready(&mut process, addr).await?;
        Ok(Self { process, addr, http, channel, _scratch: scratch })
    }

    /// The `--http` listener, when the ready file named one.
    pub fn http(&self) -> Option<SocketAddr> {
        self.http
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// The process id, while it runs (for its resident set).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    pub async fn stop(mut self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

/// A new connection to the gateway (each load client gets its own).
pub async fn connect(url: &str) -> Result<AgentClient<Channel>> {
    let channel = Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(AgentClient::new(channel))
}

/// Ready = a gRPC call gets an application answer (NOT_FOUND for an unknown session counts).
async fn wait_ready(process: &mut ChildProcess, addr: SocketAddr) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .tcp_nodelay(true);
    let probe = SessionRef { tenant: "bench".into(), id: "readiness-probe".into() };
    let deadline = tokio::time::Instant::now() + STARTUP;
    loop {
        if let Some(e) = process.exited_error() {
            return Err(e.into());
        }
        if let Ok(channel) = endpoint.connect().await {
            let mut client = AgentClient::new(channel.clone());
            match client.get_session(GetSessionRequest { session: Some(probe.clone()) }).await {
                Ok(_) => return Ok(channel),
                Err(s) if s.code() != Code::Unavailable && s.code() != Code::Unknown => return Ok(channel),
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{} did not serve within {STARTUP:?}; log tail:\n{}", process.name(), process.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The run of a phase against `turnstile dev --nats` alone (`memory`, `search`): a nats-server (started, or
/// the one at `nats`), the dev server of `bin` (default: the workspace's) on it, `measure` against it (the
/// dev server's log tail printed when it fails), both stopped, then the report, with the binary named in it
/// (`bin_of`), printed as JSON or as `markdown`.
pub async fn report_on_dev_nats<R: Serialize>(
    bin: Option<PathBuf>,
    nats: Option<&str>,
    json: bool,
    measure: impl AsyncFnOnce(&Dev) -> Result<R>,
    bin_of: fn(&mut R) -> &mut String,
    markdown: fn(&R) -> String,
) -> Result<()> {
    let bin = bin.unwrap_or_else(default_turnstile_bin);
    let nats = Nats::start_or_use(nats).await?;
    let dev = Dev::start(&bin, Some(&nats.url()), &[]).await?;
    eprintln!("nats-server {}, turnstile dev {} ({})", nats.url(), dev.url(), bin.display());
    let outcome = measure(&dev).await;
    if outcome.is_err() {
        eprintln!("turnstile dev log tail:\n{}", dev.log_tail());
    }
    dev.stop().await;
    drop(nats);
    let mut report = outcome?;
    *bin_of(&mut report) = bin.display().to_string();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::require_loopback;

    #[test]
    fn only_loopback_urls() {
        assert!(require_loopback("nats://127.0.0.1:4222").is_ok());
        assert!(require_loopback("nats://localhost:4222,nats://[::1]:4223").is_ok());
        assert!(require_loopback("nats://u:p@127.0.0.1:4222").is_ok());
        assert!(require_loopback("nats://10.0.0.1:4222").is_err());
        assert!(require_loopback("demo.nats.io").is_err());
    }
}
