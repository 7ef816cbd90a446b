//! Fuzzing the journal's decoders (issue 14 part 6): a JetStream message of any body and headers, an
//! embedded log file of any contents, a stored snapshot of any bytes decode to events or a typed
//! [`JournalError`] (a snapshot: to `None`, then the log is folded), never a panic.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../proto/tests/mutation/mod.rs"]
mod mutation;

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use async_nats::HeaderMap;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use serde_json::Value;
use turnstile_journal::jetstream::group::{decode_message, encode_group, group_headers};
use turnstile_journal::jetstream::{HEADER_LAST_SEQ, HEADER_SEQ};
use turnstile_journal::log::read_all;
use turnstile_journal::snapshot::{MemorySnapshots, Snapshot, load_for_reads, load_state};
use turnstile_journal::{EmbeddedLog, JournalError, SessionLog};
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{Envelope, SessionRef, SessionState};
use turnstile_proto::codec::encode_event;

use common::{batch, session};
use mutation::{mutate, mutations};

/// Modest and deterministic enough for CI: no persistence file is written into the tree.
fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

/// A refusal says what was wrong.
fn check_error(err: &JournalError) {
    assert!(!err.to_string().is_empty(), "{err:?}");
}

// ---- (b) the JetStream event-group codec ----

/// A header value: a number near the edges of u64 and of the group, or any text.
fn header_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        prop_oneof![Just(0u64), Just(1), Just(2), Just(3), Just(u64::MAX - 1), Just(u64::MAX), any::<u64>()]
            .prop_map(|n| Some(n.to_string())),
        "[ -~]{0,12}".prop_map(Some),
    ]
}

fn headers(seq: Option<String>, last: Option<String>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(seq) = seq {
        headers.insert(HEADER_SEQ, seq.as_str());
    }
    if let Some(last) = last {
        headers.insert(HEADER_LAST_SEQ, last.as_str());
    }
    headers
}

/// Decodes one stored message; what decodes holds the seqs its headers name, of this session.
fn check_message(s: &SessionRef, headers: Option<&HeaderMap>, body: &[u8]) {
    match decode_message(s, headers, body, 7) {
        Ok(events) => {
            assert!(!events.is_empty());
            assert!(events.iter().all(|e| &e.session == s));
            assert!(events.windows(2).all(|w| w[0].seq.checked_add(1) == Some(w[1].seq)), "{events:?}");
        }
        Err(err) => check_error(&err),
    }
}

/// Three events in one group message: its body and headers.
fn group_seed(s: &SessionRef) -> (Vec<Envelope>, Vec<u8>, HeaderMap) {
    let events = batch(s, 4, 3, "g");
    let bodies: Vec<Vec<u8>> = events.iter().map(encode_event).collect();
    let body = encode_group(bodies.iter().map(Vec::as_slice));
    let headers = group_headers(&events, Some("00-trace"));
    (events, body, headers)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn group_decoding_never_panics_on_arbitrary_bodies_and_headers(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        seq in header_value(),
        last in header_value(),
        no_headers in any::<bool>(),
    ) {
        let s = session("acme", "g");
        let headers = headers(seq, last);
        check_message(&s, (!no_headers).then_some(&headers), &body);
    }

    #[test]
    fn group_decoding_never_panics_on_mutated_groups(
        mutations in mutations(),
        seq in header_value(),
        last in header_value(),
        keep_headers in any::<bool>(),
    ) {
        let s = session("acme", "g");
        let (events, body, valid) = group_seed(&s);
        prop_assert_eq!(decode_message(&s, Some(&valid), &body, 7).unwrap(), events);
        let body = mutate(body, &mutations);
        let headers = if keep_headers { valid } else { headers(seq, last) };
        check_message(&s, Some(&headers), &body);
    }
}

