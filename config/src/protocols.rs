//! `[protocols]`: which agent protocols the gateway's `--http` port answers (SPEC §19).

use serde::Deserialize;

/// The protocol adapters served beside the console on the `--http` port; each can be switched off.
///
/// ```
/// use turnstile_config::Config;
///
/// assert!(Config::default().protocols.openai);
/// let config = Config::from_toml_str("[protocols]\nopenai = false\n").unwrap();
/// assert!(!config.protocols.openai);
/// let config = Config::from_toml_str("[protocols]\nmcp = false\na2a = false\n").unwrap();
/// assert!(!config.protocols.mcp && !config.protocols.a2a && config.protocols.openai);
/// assert!(config.protocols.agui);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProtocolsConfig {
    /// The OpenAI Responses and Conversations API (`/v1/models`, `/v1/responses`, `/v1/conversations`).
    /// Default on.
    pub openai: bool,
    /// The MCP server (`/mcp`, Streamable HTTP): each agent profile a tool. Default on.
    pub mcp: bool,
    /// A2A (`/a2a/{agent}` and each agent's card at `/a2a/{agent}/.well-known/agent-card.json`). Default on.
    pub a2a: bool,
    /// AG-UI (`POST /ag-ui/{agent}`). Default on.
    pub agui: bool,
}

impl Default for ProtocolsConfig {
    fn default() -> Self {
        Self { openai: true, mcp: true, a2a: true, agui: true }
    }
}
