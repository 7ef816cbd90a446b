//! Snapshots: a session's fold at some seq, so loading is snapshot + tail, not the whole history.
//!
//! A snapshot is only ever an optimisation: the log stays the source of truth. A snapshot that cannot
//! be decoded, has an unknown schema version, names another session, or is ahead of the log is ignored
//! with a warning and the log is folded from the start.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::log::{JournalError, SessionLog, read_all};
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;
use turnstile_model::state::{ProjectionError, SessionState};

/// The schema version of [`Snapshot`]; bump it whenever `SessionState`'s serialized shape changes.
pub const SNAPSHOT_VERSION: u32 = 2;

/// A session's fold at `state.last_seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub state: SessionState,
}

impl Snapshot {
    pub fn of(state: &SessionState) -> Self {
        Self { version: SNAPSHOT_VERSION, state: state.clone() }
    }

    pub fn seq(&self) -> u64 {
        self.state.last_seq
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail; an empty value would be ignored on load.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a stored snapshot of `session`; `None` (with a warning) for anything unusable.
    pub fn decode(session: &SessionRef, bytes: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let version = match serde_json::from_slice::<Version>(bytes) {
            Ok(v) => v.version,
            Err(e) => {
                tracing::warn!(%session, error = %e, "ignoring a corrupt snapshot; folding the log from the start");
                return None;
            }
        };
        if version != SNAPSHOT_VERSION {
            tracing::warn!(%session, version, expected = SNAPSHOT_VERSION, "ignoring a snapshot of an unknown schema version; folding the log from the start");
            return None;
        }
        match serde_json::from_slice::<Self>(bytes) {
            Ok(s) if &s.state.session == session => Some(s),
            Ok(s) => {
                tracing::warn!(%session, other = %s.state.session, "ignoring a snapshot of another session");
                None
            }
            Err(e) => {
                tracing::warn!(%session, error = %e, "ignoring a corrupt snapshot; folding the log from the start");
                None
            }
        }
    }
}

/// Where snapshots are kept (the `turnstile_snapshots` KV bucket in the cluster).
#[async_trait]
pub trait SnapshotStore: Send + Sync + 'static {
    /// The latest usable snapshot of `session`, if any. Unusable ones are `Ok(None)`.
    async fn load(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError>;

    /// Replaces the stored snapshot of its session.
    async fn save(&self, snapshot: &Snapshot) -> Result<(), JournalError>;
}

/// No snapshots: every load folds the whole log (the embedded journal, where reads are from memory).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSnapshots;

#[async_trait]
impl SnapshotStore for NoSnapshots {
    async fn load(&self, _session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        Ok(None)
    }

    async fn save(&self, _snapshot: &Snapshot) -> Result<(), JournalError> {
        Ok(())
    }
}

/// Snapshots in memory, stored encoded so loads go through the same decoding as a real store.
#[derive(Debug, Default)]
pub struct MemorySnapshots {
    entries: Mutex<HashMap<SessionRef, Vec<u8>>>,
}

impl MemorySnapshots {
    /// Overwrites the raw stored bytes of `session` (for tests of corrupt snapshots).
    pub fn put_raw(&self, session: &SessionRef, bytes: Vec<u8>) {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(session.clone(), bytes);
    }
}

#[async_trait]
impl SnapshotStore for MemorySnapshots {
    async fn load(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        let bytes = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(session).cloned();
        Ok(bytes.and_then(|b| Snapshot::decode(session, &b)))
    }

    async fn save(&self, snapshot: &Snapshot) -> Result<(), JournalError> {
        self.put_raw(&snapshot.state.session, snapshot.encode());
        Ok(())
    }
}

/// Why a session could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("the log of session {session} cannot be folded: {source}")]
    Projection { session: SessionRef, source: ProjectionError },
}

/// Loads `session`'s fold: the latest usable snapshot plus the events after it, or the whole log.
pub async fn load_state(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
    dedup_horizon: usize,
) -> Result<SessionState, LoadError> {
    Ok(load_state_keeping(log, snapshots, session, dedup_horizon, u64::MAX).await?.0)
}

/// [`load_state`], also returning the events with seq ≥ `keep_from`, from *one* read of the log: from the
/// snapshot's seq + 1 or `keep_from`, whichever is lower (a Watch resuming at `after_seq` needs both the
/// state and the events it missed).
pub async fn load_state_keeping(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
    dedup_horizon: usize,
    keep_from: u64,
) -> Result<(SessionState, Vec<Envelope>), LoadError> {
    let keep = |events: Vec<Envelope>| events.into_iter().filter(|e| e.seq >= keep_from).collect::<Vec<_>>();
    if let Some(snapshot) = snapshots.load(session).await? {
        let seq = snapshot.seq();
        let events = read_all(log, session, (seq + 1).min(keep_from.max(1))).await?;
        // A snapshot ahead of the log (the log was reset) or that the tail does not follow is unusable.
        let mut state = snapshot.state;
        let fits = log.last_seq(session).await? >= seq;
        if fits && events.iter().filter(|e| e.seq > seq).try_for_each(|e| state.apply(e)).is_ok() {
            return Ok((state, keep(events)));
        }
        tracing::warn!(%session, snapshot_seq = seq, "snapshot does not fit the log; folding the log from the start");
    }
    let events = read_all(log, session, 1).await?;
    let state = SessionState::fold(session.clone(), dedup_horizon, &events)
        .map_err(|source| LoadError::Projection { session: session.clone(), source })?;
    Ok((state, keep(events)))
}
