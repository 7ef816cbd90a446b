//! How the [`ClusterRouter`](super::ClusterRouter) reaches a worker's internal `turnstile.cluster.v1.Worker`
//! API: [`GrpcTransport`] (tonic channels, optionally TLS) in production, a fake in tests.

use std::collections::HashMap;
use std::sync::Mutex;

use std::time::Duration;
use turnstile_model::sync::lock;

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

/// Worker addresses a [`GrpcTransport`] keeps channels to by default; the least recently used one is closed
/// to make room for a new address (decision 0090).
pub const DEFAULT_MAX_CHANNELS: usize = 256;

/// tonic channels to workers, one per advertised address, opened lazily and kept: a channel reconnects
/// by itself, so a worker that restarts on the same address is reached again without a new entry. Workers
/// that come back on new addresses (a rescheduled pod) leave old ones behind: at most `max_channels` are
/// kept, the least recently used one dropped (closing its connection) when a new address needs room.
#[derive(Debug)]
pub struct GrpcTransport {
    channels: Mutex<Channels>,
    connect_timeout: Duration,
}

/// The channels by address, each with when it was last used (a counter of uses), and how new ones dial.
#[derive(Debug)]
struct Channels {
    /// TLS to the workers (`--cluster-tls-ca`); the name checked is the advertised host unless the config
    /// sets a domain. Replaced by [`GrpcTransport::set_tls`] when the files change.
    tls: Option<ClientTlsConfig>,
    by_addr: HashMap<String, (Channel, u64)>,
    uses: u64,
    max: usize,
}

impl Channels {
    /// `addr`'s channel, marked used now.
    fn get(&mut self, addr: &str) -> Option<Channel> {
        self.uses += 1;
        let uses = self.uses;
        self.by_addr.get_mut(addr).map(|(channel, used)| {
            *used = uses;
            channel.clone()
        })
    }

    /// Keeps `channel` for `addr`, dropping the least recently used ones past the bound.
    fn insert(&mut self, addr: &str, channel: Channel) {
        while self.by_addr.len() >= self.max {
            // At most `max` entries, scanned only when a new address comes: cheap next to dialing it.
            let Some(oldest) = self.by_addr.iter().min_by_key(|(_, (_, used))| *used).map(|(a, _)| a.clone()) else {
                break;
            };
            self.by_addr.remove(&oldest);
        }
        self.uses += 1;
        self.by_addr.insert(addr.to_owned(), (channel, self.uses));
    }
}

impl GrpcTransport {
    pub fn new(connect_timeout: Duration) -> Self {
        Self::with_max_channels(connect_timeout, DEFAULT_MAX_CHANNELS)
    }

    /// Keeps channels to at most `max` worker addresses (at least one).
    pub fn with_max_channels(connect_timeout: Duration, max: usize) -> Self {
        let channels = Channels { tls: None, by_addr: HashMap::new(), uses: 0, max: max.max(1) };
        Self { channels: Mutex::new(channels), connect_timeout }
    }

    /// The worker addresses it keeps channels to now.
    pub fn addresses(&self) -> Vec<String> {
        lock(&self.channels).by_addr.keys().cloned().collect()
    }

    /// Dials workers over TLS with `tls` (see `turnstile_ops::tls::client_config`).
    pub fn with_tls(connect_timeout: Duration, tls: ClientTlsConfig) -> Self {
        let transport = Self::new(connect_timeout);
        lock(&transport.channels).tls = Some(tls);
        transport
    }

    /// Dials with `tls` from now on (the cluster TLS files changed, decision 0159). The channels kept are
    /// dropped, since a channel reconnects with the config it was made with: the next call to each worker
    /// dials again with the new certificate. Calls in flight finish on their old channels.
    pub fn set_tls(&self, tls: ClientTlsConfig) {
        let mut channels = lock(&self.channels);
        channels.tls = Some(tls);
        channels.by_addr.clear();
    }

    fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = lock(&self.channels);
        if let Some(channel) = channels.get(addr) {
            return Ok(channel);
        }
        let scheme = if channels.tls.is_some() { "https" } else { "http" };
        let url = if addr.contains("://") { addr.to_owned() } else { format!("{scheme}://{addr}") };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|e| Status::unavailable(format!("worker address {addr:?} is not a valid URL: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &channels.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| Status::unavailable(format!("TLS to worker {addr:?} cannot be set up: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(addr, channel.clone());
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[tokio::test]
    async fn channels_to_old_addresses_are_dropped_least_recently_used_first() {
        let transport = GrpcTransport::with_max_channels(Duration::from_secs(1), 3);
        for addr in ["10.0.0.1:7500", "10.0.0.2:7500", "10.0.0.3:7500"] {
            transport.channel(addr).unwrap();
        }
        // The first worker is still in use; the second was rescheduled and came back on a new address.
        transport.channel("10.0.0.1:7500").unwrap();
        transport.channel("10.0.0.9:7500").unwrap();
        assert_eq!(sorted(transport.addresses()), ["10.0.0.1:7500", "10.0.0.3:7500", "10.0.0.9:7500"]);
        // However many addresses come and go, it keeps the bound.
        for i in 0..100 {
            transport.channel(&format!("10.1.0.{i}:7500")).unwrap();
        }
        assert_eq!(transport.addresses().len(), 3);
    }

    #[tokio::test]
    async fn new_tls_drops_the_channels_so_that_workers_are_dialled_again_with_it() {
        let transport = GrpcTransport::with_tls(Duration::from_secs(1), ClientTlsConfig::new());
        transport.channel("10.0.0.1:7500").unwrap();
        transport.channel("10.0.0.2:7500").unwrap();
        transport.set_tls(ClientTlsConfig::new().domain_name("worker"));
        assert!(transport.addresses().is_empty());
        transport.channel("10.0.0.1:7500").unwrap();
        assert_eq!(transport.addresses(), ["10.0.0.1:7500"]);
    }

    #[tokio::test]
    async fn a_known_address_keeps_its_channel() {
        let transport = GrpcTransport::new(Duration::from_secs(1));
        transport.channel("10.0.0.1:7500").unwrap();
        transport.channel("10.0.0.1:7500").unwrap();
        assert_eq!(transport.addresses(), ["10.0.0.1:7500"]);
    }
}
