//! Request bodies: reading the JSON fields of a request with errors that name the field, and OpenAI's
//! `input` (a string or items) and `instructions` as the messages they deliver.

use serde_json::{Map, Value};
use turnstile_model::tool_names::is_model_tool_name;
use turnstile_model::turn_tools::TurnTool;
use turnstile_proto::v1 as pb;

use super::error::ApiError;

/// The plugin name of messages whose source is this adapter.
pub const PLUGIN: &str = "openai";
/// The `form` of the message carrying a response's `instructions`.
pub const INSTRUCTIONS_FORM: &str = "instructions";
/// The `form` of `developer` and `system` input messages.
pub const DEVELOPER_FORM: &str = "notice";

/// Who an input message speaks for; it picks the message's source (SPEC §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `user`: a human prompt (`source user`).
    User,
    /// `developer` or `system` input: `source plugin{openai, notice}`.
    Developer,
    /// `assistant` input (history the client replays): `source model{openai, input}`.
    Assistant,
    /// The request's `instructions`: `source plugin{openai, instructions}`.
    Instructions,
}

/// One message an OpenAI request delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputMessage {
    pub role: Role,
    pub text: String,
}

impl InputMessage {
    /// The delivered message, with MessageId `id`.
    pub fn to_pb(&self, id: String) -> pb::UserMessage {
        use pb::message_source::Kind;
        let kind = match self.role {
            Role::User => Kind::User(pb::UserSource {}),
            Role::Developer => Kind::Plugin(pb::PluginSource { plugin: PLUGIN.into(), form: DEVELOPER_FORM.into() }),
            Role::Instructions => {
                Kind::Plugin(pb::PluginSource { plugin: PLUGIN.into(), form: INSTRUCTIONS_FORM.into() })
            }
            Role::Assistant => Kind::Model(pb::ModelSource { provider: PLUGIN.into(), model: "input".into() }),
        };
        pb::UserMessage {
            id,
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: self.text.clone() })),
            }],
            source: Some(pb::MessageSource { kind: Some(kind) }),
        }
    }
}

/// A JSON request body: an object, or a 400 that says so.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("body", "the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid("body", format!("the request body is not valid JSON: {e}"))),
    }
}

/// An optional string field (`null` counts as absent).
pub fn string<'a>(body: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::invalid(field, format!("{field} must be a string, not {}", kind(other)))),
    }
}

/// An optional object field `field` of `map` (`null` counts as absent); `param` names it in the refusal
/// (its path from the body).
fn object_at<'a>(
    map: &'a Map<String, Value>,
    field: &str,
    param: &str,
) -> Result<Option<&'a Map<String, Value>>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object)),
        Some(other) => Err(ApiError::invalid(param, format!("{param} must be an object, not {}", kind(other)))),
    }
}

/// An optional boolean field, `false` when absent.
pub fn flag(body: &Map<String, Value>, field: &str) -> Result<bool, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(field, format!("{field} must be a boolean, not {}", kind(other)))),
    }
}

/// `metadata`: at most 16 string pairs (OpenAI's rule), as the session labels they become.
pub fn metadata(body: &Map<String, Value>) -> Result<Option<Vec<(String, String)>>, ApiError> {
    let Some(map) = object_at(body, "metadata", "metadata")? else { return Ok(None) };
    if map.len() > 16 {
        return Err(ApiError::invalid("metadata", format!("metadata has {} keys; at most 16 are allowed", map.len())));
    }
    let mut pairs = Vec::with_capacity(map.len());
    for (key, value) in map {
        let Value::String(value) = value else {
            return Err(ApiError::invalid(
                format!("metadata.{key}"),
                format!("metadata values must be strings; {key} is {}", kind(value)),
            ));
        };
        pairs.push((key.clone(), value.clone()));
    }
    Ok(Some(pairs))
}

