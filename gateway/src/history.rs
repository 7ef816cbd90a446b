//! History operations that read another session's log (SPEC §13): the gateway builds a fork from the
//! source's log, then routes it to the new session's owner, which writes it as `session/forked`.

use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{EventPayload, Fork, SessionRef, SessionState, TranscriptEntry};

use crate::{read, status};

/// The full fold of `source` (from seq 1: read folds leave the transcript out, decision 0024) through the
/// `turn/end` of `upto_turn`, or through its last event when `None`. NOT_FOUND when the source does not
/// exist or has no finished turn `upto_turn`; `what` names the operation in that message.
async fn fold_through(
    log: &dyn SessionLog,
    source: &SessionRef,
    upto_turn: Option<u64>,
    what: &str,
) -> Result<SessionState, Status> {
    // The whole log in one read: a long one is read from its history archive first (decision 0181).
    let events = log.read_after(source, 0, None).await.map_err(status::from_journal)?.unwrap_or_default();
    if events.is_empty() {
        return Err(read::not_found(source));
    }
    let mut state = SessionState::new(source.clone(), DEFAULT_DEDUP_HORIZON);
    for event in &events {
        state.apply(event).map_err(|e| status::from_projection(source, e))?;
        let through = match (&event.payload, upto_turn) {
            (EventPayload::TurnEnd { turn, .. }, Some(t)) => *turn == t,
            // A fork's copied turns end in its `session/forked`: it can be forked (and its first own turn
            // evaluated) from there.
            (EventPayload::SessionForked(fork), Some(t)) => fork.at_turn == t,
            _ => false,
        };
        if through {
            return Ok(state);
        }
    }
    match upto_turn {
        None => Ok(state),
        Some(turn) => Err(Status::not_found(format!(
            "session {source} has no finished turn {turn} (its last turn is {}{}); {what} at a turn that has ended",
            state.last_turn,
            if state.open_turn.is_some() { ", still running" } else { "" }
        ))),
    }
}

/// The fork of `source` at the end of its turn `at_turn` (decision 0024).
pub async fn fork_of(log: &dyn SessionLog, source: &SessionRef, at_turn: u64) -> Result<Fork, Status> {
    let state = fold_through(log, source, Some(at_turn), "fork").await?;
    Ok(Fork {
        from: source.clone(),
        at_turn,
        at_seq: state.last_seq,
        agent: state.agent.clone(),
        compacted: state.compaction.clone(),
        transcript: state.transcript.entries().cloned().collect(),
    })
}

/// `from`'s transcript through `upto_turn` (or all of it) rendered as text for `ReferenceSession`
/// (SPEC §13), and the seq it reaches.
pub async fn reference_text(
    log: &dyn SessionLog,
    from: &SessionRef,
    upto_turn: Option<u64>,
) -> Result<(String, u64), Status> {
    let state = fold_through(log, from, upto_turn, "reference it").await?;
    let mut text = format!("Transcript of session {from} through seq {}:\n", state.last_seq);
    if let Some(c) = &state.compaction {
        text.push_str(&format!("[summary of turns {}..{}] {}\n", c.from_turn, c.upto_turn, c.summary));
    }
    for entry in state.transcript.entries() {
        let line = match entry {
            TranscriptEntry::User { message, .. } => format!("user: {}", message.text()),
            TranscriptEntry::Assistant { text, tool_calls, .. } => {
                let calls: Vec<String> =
                    tool_calls.iter().map(|c| format!(" [calls {} {}]", c.name, c.arguments)).collect();
                format!("assistant: {text}{}", calls.concat())
            }
            TranscriptEntry::ToolResult { name, output, error: None, .. } => format!("tool {name}: {output}"),
            TranscriptEntry::ToolResult { name, error: Some(e), .. } => format!("tool {name} failed: {e}"),
        };
        text.push_str(&line);
        text.push('\n');
    }
    Ok((text, state.last_seq))
}
