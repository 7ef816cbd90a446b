//! Request decoding and validation (proto → domain) for the gateway's RPCs.
//!
//! Every error names the request field that was wrong (`message.source.goal.round`) and how to fix it,
//! because it goes back to the caller verbatim as INVALID_ARGUMENT.

use turnstile_journal::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};
use turnstile_journal::{CancelCause, ValueError};
use turnstile_proto::v1 as pb;

/// A request field that breaks the API's rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("{field} is required")]
    Missing { field: String },
    #[error("{field}: {source}")]
    Value { field: String, source: ValueError },
    #[error("{field}: {detail}")]
    Invalid { field: String, detail: String },
}

fn value(field: impl Into<String>) -> impl FnOnce(ValueError) -> ConvertError {
    let field = field.into();
    move |source| ConvertError::Value { field, source }
}

/// `session`: required; an empty tenant is replaced by `default_tenant` (no auth in front of us).
pub fn session(raw: Option<pb::SessionRef>, default_tenant: &str) -> Result<SessionRef, ConvertError> {
    let raw = raw.ok_or_else(|| ConvertError::Missing { field: "session".into() })?;
    let tenant = if raw.tenant.is_empty() { default_tenant.to_owned() } else { raw.tenant };
    let session = SessionRef { tenant, id: raw.id };
    session.validate().map_err(value("session"))?;
    Ok(session)
}

/// A MessageId field (`id`, `message.id`): 1..=128 bytes.
pub fn message_id(field: &str, raw: String) -> Result<MessageId, ConvertError> {
    let id = MessageId(raw);
    id.validate().map_err(value(field))?;
    Ok(id)
}

/// A `Target` enum field; `TARGET_UNSPECIFIED` (or an unknown number) is refused.
pub fn target(field: &str, raw: i32) -> Result<Target, ConvertError> {
    match pb::Target::try_from(raw) {
        Ok(pb::Target::NextTurn) => Ok(Target::NextTurn),
        Ok(pb::Target::NextStep) => Ok(Target::NextStep),
        _ => Err(ConvertError::Invalid {
            field: field.to_owned(),
            detail: format!("target {raw} is not valid; use TARGET_NEXT_TURN (1) or TARGET_NEXT_STEP (2)"),
        }),
    }
}

