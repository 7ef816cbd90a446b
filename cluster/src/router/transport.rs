//! How the [`ClusterRouter`](super::ClusterRouter) reaches a worker's internal `turnstile.cluster.v1.Worker`
//! API: [`GrpcTransport`] (tonic channels, optionally TLS) in production, a fake in tests.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use turnstile_ops::trace::{TRACEPARENT, current_traceparent};
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::worker_client::WorkerClient;

/// How the router reaches a worker: gRPC in production, a fake in tests.
#[async_trait]
pub trait WorkerTransport: Send + Sync + 'static {
    /// Calls `Execute` on the worker at `addr`; `timeout` bounds the call.
    async fn execute(
        &self,
        addr: &str,
        request: cpb::ExecuteRequest,
        timeout: Duration,
    ) -> Result<cpb::ExecuteReply, Status>;
}

/// tonic channels to workers, one per advertised address, opened lazily and kept: a channel reconnects
/// by itself, so a worker that restarts on the same address is reached again without a new entry.
#[derive(Debug)]
pub struct GrpcTransport {
    channels: Mutex<HashMap<String, Channel>>,
    connect_timeout: Duration,
    /// TLS to the workers (`--cluster-tls-ca`); the name checked is the advertised host unless the config
    /// sets a domain.
    tls: Option<ClientTlsConfig>,
}

impl GrpcTransport {
    pub fn new(connect_timeout: Duration) -> Self {
        Self { channels: Mutex::new(HashMap::new()), connect_timeout, tls: None }
    }

    /// Dials workers over TLS with `tls` (see `turnstile_ops::tls::client_config`).
    pub fn with_tls(connect_timeout: Duration, tls: ClientTlsConfig) -> Self {
        Self { tls: Some(tls), ..Self::new(connect_timeout) }
    }

    fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = if addr.contains("://") { addr.to_owned() } else { format!("{scheme}://{addr}") };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|e| Status::unavailable(format!("worker address {addr:?} is not a valid URL: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| Status::unavailable(format!("TLS to worker {addr:?} cannot be set up: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }
}

#[async_trait]
impl WorkerTransport for GrpcTransport {
    async fn execute(
        &self,
        addr: &str,
        request: cpb::ExecuteRequest,
        timeout: Duration,
    ) -> Result<cpb::ExecuteReply, Status> {
        let mut client = WorkerClient::new(self.channel(addr)?);
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        // The worker learns which internal API version asks (SPEC §18, rolling upgrades).
        request.metadata_mut().insert(crate::codec::API_KEY, MetadataValue::from(crate::codec::API_VERSION));
        // The worker's spans join this request's trace (the current span is the routing attempt's).
        if let Some(tp) = current_traceparent().and_then(|tp| MetadataValue::try_from(tp).ok()) {
            request.metadata_mut().insert(TRACEPARENT, tp);
        }
        client.execute(request).await.map(tonic::Response::into_inner)
    }
}
