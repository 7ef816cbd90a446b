//! What a delivery counts toward the size limits (SPEC §2, decision 0085): the one rule every check of
//! `limits.max_message_bytes`, `limits.max_pending_bytes` and the journal's event size uses.
//!
//! A message counts every byte a client sends in it — its id, every string of its source, and every field
//! of every block (a text block's text; a data block's MIME type and bytes) — plus
//! [`BLOCK_OVERHEAD_BYTES`] per block, so a block with nothing in it is not free. The overhead is above what
//! a block costs beyond its fields both in memory (a `ContentBlock` is 48 bytes) and in its protobuf
//! encoding (at most 18 bytes of tags and lengths, plus a message's own framing), so the counted bytes of
//! a message bound its encoded size and, once held, the memory its fields take.
//!
//! ```
//! use turnstile_model::size::{BLOCK_OVERHEAD_BYTES, message_bytes};
//! use turnstile_model::{ContentBlock, MessageId, MessageSource, UserMessage};
//!
//! let m = UserMessage {
//!     id: MessageId("m1".into()),
//!     content: vec![ContentBlock::text(""), ContentBlock::Data { mime: "image/png".into(), bytes: vec![0; 10] }].into(),
//!     source: MessageSource::User,
//! };
//! assert_eq!(message_bytes(&m), 2 + 2 * BLOCK_OVERHEAD_BYTES + "image/png".len() + 10);
//! ```

use crate::message::{ContentBlock, MessageSource, UserMessage};

/// What each content block counts beyond its fields' bytes.
pub const BLOCK_OVERHEAD_BYTES: usize = 64;

/// What a splice event counts beyond the messages it inserts (its envelope, session, position and
/// outcome fields, and each message's framing is inside the block overhead): the room the journal's
/// event size check leaves for them.
pub const EVENT_OVERHEAD_BYTES: usize = 1024;

/// The bytes `message` counts toward the size limits (see the module docs).
pub fn message_bytes(message: &UserMessage) -> usize {
    let blocks: usize = message.content.iter().map(block_bytes).fold(0, usize::saturating_add);
    message.id.as_str().len().saturating_add(source_bytes(&message.source)).saturating_add(blocks)
}

/// The bytes `messages` count together.
pub fn messages_bytes(messages: &[UserMessage]) -> usize {
    messages.iter().map(message_bytes).fold(0, usize::saturating_add)
}

/// The bytes one block counts: its fields and [`BLOCK_OVERHEAD_BYTES`].
pub fn block_bytes(block: &ContentBlock) -> usize {
    let fields = match block {
        ContentBlock::Text { text } => text.len(),
        ContentBlock::Data { mime, bytes } => mime.len().saturating_add(bytes.len()),
    };
    fields.saturating_add(BLOCK_OVERHEAD_BYTES)
}

/// The bytes of a source's strings (its numbers are framing, inside the overhead).
fn source_bytes(source: &MessageSource) -> usize {
    match source {
        MessageSource::User => 0,
        MessageSource::Plugin { plugin, form } => plugin.len() + form.as_ref().map_or(0, String::len),
        MessageSource::Goal { goal_id, .. } => goal_id.len(),
        MessageSource::Tool { call_id } => call_id.len(),
        MessageSource::Model { provider, model } => provider.len() + model.len(),
        MessageSource::Session { tenant, session, .. } => tenant.len() + session.len(),
        MessageSource::Schedule { schedule_id, .. } => schedule_id.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageId;

    fn message(content: Vec<ContentBlock>, source: MessageSource) -> UserMessage {
        UserMessage { id: MessageId("id".into()), content: content.into(), source }
    }

    #[test]
    fn every_field_of_every_block_and_of_the_source_counts() {
        let mime = "x".repeat(1000);
        let m = message(vec![ContentBlock::Data { mime: mime.clone(), bytes: vec![] }], MessageSource::User);
        assert_eq!(message_bytes(&m), 2 + 1000 + BLOCK_OVERHEAD_BYTES);
        let plugin = MessageSource::Plugin { plugin: "p".repeat(50), form: Some("notice".into()) };
        let m = message(vec![ContentBlock::text("hi")], plugin);
        assert_eq!(message_bytes(&m), 2 + 50 + 6 + 2 + BLOCK_OVERHEAD_BYTES);
    }

    #[test]
    fn empty_blocks_are_not_free() {
        let m = message(vec![ContentBlock::text(""); 1000], MessageSource::User);
        assert_eq!(message_bytes(&m), 2 + 1000 * BLOCK_OVERHEAD_BYTES);
    }
}
