//! The ids the OpenAI adapter hands out, each encoding what any gateway needs to answer it (SPEC §19):
//! no table maps them. The tenant is never in an id: it comes from the caller's token, so another
//! tenant's id names a session the caller cannot see, which answers 404 like one that does not exist.
//!
//! - a response (a turn): `resp_` + base64url(`session.seq.turn.kind`): the session, the seq of the
//!   delivery that asked for it, the turn it opened (0 when the session was busy and the turn is found in the
//!   log later), and whether it belongs to a conversation;
//! - a conversation (a session): `conv_` + the session id;
//! - an item: a prefix (`msg_`, `mcp_`) + base64url(`session.seq`), the seq of the event the item starts at.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::error::ApiError;

/// A response: one turn of a session, found from the delivery that asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseId {
    /// The session id (in the caller's tenant).
    pub session: String,
    /// The seq of the delivery's insert splice (the original one, for a retry).
    pub seq: u64,
    /// The turn the delivery opened; 0 when not known at creation (found from the log by message id).
    pub turn: u64,
    /// The response was created in a conversation (`conversation` was given, or the session is one).
    pub conversation: bool,
    /// The response continues a turn after the call at `seq` was answered: a decision on a call awaiting
    /// approval, or a function tool's output (decisions 0103, 0113).
    pub after_approval: bool,
}

impl ResponseId {
    pub fn encode(&self) -> String {
        let kind = match (self.conversation, self.after_approval) {
            (false, false) => "r",
            (true, false) => "c",
            (false, true) => "ra",
            (true, true) => "ca",
        };
        let raw = format!("{}.{}.{}.{kind}", self.session, self.seq, self.turn);
        format!("resp_{}", URL_SAFE_NO_PAD.encode(raw))
    }

    /// Any id this adapter did not hand out is a response that does not exist (404 naming `param`).
    pub fn decode(id: &str, param: &str) -> Result<Self, ApiError> {
        let missing = || ApiError::not_found(param, format!("No response found with id '{id}'."));
        let raw = id.strip_prefix("resp_").ok_or_else(missing)?;
        let raw = URL_SAFE_NO_PAD.decode(raw).map_err(|_| missing())?;
        let raw = String::from_utf8(raw).map_err(|_| missing())?;
        let mut parts = raw.split('.');
        let (Some(session), Some(seq), Some(turn), Some(kind), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(missing());
        };
        let seq = seq.parse().ok().filter(|s| *s > 0).ok_or_else(missing)?;
        let turn = turn.parse().map_err(|_| missing())?;
        let (conversation, after_approval) = match kind {
            "r" => (false, false),
            "c" => (true, false),
            "ra" => (false, true),
            "ca" => (true, true),
            _ => return Err(missing()),
        };
        if !is_session_id(session) {
            return Err(missing());
        }
        Ok(Self { session: session.to_owned(), seq, turn, conversation, after_approval })
    }
}

/// `conv_<session>`.
pub fn conversation_id(session: &str) -> String {
    format!("conv_{session}")
}

/// The session of a conversation id; anything else is a conversation that does not exist.
pub fn conversation_session(id: &str, param: &str) -> Result<String, ApiError> {
    id.strip_prefix("conv_")
        .filter(|s| is_session_id(s))
        .map(str::to_owned)
        .ok_or_else(|| ApiError::not_found(param, format!("Conversation with id '{id}' not found.")))
}

/// An item id: `prefix` + base64url(`session.seq`).
pub fn item_id(prefix: &str, session: &str, seq: u64) -> String {
    format!("{prefix}_{}", URL_SAFE_NO_PAD.encode(format!("{session}.{seq}")))
}

/// The id of an approval request: `mcpr_` + base64url(`session.turn.seq.call_id`), the call awaiting
/// approval and the seq of its `tool/call`: all a decision and the response after it need.
pub fn approval_id(session: &str, turn: u64, seq: u64, call_id: &str) -> String {
    call_ref_id(APPROVAL_PREFIX, session, turn, seq, call_id)
}

/// The `call_id` of a `function_call` item: `call_` + base64url(`session.turn.seq.call_id`), the call of
/// a client tool of the turn and the seq of its `tool/call`: all its `function_call_output` needs, at any
/// gateway (decision 0113).
pub fn function_call_id(session: &str, turn: u64, seq: u64, call_id: &str) -> String {
    call_ref_id(FUNCTION_CALL_PREFIX, session, turn, seq, call_id)
}

const APPROVAL_PREFIX: &str = "mcpr_";
const FUNCTION_CALL_PREFIX: &str = "call_";

