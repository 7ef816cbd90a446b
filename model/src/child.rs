//! Child sessions (SPEC §13 `spawn_agent`): the names a parent's tool call gives its child.
//!
//! Both names are functions of the parent and the call id alone, so every retry of one call (by the
//! parent's owner, or by a new owner after failover) reaches the same child with the same prompt id, and
//! the child's driver deduplicates it like any retried delivery.
//!
//! ```
//! use turnstile_model::{SessionRef, child};
//! let parent = SessionRef::new("acme", "planner").unwrap();
//! let child = child::session_of(&parent, "call-1-1-1");
//! assert_eq!(child.to_string(), "acme/planner-call-1-1-1");
//! assert_eq!(child::prompt_id("call-1-1-1").as_str(), "spawn:call-1-1-1");
//! ```

use crate::message::{MAX_ID_LEN, MessageId, SessionRef};
use crate::shard::fnv1a64;

/// The child session of `parent`'s call `call_id`: `<parent id>-<call id>` in the same tenant. A call id
/// with a character outside `[A-Za-z0-9_-]`, an empty one, or one that makes the id longer than 128 bytes
/// gives `<parent id, cut to fit>-<16 hex digits of FNV-1a over "parent/call">` instead, so two calls never
/// share a child by writing alike.
pub fn session_of(parent: &SessionRef, call_id: &str) -> SessionRef {
    let plain = format!("{}-{call_id}", parent.id);
    let fits = !call_id.is_empty() && plain.len() <= MAX_ID_LEN;
    let id = if fits && call_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        plain
    } else {
        let hash = fnv1a64(format!("{}/{call_id}", parent.id).as_bytes());
        // `-` and 16 hex digits after the (cut) parent id.
        format!("{}-{hash:016x}", id_prefix(parent))
    };
    SessionRef { tenant: parent.tenant.clone(), id }
}

/// What every child id of `parent` starts with (then a `-`): its id, cut as [`session_of`] cuts it. Ids
/// are ordered, so a listing of `parent`'s children reads only the ids after this one that share it.
pub fn id_prefix(parent: &SessionRef) -> &str {
    // The parent id is ASCII (validated), so any byte index is a char boundary.
    &parent.id[..parent.id.len().min(MAX_ID_LEN - 17)]
}

/// The MessageId of the prompt the call `call_id` sends its child: `spawn:<call id>`, or, for a call id
/// too long for that, `spawn:` and 16 hex digits of its FNV-1a.
pub fn prompt_id(call_id: &str) -> MessageId {
    let plain = format!("spawn:{call_id}");
    if plain.len() <= MAX_ID_LEN && !call_id.is_empty() {
        MessageId(plain)
    } else {
        MessageId(format!("spawn:{:016x}", fnv1a64(call_id.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(id: &str) -> SessionRef {
        SessionRef::new("t", id).unwrap()
    }

    #[test]
    fn a_child_id_is_a_valid_session_id_for_any_call_id() {
        let long_parent = "p".repeat(128);
        for (p, call) in [
            ("planner", "call-1-1-1"),
            ("planner", "call_AbC.9/x y"),
            ("planner", "ünïcode"),
            ("planner", ""),
            (long_parent.as_str(), "call-1-1-1"),
            ("planner", &"c".repeat(300)),
        ] {
            let child = session_of(&parent(p), call);
            child.validate().unwrap_or_else(|e| panic!("{p}/{call}: {e}"));
            assert!(child.id.starts_with(&format!("{}-", id_prefix(&parent(p)))), "{child}");
            assert_eq!(child.tenant, "t");
            prompt_id(call).validate().unwrap();
        }
        // Characters a session id cannot hold give the hashed form, so look-alikes stay apart.
        let odd = session_of(&parent("planner"), "call_AbC.9/x y");
        assert!(odd.id.starts_with("planner-") && odd.id.len() == "planner-".len() + 16, "{odd}");
        assert_ne!(odd, session_of(&parent("planner"), "call_AbC_9_x_y"));
    }

    #[test]
    fn different_calls_get_different_children_even_when_cut() {
        let long_parent = parent(&"p".repeat(128));
        let a = session_of(&long_parent, "call-1-1-1");
        let b = session_of(&long_parent, "call-1-1-2");
        assert_ne!(a, b);
        // The same call always names the same child.
        assert_eq!(a, session_of(&long_parent, "call-1-1-1"));
        // Two call ids that write the same once sanitized still differ when the id is cut.
        assert_ne!(prompt_id(&"x".repeat(200)), prompt_id(&"y".repeat(200)));
    }
}
