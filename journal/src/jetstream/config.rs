//! [`JetStreamConfig`] and the event streams it implies: created when missing, verified when present.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::{Config as StreamConfig, DiscardPolicy, StorageType};

use super::subjects;
use crate::log::JournalError;

/// Where the JetStream journal lives and how it is laid out (ARCHITECTURE "JetStream layout").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JetStreamConfig {
    /// The NATS server(s), e.g. `nats://127.0.0.1:4222` (comma-separated for several).
    pub url: String,
    /// Event streams `TURNSTILE_EVENTS_<p>`, p = 0..partitions. Part of the layout: changing it moves
    /// sessions to other streams.
    pub partitions: u32,
    /// Replicas per stream (1 for dev, 3 in production).
    pub replicas: usize,
    /// Virtual shards V; a session's shard is a stable hash mod V and its partition is shard mod P.
    pub shards: u32,
    /// Bound on the initial connect: an unreachable server is reported, not waited for.
    pub connect_timeout: Duration,
    /// Bound on each JetStream request (publish ack, message get, stream info).
    pub request_timeout: Duration,
    /// How the NATS connection authenticates and is encrypted (`--nats-creds`, `--nats-ca`, …).
    pub security: NatsSecurity,
    /// Limits the server enforces on each event stream (`[journal] max_age_ms`, `max_bytes`).
    pub retention: Retention,
}

/// Retention limits of the event streams (decision 0027). Not part of the layout: an existing stream
/// whose limits differ is updated to these at start-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Events older than this are removed by the server (whole sessions that were idle that long, and the
    /// oldest events of longer-lived ones).
    pub max_age: Option<Duration>,
    /// Bytes a stream may hold; with it set, the stream refuses new messages when full (discard new), so
    /// nothing acknowledged is ever dropped to make room.
    pub max_bytes: Option<u64>,
}

/// Credentials and TLS of the NATS connection; all optional (a plain `nats://` server needs none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsSecurity {
    /// A `.creds` file (user JWT + NKey seed, as `nsc` writes them).
    pub creds: Option<PathBuf>,
    /// PEM CA(s) that signed the server's certificate. Setting it requires TLS.
    pub ca: Option<PathBuf>,
    /// Client certificate and key for servers that verify clients (`verify: true`). Setting them
    /// requires TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl NatsSecurity {
    /// Whether the connection must be TLS (a CA or a client certificate is configured).
    pub fn requires_tls(&self) -> bool {
        self.ca.is_some() || self.client_cert.is_some()
    }
}

impl JetStreamConfig {
    /// The defaults for `url`: one partition, one replica, 256 virtual shards.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            partitions: 1,
            replicas: 1,
            shards: 256,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            security: NatsSecurity::default(),
            retention: Retention::default(),
        }
    }

    pub(super) fn validate(&self) -> Result<(), JournalError> {
        if self.partitions == 0 || self.shards == 0 || self.replicas == 0 {
            return Err(JournalError::Storage(format!(
                "JetStream config needs partitions, shards and replicas of at least 1 (got {}, {}, {})",
                self.partitions, self.shards, self.replicas
            )));
        }
        if self.shards < self.partitions {
            return Err(JournalError::Storage(format!(
                "JetStream config has {} shards for {} partitions; some partitions would never be used: \
                 configure at least as many shards as partitions",
                self.shards, self.partitions
            )));
        }
        Ok(())
    }

    /// The configuration of partition `p`'s stream.
    pub fn stream_config(&self, partition: u32) -> StreamConfig {
        StreamConfig {
            name: subjects::stream_name(partition),
            subjects: vec![subjects::stream_subjects(partition)],
            storage: StorageType::File,
            num_replicas: self.replicas,
            // Multi-event appends are atomic batches; reads and `last_seq` may use direct gets.
            allow_atomic_publish: true,
            allow_direct: true,
            max_age: self.retention.max_age.unwrap_or_default(),
            max_bytes: self.retention.max_bytes.and_then(|b| i64::try_from(b).ok()).unwrap_or(-1),
            // Full means refuse: dropping the oldest events would cut sessions' logs from the front.
            discard: DiscardPolicy::New,
            ..Default::default()
        }
    }

    /// The configuration of partition `p`'s archive stream (decision 0181): the event stream's layout
    /// and retention under the archive's name and subjects, so the archive never outlives the log by age
    /// and a full archive refuses archiving, never appends.
    pub fn archive_stream_config(&self, partition: u32) -> StreamConfig {
        StreamConfig {
            name: subjects::archive_stream_name(partition),
            subjects: vec![subjects::archive_stream_subjects(partition)],
            ..self.stream_config(partition)
        }
    }
}

