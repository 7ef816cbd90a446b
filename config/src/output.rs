//! Structured output (SPEC §20, decision 0163): `[agents.NAME.output]`, and the one place JSON Schemas are
//! checked — an agent's when the file or `PutAgent` is read, a turn's when the gateway accepts it — and
//! replies validated against them (the worker's agents, after each final reply).
//!
//! ```
//! use turnstile_config::output::OutputValidator;
//! use turnstile_model::output::OutputSchema;
//!
//! let schema = OutputSchema::new(
//!     "answer",
//!     serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
//! );
//! let validator = OutputValidator::new(&schema).unwrap();
//! assert!(validator.check(r#"{"city": "Paris"}"#).is_ok());
//! assert_eq!(validator.check(r#"{"city": 3}"#).unwrap_err(), r#"at /city: 3 is not of type "string""#);
//! assert!(validator.check("Paris").unwrap_err().starts_with("the reply is not JSON"));
//! ```

use serde::Deserialize;
use turnstile_model::output::OutputSchema;

/// Longest schema name, in bytes (OpenAI's limit for `json_schema.name`).
pub const MAX_SCHEMA_NAME: usize = 64;

/// How many of a reply's schema violations a validation error lists (the rest are counted).
const SHOWN_ERRORS: usize = 3;

/// `[agents.NAME.output]`: the JSON Schema every final reply of the agent's turns must match.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// The name providers show the model (`[A-Za-z0-9_-]`, 1 to 64 bytes). Default `output`.
    #[serde(default = "OutputConfig::default_name")]
    pub name: String,
    /// The JSON Schema (draft 2020-12 unless `$schema` names another), as a table or JSON object.
    pub schema: serde_json::Value,
    /// Ask OpenAI-compatible providers for strict adherence (their subset of JSON Schema). Default false;
    /// replies are validated either way.
    #[serde(default)]
    pub strict: bool,
}

impl OutputConfig {
    fn default_name() -> String {
        "output".to_owned()
    }

    /// As the driver and the providers take it.
    pub fn schema(&self) -> OutputSchema {
        OutputSchema { name: self.name.clone(), schema: self.schema.clone(), strict: self.strict }
    }
}

/// Why `schema` cannot be used, naming the part (`name` or `schema`) and what is allowed.
pub fn check(schema: &OutputSchema) -> Result<(), SchemaProblem> {
    let name = &schema.name;
    if name.is_empty() || name.len() > MAX_SCHEMA_NAME {
        return Err(SchemaProblem::name(format!("must be 1 to {MAX_SCHEMA_NAME} bytes, got {}", name.len())));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(SchemaProblem::name(format!(
            "{name:?} has the character {c:?}; use only A-Z, a-z, 0-9, '-' and '_'"
        )));
    }
    OutputValidator::new(schema).map(|_| ())
}

/// What is wrong with an output schema: which part (`name` or `schema`), and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{part}: {why}")]
pub struct SchemaProblem {
    pub part: SchemaPart,
    pub why: String,
}

/// The part of an output schema a [`SchemaProblem`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaPart {
    Name,
    Schema,
}

impl std::fmt::Display for SchemaPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Name => "name",
            Self::Schema => "schema",
        })
    }
}

impl SchemaProblem {
    fn name(why: String) -> Self {
        Self { part: SchemaPart::Name, why }
    }

    fn schema(why: String) -> Self {
        Self { part: SchemaPart::Schema, why }
    }
}

/// A compiled output schema.
pub struct OutputValidator(jsonschema::Validator);

impl std::fmt::Debug for OutputValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputValidator")
    }
}

impl OutputValidator {
    /// Compiles `schema.schema`: it must be a JSON object (or boolean) that is a valid schema of its draft,
    /// with no references outside itself (nothing is fetched).
    pub fn new(schema: &OutputSchema) -> Result<Self, SchemaProblem> {
        if !(schema.schema.is_object() || schema.schema.is_boolean()) {
            return Err(SchemaProblem::schema(format!(
                "must be a JSON object (a JSON Schema), got {}",
                kind(&schema.schema)
            )));
        }
        jsonschema::options()
            .build(&schema.schema)
            .map(Self)
            .map_err(|e| SchemaProblem::schema(format!("not a valid JSON Schema: {e}")))
    }