/// Found while writing the fuzz tests (a mutated body rarely still decodes, so the proptest seldom gets
/// there): `Turnstile-Seq: 0` with `Turnstile-Last-Seq: 18446744073709551615` overflowed the event count,
/// and a last seq of u64::MAX overflowed the seq check; a debug build panicked instead of refusing the
/// message as corrupt.
#[test]
fn a_group_spanning_every_seq_is_corrupt_not_a_panic() {
    let s = session("acme", "g");
    let (_, body, _) = group_seed(&s);
    for (first, last) in [(0, u64::MAX), (1, u64::MAX), (u64::MAX, u64::MAX)] {
        let headers = headers(Some(first.to_string()), Some(last.to_string()));
        let err = decode_message(&s, Some(&headers), &body, 7).unwrap_err();
        assert!(matches!(err, JournalError::Corrupt { .. }), "{err:?}");
    }
}

// ---- (c) embedded log frames ----

fn log_file(dir: &Path, s: &SessionRef) -> std::path::PathBuf {
    dir.join("sessions").join(&s.tenant).join(format!("{}.log", s.id))
}

/// A real log file of three appends (2, 3 and 4 events) of session `acme/d`, written once (each append
/// syncs), and its events.
fn disk_seed(rt: &tokio::runtime::Runtime, s: &SessionRef) -> (Vec<u8>, Vec<Envelope>) {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let log = EmbeddedLog::open(dir.path()).unwrap();
            log.append(s, 0, &batch(s, 1, 2, "d"), None).await.unwrap();
            log.append(s, 2, &batch(s, 3, 3, "d"), None).await.unwrap();
            log.append(s, 5, &batch(s, 6, 4, "d"), None).await.unwrap();
        });
        fs::read(log_file(dir.path(), s)).unwrap()
    });
    (file.clone(), batch(s, 1, 9, "d"))
}

/// Opens a data dir whose only session file holds `contents`: the recovered events, or the refusal.
fn open_with(rt: &tokio::runtime::Runtime, s: &SessionRef, contents: &[u8]) -> Result<Vec<Envelope>, JournalError> {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(dir.path(), s);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, contents).unwrap();
    let log = EmbeddedLog::open(dir.path())?;
    Ok(rt.block_on(read_all(&log, s, 1)).unwrap())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn opening_never_panics_on_arbitrary_files(contents in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (rt, s) = (runtime(), session("acme", "d"));
        match open_with(&rt, &s, &contents) {
            Ok(events) => prop_assert!(events.iter().zip(1..).all(|(e, seq)| e.seq == seq && e.session == s)),
            Err(err) => check_error(&err),
        }
    }

    #[test]
    fn opening_never_panics_on_mutated_files(mutations in mutations()) {
        let (rt, s) = (runtime(), session("acme", "d"));
        let (valid, events) = disk_seed(&rt, &s);
        match open_with(&rt, &s, &mutate(valid, &mutations)) {
            // A crc32 per frame: whatever is accepted is a prefix of what was written.
            Ok(loaded) => prop_assert!(events.starts_with(&loaded), "{loaded:?}"),
            Err(err) => check_error(&err),
        }
    }

    #[test]
    fn a_truncated_file_opens_to_a_prefix_of_whole_frames(cut in any::<Index>()) {
        let (rt, s) = (runtime(), session("acme", "d"));
        let (valid, events) = disk_seed(&rt, &s);
        let len = cut.index(valid.len() + 1);
        let loaded = open_with(&rt, &s, &valid[..len]).unwrap();
        prop_assert!([0, 2, 5, 9].contains(&loaded.len()), "{} events", loaded.len());
        prop_assert_eq!(&events[..loaded.len()], loaded.as_slice());
    }
}

// ---- (d) snapshots ----

/// A log of 30 events with the snapshot of its first 20; the encoded snapshot.
fn snapshot_seed(rt: &tokio::runtime::Runtime, log: &EmbeddedLog, s: &SessionRef) -> Vec<u8> {
    let events = batch(s, 1, 30, "n");
    rt.block_on(log.append(s, 0, &events, None)).unwrap();
    let at_20 = SessionState::fold(s.clone(), DEFAULT_DEDUP_HORIZON, &events[..20]).unwrap();
    Snapshot::of(&at_20).encode().unwrap()
}

