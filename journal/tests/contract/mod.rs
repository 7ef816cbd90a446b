//! The `SessionLog` contract (journal/src/log.rs), written once and run against every backend.
//!
//! A backend joins with one line: `mod my_backend { contract_suite!(my_factory); }`, where `my_factory` is an
//! `async fn() -> Backend`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::Barrier;
use turnstile_journal::log::read_all;
use turnstile_journal::{EventStream, JournalError, SessionLog};
use turnstile_model::SessionRef;

use crate::common::{batch, event, session};

/// A log under test and whatever keeps it alive (a temporary dir, a server).
pub struct Backend {
    pub log: Arc<dyn SessionLog>,
    pub _keep: Box<dyn std::any::Any + Send>,
}

/// Instantiates every contract case as a test for the backend that `$factory` builds.
#[macro_export]
macro_rules! contract_suite {
    ($factory:path) => {
        $crate::contract_suite!(@cases $factory;
            append_to_new_session_expects_zero,
            racing_writers_exactly_one_wins,
            append_first_writes_only_an_empty_log,
            stale_expected_seq_conflicts_and_changes_nothing,
            invalid_batches_are_refused,
            ranged_reads,
            last_seq_follows_appends,
            tail_from_zero_and_from_the_middle,
            tail_of_a_session_without_events,
            tail_as_sent_is_the_tail_encoded,
            tail_with_concurrent_appends,
            list_sessions_order_filter_and_cursor,
            delete_removes_the_log_and_frees_the_name,
        );
    };
    (@cases $factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $factory().await;
                $crate::contract::$case(std::sync::Arc::clone(&backend.log)).await;
            }
        )*
    };
}

/// Generous: only reached when an expected event never comes.
const WAIT: Duration = Duration::from_secs(20);

async fn next(stream: &mut EventStream) -> turnstile_model::Envelope {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("tail failed: {e}"),
        Ok(None) => panic!("tail ended early"),
        Err(_) => panic!("no event within {WAIT:?}"),
    }
}

async fn seqs_until(stream: &mut EventStream, last: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.last() != Some(&last) {
        seqs.push(next(stream).await.seq);
    }
    seqs
}

pub async fn append_to_new_session_expects_zero(log: Arc<dyn SessionLog>) {
    let s = session("acme", "new");
    let events = batch(&s, 1, 3, "w");
    assert_eq!(log.append(&s, 0, &events, None).await.unwrap(), 3);
    assert_eq!(log.read(&s, 1, 100).await.unwrap(), events);
    assert_eq!(log.append(&s, 3, &batch(&s, 4, 1, "w"), None).await.unwrap(), 4);
    assert_eq!(read_all(&*log, &s, 1).await.unwrap().len(), 4);
}

