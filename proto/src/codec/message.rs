//! SPEC §1 values: sessions, messages, sources, targets, and the inbox snapshot.

use crate::v1 as pb;
use crate::v1::{content_block::Block, message_source::Kind};

use super::error::{CodecError, index, join};
use turnstile_model::ValueError;
use turnstile_model::inbox::Inbox;
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};

const SOURCE_KINDS: &str = "set one of user, plugin, goal, tool, model, session or schedule";
const TARGETS: &str = "use TARGET_NEXT_TURN or TARGET_NEXT_STEP";

pub fn encode_session_ref(session: &SessionRef) -> pb::SessionRef {
    pb::SessionRef { tenant: session.tenant.clone(), id: session.id.clone() }
}

/// Decodes and validates a session reference (path `session`).
pub fn decode_session_ref(session: pb::SessionRef) -> Result<SessionRef, CodecError> {
    session_ref_at(session, "session")
}

pub fn session_ref_at(session: pb::SessionRef, path: &str) -> Result<SessionRef, CodecError> {
    let session = SessionRef { tenant: session.tenant, id: session.id };
    session.validate().map_err(|e| CodecError::value(path, e))?;
    Ok(session)
}

pub fn required_session_at(session: Option<pb::SessionRef>, path: &str) -> Result<SessionRef, CodecError> {
    let session = session.ok_or_else(|| CodecError::missing(path, "set the session's tenant and id"))?;
    session_ref_at(session, path)
}

pub fn encode_content_block(block: &ContentBlock) -> pb::ContentBlock {
    let block = match block {
        ContentBlock::Text { text } => Block::Text(pb::TextBlock { text: text.clone() }),
        ContentBlock::Data { mime, bytes } => Block::Data(pb::DataBlock { mime: mime.clone(), bytes: bytes.clone() }),
    };
    pb::ContentBlock { block: Some(block) }
}

/// Decodes one content block (path `content`).
pub fn decode_content_block(block: pb::ContentBlock) -> Result<ContentBlock, CodecError> {
    content_block_at(block, "content")
}

pub(crate) fn content_block_at(block: pb::ContentBlock, path: &str) -> Result<ContentBlock, CodecError> {
    match block.block {
        Some(Block::Text(t)) => Ok(ContentBlock::Text { text: t.text }),
        Some(Block::Data(d)) => Ok(ContentBlock::Data { mime: d.mime, bytes: d.bytes }),
        None => Err(CodecError::invalid(path, "content block has neither text nor data; set one of them")),
    }
}

pub fn encode_message_source(source: &MessageSource) -> pb::MessageSource {
    let kind = match source {
        MessageSource::User => Kind::User(pb::UserSource {}),
        MessageSource::Plugin { plugin, form } => {
            Kind::Plugin(pb::PluginSource { plugin: plugin.clone(), form: form.clone().unwrap_or_default() })
        }
        MessageSource::Goal { goal_id, revision, round } => {
            Kind::Goal(pb::GoalSource { goal_id: goal_id.clone(), revision: *revision, round: *round })
        }
        MessageSource::Tool { call_id } => Kind::Tool(pb::ToolSource { call_id: call_id.clone() }),
        MessageSource::Model { provider, model } => {
            Kind::Model(pb::ModelSource { provider: provider.clone(), model: model.clone() })
        }
        MessageSource::Session { tenant, session, upto_seq } => {
            Kind::Session(pb::SessionSource { tenant: tenant.clone(), session: session.clone(), upto_seq: *upto_seq })
        }
        MessageSource::Schedule { schedule_id, fire_unix_ms } => {
            Kind::Schedule(pb::ScheduleSource { schedule_id: schedule_id.clone(), fire_unix_ms: *fire_unix_ms })
        }
    };
    pb::MessageSource { kind: Some(kind) }
}

/// Decodes and validates a message source (path `source`). An empty plugin form is `None`.
pub fn decode_message_source(source: pb::MessageSource) -> Result<MessageSource, CodecError> {
    message_source_at(source, "")
}

/// `parent` is the path of the value that holds the `source` field.
fn message_source_at(source: pb::MessageSource, parent: &str) -> Result<MessageSource, CodecError> {
    let source = match source.kind {
        Some(Kind::User(_)) => MessageSource::User,
        Some(Kind::Plugin(p)) => {
            MessageSource::Plugin { plugin: p.plugin, form: if p.form.is_empty() { None } else { Some(p.form) } }
        }
        Some(Kind::Goal(g)) => MessageSource::Goal { goal_id: g.goal_id, revision: g.revision, round: g.round },
        Some(Kind::Tool(t)) => MessageSource::Tool { call_id: t.call_id },
        Some(Kind::Model(m)) => MessageSource::Model { provider: m.provider, model: m.model },
        Some(Kind::Session(s)) => MessageSource::Session { tenant: s.tenant, session: s.session, upto_seq: s.upto_seq },
        Some(Kind::Schedule(s)) => MessageSource::Schedule { schedule_id: s.schedule_id, fire_unix_ms: s.fire_unix_ms },
        None => {
            return Err(CodecError::invalid(join(parent, "source"), format!("source has no kind; {SOURCE_KINDS}")));
        }
    };
    validate_source(&source, parent)?;
    Ok(source)
}

