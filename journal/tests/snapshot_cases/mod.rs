//! Snapshot cases written once, run against every [`SnapshotStore`] (memory here, JetStream KV in
//! `tests/tests/snapshots_jetstream.rs`). `put_raw` overwrites the stored bytes of a session.

use turnstile_journal::SessionLog;
use turnstile_journal::snapshot::{Snapshot, SnapshotStore, load_for_reads, load_state, reads_view};
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{SessionRef, SessionState};

use super::common::batch;

async fn fold_all(log: &dyn SessionLog, session: &SessionRef) -> SessionState {
    let events = turnstile_journal::log::read_all(log, session, 1).await.unwrap();
    SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events).unwrap()
}

/// Snapshot at seq 25 of 40 events: loading reads snapshot + tail and equals the full fold.
pub async fn snapshot_plus_tail_equals_full_fold(log: &dyn SessionLog, store: &dyn SnapshotStore, session: SessionRef) {
    let events = batch(&session, 1, 40, "s");
    log.append(&session, 0, &events[..25], None).await.unwrap();
    let at_25 = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events[..25]).unwrap();
    store.save(&Snapshot::of(&at_25)).await.unwrap();
    log.append(&session, 25, &events[25..], None).await.unwrap();

    let loaded = store.load(&session).await.unwrap().expect("snapshot stored");
    assert_eq!(loaded.seq(), 25);
    assert_eq!(loaded.state, at_25);
    let state = load_state(log, store, &session, DEFAULT_DEDUP_HORIZON).await.unwrap();
    assert_eq!(state, fold_all(log, &session).await);
    assert_eq!(state.last_seq, 40);
}

/// Corrupt bytes, an unknown version and another session's snapshot are ignored: the log is folded.
pub async fn unusable_snapshots_are_ignored(
    log: &dyn SessionLog,
    store: &dyn SnapshotStore,
    put_raw: &(dyn Fn(&SessionRef, Vec<u8>) + Sync),
    session: SessionRef,
    other: SessionRef,
) {
    log.append(&session, 0, &batch(&session, 1, 12, "u"), None).await.unwrap();
    let full = fold_all(log, &session).await;
    let mut future = Snapshot::of(&full);
    future.version += 1;
    let foreign = Snapshot::of(&SessionState::new(other, 10));
    for bytes in [b"{not json".to_vec(), future.encode().unwrap(), foreign.encode().unwrap()] {
        put_raw(&session, bytes);
        assert_eq!(store.load(&session).await.unwrap(), None);
        assert_eq!(load_state(log, store, &session, DEFAULT_DEDUP_HORIZON).await.unwrap(), full);
    }
}

/// A snapshot ahead of the log (the log was reset or is another cluster's) is ignored.
pub async fn snapshot_ahead_of_the_log_is_ignored(
    log: &dyn SessionLog,
    store: &dyn SnapshotStore,
    session: SessionRef,
) {
    let events = batch(&session, 1, 20, "a");
    let at_20 = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events).unwrap();
    store.save(&Snapshot::of(&at_20)).await.unwrap();
    log.append(&session, 0, &events[..8], None).await.unwrap();
    let state = load_state(log, store, &session, DEFAULT_DEDUP_HORIZON).await.unwrap();
    assert_eq!(state.last_seq, 8);
    assert_eq!(state, fold_all(log, &session).await);
}

/// Reads load the read snapshot (no dedup index, no transcript) plus the tail after it: the same state as
/// a full fold in its reads form, with exactly the events after the snapshot; a snapshot ahead of the log
/// is ignored there too.
pub async fn reads_load_the_read_snapshot_plus_tail(
    log: &dyn SessionLog,
    store: &dyn SnapshotStore,
    session: SessionRef,
) {
    let events = batch(&session, 1, 40, "r");
    log.append(&session, 0, &events[..25], None).await.unwrap();
    let at_25 = SessionState::fold(session.clone(), DEFAULT_DEDUP_HORIZON, &events[..25]).unwrap();
    assert!(!at_25.accepted.is_empty() && at_25.transcript.entries().count() > 0, "the case needs both parts");
    store.save(&Snapshot::of(&at_25)).await.unwrap();
    log.append(&session, 25, &events[25..], None).await.unwrap();

    let stored = store.load_for_reads(&session).await.unwrap().expect("a snapshot for reads");
    assert_eq!(stored.seq(), 25);
    assert_eq!(stored.state, reads_view(at_25.clone()), "the read snapshot leaves out the index and transcript");
    // The owner's snapshot keeps them.
    assert_eq!(store.load(&session).await.unwrap().expect("full snapshot").state, at_25);

    let full = fold_all(log, &session).await;
    let read = load_for_reads(log, store, &session).await.unwrap();
    assert_eq!(read.state, reads_view(full.clone()));
    assert_eq!(read.state.inbox, full.inbox);
    assert_eq!(read.tail, events[25..].to_vec(), "exactly the events after the snapshot");
    assert_eq!(read.events_after(30).map(<[_]>::len), Some(10));
    assert_eq!(read.events_after(40).map(<[_]>::len), Some(0));
    assert_eq!(read.events_after(10), None, "older events are not in the read");

    // A snapshot ahead of the log (another session's log reset to fewer events) is ignored.
    let other = SessionRef::new(session.tenant.clone(), format!("{}-short", session.id)).unwrap();
    let ahead = batch(&other, 1, 20, "x");
    store
        .save(&Snapshot::of(&SessionState::fold(other.clone(), DEFAULT_DEDUP_HORIZON, &ahead).unwrap()))
        .await
        .unwrap();
    log.append(&other, 0, &ahead[..8], None).await.unwrap();
    let read = load_for_reads(log, store, &other).await.unwrap();
    assert_eq!(read.state, reads_view(fold_all(log, &other).await));
    assert_eq!(read.tail.len(), 8, "folded from the start");
}
