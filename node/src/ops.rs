//! `--http ADDR` of every server: `/metrics`, `/healthz` and `/readyz` ([`turnstile_ops`]), and what
//! "ready" means for each kind of server (docs/OPERATIONS.md, "Readiness").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::connection::State;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use turnstile_model::sync::lock;
use turnstile_ops::Readiness;
use turnstile_worker::cluster::Leases;

use crate::NodeError;

/// `--http` when it is not given. Loopback: exposing metrics is the deployer's choice (`--http 0.0.0.0:9090`).
pub const DEFAULT_HTTP: &str = "127.0.0.1:9090";

/// Installs the metrics recorder first thing, so nothing recorded while a server starts is lost.
pub(crate) fn install_metrics() {
    if let Err(e) = turnstile_ops::install_metrics() {
        tracing::warn!(error = %e, "metrics are not recorded");
    }
}

/// The ops HTTP server of this process, if it runs.
#[derive(Debug)]
pub(crate) struct OpsHttp {
    addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
}

impl OpsHttp {
    /// Binds `--http` (`None`: [`DEFAULT_HTTP`]) and serves it with `readiness`. An explicit address that
    /// cannot be bound is an error; the default one being busy (several servers on one machine) is only a
    /// warning, and this process then serves no HTTP endpoints.
    pub(crate) async fn start(http: Option<&str>, readiness: Arc<dyn Readiness>) -> Result<Self, NodeError> {
        Self::start_with(http, readiness, axum::Router::new()).await
    }

    /// [`OpsHttp::start`] with `extra` routes beside the ops endpoints: a gateway's web console
    /// ([`turnstile_gateway::console`]).
    pub(crate) async fn start_with(
        http: Option<&str>,
        readiness: Arc<dyn Readiness>,
        extra: axum::Router,
    ) -> Result<Self, NodeError> {
        let listener = match (TcpListener::bind(http.unwrap_or(DEFAULT_HTTP)).await, http) {
            (Ok(l), _) => l,
            (Err(e), None) if e.kind() == std::io::ErrorKind::AddrInUse => {
                tracing::warn!("{DEFAULT_HTTP} is in use: no /metrics, /healthz, /readyz; pass --http ADDR");
                return Ok(Self { addr: None, stop: None });
            }
            (Err(e), Some(addr)) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(NodeError::HttpInUse { addr: addr.to_owned() });
            }
            (Err(cause), addr) => {
                return Err(NodeError::HttpListen { addr: addr.unwrap_or(DEFAULT_HTTP).to_owned(), cause });
            }
        };
        let addr = listener.local_addr().map_err(NodeError::LocalAddr)?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = turnstile_ops::serve_http_with(listener, readiness, extra, shutdown).await {
                tracing::error!(error = %e, "the ops HTTP server stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
        Ok(Self { addr: Some(addr), stop: Some(stop) })
    }

    /// The bound address, when the endpoints are served.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// For the banner.
    pub(crate) fn describe(&self) -> String {
        match self.addr {
            Some(addr) => format!("http://{addr} (/metrics /healthz /readyz)"),
            None => format!("off ({DEFAULT_HTTP} in use; pass --http ADDR)"),
        }
    }

    /// The web console's URL (a wildcard bind as loopback), or why there is none, for the banners.
    pub(crate) fn console(&self) -> String {
        match self.addr {
            Some(addr) => format!("{}/", crate::report::client_url(addr)),
            None => format!("off ({DEFAULT_HTTP} in use; pass --http ADDR)"),
        }
    }

    pub(crate) fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How often the NATS server is asked whether it still answers ([`NatsHealth`]).
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Not ready once the server has not answered a probe for this long: a few probes, so one slow answer (a
/// busy server, a leader election) does not take the process out of its Service.
const PROBE_STALE: Duration = Duration::from_secs(5);

/// Whether this process reaches NATS: its client is connected *and* the server it is connected to answers.
/// A connection can look open while its server hangs or is cut off by a partition: the client notices
/// only when its pings go unanswered (the journal pings every 5 s and gives up after three), so a core
/// NATS round trip to an inbox of this client is made every second and readiness fails once none has come
/// back for [`PROBE_STALE`]. With every address of `--nats` dead the process is not ready, and ready again
/// once one answers (decision 0076).
#[derive(Clone)]
pub(crate) struct NatsHealth {
    client: async_nats::Client,
    url: String,
    /// When the server last answered a probe (the start counts as an answer).
    answered: Arc<std::sync::Mutex<Instant>>,
}

impl NatsHealth {
    /// Starts the probe; it ends when the client is dropped.
    pub(crate) fn start(client: async_nats::Client, url: String) -> Self {
        let health = Self { client, url, answered: Arc::new(std::sync::Mutex::new(Instant::now())) };
        let (client, answered) = (health.client.clone(), Arc::downgrade(&health.answered));
        tokio::spawn(async move {
            use futures::StreamExt as _;
            let inbox = client.new_inbox();
            let Ok(mut echoes) = client.subscribe(inbox.clone()).await else { return };
            let mut probe: u64 = 0;
            loop {
                tokio::time::sleep(PROBE_EVERY).await;
                let Some(answered) = answered.upgrade() else { return };
                probe += 1;
                if client.publish(inbox.clone(), probe.to_string().into()).await.is_err() {
                    continue;
                }
                let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
                // Earlier probes may come back late: wait for this one.
                while let Ok(Some(echo)) = tokio::time::timeout_at(deadline, echoes.next()).await {
                    if echo.payload.as_ref() == probe.to_string().as_bytes() {
                        *lock(&answered) = Instant::now();
                        break;
                    }
                }
            }
        });
        health
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        let url = &self.url;
        match self.client.connection_state() {
            State::Connected => {}
            State::Disconnected => return Err(format!("NATS at {url} is disconnected")),
            State::Pending => return Err(format!("NATS at {url} is pending (connecting)")),
        }
        let silent = lock(&self.answered).elapsed();
        if silent >= PROBE_STALE {
            return Err(format!("NATS at {url} has not answered for {} s", silent.as_secs()));
        }
        Ok(())
    }
}

/// Ready while NATS answers ([`NatsHealth`]).
pub(crate) fn nats_ready(client: async_nats::Client, url: String) -> impl Fn() -> Result<(), String> + Send + Sync {
    let health = NatsHealth::start(client, url);
    move || health.check()
}

/// A worker is ready while NATS answers and it serves its share of the shards ([`Leases::serving`],
/// decision 0160): a rollout waits for each new worker to own shards before it moves on.
pub(crate) fn worker_ready(
    client: async_nats::Client,
    url: String,
    leases: Arc<Leases>,
) -> impl Fn() -> Result<(), String> + Send + Sync {
    let health = NatsHealth::start(client, url);
    move || {
        health.check()?;
        leases.serving()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_explicit_busy_http_port_fails_and_says_how_to_pick_another() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = OpsHttp::start(Some(&addr), Arc::new(turnstile_ops::AlwaysReady)).await.unwrap_err();
        assert_eq!(err.to_string(), format!("{addr} is in use; pass --http 127.0.0.1:0 or another port"));
    }
}
