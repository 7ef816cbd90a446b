//! Builders for real envelopes, shared by the journal's integration tests.
#![allow(dead_code)]

use turnstile_model::{
    Envelope, EventPayload, MessageSource, SessionRef, Splice, SpliceOutcome, Status, Target, TurnEndReason,
    UserMessage,
};

pub fn session(tenant: &str, id: &str) -> SessionRef {
    SessionRef::new(tenant, id).unwrap()
}

/// The payloads of an idle followup's turn (SPEC §5 canonical order), cycled by seq so every kind of event
/// is stored; `tag` makes batches of different writers distinguishable.
pub fn payload(seq: u64, tag: &str) -> EventPayload {
    let turn = seq / 10 + 1;
    let message = UserMessage {
        id: format!("{tag}-m{turn}").as_str().into(),
        content: vec![turnstile_model::ContentBlock::text(format!("prompt {turn} from {tag}"))].into(),
        source: MessageSource::User,
    };
    match seq % 10 {
        1 => EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 0,
            inserted: vec![message],
            outcome: SpliceOutcome::None,
            wake: true,
            requested_target: None,
            deadline: None,
        }),
        2 => EventPayload::Status(Status::Running),
        3 => EventPayload::TurnStart { turn },
        4 => EventPayload::InboxSpliced(Splice {
            target: Target::NextTurn,
            start: 0,
            removed_count: 1,
            inserted: vec![],
            outcome: SpliceOutcome::None,
            wake: false,
            requested_target: None,
            deadline: None,
        }),
        5 => EventPayload::StepStart { turn, step: 1 },
        6 => EventPayload::UserMessage { message, turn, step: 1 },
        7 => EventPayload::AssistantMessage {
            turn,
            step: 1,
            text: format!("echo: prompt {turn} from {tag}"),
            tool_calls: vec![],
            interrupted: false,
            max_tokens: false,
            reasoning: None,
            usage: None,
            model: None,
        },
        8 => EventPayload::StepEnd { turn, step: 1, spent: None },
        9 => EventPayload::TurnEnd { turn, reason: TurnEndReason::Completed },
        _ => EventPayload::Status(Status::Idle),
    }
}

pub fn event(session: &SessionRef, seq: u64, tag: &str) -> Envelope {
    Envelope { session: session.clone(), seq, time_ms: 1_700_000_000_000 + seq, epoch: 1, payload: payload(seq, tag) }
}

/// `n` contiguous events starting at `first_seq`.
pub fn batch(session: &SessionRef, first_seq: u64, n: u64, tag: &str) -> Vec<Envelope> {
    (first_seq..first_seq + n).map(|seq| event(session, seq, tag)).collect()
}