/// Loads `s` with `bytes` as its stored snapshot: an unusable snapshot is ignored or refused, never a panic;
/// a usable one still ends at the log's last event.
fn check_snapshot(rt: &tokio::runtime::Runtime, log: &EmbeddedLog, s: &SessionRef, bytes: Vec<u8>) {
    let _ = Snapshot::decode_any(s, &bytes);
    let store = MemorySnapshots::default();
    store.put_raw(s, bytes);
    rt.block_on(async {
        match load_state(log, &store, s, DEFAULT_DEDUP_HORIZON).await {
            Ok(state) => assert_eq!(state.last_seq, 30),
            Err(err) => assert!(!err.to_string().is_empty()),
        }
        match load_for_reads(log, &store, s).await {
            Ok(read) => assert_eq!(read.state.last_seq, 30),
            Err(err) => assert!(!err.to_string().is_empty()),
        }
    });
}

/// How many numbers a JSON tree holds.
fn count_numbers(value: &Value) -> usize {
    match value {
        Value::Number(_) => 1,
        Value::Array(items) => items.iter().map(count_numbers).sum(),
        Value::Object(map) => map.values().map(count_numbers).sum(),
        _ => 0,
    }
}

/// Replaces the number `*left` numbers further on in the walk with `n`; `*left` counts down.
fn replace_number(value: &mut Value, left: &mut usize, n: &Value) {
    match value {
        Value::Number(_) if *left == 0 => {
            *value = n.clone();
            *left = usize::MAX;
        }
        Value::Number(_) => *left = left.saturating_sub(1),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_number(v, left, n)),
        Value::Object(map) => map.values_mut().for_each(|v| replace_number(v, left, n)),
        _ => {}
    }
}

/// Replaces one number of the snapshot's JSON with `n`: a well-formed snapshot whose fold is inconsistent
/// (counts, seqs, turn numbers that disagree with the rest).
fn with_number(bytes: &[u8], at: Index, n: &Value) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(bytes).unwrap();
    let count = count_numbers(&value);
    if count > 0 {
        replace_number(&mut value, &mut at.index(count), n);
    }
    serde_json::to_vec(&value).unwrap()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn snapshot_loading_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (rt, log, s) = (runtime(), EmbeddedLog::in_memory(), session("acme", "n"));
        snapshot_seed(&rt, &log, &s);
        check_snapshot(&rt, &log, &s, bytes);
    }

    #[test]
    fn snapshot_loading_never_panics_on_mutated_bytes(mutations in mutations()) {
        let (rt, log, s) = (runtime(), EmbeddedLog::in_memory(), session("acme", "n"));
        let valid = snapshot_seed(&rt, &log, &s);
        check_snapshot(&rt, &log, &s, mutate(valid, &mutations));
    }

    #[test]
    fn snapshot_loading_never_panics_on_inconsistent_numbers(
        at in any::<Index>(),
        n in prop_oneof![Just(0u64), Just(1), Just(19), Just(21), Just(30), Just(31), Just(u64::MAX), any::<u64>()],
        negative in any::<bool>(),
    ) {
        let (rt, log, s) = (runtime(), EmbeddedLog::in_memory(), session("acme", "n"));
        let valid = snapshot_seed(&rt, &log, &s);
        let n = if negative { Value::from(-1) } else { Value::from(n) };
        check_snapshot(&rt, &log, &s, with_number(&valid, at, &n));
    }
}

/// Found by `snapshot_loading_never_panics_on_inconsistent_numbers`: a snapshot whose turn counter is
/// u64::MAX overflowed `last_turn + 1` in the fold of the next splice (a debug build panicked). Now the fold
/// refuses the tail and the log is folded from the start.
#[test]
fn a_snapshot_with_counters_at_their_maximum_is_ignored() {
    let (rt, log, s) = (runtime(), EmbeddedLog::in_memory(), session("acme", "n"));
    let valid = snapshot_seed(&rt, &log, &s);
    for key in ["last_turn", "last_seq", "last_time_ms", "epoch"] {
        let mut value: Value = serde_json::from_slice(&valid).unwrap();
        let state = value.get_mut("state").and_then(Value::as_object_mut).unwrap();
        assert!(state.contains_key(key), "the snapshot's state has no {key}: {state:?}");
        state.insert(key.into(), Value::from(u64::MAX));
        check_snapshot(&rt, &log, &s, serde_json::to_vec(&value).unwrap());
    }
}
