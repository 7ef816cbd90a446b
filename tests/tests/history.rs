//! History operations end to end (SPEC §13) through the public API of a real `turnstile dev`: `Compact`
//! and `ForkSession`, with their refusals (precise errors, nothing written).
//! Every scenario runs on the embedded journal and on `--nats` (`backend_tests!`).
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::SessionRef;
use turnstile_proto::v1::session_event::Payload;
use turnstile_tests::{Backend, Session, user_msg};

async fn two_turns(s: &Session) {
    s.followup(user_msg("A", "what is a turnstile?")).await.unwrap();
    s.when_idle().await.unwrap();
    s.followup(user_msg("B", "[[tool:echo gates]] and who invented it?")).await.unwrap();
    s.when_idle().await.unwrap();
}

async fn compact_writes_context_compacted_with_the_scripted_summary(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    two_turns(&s).await;
    let seq = s.compact().await.unwrap().seq;
    let (events, last) = s.replay(0).await.unwrap();
    assert_eq!(seq, last);
    match &events.last().unwrap().payload {
        Some(Payload::ContextCompacted(c)) => {
            assert_eq!((c.upto_turn, c.summary.as_str(), c.summarized_turns), (2, "summary of turns 1..2", 2));
        }
        other => panic!("expected context/compacted, got {other:?}"),
    }
    // Nothing left to summarize: writes nothing, answers the last seq.
    assert_eq!(s.compact().await.unwrap().seq, last);
    // The session goes on; the log kept every event of the summarized turns.
    s.followup(user_msg("C", "thanks")).await.unwrap();
    assert_eq!(s.when_idle().await.unwrap().last_turn, 3);
}

async fn a_fork_copies_the_transcript_and_goes_on_from_the_turn_after(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let source = server.session();
    two_turns(&source).await;
    let fork_id = format!("{}-fork", source.reference().id);
    let info = source.fork(1, &fork_id).await.unwrap();
    assert_eq!((info.last_seq, info.last_turn), (1, 1));
    let fork = Session::with_ref(server.client(), SessionRef { id: fork_id.clone(), ..source.reference() });
    let (events, _) = fork.replay(0).await.unwrap();
    match &events[0].payload {
        Some(Payload::SessionForked(f)) => {
            assert_eq!(f.from.as_ref().unwrap().id, source.reference().id);
            assert_eq!(f.at_turn, 1);
            assert_eq!(f.transcript.len(), 2, "turn 1: the user message and the answer");
        }
        other => panic!("expected session/forked, got {other:?}"),
    }
    assert!(fork.inbox().await.unwrap().next_turn.is_empty(), "the fork's inbox starts empty");
    fork.followup(user_msg("F", "say it shorter")).await.unwrap();
    assert_eq!(fork.when_idle().await.unwrap().last_turn, 2, "the fork's first turn is at_turn + 1");
    // The source is untouched.
    assert_eq!(source.info().await.unwrap().last_turn, 2);
}

async fn bad_forks_are_refused_precisely_and_write_nothing(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let source = server.session();
    two_turns(&source).await;
    let new_id = format!("{}-new", source.reference().id);
    let new = Session::with_ref(server.client(), SessionRef { id: new_id.clone(), ..source.reference() });

    let err = source.fork(7, &new_id).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(
        err.message().contains("no finished turn 7") && err.message().contains("last turn is 2"),
        "{}",
        err.message()
    );
    let err = source.fork(0, &new_id).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert_eq!(new.info().await.unwrap_err().code(), Code::NotFound, "nothing was written");

    // A missing source is NOT_FOUND like any read.
    let missing = server.session();
    let err = missing.fork(1, &new_id).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());

    // Onto a session that has events: ALREADY_EXISTS, and that session is unchanged.
    let other = server.session();
    other.followup(user_msg("X", "mine")).await.unwrap();
    other.when_idle().await.unwrap();
    let before = other.replay(0).await.unwrap().1;
    let err = source.fork(1, &other.reference().id).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    assert!(err.message().contains("already has events"), "{}", err.message());
    assert_eq!(other.replay(0).await.unwrap().1, before);

    // A malformed new id is INVALID_ARGUMENT.
    let err = source.fork(1, "no spaces allowed").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
}

