//! An agent profile as an MCP tool: its name, its description, and the input every agent takes.

use std::sync::{Arc, LazyLock};

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};

use crate::profiles::Profile;

/// `{message, session?}`: the prompt, and the session to continue (a new one when absent).
static INPUT_SCHEMA: LazyLock<Arc<JsonObject>> = LazyLock::new(|| {
    let schema = json!({
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1, "description": "What to ask the agent."},
            "session": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_-]{1,128}$",
                "description": "The session to continue (the `session` of an earlier result); a new session when absent."
            }
        },
        "required": ["message"],
        "additionalProperties": false
    });
    Arc::new(match schema {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    })
});

/// The tool that runs `profile`.
pub(crate) fn tool(profile: &Profile) -> Tool {
    Tool::new(profile.name.clone(), profile.description.clone(), INPUT_SCHEMA.clone())
}

/// A call's arguments, or what is wrong with them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Arguments {
    pub(crate) message: String,
    pub(crate) session: Option<String>,
}

impl Arguments {
    pub(crate) fn read(arguments: Option<&JsonObject>) -> Result<Self, String> {
        let empty = JsonObject::new();
        let arguments = arguments.unwrap_or(&empty);
        if let Some(other) = arguments.keys().find(|k| *k != "message" && *k != "session") {
            return Err(format!("unknown argument {other:?}: an agent takes `message` and optionally `session`"));
        }
        let message = match arguments.get("message") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            Some(Value::String(_)) | None => return Err("`message` is required: the prompt for the agent".into()),
            Some(_) => return Err("`message` must be a string".into()),
        };
        let session = match arguments.get("session") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if crate::ids::is_session_id(s) => Some(s.clone()),
            Some(_) => {
                return Err("`session` must be a session id: 1-128 characters of A-Z, a-z, 0-9, `_` and `-`".into());
            }
        };
        Ok(Self { message, session })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Result<Arguments, String> {
        match v {
            Value::Object(map) => Arguments::read(Some(&map)),
            _ => Arguments::read(None),
        }
    }

    #[test]
    fn arguments_are_a_message_and_an_optional_session() {
        assert_eq!(args(json!({"message": "hi"})).unwrap(), Arguments { message: "hi".into(), session: None });
        let with = args(json!({"message": "hi", "session": "s-1"})).unwrap();
        assert_eq!(with.session.as_deref(), Some("s-1"));
        assert!(args(json!({})).unwrap_err().contains("`message` is required"));
        assert!(args(json!({"message": 3})).unwrap_err().contains("must be a string"));
        assert!(args(json!({"message": "x", "session": "a b"})).unwrap_err().contains("session id"));
        assert!(args(json!({"message": "x", "tools": []})).unwrap_err().contains("unknown argument \"tools\""));
    }
}
