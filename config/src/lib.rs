//! Turnstile's configuration file (reference: `docs/CONFIGURATION.md`), parsed into
//! typed structs, defaulted and validated.
//!
//! Its place in the architecture: `node/` loads one [`Config`] per process (`--config FILE`, or the file
//! [`CONFIG_ENV`] names; the same file on every node), lets command-line flags override its public fields,
//! and hands the parts to the roles it wires: the gateway reads [`Limits`] and [`ClusterConfig`]'s layout
//! and route deadline; `turnstile-agent` builds the agents ([`AgentConfig`]) with their models
//! ([`ModelConfig`]), MCP servers ([`McpServerConfig`]), hooks ([`HookConfig`]) and tools ([`ToolRef`],
//! [`ToolPattern`]); the worker gets the lease timings, the limits and the [`JournalConfig`]'s cadences. Nothing here does I/O beyond reading the file: no async runtime,
//! no network, and secrets ([`Secret`]) are only read from the environment when a caller asks
//! ([`ModelConfig::resolve_api_key`], [`McpServerConfig::resolve_headers`]).
//!
//! Every key is optional; without a file, [`Config::default`] runs the built-in agent `scripted` on the
//! deterministic scripted model. Unknown keys and bad values are refused with a [`ConfigError`] that names
//! the key, where it is, and what is allowed:
//!
//! ```
//! use turnstile_config::Config;
//!
//! let config = Config::from_toml_str(
//!     r#"
//! default_agent = "assistant"
//!
//! [models.local]
//! provider = "openai"
//! base_url = "http://127.0.0.1:8080/v1"
//! model = "SmolLM2-135M-Instruct"
//!
//! [agents.assistant]
//! model = "local"
//! tools = ["clock"]
//! "#,
//! )
//! .unwrap();
//! assert_eq!(config.default_agent().unwrap().model, "local");
//!
//! let err = Config::from_toml_str("[agents.assistant]\nmodle = \"local\"\n").unwrap_err();
//! assert!(err.to_string().starts_with("line 2, column 1: agents.assistant.modle: unknown key (allowed: description, model, "));
//! ```

mod agent;
mod check;
mod config;
mod definition;
mod error;
mod mcp;
mod memory;
mod model;
mod names;
pub mod output;
mod overrides;
mod path;
mod protocols;
mod secret;
mod tenant;
mod tools;
mod url;
mod webhooks;

pub use agent::{AgentConfig, HookConfig, OnFailure, OnTimeout, VersionPolicy, WebhookConfig};
pub use config::{
    CONFIG_ENV, ClusterConfig, Config, JournalConfig, Limits, MIN_DEDUP_HORIZON, REQUEST_ENVELOPE_BYTES, ToolDefaults,
};
pub use definition::DefinitionFormat;
pub use error::{ConfigError, Location};
pub use mcp::{McpServerConfig, McpTransport};
pub use memory::{AgentMemory, MemoryConfig};
pub use model::{ModelConfig, Provider};
pub use names::{SCRIPTED, ValueError};
pub use overrides::OverridesConfig;
pub use protocols::ProtocolsConfig;
pub use secret::Secret;
pub use tenant::TenantConfig;
pub use tools::{Builtin, Glob, MAX_MODEL_TOOL_NAME, ToolId, ToolPattern, ToolRef, is_model_tool_name};
pub use url::HttpUrl;
pub use webhooks::WebhooksConfig;
