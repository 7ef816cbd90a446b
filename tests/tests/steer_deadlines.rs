//! Steer deadlines end to end (SPEC §11): a steer still pending when its deadline passes interrupts the
//! turn (and runs next) or is dropped; bad deadlines are refused with nothing written; a deadline that
//! passes while the owner is paused past its lease fires at once on the new owner.
//! The single-process scenarios run on the embedded journal and on `--nats` (`backend_tests!`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::OnDeadline;
use turnstile_tests::{Backend, Cluster, user_msg};

async fn interrupt_runs_a_late_steer_as_the_next_turn(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:sleep 60000]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep 60000").await.unwrap();
    s.steer_with_deadline(user_msg("S", "hurry"), Some(200), OnDeadline::Interrupt as i32).await.unwrap();
    watch.wait_line("D turn/end 1 aborted{steer-deadline}").await.unwrap();
    let lines = watch.settle(&s).await.unwrap();
    assert_eq!(s.info().await.unwrap().last_turn, 2);
    let at = |line: &str| lines.iter().position(|l| l == line).unwrap_or_else(|| panic!("no {line:?} in {lines:#?}"));
    assert!(at("D spliced next-turn 0 0 [S] wake") < at("D turn/end 1 aborted{steer-deadline}"));
    assert!(at("D turn/end 1 aborted{steer-deadline}") < at("D user/message S"));
    assert!(lines.contains(&"D assistant/message 2.1 \"echo: hurry\"".to_owned()), "{lines:#?}");
}

async fn drop_removes_a_late_steer_and_a_timely_one_runs(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:sleep 1500]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep 1500").await.unwrap();
    s.steer_with_deadline(user_msg("LATE", "too late"), Some(100), OnDeadline::Drop as i32).await.unwrap();
    // This one is claimed when the tool finishes, long before its deadline.
    s.steer_with_deadline(user_msg("OK", "in time"), Some(60_000), OnDeadline::Drop as i32).await.unwrap();
    watch.wait_line("L discarded LATE").await.unwrap();
    let lines = watch.settle(&s).await.unwrap();
    assert!(lines.contains(&"D spliced next-step 0 1 [] canceled".to_owned()), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.starts_with("D user/message LATE")), "{lines:#?}");
    assert!(lines.contains(&"D user/message OK".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:#?}");
}

async fn bad_deadlines_are_refused_and_write_nothing(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let cases: [(Option<u64>, OnDeadline, &str, &str); 4] = [
        (Some(0), OnDeadline::Interrupt, "deadline_ms", "0 is out of range"),
        (Some(8 * 24 * 3600 * 1000), OnDeadline::Drop, "deadline_ms", "is out of range"),
        (None, OnDeadline::Drop, "on_deadline", "is set without deadline_ms"),
        (None, OnDeadline::Interrupt, "on_deadline", "is set without deadline_ms"),
    ];
    for (deadline_ms, on_deadline, field, detail) in cases {
        let err = s.steer_with_deadline(user_msg("S", "x"), deadline_ms, on_deadline as i32).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(field) && err.message().contains(detail), "{}", err.message());
    }
    let err = s.steer_with_deadline(user_msg("S", "x"), Some(100), 7).await.unwrap_err();
    assert!(err.message().contains("7 is not an OnDeadline"), "{}", err.message());
    let err = s.info().await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "nothing was written: {err:?}");
    // Without on_deadline a deadline means interrupt.
    s.steer_with_deadline(user_msg("S", "x"), Some(100), OnDeadline::Unspecified as i32).await.unwrap();
}

turnstile_tests::backend_tests!(
    interrupt_runs_a_late_steer_as_the_next_turn,
    drop_removes_a_late_steer_and_a_timely_one_runs,
    bad_deadlines_are_refused_and_write_nothing,
);

/// In the `cluster` test group (docs/TESTING.md): it runs three workers and two gateways.
mod cluster {
    use super::*;

    #[tokio::test]
    async fn a_deadline_that_passes_while_the_owner_is_paused_fires_on_the_new_owner() {
        let mut cluster = Cluster::start(3, 2).await.unwrap();
        let s0 = cluster.session(0);
        let s1 = cluster.session_via(1, &s0);
        let watch = s1.watch().await.unwrap();
        s0.followup(user_msg("A", "[[tool:sleep 60000]] go")).await.unwrap();
        watch.wait_line("D tool/call 1.1 sleep 60000").await.unwrap();
        s0.steer_with_deadline(user_msg("S", "hurry"), Some(500), OnDeadline::Drop as i32).await.unwrap();
        let owner = s0.info().await.unwrap().owner;
        let victim = cluster.worker_index(&owner).unwrap();
        // A kill -9 is noticed in ~100 ms now (decision 0019), sooner than any deadline worth testing; a
        // paused owner keeps its sockets, so its shards move only when its lease (1.5 s) runs out, long
        // after the 500 ms deadline: the new owner loads the log after it and drops S first.
        cluster.sigstop_worker(victim);
        // The new owner resumes the running session by itself when it acquires the shard (decision 0005).
        watch.wait_line("L discarded S").await.unwrap();
        let lines = watch.wait_line("D turn/end 1 interrupted").await.unwrap();
        let dropped = lines.iter().position(|l| l == "D spliced next-step 0 1 [] canceled");
        let interrupted = lines.iter().position(|l| l == "D turn/end 1 interrupted");
        assert!(dropped.is_some() && dropped < interrupted, "S is dropped before the turn is repaired: {lines:#?}");
        assert!(!lines.iter().any(|l| l.starts_with("D user/message S")), "{lines:#?}");
        cluster.kill9_worker(victim);
    }
}
