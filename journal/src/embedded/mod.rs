//! The embedded backend: [`EmbeddedLog`] (in memory, or durable files under a data dir) and [`LocalBus`],
//! for `turnstile dev` and tests.
//!
//! Every session's events are kept in memory (dev scale) and reads are served from there. With a data dir
//! each append is also one checksummed, synced frame in the session's file; see [`disk`] for the format and
//! its crash recovery. Appends to one session are serialized by an async mutex whose guard travels with the
//! write, so a caller that gives up mid-append never lets a second writer in before the first is settled.

mod bus;
mod disk;
mod tail;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

pub use bus::{LIVE_CAPACITY, LocalBus};

use crate::log::{EventStream, JournalError, SessionLog};
use crate::sync;
use crate::usage::MemoryUsage;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;

/// A [`SessionLog`] kept in this process, optionally backed by files.
pub struct EmbeddedLog {
    sessions: RwLock<BTreeMap<SessionRef, Arc<Slot>>>,
    store: Option<disk::Store>,
    /// Token usage of the events appended (and, with a data dir, found at open): SPEC §17.
    usage: Arc<MemoryUsage>,
}

impl std::fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLog").field("durable", &self.store.is_some()).finish_non_exhaustive()
    }
}

/// One session: its events, the writer lock and the notifier that tails follow.
struct Slot {
    writer: Arc<Mutex<Writer>>,
    /// `events[i].seq == i + 1`.
    events: RwLock<Vec<Envelope>>,
    /// The last seq; tails wait on it and re-read `events`, so they can never skip one.
    last: watch::Sender<u64>,
}

enum Writer {
    Memory,
    Disk(disk::SessionFile),
    /// The session was deleted while this slot was current: appends take the new slot instead.
    Deleted,
}

impl EmbeddedLog {
    /// A log that lives only as long as this value.
    pub fn in_memory() -> Self {
        Self { sessions: RwLock::default(), store: None, usage: Arc::default() }
    }

    /// A log kept under `data_dir` (created if missing). Every session found there is loaded; a torn last
    /// frame is dropped, any other damage is [`JournalError::Corrupt`].
    pub fn open(data_dir: impl AsRef<Path>) -> Result<Self, JournalError> {
        let (store, recovered) = disk::Store::open(data_dir.as_ref())?;
        let usage = Arc::new(MemoryUsage::default());
        for r in &recovered {
            usage.count(&r.events);
        }
        let sessions =
            recovered.into_iter().map(|r| (r.session, Arc::new(Slot::new(r.events, Writer::Disk(r.file))))).collect();
        Ok(Self { sessions: RwLock::new(sessions), store: Some(store), usage })
    }

    /// The token usage of the sessions this log holds or held since it opened (a deleted session's usage
    /// stays counted until the process restarts).
    pub fn usage(&self) -> Arc<MemoryUsage> {
        self.usage.clone()
    }

    fn find(&self, session: &SessionRef) -> Option<Arc<Slot>> {
        sync::read(&self.sessions).get(session).cloned()
    }

    fn find_or_create(&self, session: &SessionRef) -> Arc<Slot> {
        if let Some(slot) = self.find(session) {
            return slot;
        }
        let mut sessions = sync::write(&self.sessions);
        let slot = sessions.entry(session.clone()).or_insert_with(|| {
            let writer = match &self.store {
                Some(store) => Writer::Disk(store.session_file(session)),
                None => Writer::Memory,
            };
            Arc::new(Slot::new(Vec::new(), writer))
        });
        Arc::clone(slot)
    }
}

impl Slot {
    fn new(events: Vec<Envelope>, writer: Writer) -> Self {
        let (last, _) = watch::channel(events.len() as u64);
        Self { writer: Arc::new(Mutex::new(writer)), events: RwLock::new(events), last }
    }

    fn last_seq(&self) -> u64 {
        sync::read(&self.events).len() as u64
    }

    /// Up to `limit` events from `from_seq` (seq 0 reads from 1).
    fn read(&self, from_seq: u64, limit: usize) -> Vec<Envelope> {
        let events = sync::read(&self.events);
        let start = usize::try_from(from_seq.max(1) - 1).unwrap_or(usize::MAX).min(events.len());
        events[start..].iter().take(limit).cloned().collect()
    }

    /// The conditional append, run while holding the writer lock. Synchronous: on disk it runs on a blocking
    /// thread and owns the guard, so the lock is released only once the outcome is settled.
    fn commit(
        &self,
        mut writer: OwnedMutexGuard<Writer>,
        session: &SessionRef,
        expected: u64,
        events: Vec<Envelope>,
    ) -> Result<u64, JournalError> {
        let actual = self.last_seq();
        if actual != expected {
            return Err(JournalError::Conflict { session: session.clone(), expected, actual });
        }
        if let Writer::Disk(file) = &mut *writer {
            file.append(&disk::encode_frame(&events))?;
        }
        let last = expected + events.len() as u64;
        sync::write(&self.events).extend(events);
        self.last.send_replace(last);
        Ok(last)
    }
}