/// Brings an existing stream's retention limits to the configured ones (they are operational settings,
/// not layout: changing them must not need a new stream).
async fn update_retention(
    js: &jetstream::Context,
    want: &StreamConfig,
    have: StreamConfig,
) -> Result<(), JournalError> {
    if have.max_age == want.max_age && have.max_bytes == want.max_bytes && have.discard == want.discard {
        return Ok(());
    }
    let name = want.name.clone();
    tracing::info!(
        stream = %name,
        max_age_ms = want.max_age.as_millis() as u64,
        max_bytes = want.max_bytes,
        "updating the event stream's retention limits"
    );
    let updated = StreamConfig { max_age: want.max_age, max_bytes: want.max_bytes, discard: want.discard, ..have };
    js.update_stream(updated).await.map_err(|e| {
        JournalError::Storage(format!(
            "cannot set the retention limits of JetStream stream {name} ([journal] max_age_ms, max_bytes): {e}"
        ))
    })?;
    Ok(())
}

/// Creates the stream `want` describes (a partition's event or archive stream), or checks that the
/// existing one has that layout. A mismatch is refused, never silently updated: another deployment may
/// depend on the stream as it is.
pub(super) async fn ensure_stream(
    js: &jetstream::Context,
    want: StreamConfig,
) -> Result<jetstream::stream::Stream, JournalError> {
    let name = want.name.clone();
    match js.get_stream(&name).await {
        Ok(mut stream) => {
            let info = stream.info().await.map_err(|e| unavailable(&name, e))?;
            verify(&want, &info.config)?;
            update_retention(js, &want, info.config.clone()).await?;
            Ok(stream)
        }
        Err(e) if is_not_found(&e) => match js.create_stream(want.clone()).await {
            Ok(stream) => Ok(stream),
            // Another process created it in between: verify what it made.
            Err(create) => match js.get_stream(&name).await {
                Ok(mut stream) => {
                    let info = stream.info().await.map_err(|e| unavailable(&name, e))?;
                    verify(&want, &info.config)?;
                    Ok(stream)
                }
                Err(_) => Err(JournalError::Storage(format!("could not create JetStream stream {name}: {create}"))),
            },
        },
        Err(e) => Err(unavailable(&name, e)),
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(err)
        if err.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

fn unavailable(name: &str, e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("could not read JetStream stream {name}: {e}"))
}

/// Compares the fields the journal relies on; the first difference is reported with the fix.
fn verify(want: &StreamConfig, have: &StreamConfig) -> Result<(), JournalError> {
    let name = &want.name;
    let differs = |field: &str, have: String, want: String, fix: &str| {
        JournalError::Storage(format!(
            "JetStream stream {name} exists with {field} = {have} but Turnstile needs {want}; {fix}"
        ))
    };
    let mut have_subjects = have.subjects.clone();
    have_subjects.sort();
    if have_subjects != want.subjects {
        return Err(differs(
            "subjects",
            format!("{have_subjects:?}"),
            format!("{:?}", want.subjects),
            "the partition count or naming differs from the deployment that made it: configure the same \
             partitions, or move the data and delete the stream",
        ));
    }
    if have.storage != want.storage {
        return Err(differs(
            "storage",
            format!("{:?}", have.storage),
            format!("{:?}", want.storage),
            "event streams must be file-backed: recreate the stream with file storage",
        ));
    }
    if have.num_replicas != want.num_replicas {
        return Err(differs(
            "replicas",
            have.num_replicas.to_string(),
            want.num_replicas.to_string(),
            "configure the journal's replicas to match, or change the stream's replicas on the server",
        ));
    }
    if !have.allow_atomic_publish {
        return Err(differs(
            "allow_atomic_publish",
            "false".into(),
            "true".into(),
            "multi-event appends are atomic batches: enable atomic publish on the stream (server 2.12+)",
        ));
    }
    if !have.allow_direct {
        return Err(differs("allow_direct", "false".into(), "true".into(), "enable direct get on the stream"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_differs_is_named_with_its_field() {
        let config = JetStreamConfig::new("nats://127.0.0.1:1");
        let want = config.stream_config(0);
        assert!(verify(&want, &want).is_ok());
        let mut other = want.clone();
        other.num_replicas = 3;
        let err = verify(&want, &other).unwrap_err().to_string();
        assert!(err.contains("replicas = 3") && err.contains("TURNSTILE_EVENTS_0"), "{err}");
        let mut other = want.clone();
        other.storage = StorageType::Memory;
        assert!(verify(&want, &other).unwrap_err().to_string().contains("storage"));
        let mut other = want.clone();
        other.subjects = vec!["elsewhere.>".into()];
        assert!(verify(&want, &other).unwrap_err().to_string().contains("subjects"));
    }

    #[test]
    fn degenerate_layouts_are_refused() {
        let mut config = JetStreamConfig::new("nats://x");
        assert!(config.validate().is_ok());
        config.partitions = 0;
        assert!(config.validate().is_err());
        config.partitions = 4;
        config.shards = 2;
        assert!(config.validate().is_err());
    }
}
