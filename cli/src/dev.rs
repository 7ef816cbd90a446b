//! `turnstile dev`: gateway and worker in one process, on the embedded journal (in memory or `--data-dir`)
//! or on JetStream (`--nats URL`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tokio::net::TcpListener;
use turnstile_cluster::CommandRouter;
use turnstile_gateway::{Gateway, GatewayConfig};
use turnstile_journal::jetstream::{KvSnapshots, NatsSecurity};
use turnstile_journal::snapshot::{NoSnapshots, SnapshotStore};
use turnstile_journal::{
    EmbeddedLog, JetStreamConfig, JetStreamLog, JournalError, LiveBus, LocalBus, NatsBus, SessionLog,
};
use turnstile_ops::Readiness;
use turnstile_worker::{SessionHost, WorkerConfig};

use crate::demo;
use crate::security::{self, ServerSecurity};

/// Options of `turnstile dev`.
#[derive(Clone, Debug)]
pub struct DevOpts {
    pub listen: String,
    pub data_dir: Option<PathBuf>,
    /// Run on JetStream at this NATS URL instead of the embedded journal.
    pub nats: Option<NatsOpts>,
    pub demo: bool,
    /// `--http`: `/metrics`, `/healthz`, `/readyz`.
    pub http: Option<String>,
    /// `--ready-file`: where [`report_bound`] writes the bound addresses.
    pub ready_file: Option<PathBuf>,
}

/// `--nats URL --partitions P --replicas R`.
#[derive(Clone, Debug)]
pub struct NatsOpts {
    pub url: String,
    pub partitions: u32,
    pub replicas: usize,
    /// `--nats-creds`, `--nats-ca`, `--nats-tls-cert/--nats-tls-key`.
    pub security: NatsSecurity,
}

/// The JetStream journal, the live bus on its connection and the snapshot bucket: what every server on
/// NATS (`dev --nats`, `gateway`, `worker`) opens first. The errors say what to do: an unreachable server
/// names the URL and how to start one; a stream with another layout names the field.
pub(crate) async fn open_nats_journal(
    url: &str,
    partitions: u32,
    replicas: usize,
    shards: u32,
    security: NatsSecurity,
) -> Result<(JetStreamLog, NatsBus, KvSnapshots)> {
    let mut config = JetStreamConfig::new(url.to_owned());
    config.partitions = partitions;
    config.replicas = replicas;
    config.shards = shards;
    config.security = security;
    let log = JetStreamLog::connect(config).await.map_err(|e| nats_error(url, &e))?;
    let bus = NatsBus::new(log.client().clone());
    let snapshots = KvSnapshots::open(log.client(), replicas).await.map_err(|e| nats_error(url, &e))?;
    Ok((log, bus, snapshots))
}

async fn connect_nats(opts: &NatsOpts) -> Result<(Journal, Arc<dyn Readiness>)> {
    let shards = JetStreamConfig::new(opts.url.clone()).shards;
    let (log, bus, snapshots) =
        open_nats_journal(&opts.url, opts.partitions, opts.replicas, shards, opts.security.clone()).await?;
    let journal = format!(
        "JetStream at {} ({} partition{}, {} replica{})",
        opts.url,
        opts.partitions,
        if opts.partitions == 1 { "" } else { "s" },
        opts.replicas,
        if opts.replicas == 1 { "" } else { "s" },
    );
    let ready = Arc::new(crate::ops::nats_ready(log.client().clone(), opts.url.clone()));
    Ok(((Arc::new(log), Arc::new(bus), Arc::new(snapshots), journal), ready))
}

/// The journal of `turnstile dev`: log, live bus, snapshots, and how the banner names it.
type Journal = (Arc<dyn SessionLog>, Arc<dyn LiveBus>, Arc<dyn SnapshotStore>, String);

pub(crate) fn nats_error(url: &str, err: &JournalError) -> anyhow::Error {
    match err {
        JournalError::Unavailable(detail) => {
            // The journal's message already says "cannot connect to NATS at <url>: "; say it once.
            let detail = detail.strip_prefix(&format!("cannot connect to NATS at {url}: ")).unwrap_or(detail);
            anyhow::anyhow!("cannot reach NATS at {url}: {detail}; start nats-server with -js or pass the right --nats")
        }
        other => anyhow::anyhow!("cannot use the JetStream journal at {url}: {other}"),
    }
}

/// Why the cluster's ownership buckets cannot be used, for a worker or gateway that is starting.
pub(crate) fn membership_error(url: &str, err: &turnstile_cluster::MembershipError) -> anyhow::Error {
    anyhow::anyhow!("cannot use the shard lease buckets on NATS at {url}: {err}; check that nats-server runs with -js")
}

