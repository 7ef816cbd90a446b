//! Snapshots in the JetStream KV bucket `turnstile_snapshots` (one key per session, latest only).

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;

use super::log::Positions;
use crate::log::JournalError;
use crate::snapshot::{Snapshot, SnapshotStore};
use turnstile_model::message::SessionRef;

/// The bucket every node reads and the owner writes.
pub const SNAPSHOT_BUCKET: &str = "turnstile_snapshots";

/// [`SnapshotStore`] on a JetStream KV bucket: the full snapshot under `<tenant>.<id>` (an owner's load)
/// and a read snapshot ([`Snapshot::for_reads`]) under `<tenant>.<id>.read` (GetInbox, GetSession, Watch):
/// a few KiB instead of the up to a few MiB the dedup index and the transcript make (decision 0020).
pub struct KvSnapshots {
    store: kv::Store,
    /// Where the log of this process saw each session end, to record a snapshot's stream position.
    positions: Option<Positions>,
}

impl std::fmt::Debug for KvSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvSnapshots").field("bucket", &SNAPSHOT_BUCKET).finish()
    }
}

impl KvSnapshots {
    /// Opens the bucket, creating it (file storage, `replicas`, history 1) if it does not exist. An
    /// existing bucket with other replicas is refused rather than silently changed.
    pub async fn open(client: &async_nats::Client, replicas: usize) -> Result<Self, JournalError> {
        let config = kv::Config {
            bucket: SNAPSHOT_BUCKET.to_owned(),
            description: "Turnstile session snapshots (projection + driver state at a seq)".to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas.max(1),
            ..Default::default()
        };
        let store = super::open_bucket_with(client, config).await?;
        // A bucket this call created has the configured replicas; one that existed may not. The status waits
        // out a leader election of the bucket's stream as the bucket did.
        let status =
            super::while_starting("the snapshot bucket", || async { store.status().await.map_err(unavailable) })
                .await?;
        let have = status.info.config.num_replicas.max(1);
        if have != replicas.max(1) {
            return Err(JournalError::Storage(format!(
                "KV bucket {SNAPSHOT_BUCKET} has {have} replicas but {replicas} are configured; \
                 change the configuration or recreate the bucket (snapshots can be rebuilt from the log)"
            )));
        }
        Ok(Self { store, positions: None })
    }

    /// Records in each snapshot the stream sequence of its last event when `positions` (the log of the
    /// same process) knows it, so readers start their tail there.
    pub fn with_positions(mut self, positions: Positions) -> Self {
        self.positions = Some(positions);
        self
    }
}

/// Tenants and session ids are `[A-Za-z0-9_-]`, so `tenant.id` is a valid, unambiguous KV key.
fn key(session: &SessionRef) -> String {
    format!("{}.{}", session.tenant, session.id)
}

/// The read snapshot's key: three tokens, so it is never a session's key.
fn read_key(session: &SessionRef) -> String {
    format!("{}.{}.read", session.tenant, session.id)
}

fn unavailable(e: impl std::fmt::Display) -> JournalError {
    JournalError::Unavailable(format!("snapshot store: {e}"))
}

#[async_trait]
impl SnapshotStore for KvSnapshots {
    async fn load(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        let bytes = self.store.get(key(session)).await.map_err(unavailable)?;
        Ok(bytes.and_then(|b| Snapshot::decode(session, &b)))
    }

    async fn save(&self, snapshot: &Snapshot) -> Result<(), JournalError> {
        let session = &snapshot.state.session;
        let position = snapshot.position.or_else(|| self.positions.as_ref()?.stream_seq_of(session, snapshot.seq()));
        let snapshot = Snapshot { position, ..snapshot.clone() };
        // Both encoded before either is written. Two puts, each a whole snapshot: if only one lands, each
        // key still holds a fold that fits the log, at most one snapshot interval older than the other.
        let (reads, full) = snapshot.encode_both()?;
        self.store.put(read_key(session), reads.into()).await.map_err(unavailable)?;
        self.store.put(key(session), full.into()).await.map_err(unavailable)?;
        Ok(())
    }

    async fn delete(&self, session: &SessionRef) -> Result<(), JournalError> {
        // Purge, not delete: a delete marker would keep the key's last value in the bucket's history.
        // The full snapshot first, so an interruption leaves at most a read snapshot, which a reader
        // whose log no longer reaches its seq or position ignores.
        self.store.purge(key(session)).await.map_err(unavailable)?;
        self.store.purge(read_key(session)).await.map_err(unavailable)?;
        Ok(())
    }

    async fn load_for_reads(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        let bytes = self.store.get(read_key(session)).await.map_err(unavailable)?;
        match bytes.and_then(|b| Snapshot::decode_any(session, &b)) {
            Some(snapshot) => Ok(Some(snapshot)),
            // Written before read snapshots existed, or the read put failed: the full one serves too.
            None => self.load(session).await,
        }
    }
}
