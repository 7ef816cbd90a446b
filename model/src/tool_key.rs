//! The idempotency key of a tool call (SPEC §20, decision 0143): `<session>/<turn>/<step>/<call_id>`,
//! where `<session>` is the session as Turnstile names it everywhere, `tenant/id`.
//!
//! Every place that hands a call to a tool (built-ins, MCP `_meta`, client tools, the `tool/call` event
//! and so webhooks) takes the key from here, so a call run again after a repair carries the same one.
//!
//! ```
//! use turnstile_model::{SessionRef, tool_key::idempotency_key};
//!
//! let session = SessionRef::new("acme", "s1").unwrap();
//! assert_eq!(idempotency_key(&session, 3, 2, "call-3-2-1"), "acme/s1/3/2/call-3-2-1");
//! ```

use crate::message::SessionRef;

/// The key of call `call_id` of step `step` of turn `turn` in `session`.
pub fn idempotency_key(session: &SessionRef, turn: u64, step: u32, call_id: &str) -> String {
    format!("{session}/{turn}/{step}/{call_id}")
}
