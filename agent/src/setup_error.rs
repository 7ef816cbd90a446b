//! [`AgentSetupError`]: why a configuration cannot run on this worker. Its own file so that
//! [`crate::setup`], [`crate::built`] and [`crate::versions`] all return it without importing each other.

use turnstile_config::ConfigError;
use turnstile_driver::CatalogError;

use crate::hooks::remote::RemoteHookError;
use crate::llm::endpoint::EndpointError;
use crate::tools::mcp::McpError;

/// A configuration this worker cannot run. Every message names the agent, model or variable at fault
/// (never a key's value).
#[derive(Debug, thiserror::Error)]
pub enum AgentSetupError {
    /// An agent runs on a model the configuration does not define.
    #[error("agent {agent:?}: no model named {model:?} (known: {known})")]
    UnknownModel { agent: String, model: String, known: String },
    /// An agent lists a tool this worker does not provide.
    #[error("agent {agent:?}: tool \"{tool}\" is not available in this worker ({reason}; available: {available})")]
    UnknownTool { agent: String, tool: String, reason: String, available: String },
    /// An MCP server the agents use did not start (or its headers cannot be read).
    #[error(transparent)]
    Mcp(Box<McpError>),
    /// The `api_key_env` of a model some agent runs on names a variable that is unset or blank; the
    /// message names those agents first, since the key is needed for them.
    #[error("{} model {model:?}: {source}", runs_on(agents))]
    ApiKey {
        model: String,
        /// The agents that run on (or compact with) the model, sorted.
        agents: Vec<String>,
        /// The variable `api_key_env` names.
        variable: String,
        #[source]
        source: Box<ConfigError>,
    },
    /// A model's endpoint cannot be used (bad URL, a key that is no header value, no HTTP client).
    #[error("model {model:?}: {source}")]
    Endpoint {
        model: String,
        #[source]
        source: EndpointError,
    },
    /// A remote pre-step hook's URL cannot be dialled.
    #[error("agent {agent:?}: {source}")]
    Hook {
        agent: String,
        #[source]
        source: RemoteHookError,
    },
    /// The agents do not form a catalog (the default agent is missing).
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A webhook's secret cannot be read, or there is no HTTP client.
    #[error(transparent)]
    Webhook(#[from] crate::webhooks::WebhookSetupError),
}

/// `agent "a" runs on` / `agents "a", "b" run on`: who needs a model, for [`AgentSetupError::ApiKey`].
fn runs_on(agents: &[String]) -> String {
    let names = agents.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ");
    if agents.len() == 1 { format!("agent {names} runs on") } else { format!("agents {names} run on") }
}

impl From<McpError> for AgentSetupError {
    fn from(error: McpError) -> Self {
        Self::Mcp(Box::new(error))
    }
}
