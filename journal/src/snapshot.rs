//! Snapshots: a session's fold at some seq, so loading is snapshot + tail, not the whole history.
//!
//! A snapshot is only ever an optimisation: the log stays the source of truth. A snapshot that cannot
//! be decoded, has an unknown schema version, names another session, or is ahead of the log is ignored
//! with a warning and the log is folded from the start.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::log::{JournalError, SessionLog};
use crate::sync::lock;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;
use turnstile_model::state::{AcceptedIndex, ProjectionError, SessionState};
use turnstile_model::transcript::Transcript;

/// The schema version of [`Snapshot`]; bump it whenever `SessionState`'s serialized shape changes.
/// 3: the dedup index is stored compactly (each id once, fingerprints in hex; decision 0020).
pub const SNAPSHOT_VERSION: u32 = 3;

/// A session's fold at `state.last_seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub state: SessionState,
    /// The backend's position of event `state.last_seq` (JetStream: its stream sequence), when the store
    /// knew it at save: a reader starts the tail just after it instead of locating the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// A read snapshot ([`Snapshot::for_reads`]): the state without the dedup index and the transcript.
    /// Only reads load it; an owner would lose its idempotence index, so [`Snapshot::decode`] refuses it
    /// where a full one is expected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub for_reads: bool,
}

/// `state` as reads see it: without the dedup index (only an owner deciding a retry needs it) and the
/// transcript (only model requests need it). These are the two parts of a fold that grow with a session's
/// history up to their bounds (10,000 ids; 101 turns); the rest is bounded by the inbox limits.
pub fn reads_view(mut state: SessionState) -> SessionState {
    state.accepted = AcceptedIndex::new(1);
    state.transcript = Transcript::new(state.transcript.keep_turns());
    state
}

impl Snapshot {
    pub fn of(state: &SessionState) -> Self {
        Self { version: SNAPSHOT_VERSION, state: state.clone(), position: None, for_reads: false }
    }

    /// The read snapshot of the same fold (see [`reads_view`]).
    pub fn for_reads(&self) -> Self {
        // The clone copies the index and transcript only to drop them; a snapshot is taken every 100
        // events, and this keeps the fold's shape (fields others add) out of this function.
        Self { state: reads_view(self.state.clone()), for_reads: true, ..self.clone() }
    }

    pub fn seq(&self) -> u64 {
        self.state.last_seq
    }

    /// The stored form. Serializing this plain data should never fail; if it ever does, the error says so
    /// and the caller writes no snapshot (a stored empty value would only be ignored on load, hiding the
    /// fault).
    pub fn encode(&self) -> Result<Vec<u8>, SnapshotEncodeError> {
        serde_json::to_vec(self).map_err(|e| SnapshotEncodeError {
            session: self.state.session.clone(),
            seq: self.seq(),
            detail: e.to_string(),
        })
    }

    /// The stored forms of the read snapshot and of the full one, both or neither.
    pub fn encode_both(&self) -> Result<(Vec<u8>, Vec<u8>), SnapshotEncodeError> {
        Ok((self.for_reads().encode()?, self.encode()?))
    }

    /// Decodes a stored full snapshot of `session`; `None` (with a warning) for anything unusable, a read
    /// snapshot included.
    pub fn decode(session: &SessionRef, bytes: &[u8]) -> Option<Self> {
        let snapshot = Self::decode_any(session, bytes)?;
        if snapshot.for_reads {
            tracing::warn!(%session, "ignoring a read snapshot where a full one is expected; folding the log from the start");
            return None;
        }
        Some(snapshot)
    }

