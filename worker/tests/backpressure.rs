//! Backpressure in the worker's host (issue 14): a session's command queue is bounded
//! (`[limits] max_queued_commands`) and a command that finds it full is refused at once with
//! RESOURCE_EXHAUSTED instead of holding its caller; every command that was queued is answered and
//! written once the driver moves again, and the refused one wrote nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_support;

use std::sync::Arc;
use std::time::Duration;

use log_support::TestLog;
use turnstile_agent::AgentSetup;
use turnstile_cluster::CommandRouter;
use turnstile_journal::LocalBus;
use turnstile_model::{Command, CommandError, CommandReply, EventPayload, SessionRef, Target, UserMessage};
use turnstile_worker::{SessionHost, WorkerConfig};

fn queue(id: &str) -> Command {
    let message = UserMessage::user_text(id, format!("queued {id}"));
    Command::Send { message, target: Target::NextTurn, wakeup: false, expected_turn: None, deadline: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_command_queue_refuses_at_once_and_loses_nothing_it_queued() {
    let log = Arc::new(TestLog::gated());
    let config = WorkerConfig { command_queue: 2, ..WorkerConfig::default() };
    let host = SessionHost::builder(log.clone(), Arc::new(LocalBus::new()), AgentSetup::default().into())
        .config(config)
        .build();
    let session = SessionRef::new("acme", "busy").unwrap();

    // A is taken by the driver, which then waits in its append; B and C fill the queue behind it.
    let mut accepted = Vec::new();
    for id in ["A", "B", "C"] {
        let (h, s) = (host.clone(), session.clone());
        accepted.push(tokio::spawn(async move { h.execute(&s, queue(id), None).await }));
        // Wait (bounded) until the command is where it should be: A out of the queue, B and C in it.
        let queued = if id == "A" {
            0
        } else if id == "B" {
            1
        } else {
            2
        };
        let settled = async {
            while host.queued_commands(&session) != queued || log.waiting() != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), settled).await.expect("the queue filled");
    }
    // A is in the driver (its append waits), so two are queued while one runs.
    assert_eq!(host.queued_commands(&session), 2);

    let refused = host.execute(&session, queue("D"), None).await.unwrap_err();
    let CommandError::ResourceExhausted(message) = &refused else { panic!("{refused:?}") };
    assert!(message.contains("2 commands waiting") && message.contains("retry with the same message id"), "{message}");

    // The driver moves again: every queued command is answered and written, in order; D is nowhere.
    log.release();
    let mut seqs = Vec::new();
    for task in accepted {
        match task.await.unwrap().unwrap() {
            CommandReply::Sent { seq, turn: None } => seqs.push(seq),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seqs, [1, 2, 3]);
    let events = turnstile_journal::log::read_all(log.as_ref(), &session, 1).await.unwrap();
    // Each queued message is one insert splice; the refused D is in none of them.
    let inserted: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::InboxSpliced(splice) => Some(&splice.inserted),
            _ => None,
        })
        .flatten()
        .map(|m| (m.id.0.clone(), m.text()))
        .collect();
    let expected = ["A", "B", "C"].map(|id| (id.to_owned(), format!("queued {id}")));
    assert_eq!(inserted, expected, "the refused command wrote nothing");
}
