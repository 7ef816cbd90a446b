//! `turnstile dev --data-dir`: a SIGKILLed server started again on the same directory serves the same
//! log and continues the turn count.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_proto::v1::SessionStatus;
use turnstile_tests::{DevOptions, DevServer, Session, assert_lines, user_msg};

#[tokio::test]
async fn restart_on_same_data_dir_keeps_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = DevServer::start_with(DevOptions::data_dir(dir.path())).await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    assert_eq!(s.followup(user_msg("A", "hello")).await.unwrap().turn, Some(1));
    watch.settle(&s).await.unwrap();
    s.queue(user_msg("Q", "parked")).await.unwrap();
    watch.settle(&s).await.unwrap();
    let log = s.replay(0).await.unwrap();
    let inbox = s.inbox().await.unwrap();
    assert_eq!(log.1, 11);
    drop(watch);
    server.kill();

    let server = DevServer::start_with(DevOptions::data_dir(dir.path())).await.unwrap();
    let s = Session::with_ref(server.client(), s.reference());
    assert_eq!(s.replay(0).await.unwrap(), log, "Watch(after_seq = 0) replays the same log");
    assert_eq!(s.inbox().await.unwrap(), inbox, "GetInbox folds to the same inbox");
    let info = s.info().await.unwrap();
    assert_eq!((info.status, info.last_seq, info.last_turn), (SessionStatus::Idle as i32, 11, 1));

    let watch = s.watch().await.unwrap();
    let b = s.followup(user_msg("B", "again")).await.unwrap();
    assert_eq!((b.seq, b.turn), (12, Some(2)), "the new followup opens turn 2");
    let lines = watch.settle(&s).await.unwrap();
    assert_lines(
        &lines[lines.len() - 22..],
        &[
            "D spliced next-turn 1 0 [B] wake",
            "L inserted B",
            "D status running",
            "L status running",
            "D turn/start 2",
            "D spliced next-turn 0 1 []",
            "L claimed Q 2",
            "D step/start 2.1",
            "D user/message Q",
            "D assistant/message 2.1 \"echo: parked\"",
            "D step/end 2.1",
            "D turn/end 2 completed",
            "D turn/start 3",
            "D spliced next-turn 0 1 []",
            "L claimed B 3",
            "D step/start 3.1",
            "D user/message B",
            "D assistant/message 3.1 \"echo: again\"",
            "D step/end 3.1",
            "D turn/end 3 completed",
            "D status idle",
            "L status idle",
        ],
    );
    // The replay part of this watch is the old log, unchanged.
    assert_eq!(&watch.events()[..11], &log.0[..]);
}

/// A restart of an in-memory server forgets everything: the session is gone.
#[tokio::test]
async fn restart_without_data_dir_forgets() {
    let server = DevServer::start().await.unwrap();
    let s = server.session();
    s.queue(user_msg("A", "x")).await.unwrap();
    server.kill();
    let server = DevServer::start().await.unwrap();
    let s = Session::with_ref(server.client(), s.reference());
    assert_eq!(s.info().await.unwrap_err().code(), tonic::Code::NotFound);
}