    /// Whether `reply` is JSON that matches: else what is wrong, in words the model can act on (the
    /// first few violations, each with where it is).
    pub fn check(&self, reply: &str) -> Result<(), String> {
        let value: serde_json::Value =
            serde_json::from_str(reply.trim()).map_err(|e| format!("the reply is not JSON ({e})"))?;
        let errors: Vec<String> = self
            .0
            .iter_errors(&value)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() { e.to_string() } else { format!("at {at}: {e}") }
            })
            .collect();
        match errors.len() {
            0 => Ok(()),
            n if n <= SHOWN_ERRORS => Err(errors.join("; ")),
            n => Err(format!("{}; and {} more", errors[..SHOWN_ERRORS].join("; "), n - SHOWN_ERRORS)),
        }
    }
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Config;
    use crate::error::tests::load_error;

    #[test]
    fn an_agents_output_is_read_from_the_file_and_bad_ones_name_the_key() {
        let config = Config::from_toml_str(
            "[agents.x.output]\nname = \"city\"\nschema = { type = \"object\", required = [\"city\"] }\n",
        )
        .unwrap();
        let output = config.agents["x"].output.as_ref().unwrap().schema();
        assert_eq!(output.name, "city");
        assert_eq!(output.schema, serde_json::json!({"type": "object", "required": ["city"]}));
        let e = load_error("[agents.x.output]\nschema = { type = \"objekt\" }\n");
        assert!(e.contains("agents.x.output.schema: not a valid JSON Schema"), "{e}");
        let e = load_error("[agents.x.output]\nname = \"a b\"\nschema = {}\n");
        assert!(e.contains("agents.x.output.name: \"a b\" has the character ' '"), "{e}");
        let e = load_error("[agents.x.output]\nschema = \"object\"\n");
        assert!(e.contains("agents.x.output.schema: must be a JSON object (a JSON Schema), got a string"), "{e}");
        let e = load_error("[agents.x.output]\nschemas = {}\n");
        assert!(e.contains("agents.x.output.schemas: unknown key"), "{e}");
    }

    #[test]
    fn a_definition_given_at_run_time_takes_the_same_table_and_the_same_errors() {
        use crate::DefinitionFormat;
        let config = Config::default();
        let toml = config.agent_definition("x", DefinitionFormat::Toml, "[output]\nschema = { type = \"object\" }\n");
        assert_eq!(toml.unwrap().output.unwrap().name, "output");
        let json = r#"{"output": {"name": "city", "schema": {"type": "object"}, "strict": true}}"#;
        assert!(config.agent_definition("x", DefinitionFormat::Json, json).unwrap().output.unwrap().strict);
        let bad = r#"{"output": {"schema": {"type": 3}}}"#;
        let e = config.agent_definition("x", DefinitionFormat::Json, bad).unwrap_err().to_string();
        assert!(e.starts_with("agents.x.output.schema: not a valid JSON Schema"), "{e}");
    }

    #[test]
    fn violations_are_listed_with_where_they_are_and_counted_past_three() {
        let schema = OutputSchema::new(
            "s",
            serde_json::json!({"type": "object", "properties": {
                "a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"}, "d": {"type": "string"}
            }}),
        );
        let validator = OutputValidator::new(&schema).unwrap();
        let e = validator.check(r#"{"a": 1, "b": 2, "c": 3, "d": 4}"#).unwrap_err();
        assert!(e.starts_with("at /a: 1 is not of type \"string\"; at /b:"), "{e}");
        assert!(e.ends_with("; and 1 more"), "{e}");
        assert!(validator.check(" {\"a\": \"x\"}\n").is_ok(), "surrounding whitespace is not part of the JSON");
    }
}
