//! Session overrides (SPEC §20): what one session changes of its agent, within what the agent allows.
//!
//! `ConfigureSession` sets them (all of them at once: a field left out is no override) and the driver
//! records them durably as `session/overridden` when they change; the fold keeps the last one. Each turn
//! applies them only as far as the version it runs allows ([`OverridePolicy::allowed`]), so an agent that
//! stops allowing an override stops applying it without anyone rewriting the log.
//!
//! ```
//! use turnstile_model::overrides::{OverridePolicy, SessionOverrides};
//!
//! let policy = OverridePolicy { system_prompt: true, models: vec!["large".into()], tools: false };
//! let asked = SessionOverrides {
//!     system_prompt: Some("Answer in French.".into()),
//!     model: Some("large".into()),
//!     tools: Some(vec!["clock".into()]),
//! };
//! let applied = policy.allowed(&asked);
//! assert_eq!(applied.system_prompt.as_deref(), Some("Answer in French."));
//! assert_eq!(applied.model.as_deref(), Some("large"));
//! assert_eq!(applied.tools, None, "this agent does not let sessions choose its tools");
//! ```

use serde::{Deserialize, Serialize};

/// The longest extra system prompt, in bytes.
pub const MAX_SYSTEM_PROMPT_BYTES: usize = 32 * 1024;

/// What a session overrides of its agent. `None` (and an empty prompt) is no override.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionOverrides {
    /// Sent after the agent's own system prompt.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// One of the agent's `overrides.models` (a `[models.NAME]`), instead of its `model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The tools offered, a subset of the agent's `tools` (entries as the agent lists them: `clock`,
    /// `mcp:files/*`, `client:deploy`); `Some(vec![])` offers none.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
}

impl SessionOverrides {
    /// Nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.system_prompt.is_none() && self.model.is_none() && self.tools.is_none()
    }

    /// The agent's system prompt with the extra one after it (a blank line between).
    pub fn system_after(&self, agent: Option<&str>) -> Option<String> {
        match (agent, self.system_prompt.as_deref()) {
            (Some(agent), Some(extra)) => Some(format!("{agent}\n\n{extra}")),
            (None, Some(extra)) => Some(extra.to_owned()),
            (agent, None) => agent.map(str::to_owned),
        }
    }
}

/// What an agent lets its sessions override (`[agents.NAME.overrides]`). The default allows nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OverridePolicy {
    /// A session may add a system prompt after the agent's.
    pub system_prompt: bool,
    /// The models a session may run instead of the agent's (`[models.NAME]` names).
    pub models: Vec<String>,
    /// A session may narrow the agent's tools to a subset.
    pub tools: bool,
}

/// Why overrides were refused: the field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// The agent does not allow this override at all (`field` is `system_prompt`, `model` or `tools`).
    #[error(
        "overrides.{field}: agent {agent:?} does not allow sessions to override its {what}; allow it with \
         [agents.{agent}.overrides] {allow}"
    )]
    NotAllowed { agent: String, field: &'static str, what: &'static str, allow: &'static str },
    #[error("overrides.model: {model:?} is not one of the models agent {agent:?} allows (allowed: {allowed})")]
    Model { agent: String, model: String, allowed: String },
    #[error("overrides.tools[{index}]: {tool:?} is not one of agent {agent:?}'s tools (its tools: {tools})")]
    Tool { agent: String, index: usize, tool: String, tools: String },
    #[error("overrides.tools[{index}]: {tool:?} is listed twice")]
    DuplicateTool { index: usize, tool: String },
    #[error("overrides.system_prompt: {len} bytes is over the limit of {MAX_SYSTEM_PROMPT_BYTES}; shorten it")]
    SystemPromptTooLong { len: usize },
}

impl OverrideError {
    /// The override is well formed but the agent does not allow it (FAILED_PRECONDITION: change the agent,
    /// not the request); every other problem is the request's (INVALID_ARGUMENT).
    pub fn is_not_allowed(&self) -> bool {
        matches!(self, Self::NotAllowed { .. })
    }
}