/// `text.format` (SPEC §20, decision 0172) as the turn's output schema: `json_schema` with its `name`,
/// `schema` and `strict`; `json_object` as a schema that asks for any JSON object; `text` or absent: none.
/// The schema itself is checked by the gateway, by the rule the agents' schemas are checked by.
pub fn text_format(body: &Map<String, Value>) -> Result<Option<pb::OutputSchema>, ApiError> {
    let Some(text) = object_at(body, "text", "text")? else { return Ok(None) };
    let Some(format) = object_at(text, "format", "text.format")? else { return Ok(None) };
    let field = |name: &str| format.get(name).filter(|v| !v.is_null());
    let types = "allowed: text, json_schema, json_object";
    match field("type") {
        Some(Value::String(t)) if t == "text" => Ok(None),
        Some(Value::String(t)) if t == "json_object" => Ok(Some(pb::OutputSchema {
            name: "json_object".into(),
            schema_json: r#"{"type":"object"}"#.into(),
            strict: false,
        })),
        Some(Value::String(t)) if t == "json_schema" => {
            let name = match field("name") {
                None => "output".to_owned(),
                Some(Value::String(name)) => name.clone(),
                Some(other) => {
                    return Err(ApiError::invalid(
                        "text.format.name",
                        format!("text.format.name must be a string, not {}", kind(other)),
                    ));
                }
            };
            let schema = match field("schema") {
                Some(schema @ Value::Object(_)) => schema.to_string(),
                None => {
                    return Err(ApiError::invalid(
                        "text.format.schema",
                        "text.format.schema is required: the JSON Schema the reply must match",
                    ));
                }
                Some(other) => {
                    return Err(ApiError::invalid(
                        "text.format.schema",
                        format!("text.format.schema must be a JSON Schema object, not {}", kind(other)),
                    ));
                }
            };
            let strict = match field("strict") {
                None => false,
                Some(Value::Bool(strict)) => *strict,
                Some(other) => {
                    return Err(ApiError::invalid(
                        "text.format.strict",
                        format!("text.format.strict must be a boolean, not {}", kind(other)),
                    ));
                }
            };
            Ok(Some(pb::OutputSchema { name, schema_json: schema, strict }))
        }
        Some(Value::String(t)) => {
            Err(ApiError::invalid("text.format.type", format!("text.format.type is {t:?}; {types}")))
        }
        None => Err(ApiError::invalid("text.format.type", format!("text.format.type is required; {types}"))),
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("text.format.type must be a string, not {}", kind(other)),
        )),
    }
}

/// A decision on an approval request: an `mcp_approval_response` input item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalResponse {
    pub request_id: String,
    pub approve: bool,
    pub reason: Option<String>,
}

/// The `mcp_approval_response` items of `input`, each checked; the other items are left to [`messages`].
pub fn approvals(body: &Map<String, Value>) -> Result<Vec<ApprovalResponse>, ApiError> {
    let Some(Value::Array(list)) = body.get("input") else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let Some(item) = item.as_object().filter(|o| o.get("type").and_then(Value::as_str) == Some(APPROVAL)) else {
            continue;
        };
        let at = format!("input[{i}]");
        let request_id = string(item, "approval_request_id")
            .map_err(|e| e.at(&at))?
            .ok_or_else(|| ApiError::invalid(format!("{at}.approval_request_id"), "approval_request_id is required"))?;
        let approve = match item.get("approve") {
            Some(Value::Bool(b)) => *b,
            _ => return Err(ApiError::invalid(format!("{at}.approve"), "approve is required: true or false")),
        };
        let reason = string(item, "reason").map_err(|e| e.at(&at))?.map(str::to_owned);
        out.push(ApprovalResponse { request_id: request_id.to_owned(), approve, reason });
    }
    Ok(out)
}

/// The input item type that answers an approval request.
const APPROVAL: &str = "mcp_approval_response";
/// The input item type that answers a function call.
const FUNCTION_OUTPUT: &str = "function_call_output";
/// The input item type of a function call the client resends as history.
const FUNCTION_CALL: &str = "function_call";

/// `tools`: the function tools the request declares for its caller to run, the client tools of its turn
/// (SPEC §19). Other tool types are a 400 naming the tool: the agent profile's own tools run server-side.
pub fn tools(body: &Map<String, Value>) -> Result<Vec<TurnTool>, ApiError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(ApiError::invalid("tools", format!("tools must be a list, not {}", kind(other)))),
    };
    let mut tools: Vec<TurnTool> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(tool) = tool else {
            return Err(ApiError::invalid(at.clone(), format!("{at} must be an object")));
        };
        match string(tool, "type").map_err(|e| e.at(&at))? {
            Some("function") => {}
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at}.type is {other:?}; only function tools can be declared (the agent profile's own tools \
                         run server-side and appear as mcp_call items)"
                    ),
                ));
            }
        }
        let name = string(tool, "name").map_err(|e| e.at(&at))?.unwrap_or_default();
        if !is_model_tool_name(name) {
            return Err(ApiError::invalid(
                format!("{at}.name"),
                format!("{at}.name is {name:?}; a function name is 1-64 letters, digits, '_' or '-'"),
            ));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::invalid(format!("{at}.name"), format!("function {name} is declared twice")));
        }
        let description = string(tool, "description").map_err(|e| e.at(&at))?.unwrap_or_default().to_owned();
        let parameters = match tool.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(format!("{at}.parameters"), "parameters must be a JSON Schema object"));
            }
        };
        tools.push(TurnTool { name: name.to_owned(), description, parameters });
    }
    Ok(tools)
}

