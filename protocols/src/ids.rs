//! Ids every protocol hands out or reads (SPEC §19): session ids minted for new conversations, MessageIds
//! derived from a protocol's own message ids or idempotency keys, and opaque tokens that encode the log
//! position they name, so that any gateway answers them without a lookup table.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// A session id minted for a new response chain or conversation: from the request's `Idempotency-Key` when
/// it has one (so a retried create lands in the same session and its delivery is a retry), else random.
pub fn new_session(prefix: &str, idempotency_key: Option<&str>) -> String {
    match idempotency_key {
        Some(key) => format!("{prefix}-{}", digest(key)),
        None => format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
    }
}

/// A MessageId for the `index`-th message of a request: the `Idempotency-Key` (with the index) when there is
/// one, so a retry is recognised by the session (SPEC §2), else random.
pub fn message_id(idempotency_key: Option<&str>, index: usize) -> String {
    match idempotency_key {
        Some(key) if key.len() <= 100 => format!("{key}#{index}"),
        Some(key) => format!("idem-{}#{index}", digest(key)),
        None => uuid::Uuid::new_v4().to_string(),
    }
}

fn digest(key: &str) -> String {
    let hash = Sha256::digest(key.as_bytes());
    hash.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The session id rule of SPEC §1: `[A-Za-z0-9_-]{1,128}`.
pub fn is_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A MessageId for a protocol's own message id `id` (SPEC §19: a resent message is a retry, not a new
/// one): kept as is when it is a valid MessageId, else a digest of it.
pub fn protocol_message_id(prefix: &str, id: &str) -> String {
    if !id.is_empty() && id.len() <= 120 && id.bytes().all(|b| b.is_ascii_graphic()) {
        format!("{prefix}-{id}")
    } else {
        format!("{prefix}-{}", digest(id))
    }
}

/// An opaque token of `parts` (none may contain `.` but the last): `prefix` + base64url of them joined by `.`.
pub fn token(prefix: &str, parts: &[&str]) -> String {
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(parts.join(".")))
}

/// The `n` parts of a [`token`] with `prefix`; the last part keeps any `.` it has. `None`: not such a token.
pub fn parts(prefix: &str, token: &str, n: usize) -> Option<Vec<String>> {
    let raw = URL_SAFE_NO_PAD.decode(token.strip_prefix(prefix)?).ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let parts: Vec<String> = raw.splitn(n, '.').map(str::to_owned).collect();
    (parts.len() == n).then_some(parts)
}

/// A task of A2A or MCP: the delivery at `seq` in `session`, the turn that answers it. Its id is a [`token`]
/// of the two under the protocol's prefix, so any gateway reads it back; the tenant is the caller's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskId {
    pub session: String,
    pub seq: u64,
}

impl TaskId {
    /// The task's id under `prefix`.
    pub fn token(&self, prefix: &str) -> String {
        token(prefix, &[&self.session, &self.seq.to_string()])
    }

    /// The task a [`TaskId::token`] with `prefix` names; `None`: not one this server hands out.
    pub fn from_token(prefix: &str, token: &str) -> Option<Self> {
        let mut parts = parts(prefix, token, 2)?;
        let seq = parts[1].parse().ok().filter(|s| *s > 0)?;
        let session = parts.swap_remove(0);
        is_session_id(&session).then_some(Self { session, seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_anything_else_is_none() {
        let t = token("task_", &["s-1", "42", "call.with.dots"]);
        assert_eq!(parts("task_", &t, 3).unwrap(), ["s-1", "42", "call.with.dots"]);
        assert_eq!(parts("task_", &t, 2).unwrap(), ["s-1", "42.call.with.dots"]);
        assert_eq!(parts("task_", &token("task_", &["a", "b"]), 3), None);
        assert_eq!(parts("ctx_", &t, 3), None);
        assert_eq!(parts("task_", "task_!!", 1), None);
    }

    #[test]
    fn protocol_message_ids_are_stable_and_valid() {
        assert_eq!(protocol_message_id("a2a", "m-1"), "a2a-m-1");
        let long = "x".repeat(500);
        assert_eq!(protocol_message_id("a2a", &long), protocol_message_id("a2a", &long));
        assert!(protocol_message_id("a2a", &long).len() < 128);
        assert!(protocol_message_id("a2a", "with space").starts_with("a2a-"));
        assert!(!protocol_message_id("a2a", "with space").contains(' '));
    }
}
