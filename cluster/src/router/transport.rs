//! How the [`ClusterRouter`](super::ClusterRouter) reaches a worker's internal `turnstile.cluster.v1.Worker`
//! API: [`GrpcTransport`] (tonic channels, optionally TLS) in production, a fake in tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use turnstile_model::sync::lock;

use async_trait::async_trait;
use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use turnstile_ops::trace::{TRACEPARENT, current_traceparent};
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::worker_client::WorkerClient;

use super::stream::{Answer, CommandStream};

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

/// How long a worker that answered UNIMPLEMENTED for `ExecuteStream` (an older build, during a rolling
/// upgrade) is called with unary `Execute` before the stream is tried again: a new build may have replaced
/// it on the same address by then, and one refused opening per period costs one round trip.
pub const UNARY_FOR: Duration = Duration::from_secs(60);

/// Commands whose encoding is larger than this go as unary calls: a stream's calls share one flow-control
/// window (a large import would hold the small commands behind it), and a stream message over the worker's
/// decoding limit would end the stream for every call on it, where a unary call fails alone.
pub const STREAMED_MAX_BYTES: usize = 64 * 1024;

/// The channels by address, each with when it was last used (a counter of uses), and how new ones dial.
#[derive(Debug)]
struct Channels {
    /// TLS to the workers (`--cluster-tls-ca`); the name checked is the advertised host unless the config
    /// sets a domain. Replaced by [`GrpcTransport::set_tls`] when the files change.
    tls: Option<ClientTlsConfig>,
    by_addr: HashMap<String, Worker>,
    uses: u64,
    max: usize,
}

/// What is kept per worker address.
#[derive(Debug)]
struct Worker {
    channel: Channel,
    /// The last use (a counter of uses), for dropping the least recently used address.
    used: u64,
    /// The command stream over `channel`, once a call opened it; replaced when it has ended. Dropped with
    /// the entry, which closes the stream once its calls in flight are done.
    stream: Option<Arc<CommandStream>>,
    /// Set when the worker answered UNIMPLEMENTED for the stream: unary calls until then.
    unary_until: Option<Instant>,
}

/// How one call goes to a worker.
enum Route {
    Unary(Channel),
    Stream(Arc<CommandStream>),
}

impl Channels {
    /// `addr`'s entry, marked used now.
    fn get(&mut self, addr: &str) -> Option<&mut Worker> {
        self.uses += 1;
        let uses = self.uses;
        let worker = self.by_addr.get_mut(addr)?;
        worker.used = uses;
        Some(worker)
    }

    /// Keeps `channel` for `addr`, dropping the least recently used ones past the bound.
    fn insert(&mut self, addr: &str, channel: Channel) -> &mut Worker {
        while self.by_addr.len() >= self.max {
            // At most `max` entries, scanned only when a new address comes: cheap next to dialing it.
            let Some(oldest) = self.by_addr.iter().min_by_key(|(_, w)| w.used).map(|(a, _)| a.clone()) else {
                break;
            };
            self.by_addr.remove(&oldest);
        }
        self.uses += 1;
        let worker = Worker { channel, used: self.uses, stream: None, unary_until: None };
        self.by_addr.entry(addr.to_owned()).insert_entry(worker).into_mut()
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
        Ok(self.worker(&mut channels, addr)?.channel.clone())
    }

    /// `addr`'s entry, dialing it (lazily) when it is new.
    fn worker<'a>(&self, channels: &'a mut Channels, addr: &str) -> Result<&'a mut Worker, Status> {
        if channels.by_addr.contains_key(addr) {
            // Found just above, under the same lock.
            return channels.get(addr).ok_or_else(|| Status::internal(format!("worker {addr:?} vanished")));
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
        Ok(channels.insert(addr, channel))
    }

    /// How a call of `bytes` encoded bytes goes to `addr`: on its command stream (opened now if it has
    /// none, or a new one if it ended) unless the call is large or the worker is an older build.
    fn route(&self, addr: &str, bytes: usize) -> Result<Route, Status> {
        let mut channels = lock(&self.channels);
        let worker = self.worker(&mut channels, addr)?;
        if bytes > STREAMED_MAX_BYTES || worker.unary_until.is_some_and(|until| Instant::now() < until) {
            return Ok(Route::Unary(worker.channel.clone()));
        }
        if let Some(stream) = worker.stream.as_ref().filter(|s| !s.has_ended()) {
            return Ok(Route::Stream(stream.clone()));
        }
        let stream = Arc::new(CommandStream::open(worker.channel.clone(), addr));
        worker.stream = Some(stream.clone());
        worker.unary_until = None;
        Ok(Route::Stream(stream))
    }

    /// `addr` answered UNIMPLEMENTED for the stream: unary calls for [`UNARY_FOR`].
    fn use_unary(&self, addr: &str) {
        if let Some(worker) = lock(&self.channels).get(addr) {
            worker.stream = None;
            worker.unary_until = Some(Instant::now() + UNARY_FOR);
        }
    }

    /// Whether calls to `addr` go unary now (its worker predates the command stream); for tests.
    pub fn is_unary(&self, addr: &str) -> bool {
        lock(&self.channels).by_addr.get(addr).is_some_and(|w| w.unary_until.is_some_and(|u| Instant::now() < u))
    }
}

/// One unary `Execute` over `channel`.
async fn unary(
    channel: Channel,
    request: cpb::ExecuteRequest,
    timeout: Duration,
    traceparent: Option<String>,
) -> Result<cpb::ExecuteReply, Status> {
    let mut client = WorkerClient::new(channel);
    let mut request = tonic::Request::new(request);
    request.set_timeout(timeout);
    // The worker learns which internal API version asks (SPEC §18, rolling upgrades).
    request.metadata_mut().insert(crate::codec::API_KEY, MetadataValue::from(crate::codec::API_VERSION));
    // The worker's spans join this request's trace (the current span is the routing attempt's).
    if let Some(tp) = traceparent.and_then(|tp| MetadataValue::try_from(tp).ok()) {
        request.metadata_mut().insert(TRACEPARENT, tp);
    }
    client.execute(request).await.map(tonic::Response::into_inner)
}

#[async_trait]
impl WorkerTransport for GrpcTransport {
    async fn execute(
        &self,
        addr: &str,
        request: cpb::ExecuteRequest,
        timeout: Duration,
    ) -> Result<cpb::ExecuteReply, Status> {
        // The worker's spans join this request's trace (the current span is the routing attempt's).
        let traceparent = current_traceparent();
        let stream = match self.route(addr, request.encoded_len())? {
            Route::Unary(channel) => return unary(channel, request, timeout, traceparent).await,
            Route::Stream(stream) => stream,
        };
        let start = Instant::now();
        match stream.call(request, timeout, traceparent.clone()).await {
            Answer::Done(result) => result,
            Answer::Unsupported(request) => {
                self.use_unary(addr);
                let channel = self.channel(addr)?;
                unary(channel, request, timeout.saturating_sub(start.elapsed()), traceparent).await
            }
        }
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
