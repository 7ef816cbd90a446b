//! The values of SPEC §1: sessions, message ids, messages, sources and targets.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest tenant, session id or MessageId accepted, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// A session: `tenant` + `id`, both `[A-Za-z0-9_-]{1,128}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionRef {
    pub tenant: String,
    pub id: String,
}

impl SessionRef {}

impl fmt::Display for SessionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.id)
    }
}

/// A client-minted, opaque message id (1..=128 bytes). The server never mints one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MessageId(pub String);

impl MessageId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for MessageId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// One model-visible block of a message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ContentBlock {
    Text { text: String },
    Data { mime: String, bytes: Vec<u8> },
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }
}

/// The plugin forms SPEC §1 names; an empty form is also allowed.
pub const PLUGIN_FORMS: [&str; 6] = ["instructions", "catalog", "snapshot", "notice", "relay", "recall"];

/// Who produced a message. Only [`MessageSource::User`] is a human prompt.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MessageSource {
    User,
    Plugin {
        plugin: String,
        form: Option<String>,
    },
    Goal {
        goal_id: String,
        revision: u64,
        round: u64,
    },
    Tool {
        call_id: String,
    },
    Model {
        provider: String,
        model: String,
    },
    /// A cross-session reference (SPEC §13): the text of session `tenant/session` through its seq
    /// `upto_seq`, rendered when it was injected. Replay never reads that session again.
    Session {
        tenant: String,
        session: String,
        upto_seq: u64,
    },
    /// A firing of schedule `schedule_id` (SPEC §15) at `fire_unix_ms`; its MessageId is
    /// `<schedule_id>@<fire_unix_ms>`.
    Schedule {
        schedule_id: String,
        fire_unix_ms: u64,
    },
}

impl MessageSource {
    /// The `kind` discriminator of SPEC §1.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Plugin { .. } => "plugin",
            Self::Goal { .. } => "goal",
            Self::Tool { .. } => "tool",
            Self::Model { .. } => "model",
            Self::Session { .. } => "session",
            Self::Schedule { .. } => "schedule",
        }
    }

    pub fn is_human(&self) -> bool {
        matches!(self, Self::User)
    }
}

/// An immutable user-role message: id, model-visible content and producer.
///
/// The content is shared, not copied, by every clone: the event that logs a message, the inbox that folds
/// it, the transcript it joins and an in-memory log all hold the same blocks (decision 0107), so a message
/// costs its bytes once however many of them keep it. Build it from a `Vec` with `.into()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UserMessage {
    pub id: MessageId,
    pub content: Arc<[ContentBlock]>,
    pub source: MessageSource,
}

impl UserMessage {
    /// A human prompt with one text block.
    pub fn user_text(id: impl Into<String>, text: impl Into<String>) -> Self {
        Self { id: MessageId(id.into()), content: Arc::new([ContentBlock::text(text)]), source: MessageSource::User }
    }

    /// Appends `block` to the content (a new shared buffer: the content of a message is shared with its
    /// event and the fold, decision 0107, so it is replaced rather than changed in place).
    pub fn push_block(&mut self, block: ContentBlock) {
        let mut content = self.content.to_vec();
        content.push(block);
        self.content = content.into();
    }

    /// The text blocks joined by newlines (what the scripted model reads).
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                ContentBlock::Data { .. } => None,
            })
            .collect();
        texts.join("\n")
    }

    /// Whether a model would see anything: a text block with non-blank text, or a data block with bytes.
    /// Hosted providers refuse a user message without it (Anthropic: "text content blocks must contain
    /// non-whitespace text"), so one is refused when delivered rather than when its turn runs.
    pub fn has_content(&self) -> bool {
        self.content.iter().any(|b| match b {
            ContentBlock::Text { text } => !text.trim().is_empty(),
            ContentBlock::Data { bytes, .. } => !bytes.is_empty(),
        })
    }
}

/// Which pending list a delivery joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    /// One message opens one turn.
    NextTurn,
    /// Joins the next model step.
    NextStep,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NextTurn => "next-turn",
            Self::NextStep => "next-step",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