/// A required message; a missing (or empty) source becomes `default_source`.
pub fn user_message(
    field: &str,
    raw: Option<pb::UserMessage>,
    default_source: &MessageSource,
) -> Result<UserMessage, ConvertError> {
    let raw = raw.ok_or_else(|| ConvertError::Missing { field: field.to_owned() })?;
    let id = message_id(&format!("{field}.id"), raw.id)?;
    let content = raw
        .content
        .into_iter()
        .enumerate()
        .map(|(i, block)| match block.block {
            Some(pb::content_block::Block::Text(t)) => Ok(ContentBlock::Text { text: t.text }),
            Some(pb::content_block::Block::Data(d)) => Ok(ContentBlock::Data { mime: d.mime, bytes: d.bytes }),
            None => Err(ConvertError::Invalid {
                field: format!("{field}.content[{i}]"),
                detail: "the block is empty; set `text` or `data`".into(),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let source = match raw.source.and_then(|s| s.kind) {
        None => default_source.clone(),
        Some(kind) => source_kind(kind),
    };
    source.validate().map_err(value(format!("{field}.source")))?;
    Ok(UserMessage { id, content, source })
}

fn source_kind(kind: pb::message_source::Kind) -> MessageSource {
    use pb::message_source::Kind;
    match kind {
        Kind::User(_) => MessageSource::User,
        Kind::Plugin(p) => MessageSource::Plugin { plugin: p.plugin, form: (!p.form.is_empty()).then_some(p.form) },
        Kind::Goal(g) => MessageSource::Goal { goal_id: g.goal_id, revision: g.revision, round: g.round },
        Kind::Tool(t) => MessageSource::Tool { call_id: t.call_id },
        Kind::Model(m) => MessageSource::Model { provider: m.provider, model: m.model },
    }
}

/// The default source of `Inject`: a plugin with no name and no form.
pub fn inject_default_source() -> MessageSource {
    MessageSource::Plugin { plugin: String::new(), form: None }
}

/// `cause`: a missing cause (or an empty oneof) is `user`.
pub fn cancel_cause(raw: Option<pb::CancelCause>) -> CancelCause {
    use pb::cancel_cause::Cause;
    match raw.and_then(|c| c.cause) {
        None | Some(Cause::User(_)) => CancelCause::User,
        Some(Cause::Parent(_)) => CancelCause::Parent,
        Some(Cause::Hook(h)) => CancelCause::Hook { reason: h.reason },
        Some(Cause::Disposed(_)) => CancelCause::Disposed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_message(id: &str, source: Option<pb::message_source::Kind>) -> pb::UserMessage {
        pb::UserMessage {
            id: id.into(),
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: "hi".into() })),
            }],
            source: source.map(|k| pb::MessageSource { kind: Some(k) }),
        }
    }

    #[test]
    fn empty_tenant_becomes_the_default() {
        let s = session(Some(pb::SessionRef { tenant: String::new(), id: "s1".into() }), "default").unwrap();
        assert_eq!(s, SessionRef { tenant: "default".into(), id: "s1".into() });
    }

    #[test]
    fn missing_or_malformed_session_is_named() {
        let err = session(None, "default").unwrap_err();
        assert_eq!(err.to_string(), "session is required");
        let err = session(Some(pb::SessionRef { tenant: "acme".into(), id: "a/b".into() }), "default").unwrap_err();
        assert!(err.to_string().starts_with("session: session id \"a/b\""), "{err}");
        let err = session(Some(pb::SessionRef { tenant: "acme".into(), id: String::new() }), "d").unwrap_err();
        assert!(err.to_string().contains("1 to 128 bytes"), "{err}");
    }

    #[test]
    fn message_ids_must_be_1_to_128_bytes() {
        assert!(message_id("id", "x".repeat(128)).is_ok());
        let err = message_id("message.id", "x".repeat(129)).unwrap_err();
        assert!(err.to_string().starts_with("message.id: message id must be 1 to 128 bytes, got 129"), "{err}");
        assert!(message_id("id", String::new()).is_err());
    }

    #[test]
    fn unspecified_target_lists_the_valid_values() {
        let err = target("target", 0).unwrap_err();
        assert!(err.to_string().contains("TARGET_NEXT_TURN"), "{err}");
        assert!(err.to_string().contains("TARGET_NEXT_STEP"), "{err}");
        assert!(target("target", 7).is_err());
        assert_eq!(target("target", 2).unwrap(), Target::NextStep);
    }

    #[test]
    fn missing_source_takes_the_default_and_explicit_sources_are_kept() {
        let m = user_message("message", Some(text_message("m1", None)), &MessageSource::User).unwrap();
        assert_eq!(m.source, MessageSource::User);
        assert_eq!(m.content, vec![ContentBlock::text("hi")]);
        let m = user_message("message", Some(text_message("m1", None)), &inject_default_source()).unwrap();
        assert_eq!(m.source, MessageSource::Plugin { plugin: String::new(), form: None });
        let tool = pb::message_source::Kind::Tool(pb::ToolSource { call_id: "c9".into() });
        let m = user_message("message", Some(text_message("m1", Some(tool))), &inject_default_source()).unwrap();
        assert_eq!(m.source, MessageSource::Tool { call_id: "c9".into() });
        let plugin = pb::message_source::Kind::Plugin(pb::PluginSource { plugin: "mem".into(), form: "recall".into() });
        let m = user_message("message", Some(text_message("m1", Some(plugin))), &MessageSource::User).unwrap();
        assert_eq!(m.source, MessageSource::Plugin { plugin: "mem".into(), form: Some("recall".into()) });
    }

    #[test]
    fn invalid_sources_and_blocks_name_their_field() {
        let goal = pb::message_source::Kind::Goal(pb::GoalSource { goal_id: "g".into(), revision: 1, round: 0 });
        let err = user_message("message", Some(text_message("m1", Some(goal))), &MessageSource::User).unwrap_err();
        assert_eq!(err.to_string(), "message.source: goal source round must be at least 1");
        let form = pb::message_source::Kind::Plugin(pb::PluginSource { plugin: "p".into(), form: "poem".into() });
        let err = user_message("message", Some(text_message("m1", Some(form))), &MessageSource::User).unwrap_err();
        assert!(err.to_string().contains("\"poem\""), "{err}");
        let mut raw = text_message("m1", None);
        raw.content.push(pb::ContentBlock { block: None });
        let err = user_message("inserted[0]", Some(raw), &MessageSource::User).unwrap_err();
        assert!(err.to_string().starts_with("inserted[0].content[1]: the block is empty"), "{err}");
        let err = user_message("message", None, &MessageSource::User).unwrap_err();
        assert_eq!(err.to_string(), "message is required");
    }

    #[test]
    fn missing_cancel_cause_is_user() {
        assert_eq!(cancel_cause(None), CancelCause::User);
        assert_eq!(cancel_cause(Some(pb::CancelCause { cause: None })), CancelCause::User);
        let hook = pb::CancelCause { cause: Some(pb::cancel_cause::Cause::Hook(pb::HookCause { reason: "r".into() })) };
        assert_eq!(cancel_cause(Some(hook)), CancelCause::Hook { reason: "r".into() });
    }
}