/// Binds first so a busy port fails before anything else starts, with the fix in the message.
pub(crate) async fn bind(listen: &str) -> Result<TcpListener> {
    match TcpListener::bind(listen).await {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            bail!("{listen} is in use; pass --listen 127.0.0.1:0 or another port")
        }
        Err(e) => Err(e).with_context(|| format!("cannot listen on {listen}; pass --listen HOST:PORT")),
    }
}

/// One listener of this process: its name (`grpc`, `worker`, `http`) and the address it is bound to.
pub(crate) type Bound = (&'static str, SocketAddr);

/// `name` bound at `listener` and, when they are served, the ops HTTP endpoints.
pub(crate) fn bound_with_http(name: &'static str, listener: SocketAddr, http: &crate::ops::OpsHttp) -> Vec<Bound> {
    let mut bound = vec![(name, listener)];
    bound.extend(http.addr().map(|addr| ("http", addr)));
    bound
}

/// The stdout line that reports one bound listener: `turnstile: listening NAME=ADDR`, ADDR as bound
/// (`127.0.0.1:40123`, `[::1]:40123`, a wildcard bind as `0.0.0.0:40123`). A stable, machine-readable
/// format: docs/TESTING.md and docs/decisions/0007-bound-addresses.md.
pub(crate) fn listening_line((name, addr): Bound) -> String {
    format!("turnstile: listening {name}={addr}")
}

/// The `--ready-file` object: `{"pid":N,"NAME":"ADDR",…}` with one member per listener plus `fields`.
pub(crate) fn ready_json(pid: u32, bound: &[Bound], fields: &[(&str, String)]) -> String {
    let mut object = serde_json::Map::new();
    object.insert("pid".to_owned(), pid.into());
    for (name, addr) in bound {
        object.insert((*name).to_owned(), addr.to_string().into());
    }
    for (name, value) in fields {
        object.insert((*name).to_owned(), value.clone().into());
    }
    serde_json::Value::Object(object).to_string()
}

/// Reports every bound address once all listeners are bound, before serving: one [`listening_line`] per
/// listener on stdout, and with `--ready-file PATH` the [`ready_json`] object (plus `fields`), written to a
/// temporary file beside PATH and renamed over it, so a reader sees all of it or nothing.
pub(crate) fn report_bound(bound: &[Bound], fields: &[(&str, String)], ready_file: Option<&Path>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for listener in bound {
        writeln!(out, "{}", listening_line(*listener)).context("cannot write to stdout")?;
    }
    out.flush().context("cannot write to stdout")?;
    let Some(path) = ready_file else { return Ok(()) };
    let name =
        path.file_name().with_context(|| format!("--ready-file {} names no file", path.display()))?.to_string_lossy();
    let pid = std::process::id();
    let temporary = path.with_file_name(format!(".{name}.{pid}.tmp"));
    std::fs::write(&temporary, ready_json(pid, bound, fields) + "\n")
        .and_then(|()| std::fs::rename(&temporary, path))
        .with_context(|| format!("cannot write --ready-file {}", path.display()))
}

/// The URL clients use for `addr`: a wildcard bind is reached over loopback.
pub(crate) fn client_url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() { std::net::Ipv4Addr::LOCALHOST.into() } else { addr.ip() };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// [`client_url`] with `https://` when the server speaks TLS.
pub(crate) fn client_url_for(addr: SocketAddr, tls: bool) -> String {
    let url = client_url(addr);
    if tls { url.replacen("http://", "https://", 1) } else { url }
}

fn banner(url: &str, journal: &str, auth: &str) -> String {
    let addr_flag = if url == crate::DEFAULT_ADDR { String::new() } else { format!(" --addr {url}") };
    format!(
        "turnstile dev: gateway + worker in one process\n  \
         listening  {url}\n  \
         journal    {journal}\n  \
         {auth}\n  \
         try        turnstile{addr_flag} followup s1 \"hello\"\n             \
         turnstile{addr_flag} watch s1 --until-idle\n  \
         stop       Ctrl-C\n"
    )
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

pub async fn run(opts: DevOpts, security: ServerSecurity) -> Result<()> {
    crate::ops::install_metrics();
    if opts.demo && (security.auth.is_enabled() || security.tls.is_some()) {
        bail!("--demo talks to the server without a token or TLS; drop --demo or the auth/TLS flags");
    }
    let listener = bind(&opts.listen).await?;
    let local = listener.local_addr().context("cannot read the bound address")?;
    let auth_line = security::auth_line(&security.auth, local, &opts.listen)?;
    // The embedded journal reads from memory, so it keeps no snapshots; JetStream keeps them in KV. The
    // embedded journal is ready once open; on NATS, readiness follows the connection.
    let always: Arc<dyn Readiness> = Arc::new(turnstile_ops::AlwaysReady);
    let ((log, bus, snapshots, journal), ready): (Journal, Arc<dyn Readiness>) = match (&opts.nats, &opts.data_dir) {
        (Some(nats), _) => connect_nats(nats).await?,
        (None, Some(dir)) => {
            let log = EmbeddedLog::open(dir)
                .with_context(|| format!("cannot open the journal in {}; check --data-dir", dir.display()))?;
            let journal = format!("embedded, on disk in {}", dir.display());
            ((Arc::new(log), Arc::new(LocalBus::new()), Arc::new(NoSnapshots), journal), always)
        }
        (None, None) => (
            (
                Arc::new(EmbeddedLog::in_memory()),
                Arc::new(LocalBus::new()),
                Arc::new(NoSnapshots),
                "embedded, in memory (lost on exit; pass --data-dir DIR to keep sessions)".to_owned(),
            ),
            always,
        ),
    };
    let http = crate::ops::OpsHttp::start(opts.http.as_deref(), ready).await?;
    let host = SessionHost::with_snapshots(log.clone(), bus.clone(), snapshots.clone(), WorkerConfig::default());
    let resumed = host.resume_running().await.context("cannot resume the sessions that were running")?;
    if resumed > 0 {
        tracing::info!(resumed, "resumed sessions that were running when the last process stopped");
    }
    let router: Arc<dyn CommandRouter> = host;
    let gateway =
        Gateway::new(router, log, bus, GatewayConfig::default()).with_snapshots(snapshots).with_auth(security.auth);

    let url = client_url_for(local, security.tls.is_some());
    print!("{}", banner(&url, &journal, &auth_line));
    println!("  http       {}", http.describe());
    let bound = bound_with_http("grpc", local, &http);
    report_bound(&bound, &[], opts.ready_file.as_deref())?;
    tracing::info!(%local, tls = security.tls.is_some(), "serving turnstile.v1.Agent");

    let server = tokio::spawn(turnstile_gateway::serve_with(gateway, listener, security.tls, shutdown_signal()));
    if opts.demo {
        let url = url.clone();
        tokio::spawn(async move {
            if let Err(e) = demo::run(&url).await {
                eprintln!("demo failed: {e:#}");
            }
        });
    }
    server.await.context("the server task panicked")?.context("the gRPC server stopped")?;
    http.stop();
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_port_says_how_to_pick_another() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = bind(&addr).await.unwrap_err();
        assert_eq!(err.to_string(), format!("{addr} is in use; pass --listen 127.0.0.1:0 or another port"));
    }

    #[test]
    fn an_unreachable_nats_is_named_with_the_fix() {
        let url = "nats://127.0.0.1:1";
        let err = JournalError::Unavailable(format!("cannot connect to NATS at {url}: connection refused"));
        assert_eq!(
            nats_error(url, &err).to_string(),
            "cannot reach NATS at nats://127.0.0.1:1: connection refused; start nats-server with -js or pass \
             the right --nats"
        );
        let err = JournalError::Storage("stream TURNSTILE_EVENTS_0 exists with replicas = 3".into());
        assert!(nats_error(url, &err).to_string().starts_with("cannot use the JetStream journal at nats://"));
    }

    #[test]
    fn bound_addresses_are_reported_in_the_documented_formats() {
        let grpc: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let http: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(listening_line(("grpc", grpc)), "turnstile: listening grpc=127.0.0.1:40123");
        assert_eq!(listening_line(("http", http)), "turnstile: listening http=[::1]:9");
        let json: serde_json::Value =
            serde_json::from_str(&ready_json(7, &[("worker", grpc)], &[("advertise", "10.0.0.5:7501".into())]))
                .unwrap();
        assert_eq!(json, serde_json::json!({"pid": 7, "worker": "127.0.0.1:40123", "advertise": "10.0.0.5:7501"}));
    }

    #[test]
    fn the_ready_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("turnstile-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        std::fs::write(&path, "stale").unwrap();
        let grpc: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        report_bound(&[("grpc", grpc)], &[], Some(&path)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["grpc"], "127.0.0.1:40123");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wildcard_binds_are_reached_over_loopback() {
        assert_eq!(client_url("0.0.0.0:7400".parse().unwrap()), "http://127.0.0.1:7400");
        assert_eq!(client_url("127.0.0.1:9".parse().unwrap()), "http://127.0.0.1:9");
    }

    #[test]
    fn the_banner_names_the_address_in_examples_only_when_it_is_not_the_default() {
        assert!(!banner(crate::DEFAULT_ADDR, "mem", "auth: off (loopback only)").contains("--addr"));
        let b = banner("http://127.0.0.1:9", "mem", "auth: off (loopback only)");
        assert!(b.contains("\n  auth: off (loopback only)\n"), "{b}");
        assert!(b.contains("turnstile --addr http://127.0.0.1:9 followup s1"), "{b}");
    }
}
