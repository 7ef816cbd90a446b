//! Opening the JetStream journal every server on NATS (`dev --nats`, `gateway`, `worker`) starts with.

use turnstile_journal::jetstream::Retention;
use turnstile_journal::jetstream::{KvSnapshots, NatsSecurity};
use turnstile_journal::{JetStreamConfig, JetStreamLog, NatsBus};

use crate::NodeError;

/// The JetStream journal, the live bus on its connection and the snapshot bucket. The errors say what to
/// do: an unreachable server names the URL and how to start one; a stream with another layout names the
/// field.
pub(crate) async fn open_nats(
    nats: &NatsOptions,
    partitions: u32,
    replicas: usize,
    shards: u32,
    journal: &turnstile_config::JournalConfig,
) -> Result<(JetStreamLog, NatsBus, KvSnapshots), NodeError> {
    let url = nats.url.as_str();
    let mut config = JetStreamConfig::new(url.to_owned());
    config.retention = Retention { max_age: journal.max_age(), max_bytes: journal.max_bytes() };
    config.partitions = partitions;
    config.replicas = replicas;
    config.shards = shards;
    config.security = nats.security.clone();
    let log = JetStreamLog::connect(config).await.map_err(|e| NodeError::nats(url, e))?;
    let bus = NatsBus::new(log.client().clone());
    let snapshots = KvSnapshots::open(log.client(), replicas)
        .await
        .map_err(|e| NodeError::nats(url, e))?
        .with_positions(log.positions());
    Ok((log, bus, snapshots))
}

/// [`open_nats`] laid out by the configuration's `[cluster]` (partitions, replicas, shards) and `[journal]`:
/// the journal of a gateway or a worker.
pub(crate) async fn open_cluster_nats(
    nats: &NatsOptions,
    config: &turnstile_config::Config,
) -> Result<(JetStreamLog, NatsBus, KvSnapshots), NodeError> {
    let c = &config.cluster;
    open_nats(nats, c.partitions, crate::replicas(config), c.shards, &config.journal).await
}

/// `--nats URL` and the credentials and TLS of that connection (`--nats-creds`, `--nats-ca`,
/// `--nats-tls-cert/--nats-tls-key`).
#[derive(Clone, Debug, Default)]
pub struct NatsOptions {
    /// NATS server URL(s), comma-separated for several.
    pub url: String,
    pub security: NatsSecurity,
}

impl NatsOptions {
    /// A plain connection to `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), security: NatsSecurity::default() }
    }
}
