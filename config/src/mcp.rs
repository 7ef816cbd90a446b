//! `[mcp.NAME]`: MCP servers whose tools agents may list as `mcp:NAME/TOOL`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::ConfigError;
use crate::names::{ENV_VAR_RULE, is_env_var, is_header_name};
use crate::path::{Invalid, KeyPath, positive};
use crate::secret::{Secret, from_env};
use crate::url::HttpUrl;

/// How the worker reaches an MCP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        /// The program (looked up in `PATH` when it has no `/`).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the worker's environment for it.
        env: BTreeMap<String, String>,
        /// Its working directory (relative to the worker's); default the worker's.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP server.
    Http {
        /// Its MCP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
        url: HttpUrl,
        /// Header name → the name of the environment variable that holds the header's value
        /// (e.g. `Authorization = "FILES_TOKEN"`).
        headers_env: BTreeMap<String, String>,
    },
}

/// One MCP server (`[mcp.NAME]`): either `command` (stdio) or `url` (streamable HTTP), never both.
///
/// ```
/// use turnstile_config::{Config, McpTransport};
///
/// let config = Config::from_toml_str("[mcp.files]\ncommand = \"python3\"\nargs = [\"files_server.py\"]\n").unwrap();
/// assert!(matches!(&config.mcp["files"].transport, McpTransport::Stdio { command, .. } if command == "python3"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawMcpServer")]
pub struct McpServerConfig {
    /// The table's name (`NAME` of `[mcp.NAME]`); set by the parser, not written in the file.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// Deadline of a call of this server's tools, in ms; default the agent's `tool_deadline_ms`.
    pub tool_deadline_ms: Option<u64>,
}

/// The keys as written, before the transport is chosen.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpServer {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<PathBuf>,
    url: Option<HttpUrl>,
    headers_env: Option<BTreeMap<String, String>>,
    tool_deadline_ms: Option<u64>,
}

impl TryFrom<RawMcpServer> for McpServerConfig {
    type Error = String;

    fn try_from(raw: RawMcpServer) -> Result<Self, String> {
        const FORMS: &str = "a server is either stdio (command, args, env, cwd) or streamable HTTP (url, headers_env)";
        let transport = match (raw.command, raw.url) {
            (Some(_), Some(_)) => return Err(format!("both command and url are set; {FORMS}")),
            (None, None) => {
                return Err(format!(
                    "neither command nor url is set; {FORMS}, e.g. command = \"python3\" or url = \"http://127.0.0.1:9000/mcp\""
                ));
            }
            (Some(command), None) => {
                if raw.headers_env.is_some() {
                    return Err(
                        "headers_env is for streamable HTTP servers (url); this one is stdio (command)".to_owned()
                    );
                }
                McpTransport::Stdio {
                    command,
                    args: raw.args.unwrap_or_default(),
                    env: raw.env.unwrap_or_default(),
                    cwd: raw.cwd,
                }
            }
            (None, Some(url)) => {
                if raw.args.is_some() || raw.env.is_some() || raw.cwd.is_some() {
                    return Err("args, env and cwd are for stdio servers (command); this one is streamable HTTP (url)"
                        .to_owned());
                }
                McpTransport::Http { url, headers_env: raw.headers_env.unwrap_or_default() }
            }
        };
        Ok(Self { name: String::new(), transport, tool_deadline_ms: raw.tool_deadline_ms })
    }
}

impl McpServerConfig {
    /// `tool_deadline_ms` as a duration.
    pub fn tool_deadline(&self) -> Option<Duration> {
        self.tool_deadline_ms.map(Duration::from_millis)
    }

    /// The HTTP headers of a streamable HTTP server, their values read through `env` from the variables
    /// `headers_env` names (empty for a stdio server); an error naming the key and the variable when one is
    /// unset or blank.
    pub fn resolve_headers(&self, env: impl Fn(&str) -> Option<String>) -> Result<Vec<(String, Secret)>, ConfigError> {
        let McpTransport::Http { headers_env, .. } = &self.transport else { return Ok(Vec::new()) };
        let path = KeyPath::root().key("mcp").key(&self.name).key("headers_env");
        headers_env
            .iter()
            .map(|(header, variable)| {
                let purpose = format!("the value of header {header} for MCP server {:?}", self.name);
                from_env(&path.key(header).to_string(), variable, &purpose, &env).map(|v| (header.clone(), v))
            })
            .collect()
    }

    pub(crate) fn check(&self, path: &KeyPath) -> Result<(), Invalid> {
        if let Some(ms) = self.tool_deadline_ms {
            positive(path, "tool_deadline_ms", ms, "a deadline of 0 would fail every call")?;
        }
        match &self.transport {
            McpTransport::Stdio { command, env, .. } => {
                if command.trim().is_empty() {
                    return Err(path.key("command").invalid("must name a program, e.g. command = \"python3\""));
                }
                if let Some(name) = env.keys().find(|k| !is_env_var(k)) {
                    return Err(path.key("env").key(name).invalid(format!("must be {ENV_VAR_RULE}")));
                }
            }
            McpTransport::Http { headers_env, .. } => {
                for (header, variable) in headers_env {
                    if !is_header_name(header) {
                        return Err(path.key("headers_env").key(header).invalid(
                            "not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, e.g. \"Authorization\")",
                        ));
                    }
                    if !is_env_var(variable) {
                        return Err(path.key("headers_env").key(header).invalid(format!(
                            "must be {ENV_VAR_RULE}; put the header's value in that variable and name the variable here"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}
