//! Snapshot + tail loading on the embedded log with in-memory snapshots.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod snapshot_cases;

use turnstile_journal::EmbeddedLog;
use turnstile_journal::snapshot::MemorySnapshots;

use common::session;

#[tokio::test]
async fn snapshot_plus_tail_equals_full_fold() {
    let (log, store) = (EmbeddedLog::in_memory(), MemorySnapshots::default());
    snapshot_cases::snapshot_plus_tail_equals_full_fold(&log, &store, session("t", "a")).await;
}

#[tokio::test]
async fn unusable_snapshots_are_ignored() {
    let (log, store) = (EmbeddedLog::in_memory(), MemorySnapshots::default());
    let put = |s: &turnstile_model::SessionRef, b: Vec<u8>| store.put_raw(s, b);
    snapshot_cases::unusable_snapshots_are_ignored(&log, &store, &put, session("t", "b"), session("t", "c")).await;
}

#[tokio::test]
async fn snapshot_ahead_of_the_log_is_ignored() {
    let (log, store) = (EmbeddedLog::in_memory(), MemorySnapshots::default());
    snapshot_cases::snapshot_ahead_of_the_log_is_ignored(&log, &store, session("t", "d")).await;
}

#[tokio::test]
async fn reads_load_the_read_snapshot_plus_tail() {
    let (log, store) = (EmbeddedLog::in_memory(), MemorySnapshots::default());
    snapshot_cases::reads_load_the_read_snapshot_plus_tail(&log, &store, session("t", "e")).await;
}