/// The output a `function_call_output` item gives the call its `call_id` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionOutput {
    pub call_id: String,
    pub output: String,
}

/// The `function_call_output` items that end `input` (with the resent `function_call`s among them), each
/// checked: the answers to the calls the turn waits for. Everything before them is history the client
/// resends (the Agents SDK sends its whole run each time, earlier rounds' calls and outputs included).
pub fn function_outputs(body: &Map<String, Value>) -> Result<Vec<FunctionOutput>, ApiError> {
    let Some(Value::Array(list)) = body.get("input") else { return Ok(Vec::new()) };
    let is_function =
        |item: &Value| matches!(item.get("type").and_then(Value::as_str), Some(FUNCTION_OUTPUT | FUNCTION_CALL));
    let tail = list.len() - list.iter().rev().take_while(|item| is_function(item)).count();
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate().skip(tail) {
        if item.get("type").and_then(Value::as_str) != Some(FUNCTION_OUTPUT) {
            continue;
        }
        let at = format!("input[{i}]");
        let Some(item) = item.as_object() else { continue };
        let call_id = string(item, "call_id")
            .map_err(|e| e.at(&at))?
            .ok_or_else(|| ApiError::invalid(format!("{at}.call_id"), "call_id is required"))?;
        let output = match item.get("output") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => {
                let texts: Vec<&str> = parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
                if texts.len() != parts.len() {
                    return Err(ApiError::invalid(
                        format!("{at}.output"),
                        "output parts must be text ({\"type\": \"input_text\", \"text\": ...}); images and files are \
                         not supported yet",
                    ));
                }
                texts.join("\n")
            }
            _ => return Err(ApiError::invalid(format!("{at}.output"), "output is required: a string or text parts")),
        };
        out.push(FunctionOutput { call_id: call_id.to_owned(), output });
    }
    Ok(out)
}

/// The index of the first `function_call` item of `input` (history a client resends with its output).
pub fn first_function_call(body: &Map<String, Value>) -> Option<usize> {
    let Some(Value::Array(list)) = body.get("input") else { return None };
    list.iter().position(|item| item.get("type").and_then(Value::as_str) == Some(FUNCTION_CALL))
}

/// `instructions` then `input`, as the messages to deliver in order. Only text is supported; anything
/// else is a 400 naming the item and what is allowed.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<InputMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(text) = string(body, "instructions")? {
        out.push(InputMessage { role: Role::Instructions, text: text.to_owned() });
    }
    // Function calls and their outputs are read by `function_outputs`.
    out.extend(items_but(body.get("input"), "input", &[APPROVAL, FUNCTION_OUTPUT, FUNCTION_CALL])?);
    Ok(out)
}

/// Input items (`input` of a response, `items` of a conversation): a string, or a list of messages.
pub fn items(value: Option<&Value>, param: &str) -> Result<Vec<InputMessage>, ApiError> {
    items_but(value, param, &[APPROVAL])
}

/// [`items`], leaving out the items of the types `skip` (read elsewhere).
fn items_but(value: Option<&Value>, param: &str, skip: &[&str]) -> Result<Vec<InputMessage>, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(text)) => return Ok(vec![InputMessage { role: Role::User, text: text.clone() }]),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ApiError::invalid(
                param,
                format!("{param} must be a string or a list of input items, not {}", kind(other)),
            ));
        }
    };
    list.iter()
        .enumerate()
        .filter(|(_, item)| item.get("type").and_then(Value::as_str).is_none_or(|t| !skip.contains(&t)))
        .map(|(i, item)| message(item, &format!("{param}[{i}]")))
        .collect()
}

