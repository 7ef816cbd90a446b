//! The gateway's request policy on top of the one proto → model codec (`turnstile_proto::codec`).
//!
//! Decoding and validation (ids, sources, content blocks, targets) are the codec's, with errors that name
//! the request field (`message.source.goal.round`) and say how to fix it; they go back to the caller
//! verbatim as INVALID_ARGUMENT. What is the gateway's own: an empty tenant means the caller's default
//! tenant, a message without a source gets the preset's default (`user`, or `plugin{""}` for inject),
//! and a missing cancel cause is `user`.

use turnstile_model::{
    CancelCause, DeadlineSpec, MAX_STEER_DEADLINE_MS, MessageId, MessageSource, OnDeadline, SessionRef, Target,
    UserMessage,
};
use turnstile_proto::codec::message::{required_session_at, target_at, user_message_at};
use turnstile_proto::codec::{CodecError, decode_cancel_cause, on_deadline_at};
use turnstile_proto::v1 as pb;

/// `session`: required; an empty tenant is replaced by `default_tenant` (no auth in front of us).
pub fn session(raw: Option<pb::SessionRef>, default_tenant: &str) -> Result<SessionRef, CodecError> {
    let raw = raw.map(|mut s| {
        if s.tenant.is_empty() {
            default_tenant.clone_into(&mut s.tenant);
        }
        s
    });
    required_session_at(raw, "session")
}

/// A MessageId field (`id`): 1..=128 bytes.
pub fn message_id(field: &str, raw: String) -> Result<MessageId, CodecError> {
    let id = MessageId(raw);
    id.validate().map_err(|e| CodecError::value(field, e))?;
    Ok(id)
}

/// A steer's `deadline_ms` and `on_deadline` (SPEC §11): a deadline of 1 ms to 7 days; `on_deadline`
/// defaults to INTERRUPT and means nothing without a deadline.
pub fn steer_deadline(deadline_ms: Option<u64>, on_deadline: i32) -> Result<Option<DeadlineSpec>, CodecError> {
    let Some(after_ms) = deadline_ms else {
        if on_deadline != 0 {
            return Err(CodecError::invalid(
                "on_deadline",
                "is set without deadline_ms; set deadline_ms too, or leave on_deadline unspecified",
            ));
        }
        return Ok(None);
    };
    if after_ms == 0 || after_ms > MAX_STEER_DEADLINE_MS {
        return Err(CodecError::invalid(
            "deadline_ms",
            format!("{after_ms} is out of range; give 1 to {MAX_STEER_DEADLINE_MS} (7 days) milliseconds"),
        ));
    }
    let on_deadline = on_deadline_at(on_deadline, "on_deadline", Some(OnDeadline::Interrupt))?;
    Ok(Some(DeadlineSpec { after_ms, on_deadline }))
}

/// A `Target` enum field; `TARGET_UNSPECIFIED` (or an unknown number) is refused.
pub fn target(field: &str, raw: i32) -> Result<Target, CodecError> {
    target_at(raw, field)
}

/// A required message; a missing (or empty) source becomes `default_source`.
pub fn user_message(
    field: &str,
    raw: Option<pb::UserMessage>,
    default_source: &MessageSource,
) -> Result<UserMessage, CodecError> {
    let mut raw = raw.ok_or_else(|| CodecError::missing(field, "set the message's id and content"))?;
    if raw.source.as_ref().is_some_and(|s| s.kind.is_none()) {
        raw.source = None;
    }
    user_message_at(raw, field, Some(default_source.clone()))
}

/// The default source of `Inject`: a plugin with no name and no form.
pub fn inject_default_source() -> MessageSource {
    MessageSource::Plugin { plugin: String::new(), form: None }
}

/// `cause`: a missing cause (or an empty oneof) is `user`.
pub fn cancel_cause(raw: Option<pb::CancelCause>) -> CancelCause {
    raw.and_then(|c| decode_cancel_cause(c).ok()).unwrap_or(CancelCause::User)
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_model::ContentBlock;

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
        assert_eq!(err.to_string(), "session: is missing; set the session's tenant and id");
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
        assert_eq!(m.content, vec![ContentBlock::text("hi")].into());
        let m = user_message("message", Some(text_message("m1", None)), &inject_default_source()).unwrap();
        assert_eq!(m.source, MessageSource::Plugin { plugin: String::new(), form: None });
        let mut empty = text_message("m1", None);
        empty.source = Some(pb::MessageSource { kind: None });
        let m = user_message("message", Some(empty), &MessageSource::User).unwrap();
        assert_eq!(m.source, MessageSource::User);
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
        assert!(err.to_string().starts_with("message.source"), "{err}");
        assert!(err.to_string().contains("round"), "{err}");
        let form = pb::message_source::Kind::Plugin(pb::PluginSource { plugin: "p".into(), form: "poem".into() });
        let err = user_message("message", Some(text_message("m1", Some(form))), &MessageSource::User).unwrap_err();
        assert!(err.to_string().contains("\"poem\""), "{err}");
        let mut raw = text_message("m1", None);
        raw.content.push(pb::ContentBlock { block: None });
        let err = user_message("inserted[0]", Some(raw), &MessageSource::User).unwrap_err();
        assert!(
            err.to_string().starts_with("inserted[0].content[1]: content block has neither text nor data"),
            "{err}"
        );
        let err = user_message("message", None, &MessageSource::User).unwrap_err();
        assert_eq!(err.to_string(), "message: is missing; set the message's id and content");
    }

    #[test]
    fn missing_cancel_cause_is_user() {
        assert_eq!(cancel_cause(None), CancelCause::User);
        assert_eq!(cancel_cause(Some(pb::CancelCause { cause: None })), CancelCause::User);
        let hook = pb::CancelCause { cause: Some(pb::cancel_cause::Cause::Hook(pb::HookCause { reason: "r".into() })) };
        assert_eq!(cancel_cause(Some(hook)), CancelCause::Hook { reason: "r".into() });
    }
}