async fn a_reference_injects_the_other_sessions_transcript_with_a_session_source(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let from = server.session();
    two_turns(&from).await;
    let s = server.session();
    let reply = s.reference_session(from.reference(), Some(1), "ref-1").await.unwrap();
    assert_eq!((reply.seq, reply.turn), (1, None), "an inject: one splice, no turn");
    let inbox = s.inbox().await.unwrap();
    let m = &inbox.next_step[0];
    assert_eq!(m.id, "ref-1");
    let text = turnstile_tests::text_of(m);
    assert!(
        text.contains("user: what is a turnstile?") && text.contains("assistant: echo: what is a turnstile?"),
        "{text}"
    );
    assert!(!text.contains("who invented"), "turn 2 is after upto_turn: {text}");
    match m.source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(turnstile_proto::v1::message_source::Kind::Session(src)) => {
            assert_eq!(src.session, from.reference().id);
            assert_eq!(src.upto_seq, 9, "the seq of turn 1's turn/end");
        }
        other => panic!("expected a session source, got {other:?}"),
    }
    // The next followup enters it; replay never needs the referenced session again.
    s.followup(user_msg("P", "summarise that")).await.unwrap();
    s.when_idle().await.unwrap();
    let (events, _) = s.replay(0).await.unwrap();
    let entered: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::UserMessage(u)) => u.message.as_ref().map(|m| m.id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(entered, ["ref-1", "P"]);
}

async fn a_reference_to_a_missing_session_or_turn_is_not_found_and_writes_nothing(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let missing = server.session();
    let err = s.reference_session(missing.reference(), None, "ref-1").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    let from = server.session();
    two_turns(&from).await;
    let err = s.reference_session(from.reference(), Some(3), "ref-1").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(err.message().contains("no finished turn 3"), "{}", err.message());
    let err = s.reference_session(from.reference(), None, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound, "nothing was written");
}

/// A cluster of 3 workers: the fork's shard is owned by another worker than the source's, and the fork runs
/// there (the new session's owner writes `session/forked`; the gateway read the source's log).
#[tokio::test]
async fn a_fork_runs_on_whatever_worker_owns_it() {
    let cluster = turnstile_tests::Cluster::start(3, 2).await.unwrap();
    cluster.wait_balanced().await.unwrap();
    let source = cluster.session(0);
    two_turns(&source).await;
    let source_owner = source.info().await.unwrap().owner;
    // Fork ids hash to shards all over the cluster: within a few candidates one lands elsewhere (each
    // lands on the source's worker with probability about 1/3).
    let mut forked = None;
    for i in 0..40 {
        let id = format!("{}-fork{i}", source.reference().id);
        let info = source.fork(2, &id).await.unwrap();
        if info.owner != source_owner {
            forked = Some((id, info.owner));
            break;
        }
    }
    let (id, owner) = forked.expect("no fork landed on another worker in 40 tries");
    let fork = Session::with_ref(cluster.client(1), SessionRef { id, ..source.reference() });
    fork.followup(user_msg("F", "go on")).await.unwrap();
    let idle = fork.when_idle().await.unwrap();
    assert_eq!((idle.last_turn, idle.owner.as_str()), (3, owner.as_str()), "{}", cluster.logs());
    let (events, _) = fork.replay(0).await.unwrap();
    let answered = events
        .iter()
        .any(|e| matches!(&e.payload, Some(Payload::AssistantMessage(m)) if m.turn == 3 && m.text == "echo: go on"));
    assert!(answered, "{events:?}");
}

turnstile_tests::backend_tests!(
    compact_writes_context_compacted_with_the_scripted_summary,
    a_fork_copies_the_transcript_and_goes_on_from_the_turn_after,
    bad_forks_are_refused_precisely_and_write_nothing,
    a_reference_injects_the_other_sessions_transcript_with_a_session_source,
    a_reference_to_a_missing_session_or_turn_is_not_found_and_writes_nothing,
);
