//! Protobuf mapping between the domain model and `crate::v1`.
//!
//! Encoding is total: every domain value has one protobuf form. Decoding is *validation*: a protobuf value
//! that breaks a rule of SPEC §1–§5 is refused with a [`CodecError`] whose message names the field path
//! (`message.content[1]`, `inbox_spliced.target`, …) and says how to fix it. Message *size* is not checked
//! here: the driver checks it against its configured limit.
//!
//! Submodules: [`message`] (values of SPEC §1), [`event`] (durable events), [`live`] (live events),
//! [`session`] (what reads report of a session and its goal), [`schedule`] (schedules and labels).
//! The internal gateway → worker hop's commands and replies are `turnstile_cluster::codec`.

pub mod error;
pub mod event;
pub mod live;
pub mod message;
pub mod parts;
pub mod schedule;
pub mod session;
pub mod values;

#[cfg(test)]
mod tests;

pub use error::CodecError;
pub use event::{
    EVENT_FORMAT, decode_event, decode_session_event, encode_event, encode_session_event, encode_transcript_item,
    stored_as_sent,
};
pub use live::{decode_live, decode_live_event, encode_live, encode_live_event};
pub use message::{
    decode_content_block, decode_inbox_snapshot, decode_message_source, decode_session_ref, decode_target,
    decode_user_message, decode_user_message_with_default_source, encode_content_block, encode_inbox,
    encode_message_source, encode_session_ref, encode_target, encode_user_message,
};
pub use parts::{decode_usage, encode_overrides, encode_usage, overrides_at};
pub use session::{
    encode_goal_action, encode_goal_info, encode_session_info, goal_action_at, goal_info_at, session_info_at,
};
pub use values::{
    decode_cancel_cause, decode_splice, decode_status, decode_turn_end_reason, encode_cancel_cause, encode_inject_mode,
    encode_on_deadline, encode_splice, encode_status, encode_turn_end_reason, inject_mode_at, on_deadline_at,
};
