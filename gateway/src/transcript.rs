//! `GetTranscript` (SPEC §21): a session's conversation as items, read from its log by the model's
//! [`TranscriptReader`] (decision 0105).
//!
//! Every page reads the log from seq 1: how a message was delivered and a turn's usage come from events
//! before the page's first item. A page ends at `page_size` items or at [`MAX_REPLY_BYTES`], whichever
//! comes first (at least one item, so a page always advances).

use prost::Message as _;
use tonic::Status;
use turnstile_journal::SessionLog;
use turnstile_model::{SessionRef, TranscriptReader};
use turnstile_proto::codec;
use turnstile_proto::v1 as pb;

use crate::{read, status};

/// Encoded items in one reply at most: under the 4 MiB a gRPC client accepts by default, with room for the
/// envelope. A single larger item is still sent alone.
pub(crate) const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

/// Events read from the log per request to it.
const CHUNK: usize = 1024;

/// The items of `session` with a seq above `after_seq`, at most `page_size` of them; NOT_FOUND for a session
/// without events.
pub(crate) async fn page(
    log: &dyn SessionLog,
    session: &SessionRef,
    after_seq: u64,
    page_size: usize,
) -> Result<pb::GetTranscriptReply, Status> {
    let last_seq = log.last_seq(session).await.map_err(status::from_journal)?;
    if last_seq == 0 {
        return Err(read::not_found(session));
    }
    let mut reader = TranscriptReader::new();
    let mut items: Vec<pb::TranscriptItem> = Vec::new();
    let mut bytes = 0;
    let mut next = 1;
    while next <= last_seq {
        let events = log.read(session, next, CHUNK).await.map_err(status::from_journal)?;
        let Some(last) = events.last() else { break };
        next = last.seq + 1;
        for event in events.iter().take_while(|e| e.seq <= last_seq) {
            let Some(item) = reader.read(event) else { continue };
            if item.seq <= after_seq {
                continue;
            }
            let item = codec::encode_transcript_item(&item);
            let len = item.encoded_len();
            if items.len() >= page_size || (!items.is_empty() && bytes + len > MAX_REPLY_BYTES) {
                let next_seq = items.last().map_or(after_seq, |i| i.seq);
                return Ok(pb::GetTranscriptReply { items, next_seq, last_seq });
            }
            bytes += len;
            items.push(item);
        }
    }
    Ok(pb::GetTranscriptReply { items, next_seq: 0, last_seq })
}