/// Validates a source and points the error at the field that breaks the rule.
fn validate_source(source: &MessageSource, parent: &str) -> Result<(), CodecError> {
    source.validate().map_err(|e| match e {
        ValueError::PluginForm { .. } => CodecError::value(join(parent, "source.plugin.form"), e),
        ValueError::GoalRound => CodecError::value(join(parent, "source.goal.round"), e),
        // The field name already is the path below the message (`source.goal.goal_id`).
        ValueError::EmptyField { field } => CodecError::invalid(join(parent, field), "must not be empty"),
        other => CodecError::value(join(parent, "source"), other),
    })
}

pub fn encode_user_message(message: &UserMessage) -> pb::UserMessage {
    pb::UserMessage {
        id: message.id.0.clone(),
        content: message.content.iter().map(encode_content_block).collect(),
        source: Some(encode_message_source(&message.source)),
    }
}

/// Decodes and validates a message (path `message`); a missing source is an error.
pub fn decode_user_message(message: pb::UserMessage) -> Result<UserMessage, CodecError> {
    user_message_at(message, "message", None)
}

/// Like [`decode_user_message`], but a message without a source gets `default` (the gateway's choice per
/// delivery preset: `user` for most, `plugin{""}` for inject).
pub fn decode_user_message_with_default_source(
    message: pb::UserMessage,
    default: MessageSource,
) -> Result<UserMessage, CodecError> {
    user_message_at(message, "message", Some(default))
}

pub fn user_message_at(
    message: pb::UserMessage,
    path: &str,
    default: Option<MessageSource>,
) -> Result<UserMessage, CodecError> {
    let id = MessageId(message.id);
    id.validate().map_err(|e| CodecError::value(join(path, "id"), e))?;
    // Paths are built only for an error: this runs for every message of every event read.
    let content = message
        .content
        .into_iter()
        .enumerate()
        .map(|(i, block)| content_block_at(block, "").map_err(|e| e.under(&index(&join(path, "content"), i))))
        .collect::<Result<Vec<_>, _>>()?;
    let source = match (message.source, default) {
        (Some(source), _) => message_source_at(source, path)?,
        (None, Some(default)) => {
            validate_source(&default, path)?;
            default
        }
        (None, None) => return Err(CodecError::missing(join(path, "source"), SOURCE_KINDS)),
    };
    Ok(UserMessage { id, content: content.into(), source })
}

pub fn required_message_at(message: Option<pb::UserMessage>, path: &str) -> Result<UserMessage, CodecError> {
    let message = message.ok_or_else(|| CodecError::missing(path, "set the full message (id, content, source)"))?;
    user_message_at(message, path, None)
}

pub fn messages_at(messages: Vec<pb::UserMessage>, path: &str) -> Result<Vec<UserMessage>, CodecError> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| user_message_at(m, "", None).map_err(|e| e.under(&index(path, i))))
        .collect()
}

pub fn encode_target(target: Target) -> pb::Target {
    match target {
        Target::NextTurn => pb::Target::NextTurn,
        Target::NextStep => pb::Target::NextStep,
    }
}

/// Decodes a target enum value (path `target`); `TARGET_UNSPECIFIED` is refused.
pub fn decode_target(raw: i32) -> Result<Target, CodecError> {
    target_at(raw, "target")
}

pub fn target_at(raw: i32, path: &str) -> Result<Target, CodecError> {
    match optional_target_at(raw, path)? {
        Some(target) => Ok(target),
        None => Err(CodecError::invalid(path, format!("TARGET_UNSPECIFIED is not a target; {TARGETS}"))),
    }
}

/// `TARGET_UNSPECIFIED` is `None`; unknown values are refused.
pub fn optional_target_at(raw: i32, path: &str) -> Result<Option<Target>, CodecError> {
    match pb::Target::try_from(raw) {
        Ok(pb::Target::Unspecified) => Ok(None),
        Ok(pb::Target::NextTurn) => Ok(Some(Target::NextTurn)),
        Ok(pb::Target::NextStep) => Ok(Some(Target::NextStep)),
        Err(_) => Err(CodecError::invalid(path, format!("{raw} is not a known target; {TARGETS}"))),
    }
}

/// The inbox as `GetInbox` returns it; `seq` is the last event folded into it.
pub fn encode_inbox(inbox: &Inbox, seq: u64) -> pb::InboxSnapshot {
    pb::InboxSnapshot {
        seq,
        next_turn: inbox.next_turn.iter().map(encode_user_message).collect(),
        next_step: inbox.next_step.iter().map(encode_user_message).collect(),
    }
}

/// The inverse of [`encode_inbox`]: the seq and the inbox. Does not check that ids are unique.
pub fn decode_inbox_snapshot(snapshot: pb::InboxSnapshot) -> Result<(u64, Inbox), CodecError> {
    let next_turn = messages_at(snapshot.next_turn, "next_turn")?;
    let next_step = messages_at(snapshot.next_step, "next_step")?;
    Ok((snapshot.seq, Inbox { next_turn, next_step }))
}
