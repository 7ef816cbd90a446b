//! Fuzzing the internal API's command codec (issue 14 part 6): an `ExecuteRequest` or `ExecuteReply` of any
//! bytes, or a mutated valid one, decodes to a command (reply) or a typed [`CodecError`], never a panic; what
//! decodes re-encodes to the same command, so the owner runs exactly what the gateway built.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
#[path = "../../proto/tests/mutation/mod.rs"]
mod mutation;

use mutation::{mutate, mutations};
use prost::Message as _;
use turnstile_cluster::codec::{
    decode_command_reply, decode_execute_request, encode_command_reply, encode_execute_request,
};
use turnstile_model::{
    CancelCause, Command, CommandReply, ContentBlock, DeadlineSpec, GoalAction, InjectMode, MessageSource, OnDeadline,
    SessionRef, Target, UserMessage,
};
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::codec::CodecError;

/// Modest and deterministic enough for CI: no persistence file is written into the tree.
fn config() -> Config {
    Config { cases: 512, failure_persistence: None, ..Config::default() }
}

fn session() -> SessionRef {
    SessionRef::new("acme", "s-1").unwrap()
}

fn message(id: &str) -> UserMessage {
    UserMessage { id: id.into(), content: vec![ContentBlock::text("hello")].into(), source: MessageSource::User }
}

/// Valid commands of most kinds, the material the mutations start from.
fn commands() -> Vec<Command> {
    vec![
        Command::Send {
            message: message("m-1"),
            target: Target::NextStep,
            wakeup: true,
            expected_turn: Some(4),
            deadline: Some(DeadlineSpec { after_ms: 5_000, on_deadline: OnDeadline::Interrupt }),
        },
        Command::Interrupt { message: message("m-2") },
        Command::Cancel { cause: CancelCause::Hook { reason: "policy".into() }, keep_inbox: true },
        Command::Replace { id: "m-1".into(), message: message("m-3") },
        Command::Remove { id: "m-1".into() },
        Command::Splice { target: Target::NextTurn, start: 1, delete_count: 2, inserted: vec![message("m-4")] },
        Command::Clear,
        Command::Configure {
            agent: "assistant".into(),
            inject_mode: InjectMode::Pending,
            version: Some(1),
            overrides: Default::default(),
        },
        Command::Migrate { agent: "assistant".into(), version: 2 },
        Command::Decide { call_id: "call-1".into(), approve: false, reason: "no".into() },
        Command::SetGoal { goal_id: "g1".into(), objective: "ship it".into(), max_rounds: 3 },
        Command::UpdateGoal { goal_id: "g1".into(), action: GoalAction::Pause },
        Command::WhenIdle,
        Command::Compact,
        Command::Delete,
    ]
}

fn replies() -> Vec<CommandReply> {
    vec![
        CommandReply::Sent { seq: 9, turn: Some(2) },
        CommandReply::Sent { seq: 3, turn: None },
        CommandReply::Written { seq: 12 },
    ]
}

fn check_error(err: &CodecError) {
    assert!(!err.to_string().is_empty(), "{err:?}");
}

fn check_request(bytes: &[u8]) {
    let Ok(raw) = cpb::ExecuteRequest::decode(bytes) else { return };
    match decode_execute_request(raw) {
        Ok((session, command, timeout)) => {
            let again = decode_execute_request(encode_execute_request(&session, &command, timeout)).unwrap();
            assert_eq!(again, (session, command, timeout));
        }
        Err(err) => check_error(&err),
    }
}

fn check_reply(bytes: &[u8]) {
    let Ok(raw) = cpb::ExecuteReply::decode(bytes) else { return };
    match decode_command_reply(raw) {
        Ok(reply) => {
            let again = decode_command_reply(encode_command_reply(&session(), &reply)).unwrap();
            assert_eq!(again, reply);
        }
        Err(err) => check_error(&err),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn execute_decoding_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_request(&bytes);
        check_reply(&bytes);
    }

    #[test]
    fn execute_decoding_never_panics_on_mutated_requests(
        command in any::<Index>(),
        mutations in mutations(),
    ) {
        let command = command.get(&commands()).clone();
        let valid = encode_execute_request(&session(), &command, Some(Duration::from_millis(250))).encode_to_vec();
        check_request(&mutate(valid, &mutations));
    }

    #[test]
    fn execute_decoding_never_panics_on_mutated_replies(
        reply in any::<Index>(),
        mutations in mutations(),
    ) {
        let reply = reply.get(&replies()).clone();
        let valid = encode_command_reply(&session(), &reply).encode_to_vec();
        check_reply(&mutate(valid, &mutations));
    }
}

/// Every seed round-trips, so the mutations start from what the gateway really sends.
#[test]
fn seeds_round_trip() {
    for command in commands() {
        let request = encode_execute_request(&session(), &command, None);
        assert_eq!(decode_execute_request(request).unwrap(), (session(), command, None));
    }
    for reply in replies() {
        assert_eq!(decode_command_reply(encode_command_reply(&session(), &reply)).unwrap(), reply);
    }
}
