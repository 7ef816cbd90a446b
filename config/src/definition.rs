//! Agent definitions given at run time (`PutAgent`, SPEC §20): parsed and checked by the very code that
//! reads `[agents.NAME]` of the file, so the API refuses exactly what the file refuses, with the same
//! message naming the same key (`agents.NAME.model: no model named …`).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::de::DeTable;

use crate::agent::{AgentConfig, canonical};
use crate::config::Config;
use crate::error::{ConfigError, Location};
use crate::names::{NAME_RULE, is_name};
use crate::path::{self, KeyPath};

/// How a definition is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefinitionFormat {
    /// The body of an `[agents.NAME]` table: `model = "local"`, `system = "…"`, …
    Toml,
    /// The same keys as one JSON object.
    Json,
}

/// Keys of the file's agents that a definition given at run time may not set, and why.
const FILE_ONLY: &[(&str, &str)] = &[
    (
        "tenants",
        "is for agents of the configuration file; an agent put through the API belongs to the caller's tenant alone",
    ),
    ("webhooks", "is for agents of the configuration file; register an API agent's webhooks with CreateWebhook"),
];

/// Only the `agents` table, so the file's own deserialization (and its errors) apply to one agent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsOnly {
    agents: BTreeMap<String, AgentConfig>,
}

impl Config {
    /// Parses and checks the agent `name` defined by `text` (written as `format`), as `[agents.NAME]` of
    /// this configuration would be: the models and MCP servers it names must be this configuration's.
    /// Errors name the key (`agents.NAME.KEY`) with the file's message; they carry no line and column.
    ///
    /// ```
    /// use turnstile_config::{Config, DefinitionFormat};
    ///
    /// let config = Config::default();
    /// let agent = config.agent_definition("helper", DefinitionFormat::Json, r#"{"system": "Be brief."}"#).unwrap();
    /// assert_eq!(agent.system, "Be brief.");
    /// assert_eq!(agent.definition, r#"{"system":"Be brief."}"#);
    /// let err = config.agent_definition("helper", DefinitionFormat::Toml, "model = \"gpt\"").unwrap_err();
    /// assert_eq!(err.to_string(), r#"agents.helper.model: no model named "gpt" (known: scripted)"#);
    /// ```
    pub fn agent_definition(
        &self,
        name: &str,
        format: DefinitionFormat,
        text: &str,
    ) -> Result<AgentConfig, ConfigError> {
        self.definition(name, format, text, true)
    }

    /// [`Config::agent_definition`] of a file agent's stored definition (canonical JSON), which may set the
    /// keys only the file may (`tenants`, `webhooks`).
    pub fn file_agent_definition(&self, name: &str, json: &str) -> Result<AgentConfig, ConfigError> {
        self.definition(name, DefinitionFormat::Json, json, false)
    }

    fn definition(
        &self,
        name: &str,
        format: DefinitionFormat,
        text: &str,
        from_api: bool,
    ) -> Result<AgentConfig, ConfigError> {
        let path = KeyPath::root().key("agents").key(name);
        if !is_name(name) {
            return Err(unlocated(path.invalid(format!("not a valid name (allowed: {NAME_RULE})")).into_error(None)));
        }
        let table: toml::Table = match format {
            DefinitionFormat::Toml => toml::from_str(text).map_err(|e| unlocated(path::syntax_error(text, &e)))?,
            DefinitionFormat::Json => serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
                location: Location::default(),
                message: format!("not a JSON object of an agent's keys: {e}"),
            })?,
        };
        for (key, why) in FILE_ONLY {
            if from_api && table.contains_key(*key) {
                return Err(unlocated(path.key(key).invalid(*why).into_error(None)));
            }
        }
        let definition = canonical(&table);
        // The file's own pipeline over a document holding just this agent, so errors are the file's.
        let mut agents = toml::Table::new();
        agents.insert(name.to_owned(), toml::Value::Table(table));
        let mut root = toml::Table::new();
        root.insert("agents".to_owned(), toml::Value::Table(agents));
        let document = toml::to_string(&root).map_err(|e| ConfigError::Syntax {
            location: Location::default(),
            message: format!("the definition cannot be written as TOML: {e}"),
        })?;
        let spanned = DeTable::parse(&document).map_err(|e| unlocated(path::syntax_error(&document, &e)))?;
        let spanned = spanned.get_ref();
        let parsed: AgentsOnly =
            toml::from_str(&document).map_err(|e| unlocated(path::deserialize_error(&document, spanned, &e)))?;
        let mut agent = parsed.agents.into_values().next().unwrap_or_default();
        agent.name = name.to_owned();
        agent.definition = definition;
        agent.check(&path, self).map_err(|e| unlocated(e.into_error(None)))?;
        Ok(agent)
    }
}