    /// Decodes a stored snapshot of `session`, full or read; `None` (with a warning) for anything unusable.
    pub fn decode_any(session: &SessionRef, bytes: &[u8]) -> Option<Self> {
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

/// A snapshot that could not be serialized: nothing of it is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the snapshot of {session} at seq {seq} cannot be encoded, so none is written: {detail}")]
pub struct SnapshotEncodeError {
    pub session: SessionRef,
    pub seq: u64,
    pub detail: String,
}

impl From<SnapshotEncodeError> for JournalError {
    fn from(e: SnapshotEncodeError) -> Self {
        JournalError::Storage(e.to_string())
    }
}

/// Where snapshots are kept (the `turnstile_snapshots` KV bucket in the cluster).
#[async_trait]
pub trait SnapshotStore: Send + Sync + 'static {
    /// The latest usable snapshot of `session`, if any. Unusable ones are `Ok(None)`.
    async fn load(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError>;

    /// Replaces the stored snapshot of its session (and, in stores that keep one, its read snapshot).
    async fn save(&self, snapshot: &Snapshot) -> Result<(), JournalError>;

    /// Removes every snapshot of `session` (the full one and the read one), for `DeleteSession`. Removing
    /// none is not an error.
    async fn delete(&self, session: &SessionRef) -> Result<(), JournalError>;

    /// The latest usable snapshot for reads: a read snapshot ([`Snapshot::for_reads`]) where the store keeps
    /// them, else the full one.
    async fn load_for_reads(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        self.load(session).await
    }
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

    async fn delete(&self, _session: &SessionRef) -> Result<(), JournalError> {
        Ok(())
    }
}

/// Snapshots in memory, stored encoded so loads go through the same decoding as a real store; like the KV
/// store it keeps a read snapshot beside each full one.
#[derive(Debug, Default)]
pub struct MemorySnapshots {
    entries: Mutex<HashMap<SessionRef, Vec<u8>>>,
    reads: Mutex<HashMap<SessionRef, Vec<u8>>>,
}

impl MemorySnapshots {
    /// Overwrites the raw stored bytes of `session`'s full snapshot (for tests of corrupt snapshots).
    pub fn put_raw(&self, session: &SessionRef, bytes: Vec<u8>) {
        lock(&self.entries).insert(session.clone(), bytes);
    }
}

#[async_trait]
impl SnapshotStore for MemorySnapshots {
    async fn load(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        let bytes = lock(&self.entries).get(session).cloned();
        Ok(bytes.and_then(|b| Snapshot::decode(session, &b)))
    }

    async fn save(&self, snapshot: &Snapshot) -> Result<(), JournalError> {
        let (reads, full) = snapshot.encode_both()?;
        lock(&self.reads).insert(snapshot.state.session.clone(), reads);
        self.put_raw(&snapshot.state.session, full);
        Ok(())
    }

    async fn delete(&self, session: &SessionRef) -> Result<(), JournalError> {
        lock(&self.reads).remove(session);
        lock(&self.entries).remove(session);
        Ok(())
    }

    async fn load_for_reads(&self, session: &SessionRef) -> Result<Option<Snapshot>, JournalError> {
        let bytes = lock(&self.reads).get(session).cloned();
        match bytes.and_then(|b| Snapshot::decode_any(session, &b)) {
            Some(snapshot) => Ok(Some(snapshot)),
            None => self.load(session).await,
        }
    }
}

/// Why a session could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("the log of session {session} cannot be folded: {source}")]
    /// Boxed: a projection error is large, and loads return this on every path.
    Projection { session: SessionRef, source: Box<ProjectionError> },
}

/// The fold of a session whose log has no events (whatever snapshot is stored: one ahead of the log is
/// ignored).
pub fn empty_state(session: &SessionRef, dedup_horizon: usize) -> Result<SessionState, LoadError> {
    fold(session, dedup_horizon, &[])
}

/// `events` folded from an empty state.
fn fold(session: &SessionRef, dedup_horizon: usize, events: &[Envelope]) -> Result<SessionState, LoadError> {
    SessionState::fold(session.clone(), dedup_horizon, events)
        .map_err(|source| LoadError::Projection { session: session.clone(), source: Box::new(source) })
}

/// Loads `session`'s full fold (an owner's load): the latest usable snapshot plus the events after it, or
/// the whole log.
pub async fn load_state(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
    dedup_horizon: usize,
) -> Result<SessionState, LoadError> {
    // The snapshot and the log's end are asked for at once: a session without events (a fresh one) is
    // known after one round trip, and a log that remembers the end (JetStream) appends its first group
    // without asking again.
    let (snapshot, last) = futures::join!(snapshots.load(session), log.last_seq(session));
    if last? == 0 {
        return empty_state(session, dedup_horizon);
    }
    if let Some(snapshot) = snapshot?
        && let Some((state, _)) = fold_tail(log, session, snapshot).await?
    {
        return Ok(state);
    }
    Ok(fold_log(log, session, dedup_horizon).await?.0)
}

/// What a read loaded: the fold in [`reads_view`] form and the events it folded onto its snapshot (the
/// whole log when there was no usable snapshot), in order.
#[derive(Clone, Debug)]
pub struct ReadFold {
    pub state: SessionState,
    pub tail: Vec<Envelope>,
}

impl ReadFold {
    /// The events with seq > `after_seq`, when this read holds all of them (a Watch resuming there needs
    /// no other read of the log).
    pub fn events_after(&self, after_seq: u64) -> Option<&[Envelope]> {
        if after_seq >= self.state.last_seq {
            return Some(&[]);
        }
        let first = self.tail.first()?.seq;
        (after_seq + 1 >= first)
            .then(|| &self.tail[usize::try_from(after_seq + 1 - first).unwrap_or(usize::MAX).min(self.tail.len())..])
    }
}

/// The fold reads serve (GetInbox, GetSession, Watch's caught-up), in [`reads_view`] form: the latest read
/// snapshot plus the events after it. The tail is read from the snapshot's recorded position, so the cost
/// is a snapshot get, one last-event get and the tail: flat in the length of the history.
pub async fn load_for_reads(
    log: &dyn SessionLog,
    snapshots: &dyn SnapshotStore,
    session: &SessionRef,
) -> Result<ReadFold, LoadError> {
    let (state, tail) = match snapshots.load_for_reads(session).await? {
        Some(snapshot) => match fold_tail(log, session, snapshot).await? {
            Some(loaded) => loaded,
            None => fold_log(log, session, turnstile_model::state::DEFAULT_DEDUP_HORIZON).await?,
        },
        None => fold_log(log, session, turnstile_model::state::DEFAULT_DEDUP_HORIZON).await?,
    };
    Ok(ReadFold { state: reads_view(state), tail })
}

/// `snapshot`'s state with the events after it folded on, and those events; `None` (with a warning) when
/// the snapshot does not fit the log: ahead of it, at a position that holds another event, or not
/// followed by its tail.
async fn fold_tail(
    log: &dyn SessionLog,
    session: &SessionRef,
    snapshot: Snapshot,
) -> Result<Option<(SessionState, Vec<Envelope>)>, LoadError> {
    let seq = snapshot.seq();
    let Some(tail) = log.read_after(session, seq, snapshot.position).await? else {
        tracing::warn!(%session, snapshot_seq = seq, "snapshot is ahead of the log; folding the log from the start");
        return Ok(None);
    };
    let mut state = snapshot.state;
    if tail.iter().try_for_each(|e| state.apply(e)).is_err() {
        tracing::warn!(%session, snapshot_seq = seq, "the log does not follow the snapshot; folding the log from the start");
        return Ok(None);
    }
    Ok(Some((state, tail)))
}

/// The whole log folded from seq 1 (one read from the start, not page by page), and its events.
async fn fold_log(
    log: &dyn SessionLog,
    session: &SessionRef,
    dedup_horizon: usize,
) -> Result<(SessionState, Vec<Envelope>), LoadError> {
    let events = log.read_after(session, 0, None).await?.unwrap_or_default();
    let state = fold(session, dedup_horizon, &events)?;
    Ok((state, events))
}