#[async_trait]
impl SessionLog for EmbeddedLog {
    /// Checks the batch shape and passes every event through the codec, so what is kept in memory is exactly
    /// what a restart (or another backend) reads back. No headers are kept: `traceparent` is dropped.
    ///
    /// An event the codec gives back unchanged is kept as the caller's own value, whose message content is
    /// shared with the writer's fold (decision 0107): the log then costs no second copy of a message.
    async fn append(
        &self,
        session: &SessionRef,
        expected_last_seq: u64,
        events: &[Envelope],
        _traceparent: Option<&str>,
    ) -> Result<u64, JournalError> {
        let events: Vec<Envelope> = crate::log::check_batch(session, expected_last_seq, events, usize::MAX)?
            .into_iter()
            .zip(events)
            .map(|(checked, event)| if checked.stored == *event { event.clone() } else { checked.stored })
            .collect();
        let (slot, writer) = loop {
            let slot = self.find_or_create(session);
            let writer = Arc::clone(&slot.writer).lock_owned().await;
            // A delete that held the lock first took this slot out of the map: the next lookup is new.
            if !matches!(*writer, Writer::Deleted) {
                break (slot, writer);
            }
        };
        // Counted once the append is settled, from what was stored: a refused append counts nothing.
        let counted: Vec<Envelope> =
            events.iter().filter(|e| turnstile_model::usage::counted(e).is_some()).cloned().collect();
        let last = if self.store.is_none() {
            slot.commit(writer, session, expected_last_seq, events)?
        } else {
            let session = session.clone();
            tokio::task::spawn_blocking(move || slot.commit(writer, &session, expected_last_seq, events))
                .await
                .map_err(|e| {
                    JournalError::Unavailable(format!("the append task did not finish ({e}); re-read the log"))
                })??
        };
        self.usage.count(&counted);
        Ok(last)
    }

    async fn read(&self, session: &SessionRef, from_seq: u64, limit: usize) -> Result<Vec<Envelope>, JournalError> {
        Ok(self.find(session).map(|slot| slot.read(from_seq, limit)).unwrap_or_default())
    }

    async fn last_seq(&self, session: &SessionRef) -> Result<u64, JournalError> {
        Ok(self.find(session).map_or(0, |slot| slot.last_seq()))
    }

    async fn tail(&self, session: &SessionRef, after_seq: u64) -> Result<EventStream, JournalError> {
        // A tail of a session with no events yet needs its slot so it hears the first append.
        let slot = self.find_or_create(session);
        Ok(tail::follow(&slot, after_seq))
    }

    async fn delete(&self, session: &SessionRef) -> Result<u64, JournalError> {
        delete_slot(self, session).await
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<&SessionRef>,
        limit: usize,
    ) -> Result<Vec<SessionRef>, JournalError> {
        let sessions = sync::read(&self.sessions);
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(sessions
            .range((lower, Bound::Unbounded))
            .filter(|(s, _)| tenant.is_none_or(|t| s.tenant.as_str() >= t))
            .take_while(|(s, _)| tenant.is_none_or(|t| s.tenant == t))
            .filter(|(_, slot)| slot.last_seq() > 0)
            .take(limit)
            .map(|(s, _)| s.clone())
            .collect())
    }
}

/// [`SessionLog::delete`]: under the slot's writer lock, the file goes first (durably), then the slot
/// leaves the map, so no append can land in between and a new append after it starts a new slot (and
/// file). Tails of the old slot end once the last handle on it drops.
async fn delete_slot(log: &EmbeddedLog, session: &SessionRef) -> Result<u64, JournalError> {
    let Some(slot) = log.find(session) else { return Ok(0) };
    let mut writer = Arc::clone(&slot.writer).lock_owned().await;
    if matches!(*writer, Writer::Deleted) {
        return Ok(0);
    }
    let last = slot.last_seq();
    if let Writer::Disk(_) = &*writer {
        writer = tokio::task::spawn_blocking(move || {
            if let Writer::Disk(file) = &mut *writer {
                file.remove()?;
            }
            Ok::<_, JournalError>(writer)
        })
        .await
        .map_err(|e| JournalError::Unavailable(format!("the delete task did not finish ({e}); delete again")))??;
    }
    *writer = Writer::Deleted;
    {
        let mut sessions = sync::write(&log.sessions);
        if sessions.get(session).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
            sessions.remove(session);
        }
    }
    sync::write(&slot.events).clear();
    Ok(last)
}