fn call_ref_id(prefix: &str, session: &str, turn: u64, seq: u64, call_id: &str) -> String {
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(format!("{session}.{turn}.{seq}.{call_id}")))
}

/// A call awaiting approval or its client, as its request id names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalCall {
    pub session: String,
    pub turn: u64,
    pub seq: u64,
    pub call_id: String,
}

/// The call an approval request id names; anything else is not one (404 naming `param`).
pub fn approval_call(id: &str, param: &str) -> Result<ApprovalCall, ApiError> {
    call_ref(id, APPROVAL_PREFIX, param, "approval request")
}

/// The call a `function_call_output`'s `call_id` names; anything else is not one (404 naming `param`).
pub fn function_call(id: &str, param: &str) -> Result<ApprovalCall, ApiError> {
    call_ref(id, FUNCTION_CALL_PREFIX, param, "function call")
}

fn call_ref(id: &str, prefix: &str, param: &str, what: &str) -> Result<ApprovalCall, ApiError> {
    let missing = || ApiError::not_found(param, format!("No {what} found with id '{id}'."));
    let raw = id.strip_prefix(prefix).ok_or_else(missing)?;
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(raw).map_err(|_| missing())?).map_err(|_| missing())?;
    let mut parts = raw.splitn(4, '.');
    let (Some(session), Some(turn), Some(seq), Some(call)) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(missing());
    };
    let turn = turn.parse().map_err(|_| missing())?;
    let seq = seq.parse().ok().filter(|s| *s > 0).ok_or_else(missing)?;
    if !is_session_id(session) || call.is_empty() {
        return Err(missing());
    }
    Ok(ApprovalCall { session: session.to_owned(), turn, seq, call_id: call.to_owned() })
}

/// The seq an item id of `session` names, if it is one.
pub fn item_seq(id: &str, session: &str) -> Option<u64> {
    let (_, raw) = id.split_once('_')?;
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(raw).ok()?).ok()?;
    let (s, seq) = raw.rsplit_once('.')?;
    (s == session).then(|| seq.parse().ok()).flatten()
}

pub use crate::ids::{is_session_id, message_id, new_session};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_ids_round_trip_and_anything_else_is_not_found() {
        let id = ResponseId { session: "oai-1_x".into(), seq: 42, turn: 7, conversation: true, after_approval: true };
        let text = id.encode();
        assert!(text.starts_with("resp_"), "{text}");
        assert_eq!(ResponseId::decode(&text, "response_id").unwrap(), id);
        for bad in ["", "resp_", "resp_!!", "msg_abc", &format!("resp_{}", URL_SAFE_NO_PAD.encode("a.b.c.r"))] {
            let err = ResponseId::decode(bad, "response_id").unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::NOT_FOUND, "{bad}");
        }
    }

    #[test]
    fn item_and_conversation_ids_name_their_session() {
        let id = item_id("msg", "s1", 9);
        assert_eq!(item_seq(&id, "s1"), Some(9));
        assert_eq!(item_seq(&id, "s2"), None);
        assert_eq!(conversation_session(&conversation_id("conv-1"), "c").unwrap(), "conv-1");
        assert!(conversation_session("conv_bad.id", "c").is_err());
    }

    #[test]
    fn approval_ids_name_the_session_turn_and_call() {
        let id = approval_id("s-1", 3, 17, "call.with.dots");
        let call = ApprovalCall { session: "s-1".into(), turn: 3, seq: 17, call_id: "call.with.dots".into() };
        assert_eq!(approval_call(&id, "p").unwrap(), call);
        assert!(approval_call("mcpr_x", "p").is_err());
        let id = function_call_id("s-1", 3, 17, "call.with.dots");
        assert!(id.starts_with("call_"), "{id}");
        assert_eq!(function_call(&id, "p").unwrap(), call);
        assert!(function_call(&approval_id("s-1", 3, 17, "c"), "p").is_err());
    }

    #[test]
    fn idempotency_keys_give_the_same_session_and_message_ids() {
        assert_eq!(new_session("resp", Some("k1")), new_session("resp", Some("k1")));
        assert_ne!(new_session("resp", Some("k1")), new_session("resp", Some("k2")));
        assert_ne!(new_session("resp", None), new_session("resp", None));
        assert_eq!(message_id(Some("k1"), 0), "k1#0");
        let long = "k".repeat(300);
        assert!(message_id(Some(&long), 1).len() <= 128);
        assert!(is_session_id(&new_session("resp", Some(&long))));
    }
}
