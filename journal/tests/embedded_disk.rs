//! What only the on-disk embedded log promises: restarts keep everything, a torn last frame is dropped,
//! other damage is reported.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use common::{batch, session};
use turnstile_journal::log::read_all;
use turnstile_journal::{EmbeddedLog, JournalError, SessionLog};
use turnstile_model::SessionRef;
use turnstile_proto::codec::encode_event;

fn log_file(dir: &Path, s: &SessionRef) -> PathBuf {
    dir.join("sessions").join(&s.tenant).join(format!("{}.log", s.id))
}

async fn stored_bytes(log: &EmbeddedLog, s: &SessionRef) -> Vec<Vec<u8>> {
    read_all(log, s, 1).await.unwrap().iter().map(encode_event).collect()
}

/// Three appends of 2, 3 and 4 events: frames end at seqs 2, 5 and 9.
async fn three_frames(dir: &Path, s: &SessionRef) {
    let log = EmbeddedLog::open(dir).unwrap();
    log.append(s, 0, &batch(s, 1, 2, "w"), None).await.unwrap();
    log.append(s, 2, &batch(s, 3, 3, "w"), None).await.unwrap();
    log.append(s, 5, &batch(s, 6, 4, "w"), None).await.unwrap();
}

/// Byte offsets where each frame of a file starts, read from the length headers.
fn frame_starts(path: &Path) -> Vec<usize> {
    let bytes = fs::read(path).unwrap();
    let mut starts = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        starts.push(pos);
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    assert_eq!(pos, bytes.len(), "frames tile the file exactly");
    starts
}

#[tokio::test]
async fn restart_keeps_every_session_and_event_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = [session("acme", "one"), session("acme", "two"), session("zeta", "x_y-z")];
    let mut before = Vec::new();
    {
        let log = EmbeddedLog::open(dir.path()).unwrap();
        for (i, s) in sessions.iter().enumerate() {
            let mut last = 0;
            for n in 1..=(i as u64 + 2) {
                last = log.append(s, last, &batch(s, last + 1, n, s.id.as_str()), None).await.unwrap();
            }
            before.push(stored_bytes(&log, s).await);
        }
    }
    let files_before: Vec<_> = sessions.iter().map(|s| fs::read(log_file(dir.path(), s)).unwrap()).collect();

    let log = EmbeddedLog::open(dir.path()).unwrap();
    assert_eq!(log.list_sessions(None, None, 10).await.unwrap(), sessions);
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(stored_bytes(&log, s).await, before[i], "{s}");
        assert_eq!(fs::read(log_file(dir.path(), s)).unwrap(), files_before[i], "open leaves a good file alone");
    }
    // The reopened log continues where it was, and a stale writer still conflicts.
    let s = &sessions[0];
    let last = log.last_seq(s).await.unwrap();
    assert_eq!(last, 3);
    assert!(matches!(log.append(s, 1, &batch(s, 2, 1, "late"), None).await, Err(JournalError::Conflict { .. })));
    assert_eq!(log.append(s, last, &batch(s, last + 1, 1, "again"), None).await.unwrap(), last + 1);
    drop(log);
    let log = EmbeddedLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(s).await.unwrap(), last + 1);
}

#[tokio::test]
async fn each_append_is_one_frame() {
    let dir = tempfile::tempdir().unwrap();
    let s = session("acme", "frames");
    three_frames(dir.path(), &s).await;
    let path = log_file(dir.path(), &s);
    let starts = frame_starts(&path);
    assert_eq!(starts.len(), 3);
    let bytes = fs::read(&path).unwrap();
    for (&start, count) in starts.iter().zip([2u32, 3, 4]) {
        let body_len = u32::from_le_bytes(bytes[start..start + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[start + 4..start + 8].try_into().unwrap());
        let body = &bytes[start + 8..start + 8 + body_len];
        assert_eq!(crc32fast::hash(body), crc);
        assert_eq!(u32::from_le_bytes(body[..4].try_into().unwrap()), count);
    }
}

#[tokio::test]
async fn torn_last_frame_is_dropped_and_the_log_stays_appendable() {
    for cut in [1u64, 3, 20] {
        let dir = tempfile::tempdir().unwrap();
        let s = session("acme", "torn");
        three_frames(dir.path(), &s).await;
        let path = log_file(dir.path(), &s);
        let last_frame = *frame_starts(&path).last().unwrap() as u64;
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(file.metadata().unwrap().len() - cut).unwrap();
        drop(file);

        let log = EmbeddedLog::open(dir.path()).unwrap();
        assert_eq!(log.last_seq(&s).await.unwrap(), 5, "cut {cut}: the whole last append is gone");
        assert_eq!(fs::metadata(&path).unwrap().len(), last_frame, "cut {cut}: the torn bytes are truncated");
        assert_eq!(log.append(&s, 5, &batch(&s, 6, 2, "after"), None).await.unwrap(), 7);
        drop(log);
        let log = EmbeddedLog::open(dir.path()).unwrap();
        let events = read_all(&log, &s, 1).await.unwrap();
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=7).collect::<Vec<_>>());
        assert_eq!(events[5..], batch(&s, 6, 2, "after"));
    }
}

#[tokio::test]
async fn last_frame_failing_its_checksum_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = session("acme", "crc-tail");
    three_frames(dir.path(), &s).await;
    let path = log_file(dir.path(), &s);
    let mut bytes = fs::read(&path).unwrap();
    let end = bytes.len();
    bytes[end - 2] ^= 0x55;
    fs::write(&path, &bytes).unwrap();
    let log = EmbeddedLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(&s).await.unwrap(), 5);
}

#[tokio::test]
async fn corrupt_middle_frame_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let s = session("acme", "rot");
    three_frames(dir.path(), &s).await;
    let path = log_file(dir.path(), &s);
    let second = frame_starts(&path)[1];
    let mut bytes = fs::read(&path).unwrap();
    bytes[second + 20] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    match EmbeddedLog::open(dir.path()) {
        Err(JournalError::Corrupt { session, seq, detail }) => {
            assert_eq!((session, seq), (s, 3), "{detail}");
            assert!(detail.contains("checksum"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn events_of_another_session_in_a_file_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (session("acme", "a"), session("acme", "b"));
    three_frames(dir.path(), &a).await;
    let foreign = fs::read(log_file(dir.path(), &a)).unwrap();
    fs::create_dir_all(log_file(dir.path(), &b).parent().unwrap()).unwrap();
    fs::write(log_file(dir.path(), &b), foreign).unwrap();
    match EmbeddedLog::open(dir.path()) {
        Err(JournalError::Corrupt { session, seq, .. }) => assert_eq!((session, seq), (b, 1)),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn frames_out_of_seq_order_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let s = session("acme", "dup");
    three_frames(dir.path(), &s).await;
    let path = log_file(dir.path(), &s);
    let starts = frame_starts(&path);
    let mut bytes = fs::read(&path).unwrap();
    // Replay the first frame (seqs 1-2) after the others: checksums hold, the fold does not.
    let first = bytes[..starts[1]].to_vec();
    bytes.extend_from_slice(&first);
    fs::write(&path, &bytes).unwrap();
    match EmbeddedLog::open(dir.path()) {
        Err(JournalError::Corrupt { session, seq, detail }) => {
            assert_eq!((session, seq), (s, 10), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_file_with_a_bad_name_is_a_storage_error() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = dir.path().join("sessions").join("acme");
    fs::create_dir_all(&tenant).unwrap();
    fs::write(tenant.join("bad name.log"), b"").unwrap();
    assert!(matches!(EmbeddedLog::open(dir.path()), Err(JournalError::Storage(_))));
}
