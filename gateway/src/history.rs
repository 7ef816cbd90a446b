//! History operations that read another session's log (SPEC §13): the gateway builds a fork from the
//! source's log, then routes it to the new session's owner, which writes it as `session/forked`.

use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_journal::log::read_all;
use turnstile_model::state::DEFAULT_DEDUP_HORIZON;
use turnstile_model::{EventPayload, Fork, SessionRef, SessionState};

use crate::{read, status};

/// The fork of `source` at the end of its turn `at_turn`: the source's fold at that `turn/end` (a full
/// fold from seq 1: read folds leave the transcript out, decision 0024). NOT_FOUND when the source does
/// not exist or has no finished turn `at_turn`.
pub async fn fork_of(log: &dyn SessionLog, source: &SessionRef, at_turn: u64) -> Result<Fork, Status> {
    let events = read_all(log, source, 1).await.map_err(status::from_journal)?;
    if events.is_empty() {
        return Err(read::not_found(source));
    }
    let mut state = SessionState::new(source.clone(), DEFAULT_DEDUP_HORIZON);
    for event in &events {
        state.apply(event).map_err(|e| status::from_projection(source, e))?;
        if matches!(event.payload, EventPayload::TurnEnd { turn, .. } if turn == at_turn) {
            return Ok(Fork {
                from: source.clone(),
                at_turn,
                at_seq: event.seq,
                agent: state.agent.clone(),
                compacted: state.compaction.clone(),
                transcript: state.transcript.entries().cloned().collect(),
            });
        }
    }
    Err(Status::not_found(format!(
        "session {source} has no finished turn {at_turn} (its last turn is {}{}); fork at a turn that has ended",
        state.last_turn,
        if state.open_turn.is_some() { ", still running" } else { "" }
    )))
}