impl OverridePolicy {
    /// Checks `overrides` against this policy of `agent`, whose tools are `agent_tools` (as listed).
    pub fn check(
        &self,
        agent: &str,
        agent_tools: &[String],
        overrides: &SessionOverrides,
    ) -> Result<(), OverrideError> {
        let not_allowed =
            |field, what, allow| OverrideError::NotAllowed { agent: agent.to_owned(), field, what, allow };
        if let Some(prompt) = &overrides.system_prompt {
            if !self.system_prompt {
                return Err(not_allowed("system_prompt", "system prompt", "system_prompt = true"));
            }
            if prompt.len() > MAX_SYSTEM_PROMPT_BYTES {
                return Err(OverrideError::SystemPromptTooLong { len: prompt.len() });
            }
        }
        if let Some(model) = &overrides.model {
            if self.models.is_empty() {
                return Err(not_allowed("model", "model", "models = [\"NAME\", …]"));
            }
            if !self.models.contains(model) {
                return Err(OverrideError::Model {
                    agent: agent.to_owned(),
                    model: model.clone(),
                    allowed: self.models.join(", "),
                });
            }
        }
        if let Some(tools) = &overrides.tools {
            if !self.tools {
                return Err(not_allowed("tools", "tools", "tools = true"));
            }
            for (index, tool) in tools.iter().enumerate() {
                if !agent_tools.contains(tool) {
                    let listed = if agent_tools.is_empty() { "none".to_owned() } else { agent_tools.join(", ") };
                    return Err(OverrideError::Tool {
                        agent: agent.to_owned(),
                        index,
                        tool: tool.clone(),
                        tools: listed,
                    });
                }
                if tools[..index].contains(tool) {
                    return Err(OverrideError::DuplicateTool { index, tool: tool.clone() });
                }
            }
        }
        Ok(())
    }

    /// The part of `overrides` this policy allows: what a turn of a version with this policy applies. A
    /// model no longer allowed falls back to the agent's own. A tool subset is kept whole: the runner offers
    /// only those of its tools that the version has.
    pub fn allowed(&self, overrides: &SessionOverrides) -> SessionOverrides {
        SessionOverrides {
            system_prompt: overrides.system_prompt.clone().filter(|_| self.system_prompt),
            model: overrides.model.clone().filter(|m| self.models.contains(m)),
            tools: overrides.tools.clone().filter(|_| self.tools),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> OverridePolicy {
        OverridePolicy { system_prompt: true, models: vec!["small".into(), "large".into()], tools: true }
    }

    fn tools() -> Vec<String> {
        vec!["clock".into(), "echo".into()]
    }

    #[test]
    fn each_refusal_names_its_field() {
        let none = OverridePolicy::default();
        let prompt = SessionOverrides { system_prompt: Some("x".into()), ..SessionOverrides::default() };
        let e = none.check("a", &tools(), &prompt).unwrap_err();
        assert!(e.is_not_allowed());
        assert!(matches!(e, OverrideError::NotAllowed { field: "system_prompt", .. }));
        let model = SessionOverrides { model: Some("huge".into()), ..SessionOverrides::default() };
        assert!(matches!(none.check("a", &tools(), &model), Err(OverrideError::NotAllowed { field: "model", .. })));
        assert!(matches!(policy().check("a", &tools(), &model), Err(OverrideError::Model { .. })));
        let tool = SessionOverrides { tools: Some(vec!["echo".into(), "sleep".into()]), ..SessionOverrides::default() };
        assert!(matches!(none.check("a", &tools(), &tool), Err(OverrideError::NotAllowed { field: "tools", .. })));
        let e = policy().check("a", &tools(), &tool).unwrap_err();
        assert_eq!(
            e,
            OverrideError::Tool { agent: "a".into(), index: 1, tool: "sleep".into(), tools: "clock, echo".into() }
        );
        assert!(!e.is_not_allowed());
        let twice = SessionOverrides { tools: Some(vec!["echo".into(), "echo".into()]), ..SessionOverrides::default() };
        assert!(matches!(policy().check("a", &tools(), &twice), Err(OverrideError::DuplicateTool { index: 1, .. })));
        let long = SessionOverrides {
            system_prompt: Some("x".repeat(MAX_SYSTEM_PROMPT_BYTES + 1)),
            ..SessionOverrides::default()
        };
        assert!(matches!(policy().check("a", &tools(), &long), Err(OverrideError::SystemPromptTooLong { .. })));
        let all =
            SessionOverrides { system_prompt: Some("x".into()), model: Some("large".into()), tools: Some(vec![]) };
        assert_eq!(policy().check("a", &tools(), &all), Ok(()));
    }

    #[test]
    fn a_turn_applies_only_what_its_version_allows() {
        let asked = SessionOverrides {
            system_prompt: Some("x".into()),
            model: Some("large".into()),
            tools: Some(vec!["clock".into()]),
        };
        assert_eq!(policy().allowed(&asked), asked);
        assert!(OverridePolicy::default().allowed(&asked).is_empty());
        let fewer = OverridePolicy { models: vec!["small".into()], ..policy() };
        assert_eq!(fewer.allowed(&asked).model, None);
    }

    #[test]
    fn the_extra_prompt_follows_the_agents() {
        let o = SessionOverrides { system_prompt: Some("extra".into()), ..SessionOverrides::default() };
        assert_eq!(o.system_after(Some("base")).as_deref(), Some("base\n\nextra"));
        assert_eq!(o.system_after(None).as_deref(), Some("extra"));
        assert_eq!(SessionOverrides::default().system_after(Some("base")).as_deref(), Some("base"));
    }
}