/// The error without a position: positions would point into the document built above, not the caller's text.
fn unlocated(error: ConfigError) -> ConfigError {
    match error {
        ConfigError::Invalid { key, message, .. } => {
            ConfigError::Invalid { location: Location::default(), key, message }
        }
        ConfigError::Syntax { message, .. } => ConfigError::Syntax { location: Location::default(), message },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config() -> Config {
        Config::from_toml_str("[models.local]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n").unwrap()
    }

    /// The same mistake in the file and through the API gets the same key and message.
    #[test]
    fn a_definition_is_refused_exactly_as_the_file_refuses_it() {
        let config = config();
        for (body, key) in [
            ("modle = \"local\"", "agents.a.modle"),
            ("model = \"gpt\"", "agents.a.model"),
            ("history_turns = \"many\"", "agents.a.history_turns"),
            ("tools = [\"clock\", \"clock\"]", "agents.a.tools[1]"),
            ("approval = [\"client:x\"]", "agents.a.approval[0]"),
            ("version_policy = \"sometimes\"", "agents.a.version_policy"),
            ("tool_deadline_ms = 0", "agents.a.tool_deadline_ms"),
        ] {
            let file = Config::from_toml_str(&format!(
                "[models.local]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n[agents.a]\n{body}\n"
            ))
            .unwrap_err();
            let api = config.agent_definition("a", DefinitionFormat::Toml, body).unwrap_err();
            assert_eq!(api.key(), Some(key), "{api}");
            assert_eq!(api.key(), file.key(), "{body}");
            let (ConfigError::Invalid { message: a, .. }, ConfigError::Invalid { message: f, .. }) = (&api, &file)
            else {
                panic!("{api:?} / {file:?}")
            };
            assert_eq!(a, f, "{body}");
        }
    }

    #[test]
    fn json_and_toml_definitions_are_one_definition() {
        let config = config();
        let toml = config
            .agent_definition(
                "a",
                DefinitionFormat::Toml,
                "system = \"S\"\nmodel = \"local\"\nversion_policy = \"pin\"",
            )
            .unwrap();
        let json = config
            .agent_definition("a", DefinitionFormat::Json, r#"{"version_policy":"pin","model":"local","system":"S"}"#)
            .unwrap();
        assert_eq!(toml, json);
        assert_eq!(toml.definition, r#"{"model":"local","system":"S","version_policy":"pin"}"#);
        assert_eq!(toml.version_policy, crate::VersionPolicy::Pin);
        let err = config.agent_definition("a", DefinitionFormat::Json, r#"{"model":"local","history_turns":"x"}"#);
        assert_eq!(err.unwrap_err().key(), Some("agents.a.history_turns"));
    }

    #[test]
    fn names_and_file_only_keys_are_refused_naming_them() {
        let config = config();
        let err = config.agent_definition("a b", DefinitionFormat::Toml, "").unwrap_err();
        assert_eq!(err.key(), Some("agents.\"a b\""));
        let err = config.agent_definition("a", DefinitionFormat::Toml, "tenants = [\"x\"]").unwrap_err();
        assert_eq!(err.key(), Some("agents.a.tenants"));
        let err = config.agent_definition("a", DefinitionFormat::Json, "[1]").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
        // A file agent's stored definition keeps its tenants.
        let file = config.file_agent_definition("a", r#"{"tenants":["x"]}"#).unwrap();
        assert_eq!(file.tenants.unwrap()[0].as_str(), "x");
    }

    #[test]
    fn the_files_agents_keep_their_definition_as_written() {
        let config = Config::from_toml_str("[agents.a]\nsystem = \"S\"\nhistory_turns = 3\n").unwrap();
        assert_eq!(config.agents["a"].definition, r#"{"history_turns":3,"system":"S"}"#);
        assert_eq!(config.agents["scripted"].definition, r#"{"tools":["sleep","echo","clock"]}"#);
    }
}