pub async fn racing_writers_exactly_one_wins(log: Arc<dyn SessionLog>) {
    for round in 0..10 {
        let s = session("race", &format!("s{round}"));
        let barrier = Arc::new(Barrier::new(2));
        let writers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|tag| {
                let (log, s, barrier) = (Arc::clone(&log), s.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    let events = batch(&s, 1, 2, tag);
                    barrier.wait().await;
                    (tag, events.clone(), log.append(&s, 0, &events, None).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for writer in writers {
            let (tag, events, result) = writer.await.unwrap();
            match result {
                Ok(last) => {
                    assert_eq!(last, 2);
                    winners.push(events);
                }
                Err(JournalError::Conflict { session, expected, actual }) => {
                    assert_eq!((session, expected, actual), (s.clone(), 0, 2), "loser {tag}");
                }
                Err(e) => panic!("writer {tag}: unexpected {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one writer wins");
        // No fork: the stored chain is the winner's, whole.
        assert_eq!(read_all(&*log, &s, 1).await.unwrap(), winners[0]);
    }
}

/// `append_first` writes the first events of a log and nothing on a log that has some, whatever this
/// process knows of the session (a writer that never read it, one that read it before another wrote it).
pub async fn append_first_writes_only_an_empty_log(log: Arc<dyn SessionLog>) {
    let s = session("acme", "first");
    let first = batch(&s, 1, 2, "a");
    let refused = |session: &SessionRef| Err(JournalError::FirstRefused { session: session.clone() });
    assert_eq!(log.append_first(&s, &first, None).await, Ok(2));
    assert_eq!(log.append_first(&s, &batch(&s, 1, 3, "b"), None).await, refused(&s));
    assert_eq!(read_all(&*log, &s, 1).await.unwrap(), first);
    // This process saw the log empty, then another writer appended: still refused.
    let other = session("acme", "first-other");
    assert_eq!(log.last_seq(&other).await.unwrap(), 0);
    let writer_b = batch(&other, 1, 1, "b");
    log.append(&other, 0, &writer_b, None).await.unwrap();
    assert_eq!(log.append_first(&other, &batch(&other, 1, 1, "c"), None).await, refused(&other));
    assert_eq!(read_all(&*log, &other, 1).await.unwrap(), writer_b);
    // The log ends where the written group ends: the next append follows it.
    assert_eq!(log.append(&s, 2, &batch(&s, 3, 1, "a"), None).await.unwrap(), 3);
    // Two first writers at once: exactly one wins.
    let raced = session("acme", "first-race");
    let (group_a, group_b) = (batch(&raced, 1, 1, "a"), batch(&raced, 1, 1, "b"));
    let (a, b) = tokio::join!(log.append_first(&raced, &group_a, None), log.append_first(&raced, &group_b, None));
    let written = [a, b];
    assert_eq!(written.iter().filter(|w| w.is_ok()).count(), 1, "{written:?}");
    assert!(written.contains(&refused(&raced)), "{written:?}");
    assert_eq!(log.last_seq(&raced).await.unwrap(), 1);
    // A malformed group is refused as by `append`.
    assert!(matches!(
        log.append_first(&session("acme", "first-bad"), &batch(&s, 2, 1, "x"), None).await,
        Err(JournalError::InvalidBatch { .. })
    ));
}

pub async fn stale_expected_seq_conflicts_and_changes_nothing(log: Arc<dyn SessionLog>) {
    let s = session("acme", "stale");
    let stored = batch(&s, 1, 3, "w");
    log.append(&s, 0, &stored, None).await.unwrap();
    for expected in [0, 1, 2, 7] {
        let err = log.append(&s, expected, &batch(&s, expected + 1, 1, "late"), None).await.unwrap_err();
        assert_eq!(err, JournalError::Conflict { session: s.clone(), expected, actual: 3 });
    }
    assert_eq!(log.read(&s, 1, 100).await.unwrap(), stored);
    assert_eq!(log.last_seq(&s).await.unwrap(), 3);
}

pub async fn invalid_batches_are_refused(log: Arc<dyn SessionLog>) {
    let s = session("acme", "invalid");
    let other = session("acme", "other");
    let mut gap = batch(&s, 1, 2, "w");
    gap[1].seq = 3;
    let mut mixed = batch(&s, 1, 2, "w");
    mixed[1].session = other.clone();
    let cases: Vec<(&str, u64, Vec<_>)> = vec![
        ("empty", 0, vec![]),
        ("gap", 0, gap),
        ("not from expected + 1", 0, batch(&s, 2, 2, "w")),
        ("names another session", 0, mixed),
        ("only another session", 0, batch(&other, 1, 1, "w")),
    ];
    for (what, expected, events) in cases {
        match log.append(&s, expected, &events, None).await {
            Err(JournalError::InvalidBatch { session, .. }) => assert_eq!(session, s, "{what}"),
            other => panic!("{what}: expected InvalidBatch, got {other:?}"),
        }
    }
    assert_eq!(log.last_seq(&s).await.unwrap(), 0);
    assert_eq!(log.last_seq(&other).await.unwrap(), 0);
    assert!(log.list_sessions(Some("acme"), None, 10).await.unwrap().is_empty());
    // A valid batch after the refusals still starts at 1.
    log.append(&s, 0, &batch(&s, 1, 1, "w"), None).await.unwrap();
    let mut gap = batch(&s, 2, 3, "w");
    gap[2].seq = 5;
    assert!(matches!(log.append(&s, 1, &gap, None).await, Err(JournalError::InvalidBatch { .. })));
    assert_eq!(log.last_seq(&s).await.unwrap(), 1);
}

pub async fn ranged_reads(log: Arc<dyn SessionLog>) {
    let s = session("acme", "ranged");
    let all = batch(&s, 1, 10, "w");
    log.append(&s, 0, &all[..4], None).await.unwrap();
    log.append(&s, 4, &all[4..], None).await.unwrap();
    assert_eq!(log.read(&s, 1, 100).await.unwrap(), all);
    assert_eq!(log.read(&s, 0, 2).await.unwrap(), all[..2]);
    assert_eq!(log.read(&s, 4, 3).await.unwrap(), all[3..6]);
    assert_eq!(log.read(&s, 10, 5).await.unwrap(), all[9..]);
    assert!(log.read(&s, 11, 5).await.unwrap().is_empty());
    assert!(log.read(&s, 3, 0).await.unwrap().is_empty());
    assert!(log.read(&session("acme", "unknown"), 1, 5).await.unwrap().is_empty());
}

pub async fn last_seq_follows_appends(log: Arc<dyn SessionLog>) {
    let s = session("acme", "last");
    assert_eq!(log.last_seq(&s).await.unwrap(), 0);
    log.append(&s, 0, &batch(&s, 1, 1, "w"), None).await.unwrap();
    assert_eq!(log.last_seq(&s).await.unwrap(), 1);
    log.append(&s, 1, &batch(&s, 2, 5, "w"), None).await.unwrap();
    assert_eq!(log.last_seq(&s).await.unwrap(), 6);
    assert_eq!(log.last_seq(&session("acme", "untouched")).await.unwrap(), 0);
}

pub async fn tail_from_zero_and_from_the_middle(log: Arc<dyn SessionLog>) {
    let s = session("acme", "tail");
    let all = batch(&s, 1, 11, "w");
    log.append(&s, 0, &all[..5], None).await.unwrap();
    let mut from_zero = log.tail(&s, 0).await.unwrap();
    let mut from_three = log.tail(&s, 3).await.unwrap();
    log.append(&s, 5, &all[5..7], None).await.unwrap();
    log.append(&s, 7, &all[7..10], None).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.push(next(&mut from_zero).await);
    }
    assert_eq!(seen, all[..10]);
    assert_eq!(seqs_until(&mut from_three, 10).await, (4..=10).collect::<Vec<_>>());
    // Nothing repeats before the next append reaches either tail.
    log.append(&s, 10, &all[10..], None).await.unwrap();
    assert_eq!(next(&mut from_zero).await, all[10]);
    assert_eq!(next(&mut from_three).await.seq, 11);
    // A tail from the end sees only what comes next.
    let mut from_end = log.tail(&s, 11).await.unwrap();
    log.append(&s, 11, &[event(&s, 12, "w")], None).await.unwrap();
    assert_eq!(next(&mut from_end).await.seq, 12);
}

/// A Watch's history (`tail_as_sent`) is exactly the tail, encoded: whether a backend passes stored
/// events on as they are or encodes decoded ones, a reader cannot tell.
pub async fn tail_as_sent_is_the_tail_encoded(log: Arc<dyn SessionLog>) {
    let s = session("acme", "tail-as-sent");
    let all = batch(&s, 1, 9, "w");
    log.append(&s, 0, &all[..4], None).await.unwrap();
    log.append(&s, 4, &all[4..5], None).await.unwrap();
    let mut sent = log.tail_as_sent(&s, 2).await.unwrap();
    log.append(&s, 5, &all[5..], None).await.unwrap();
    for want in &all[2..] {
        let got = match tokio::time::timeout(WAIT, sent.next()).await {
            Ok(Some(Ok(event))) => event,
            other => panic!("tail_as_sent gave {other:?} where seq {} was due", want.seq),
        };
        assert_eq!(got, turnstile_proto::codec::encode_session_event(want));
    }
}

pub async fn tail_of_a_session_without_events(log: Arc<dyn SessionLog>) {
    let s = session("acme", "tail-new");
    let mut tail = log.tail(&s, 0).await.unwrap();
    let first = batch(&s, 1, 2, "w");
    log.append(&s, 0, &first, None).await.unwrap();
    assert_eq!(next(&mut tail).await, first[0]);
    assert_eq!(next(&mut tail).await, first[1]);
}

pub async fn tail_with_concurrent_appends(log: Arc<dyn SessionLog>) {
    const TOTAL: u64 = 300;
    let s = session("acme", "busy");
    let early = log.tail(&s, 0).await.unwrap();
    let writer = {
        let (log, s) = (Arc::clone(&log), s.clone());
        tokio::spawn(async move {
            let mut last = 0;
            while last < TOTAL {
                let n = (last % 4 + 1).min(TOTAL - last);
                last = log.append(&s, last, &batch(&s, last + 1, n, "w"), None).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tails = vec![early];
    // Tails that start while the writer runs, from wherever it has reached.
    for _ in 0..3 {
        tokio::task::yield_now().await;
        let at = log.last_seq(&s).await.unwrap();
        tails.push(log.tail(&s, at).await.unwrap());
        tails.push(log.tail(&s, at / 2).await.unwrap());
    }
    let readers: Vec<_> = tails
        .into_iter()
        .map(|mut tail| {
            tokio::spawn(async move {
                let first = next(&mut tail).await.seq;
                let mut seqs = vec![first];
                seqs.extend(seqs_until(&mut tail, TOTAL).await);
                seqs
            })
        })
        .collect();
    writer.await.unwrap();
    for reader in readers {
        let seqs = reader.await.unwrap();
        let first = seqs[0];
        assert_eq!(seqs, (first..=TOTAL).collect::<Vec<_>>(), "every event once, in order");
    }
}

pub async fn list_sessions_order_filter_and_cursor(log: Arc<dyn SessionLog>) {
    let names = [("beta", "s2"), ("alpha", "z"), ("beta", "s1"), ("alpha", "a"), ("gamma", "only"), ("alpha", "m")];
    for (tenant, id) in names {
        let s = session(tenant, id);
        log.append(&s, 0, &batch(&s, 1, 1, "w"), None).await.unwrap();
    }
    // A session that was only tailed, or refused, has no events and is not listed.
    let _tail = log.tail(&session("alpha", "b-tailed"), 0).await.unwrap();
    let refused = session("alpha", "c-refused");
    assert!(log.append(&refused, 0, &[], None).await.is_err());

    let refs = |pairs: &[(&str, &str)]| pairs.iter().map(|(t, i)| session(t, i)).collect::<Vec<SessionRef>>();
    let everything =
        refs(&[("alpha", "a"), ("alpha", "m"), ("alpha", "z"), ("beta", "s1"), ("beta", "s2"), ("gamma", "only")]);
    assert_eq!(log.list_sessions(None, None, 100).await.unwrap(), everything);
    assert_eq!(log.list_sessions(Some("beta"), None, 100).await.unwrap(), everything[3..5]);
    assert!(log.list_sessions(Some("delta"), None, 100).await.unwrap().is_empty());

    // Paging with the cursor visits every session once, in order.
    let mut pages = Vec::new();
    let mut after: Option<SessionRef> = None;
    loop {
        let page = log.list_sessions(None, after.as_ref(), 4).await.unwrap();
        assert!(page.len() <= 4);
        let Some(last) = page.last().cloned() else { break };
        pages.extend(page);
        after = Some(last);
    }
    assert_eq!(pages, everything);

    // Cursor and tenant filter together; the cursor need not be a stored session.
    let a = session("alpha", "a");
    assert_eq!(log.list_sessions(Some("alpha"), Some(&a), 1).await.unwrap(), everything[1..2]);
    assert_eq!(log.list_sessions(Some("alpha"), Some(&session("alpha", "n")), 10).await.unwrap(), everything[2..3]);
    assert_eq!(log.list_sessions(Some("beta"), Some(&session("alpha", "zz")), 10).await.unwrap(), everything[3..5]);
    assert!(log.list_sessions(Some("alpha"), Some(&session("alpha", "z")), 10).await.unwrap().is_empty());
    assert!(log.list_sessions(None, None, 0).await.unwrap().is_empty());
}

pub async fn delete_removes_the_log_and_frees_the_name(log: Arc<dyn SessionLog>) {
    let s = session("acme", "doomed");
    let kept = session("acme", "kept");
    log.append(&s, 0, &batch(&s, 1, 3, "old"), None).await.unwrap();
    log.append(&s, 3, &batch(&s, 4, 2, "old"), None).await.unwrap();
    log.append(&kept, 0, &batch(&kept, 1, 2, "k"), None).await.unwrap();
    let mut old_tail = log.tail(&s, 0).await.unwrap();
    assert_eq!(seqs_until(&mut old_tail, 5).await, vec![1, 2, 3, 4, 5]);

    assert_eq!(log.delete(&s).await.unwrap(), 5, "delete answers the seq the log had");
    assert_eq!(log.last_seq(&s).await.unwrap(), 0);
    assert!(log.read(&s, 1, 100).await.unwrap().is_empty());
    assert_eq!(log.read_after(&s, 3, None).await.unwrap(), None, "a read past the new end says reset");
    assert_eq!(log.list_sessions(Some("acme"), None, 10).await.unwrap(), vec![kept.clone()]);
    // Deleting what has no events removes nothing and says so.
    assert_eq!(log.delete(&s).await.unwrap(), 0);
    assert_eq!(log.delete(&session("acme", "never")).await.unwrap(), 0);
    // The writer of the old log is refused: its expected seq is gone.
    assert!(matches!(
        log.append(&s, 5, &batch(&s, 6, 1, "old"), None).await,
        Err(JournalError::Conflict { actual: 0, .. })
    ));

    // The name is free: a new log starts at seq 1 and holds only its own events.
    let fresh = batch(&s, 1, 2, "new");
    assert_eq!(log.append(&s, 0, &fresh, None).await.unwrap(), 2);
    assert_eq!(read_all(&*log, &s, 1).await.unwrap(), fresh);
    let mut new_tail = log.tail(&s, 0).await.unwrap();
    let first = next(&mut new_tail).await;
    assert_eq!(first, fresh[0], "a new tail sees the new log only");
    // The other session is untouched.
    assert_eq!(read_all(&*log, &kept, 1).await.unwrap(), batch(&kept, 1, 2, "k"));
    // The old tail never delivers the old log again: it ends, or it goes on with the new log only.
    // (An error item is an end too: the JetStream tail reports the jump back to seq 1 as one.)
    if let Ok(Some(Ok(event))) = tokio::time::timeout(Duration::from_millis(0), old_tail.next()).await {
        assert!(fresh.contains(&event), "an old tail delivered {event:?} after the delete");
    }
}
