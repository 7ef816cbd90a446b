//! Builders for messages, sources and session references.

use turnstile_proto::v1::content_block::Block;
use turnstile_proto::v1::message_source::Kind;
use turnstile_proto::v1::{
    ContentBlock, DataBlock, MessageSource, PluginSource, SessionRef, TextBlock, UserMessage, UserSource,
};

/// The tenant every harness session uses (auth is off in `turnstile dev`).
pub const TEST_TENANT: &str = "test";

/// A session id no other test uses: `s-<uuid>` fits `[A-Za-z0-9_-]{1,128}`.
pub fn new_session_ref() -> SessionRef {
    SessionRef { tenant: TEST_TENANT.into(), id: format!("s-{}", uuid::Uuid::new_v4()) }
}

/// A human prompt (`source.kind == user`) with one text block.
pub fn user_msg(id: &str, text: &str) -> UserMessage {
    source_msg(id, text, Some(Kind::User(UserSource {})))
}

/// A message from a plugin, with an optional form.
pub fn plugin_msg(id: &str, text: &str, plugin: &str, form: &str) -> UserMessage {
    source_msg(id, text, Some(Kind::Plugin(PluginSource { plugin: plugin.into(), form: form.into() })))
}

/// A one-text-block message with any source (`None` leaves the source unset for the server to default).
pub fn source_msg(id: &str, text: &str, kind: Option<Kind>) -> UserMessage {
    UserMessage {
        id: id.into(),
        content: vec![ContentBlock { block: Some(Block::Text(TextBlock { text: text.into() })) }],
        source: kind.map(|kind| MessageSource { kind: Some(kind) }),
    }
}

/// A human prompt with one data block.
pub fn data_msg(id: &str, mime: &str, bytes: Vec<u8>) -> UserMessage {
    UserMessage {
        id: id.into(),
        content: vec![ContentBlock { block: Some(Block::Data(DataBlock { mime: mime.into(), bytes })) }],
        source: Some(MessageSource { kind: Some(Kind::User(UserSource {})) }),
    }
}

/// The text blocks of a message, joined by newlines (what the scripted model reads).
pub fn text_of(message: &UserMessage) -> String {
    let texts: Vec<&str> = message
        .content
        .iter()
        .filter_map(|b| match &b.block {
            Some(Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n")
}