fn message(item: &Value, param: &str) -> Result<InputMessage, ApiError> {
    let Value::Object(item) = item else {
        return Err(ApiError::invalid(param, format!("{param} must be an object")));
    };
    let kind_field = string(item, "type").map_err(|e| e.at(param))?.unwrap_or("message");
    if kind_field != "message" {
        return Err(ApiError::invalid(
            format!("{param}.type"),
            format!(
                "input items of type {kind_field:?} are not supported yet; send messages (type \"message\" with a \
                 role and text content); docs/PROTOCOLS.md lists what is supported"
            ),
        ));
    }
    let role = match string(item, "role").map_err(|e| e.at(param))? {
        Some("user") => Role::User,
        Some("developer" | "system") => Role::Developer,
        Some("assistant") => Role::Assistant,
        other => {
            return Err(ApiError::invalid(
                format!("{param}.role"),
                format!("{param}.role is {other:?}; allowed: user, developer, system, assistant"),
            ));
        }
    };
    let content = format!("{param}.content");
    let text = match item.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{content}[{j}]");
                let part_type = part.get("type").and_then(Value::as_str);
                match (part_type, part.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    _ => {
                        return Err(ApiError::invalid(
                            at.clone(),
                            format!(
                                "{at} must be a text part ({{\"type\": \"input_text\", \"text\": ...}}); images and \
                                 files are not supported yet"
                            ),
                        ));
                    }
                }
            }
            texts.join("\n")
        }
        _ => return Err(ApiError::invalid(content.clone(), format!("{content} must be a string or a list of parts"))),
    };
    Ok(InputMessage { role, text })
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn text_format_is_the_turns_output_schema() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let format =
            json!({"text": {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": true}}});
        let got = text_format(&body(format)).unwrap().unwrap();
        assert_eq!((got.name.as_str(), got.strict), ("city", true));
        assert_eq!(serde_json::from_str::<Value>(&got.schema_json).unwrap(), schema);
        assert_eq!(text_format(&body(json!({"text": {"format": {"type": "text"}}}))).unwrap(), None);
        assert_eq!(text_format(&body(json!({"input": "x"}))).unwrap(), None);
        let object = text_format(&body(json!({"text": {"format": {"type": "json_object"}}}))).unwrap().unwrap();
        assert_eq!(object.schema_json, r#"{"type":"object"}"#);
        for (bad, param) in [
            (json!({"text": "json"}), "text"),
            (json!({"text": {"format": {"type": "yaml"}}}), "text.format.type"),
            (json!({"text": {"format": {"name": "x"}}}), "text.format.type"),
            (json!({"text": {"format": {"type": "json_schema", "name": "x"}}}), "text.format.schema"),
            (json!({"text": {"format": {"type": "json_schema", "schema": {}, "strict": "yes"}}}), "text.format.strict"),
        ] {
            assert_eq!(text_format(&body(bad)).unwrap_err().param.as_deref(), Some(param));
        }
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let got = messages(&body(json!({"input": "hi", "instructions": "be brief"}))).unwrap();
        assert_eq!(
            got,
            vec![
                InputMessage { role: Role::Instructions, text: "be brief".into() },
                InputMessage { role: Role::User, text: "hi".into() },
            ]
        );
    }

    #[test]
    fn items_keep_their_roles_and_join_their_text_parts() {
        let input = json!([
            {"role": "developer", "content": "ctx"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "earlier"}]},
        ]);
        let got = items(Some(&input), "input").unwrap();
        assert_eq!(got.iter().map(|m| m.role).collect::<Vec<_>>(), [Role::Developer, Role::User, Role::Assistant]);
        assert_eq!(got[1].text, "a\nb");
    }

    #[test]
    fn the_function_call_outputs_that_end_the_input_answer_and_the_rest_is_history() {
        let output = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "r"});
        let call = |id: &str| json!({"type": "function_call", "call_id": id, "name": "f", "arguments": "{}"});
        let input = json!({"input": [
            {"role": "user", "content": "hi"}, call("c1"), output("c1"),
            {"role": "assistant", "content": "next"}, call("c2"), output("c2"),
        ]});
        let got = function_outputs(&body(input)).unwrap();
        assert_eq!(got, vec![FunctionOutput { call_id: "c2".into(), output: "r".into() }]);
        // A message after the outputs is new input: no outputs answer, and the calls before are history.
        let input = json!({"input": [call("c1"), output("c1"), {"role": "user", "content": "more"}]});
        assert_eq!(function_outputs(&body(input.clone())).unwrap(), vec![]);
        assert_eq!(first_function_call(&body(input)), Some(0));
        let err = function_outputs(&body(json!({"input": [{"type": "function_call_output", "call_id": "c"}]})));
        assert_eq!(err.unwrap_err().param.as_deref(), Some("input[0].output"));
        let tools =
            tools(&body(json!({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]})));
        assert_eq!(tools.unwrap_err().param.as_deref(), Some("tools[1].name"));
    }

    #[test]
    fn unsupported_items_name_the_field() {
        let err = items(Some(&json!([{"role": "user", "content": [{"type": "input_image"}]}])), "input").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].content[0]"));
        let err = items(Some(&json!([{"role": "robot", "content": "x"}])), "input").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].role"));
        let err = items(Some(&json!(7)), "input").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input"));
        let err = metadata(&body(json!({"metadata": {"k": 1}}))).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("metadata.k"));
    }
}
