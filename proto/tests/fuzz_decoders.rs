//! Fuzzing the proto → model decoders (issue 14 part 6): arbitrary bytes and mutated valid encodings give a
//! decoded value or a typed [`CodecError`], never a panic; whatever decodes re-encodes to a value that
//! decodes to itself, so a stored event cannot change meaning on its next read.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use proptest::test_runner::Config;
mod mutation;

use mutation::{mutate, mutations};
use prost::Message as _;
use turnstile_model::{
    ContentBlock, Envelope, EventPayload, MessageSource, SessionRef, Splice, SpliceOutcome, Status, Target,
    TurnEndReason, UserMessage,
};
use turnstile_proto::codec::{self, CodecError};
use turnstile_proto::v1 as pb;

/// Modest and deterministic enough for CI: no persistence file is written into the tree.
fn config() -> Config {
    Config { cases: 512, failure_persistence: None, ..Config::default() }
}

fn session() -> SessionRef {
    SessionRef::new("acme", "s-1").unwrap()
}

fn message(source: MessageSource) -> UserMessage {
    UserMessage {
        id: "m-1".into(),
        content: vec![
            ContentBlock::text("hello"),
            ContentBlock::Data { mime: "image/png".into(), bytes: vec![0, 1, 2, 255] },
        ]
        .into(),
        source,
    }
}

fn sources() -> Vec<MessageSource> {
    vec![
        MessageSource::User,
        MessageSource::Plugin { plugin: "memory".into(), form: Some("recall".into()) },
        MessageSource::Goal { goal_id: "g1".into(), revision: 3, round: 2 },
        MessageSource::Tool { call_id: "call-7".into() },
        MessageSource::Model { provider: "scripted".into(), model: "echo".into() },
        MessageSource::Session { tenant: "acme".into(), session: "other".into(), upto_seq: 9 },
    ]
}

/// Valid events of several payload kinds, the material the mutations start from.
fn seeds() -> Vec<Vec<u8>> {
    let payloads = vec![
        EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: sources().into_iter().map(message).collect(),
            outcome: SpliceOutcome::None,
            wake: true,
            requested_target: Some(Target::NextStep),
            deadline: None,
        }),
        EventPayload::Status(Status::Running),
        EventPayload::TurnStart { turn: 3 },
        EventPayload::StepStart { turn: 3, step: 1 },
        EventPayload::UserMessage { message: message(MessageSource::User), turn: 3, step: 1 },
        EventPayload::AssistantMessage {
            turn: 3,
            step: 1,
            text: "echo".into(),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: true,
            reasoning: None,
            usage: None,
            model: None,
        },
        EventPayload::StepEnd { turn: 3, step: 1, spent: None },
        EventPayload::TurnEnd { turn: 3, reason: TurnEndReason::Completed },
    ];
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, payload)| {
            let seq = i as u64 + 1;
            codec::encode_event(&Envelope { session: session(), seq, time_ms: 1_700_000_000_000, epoch: 2, payload })
        })
        .collect()
}

/// A refusal says what was wrong: its message is not empty, and a field error names its field.
fn check_error(err: &CodecError) {
    assert!(!err.to_string().is_empty(), "{err:?}");
    if let Some(path) = err.path() {
        assert!(!path.is_empty(), "{err:?}");
    }
}

/// Decodes `bytes` as a stored event; what decodes must survive a re-encode unchanged.
fn check_event(bytes: &[u8]) {
    match codec::decode_event(bytes) {
        Ok(event) => {
            let again = codec::decode_event(&codec::encode_event(&event)).expect("a decoded event re-encodes");
            assert_eq!(again, event);
        }
        Err(err) => check_error(&err),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decode_event_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_event(&bytes);
    }

    #[test]
    fn decode_event_never_panics_on_mutated_encodings(
        seed in any::<prop::sample::Index>(),
        mutations in mutations(),
    ) {
        let seeds = seeds();
        check_event(&mutate(seed.get(&seeds).clone(), &mutations));
    }

    #[test]
    fn decode_live_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        match codec::decode_live(&bytes) {
            Ok(event) => {
                let again = codec::decode_live(&codec::encode_live(&event)).expect("a decoded live event re-encodes");
                prop_assert_eq!(again, event);
            }
            Err(err) => check_error(&err),
        }
    }

    #[test]
    fn message_decoders_never_panic_on_mutated_encodings(
        source in any::<prop::sample::Index>(),
        mutations in mutations(),
    ) {
        let source = source.get(&sources()).clone();
        let bytes = mutate(codec::encode_user_message(&message(source.clone())).encode_to_vec(), &mutations);
        if let Ok(raw) = pb::UserMessage::decode(bytes.as_slice()) {
            match codec::decode_user_message(raw) {
                Ok(decoded) => {
                    let again = codec::decode_user_message(codec::encode_user_message(&decoded)).unwrap();
                    prop_assert_eq!(again, decoded);
                }
                Err(err) => check_error(&err),
            }
        }
        let bytes = mutate(codec::encode_message_source(&source).encode_to_vec(), &mutations);
        if let Ok(raw) = pb::MessageSource::decode(bytes.as_slice()) {
            match codec::decode_message_source(raw) {
                Ok(decoded) => {
                    let again = codec::decode_message_source(codec::encode_message_source(&decoded)).unwrap();
                    prop_assert_eq!(again, decoded);
                }
                Err(err) => check_error(&err),
            }
        }
        let bytes = mutate(codec::encode_session_ref(&session()).encode_to_vec(), &mutations);
        if let Ok(raw) = pb::SessionRef::decode(bytes.as_slice())
            && let Err(err) = codec::decode_session_ref(raw) {
                check_error(&err);
            }
    }

    #[test]
    fn message_decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(raw) = pb::UserMessage::decode(bytes.as_slice())
            && let Err(err) = codec::decode_user_message(raw) {
                check_error(&err);
            }
        if let Ok(raw) = pb::MessageSource::decode(bytes.as_slice())
            && let Err(err) = codec::decode_message_source(raw) {
                check_error(&err);
            }
        if let Ok(raw) = pb::InboxSnapshot::decode(bytes.as_slice())
            && let Err(err) = codec::decode_inbox_snapshot(raw) {
                check_error(&err);
            }
    }
}

/// The seeds are valid, so the mutation test starts from real encodings, not from noise.
#[test]
fn seeds_decode() {
    for bytes in seeds() {
        check_event(&bytes);
        codec::decode_event(&bytes).unwrap();
    }
}
