//! Tool references (an agent's `tools`) and approval patterns (its `approval`).
//!
//! | written | meaning |
//! |---|---|
//! | `clock`, `echo`, `sleep`, `spawn_agent` | a built-in tool ([`Builtin`]) |
//! | `mcp:SERVER/TOOL` | tool `TOOL` of the MCP server `[mcp.SERVER]`, offered to the model as `SERVER__TOOL` |
//! | `mcp:SERVER/*` | every tool that server lists |
//! | `client:NAME` | a client tool served over `ServeTools` |
//!
//! Approval patterns use the same forms with `*` matching any run of characters in the tool part:
//! `mcp:files/write_*`, `client:*`.

use std::fmt;
use std::str::FromStr;

use crate::names::{ValueError, deserialize_from_str, keyword_enum};

keyword_enum! {
    /// A tool every agent may list (SPEC §9, §13). `goal_complete` is not one: it is offered
    /// automatically while the session has an active goal (SPEC §10).
    pub enum Builtin ("built-in tool") {
        /// `clock`: the current time.
        Clock = "clock",
        /// `echo TEXT`: returns TEXT.
        Echo = "echo",
        /// `sleep MS`: waits MS milliseconds (stops at once on abort).
        Sleep = "sleep",
        /// `spawn_agent {agent, prompt}`: runs a child session and returns its answer.
        SpawnAgent = "spawn_agent",
        /// `memory_get {namespace, key}`: a document of the tenant's memory (SPEC §20).
        MemoryGet = "memory_get",
        /// `memory_put {namespace, key, document}`: writes a document; also an event of the session.
        MemoryPut = "memory_put",
        /// `memory_search {query, namespace?}`: the documents that best match the words.
        MemorySearch = "memory_search",
    }
}

pub use turnstile_model::tool_names::{MAX_MODEL_TOOL_NAME, is_model_tool_name};

/// A tool name as a call names it at run time, to match against [`ToolRef`] and [`ToolPattern`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolId<'a> {
    /// A built-in tool.
    Builtin(Builtin),
    /// Tool `tool` of MCP server `server`.
    Mcp {
        /// The `[mcp.SERVER]` name.
        server: &'a str,
        /// The tool's name as the server lists it.
        tool: &'a str,
    },
    /// A client tool.
    Client(&'a str),
}

impl<'a> ToolId<'a> {
    /// The tool a model-facing name stands for: `SERVER__TOOL` is a tool of an MCP server, a built-in's
    /// name is that built-in, any other name a client tool (client tools may not take built-in names).
    ///
    /// ```
    /// use turnstile_config::{Builtin, ToolId};
    ///
    /// assert_eq!(ToolId::from_call_name("files__read_file"), ToolId::Mcp { server: "files", tool: "read_file" });
    /// assert_eq!(ToolId::from_call_name("clock"), ToolId::Builtin(Builtin::Clock));
    /// assert_eq!(ToolId::from_call_name("lookup"), ToolId::Client("lookup"));
    /// ```
    pub fn from_call_name(name: &'a str) -> Self {
        if let Some((server, tool)) = name.split_once("__") {
            return Self::Mcp { server, tool };
        }
        match name.parse::<Builtin>() {
            Ok(builtin) => Self::Builtin(builtin),
            Err(_) => Self::Client(name),
        }
    }
}

/// One entry of an agent's `tools`.
///
/// ```
/// use turnstile_config::{Builtin, ToolId, ToolRef};
///
/// let all: ToolRef = "mcp:files/*".parse().unwrap();
/// assert!(all.matches(ToolId::Mcp { server: "files", tool: "read_file" }));
/// assert_eq!("clock".parse::<ToolRef>().unwrap(), ToolRef::Builtin(Builtin::Clock));
/// assert!("mcp:files".parse::<ToolRef>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ToolRef {
    /// A built-in tool.
    Builtin(Builtin),
    /// Tools of an MCP server.
    Mcp {
        /// The `[mcp.SERVER]` name.
        server: String,
        /// One tool, or `None` for `*`: every tool the server lists.
        tool: Option<String>,
    },
    /// A client tool.
    Client(String),
}

impl ToolRef {
    /// Whether a call of `tool` is covered by this entry.
    pub fn matches(&self, tool: ToolId<'_>) -> bool {
        match (self, tool) {
            (Self::Builtin(a), ToolId::Builtin(b)) => *a == b,
            (Self::Mcp { server, tool: None }, ToolId::Mcp { server: s, .. }) => server == s,
            (Self::Mcp { server, tool: Some(t) }, ToolId::Mcp { server: s, tool }) => server == s && t == tool,
            (Self::Client(name), ToolId::Client(n)) => name == n,
            _ => false,
        }
    }

    /// The MCP server this entry names, if any.
    pub fn mcp_server(&self) -> Option<&str> {
        match self {
            Self::Mcp { server, .. } => Some(server),
            Self::Builtin(_) | Self::Client(_) => None,
        }
    }
}

/// What the tool forms are, for messages.
const FORMS: &str = "clock, echo, sleep, spawn_agent, memory_get, memory_put, memory_search, mcp:SERVER/TOOL, mcp:SERVER/*, client:NAME";

fn unknown_tool(s: &str) -> ValueError {
    if s == "goal_complete" {
        return ValueError(
            "\"goal_complete\" is offered automatically while the session has an active goal; remove it".to_owned(),
        );
    }
    ValueError(format!("unknown tool {s:?} (allowed: {FORMS})"))
}

/// A server name: `[A-Za-z0-9_-]`, no `__` and no trailing `_`, so that `SERVER__TOOL` splits back.
pub(crate) fn is_server_name(s: &str) -> bool {
    crate::names::is_name(s) && !s.contains("__") && !s.ends_with('_')
}

/// A tool name of an MCP server or a client: 1 to 128 of `[A-Za-z0-9_.-]` (plus `*` in a pattern).
fn is_tool_name(s: &str, glob: bool) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b) || (glob && b == b'*'))
}

/// The form of a tool reference or pattern.
enum Form<'a> {
    Builtin,
    Mcp { server: &'a str, tool: &'a str },
    Client(&'a str),
}

/// Splits `mcp:SERVER/TOOL` or `client:NAME`, checking the names.
fn split(s: &str, glob: bool) -> Result<Form<'_>, ValueError> {
    let tool_rule = if glob {
        "1 to 128 letters, digits, '_', '.', '-' or '*'"
    } else {
        "1 to 128 letters, digits, '_', '.' or '-'"
    };
    if let Some(rest) = s.strip_prefix("mcp:") {
        let Some((server, tool)) = rest.split_once('/') else {
            return Err(ValueError(format!(
                "{s:?}: an MCP tool is written mcp:SERVER/TOOL or mcp:SERVER/* (allowed: {FORMS})"
            )));
        };
        if !is_server_name(server) {
            return Err(ValueError(format!(
                "{s:?}: the server name must be 1 to 64 letters, digits, '_' or '-', without \"__\" or a trailing '_'"
            )));
        }
        let tool_ok = if glob { is_tool_name(tool, true) } else { tool == "*" || is_tool_name(tool, false) };
        if !tool_ok {
            let star = if glob { "" } else { ", or * for every tool of the server" };
            return Err(ValueError(format!("{s:?}: the tool name must be {tool_rule}{star}")));
        }
        return Ok(Form::Mcp { server, tool });
    }
    if let Some(name) = s.strip_prefix("client:") {
        if !is_tool_name(name, glob) || name.contains("__") {
            return Err(ValueError(format!("{s:?}: a client tool name must be {tool_rule}, without \"__\"")));
        }
        if Builtin::from_str(name).is_ok() {
            return Err(ValueError(format!("{s:?}: a client tool cannot take the name of a built-in tool")));
        }
        return Ok(Form::Client(name));
    }
    Ok(Form::Builtin)
}

impl FromStr for ToolRef {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, ValueError> {
        match split(s, false)? {
            Form::Client(name) => Ok(Self::Client(name.to_owned())),
            Form::Mcp { server, tool } => {
                Ok(Self::Mcp { server: server.to_owned(), tool: (tool != "*").then(|| tool.to_owned()) })
            }
            Form::Builtin => Builtin::from_str(s).map(Self::Builtin).map_err(|_| unknown_tool(s)),
        }
    }
}

deserialize_from_str!(ToolRef);

impl fmt::Display for ToolRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin(b) => f.write_str(b.as_str()),
            Self::Mcp { server, tool } => write!(f, "mcp:{server}/{}", tool.as_deref().unwrap_or("*")),
            Self::Client(name) => write!(f, "client:{name}"),
        }
    }
}

/// A tool name pattern in which `*` matches any run of characters (including none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Glob(String);

impl Glob {
    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches the pattern.
    ///
    /// ```
    /// use turnstile_config::{ToolId, ToolPattern};
    ///
    /// let p: ToolPattern = "mcp:files/write_*".parse().unwrap();
    /// assert!(p.matches(ToolId::Mcp { server: "files", tool: "write_file" }));
    /// assert!(!p.matches(ToolId::Mcp { server: "files", tool: "read_file" }));
    /// ```
    pub fn matches(&self, name: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = name.strip_prefix(first) else { return false };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
        for part in middle {
            match rest.find(part) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// One entry of an agent's `approval`: calls it matches wait for a `Decide`.
///
/// ```
/// use turnstile_config::{ToolId, ToolPattern};
///
/// let p: ToolPattern = "client:*".parse().unwrap();
/// assert!(p.matches(ToolId::Client("lookup")));
/// assert!(!p.matches(ToolId::Mcp { server: "files", tool: "lookup" }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ToolPattern {
    /// A built-in tool.
    Builtin(Builtin),
    /// Tools of one MCP server whose names match the glob.
    Mcp {
        /// The `[mcp.SERVER]` name.
        server: String,
        /// The tool part.
        tool: Glob,
    },
    /// Client tools whose names match the glob.
    Client(Glob),
}

impl ToolPattern {
    /// Whether a call of `tool` needs approval under this pattern.
    pub fn matches(&self, tool: ToolId<'_>) -> bool {
        match (self, tool) {
            (Self::Builtin(a), ToolId::Builtin(b)) => *a == b,
            (Self::Mcp { server, tool: glob }, ToolId::Mcp { server: s, tool }) => server == s && glob.matches(tool),
            (Self::Client(glob), ToolId::Client(name)) => glob.matches(name),
            _ => false,
        }
    }

    /// Whether some call the agent may make through `tool` could match this pattern (an entry naming a
    /// whole MCP server may list any tool).
    pub fn may_match(&self, tool: &ToolRef) -> bool {
        match (self, tool) {
            (Self::Mcp { server, .. }, ToolRef::Mcp { server: s, tool: None }) => server == s,
            (_, ToolRef::Builtin(b)) => self.matches(ToolId::Builtin(*b)),
            (_, ToolRef::Mcp { server, tool: Some(t) }) => self.matches(ToolId::Mcp { server, tool: t }),
            (_, ToolRef::Client(name)) => self.matches(ToolId::Client(name)),
            (_, ToolRef::Mcp { tool: None, .. }) => false,
        }
    }

    /// The MCP server this pattern names, if any.
    pub fn mcp_server(&self) -> Option<&str> {
        match self {
            Self::Mcp { server, .. } => Some(server),
            Self::Builtin(_) | Self::Client(_) => None,
        }
    }
}

impl FromStr for ToolPattern {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, ValueError> {
        match split(s, true)? {
            Form::Client(name) => Ok(Self::Client(Glob(name.to_owned()))),
            Form::Mcp { server, tool } => Ok(Self::Mcp { server: server.to_owned(), tool: Glob(tool.to_owned()) }),
            Form::Builtin => Builtin::from_str(s).map(Self::Builtin).map_err(|_| unknown_tool(s)),
        }
    }
}

deserialize_from_str!(ToolPattern);

impl fmt::Display for ToolPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin(b) => f.write_str(b.as_str()),
            Self::Mcp { server, tool } => write!(f, "mcp:{server}/{}", tool.as_str()),
            Self::Client(glob) => write!(f, "client:{}", glob.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_builtins_are_the_models_builtin_tool_names() {
        let mut names: Vec<&str> = super::Builtin::ALL.iter().map(|b| b.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, turnstile_model::tool_names::BUILTIN_TOOL_NAMES);
    }

    use super::*;

    fn tool(s: &str) -> Result<ToolRef, String> {
        s.parse::<ToolRef>().map_err(|e| e.to_string())
    }

    fn pattern(s: &str) -> ToolPattern {
        s.parse().unwrap()
    }

    #[test]
    fn tool_references_parse_and_print_back() {
        for s in ["clock", "echo", "sleep", "spawn_agent", "mcp:files/*", "mcp:files/read_file", "client:lookup"] {
            assert_eq!(tool(s).unwrap().to_string(), s);
        }
        assert_eq!(tool("mcp:files/*").unwrap(), ToolRef::Mcp { server: "files".into(), tool: None });
        assert_eq!(tool("client:lookup").unwrap(), ToolRef::Client("lookup".into()));
    }

    #[test]
    fn bad_tool_references_say_what_is_allowed() {
        assert_eq!(
            tool("clok").unwrap_err(),
            r#"unknown tool "clok" (allowed: clock, echo, sleep, spawn_agent, memory_get, memory_put, memory_search, mcp:SERVER/TOOL, mcp:SERVER/*, client:NAME)"#
        );
        assert_eq!(
            tool("goal_complete").unwrap_err(),
            r#""goal_complete" is offered automatically while the session has an active goal; remove it"#
        );
        assert_eq!(
            tool("mcp:files").unwrap_err(),
            r#""mcp:files": an MCP tool is written mcp:SERVER/TOOL or mcp:SERVER/* (allowed: clock, echo, sleep, spawn_agent, memory_get, memory_put, memory_search, mcp:SERVER/TOOL, mcp:SERVER/*, client:NAME)"#
        );
        assert_eq!(
            tool("mcp:files/write_*").unwrap_err(),
            r#""mcp:files/write_*": the tool name must be 1 to 128 letters, digits, '_', '.' or '-', or * for every tool of the server"#
        );
        assert!(tool("mcp:a__b/x").unwrap_err().contains("without \"__\""));
        assert!(tool("mcp:/x").is_err() && tool("mcp:a/").is_err() && tool("client:").is_err());
        assert_eq!(
            tool("client:echo").unwrap_err(),
            r#""client:echo": a client tool cannot take the name of a built-in tool"#
        );
        assert!(tool("client:a__b").is_err());
    }

    #[test]
    fn globs_match_runs_of_characters() {
        let g = |p: &str| Glob(p.to_owned());
        assert!(g("*").matches("") && g("*").matches("anything"));
        assert!(g("write_*").matches("write_") && g("write_*").matches("write_file"));
        assert!(!g("write_*").matches("read_file"));
        assert!(g("*_file").matches("read_file") && !g("*_file").matches("read_files"));
        assert!(g("a*b*c").matches("abc") && g("a*b*c").matches("axxbyyc") && !g("a*b*c").matches("acb"));
        assert!(g("aa*aa").matches("aaaa") && !g("aa*aa").matches("aaa"));
        assert!(g("exact").matches("exact") && !g("exact").matches("exactly"));
    }

    #[test]
    fn patterns_match_calls_and_may_match_references() {
        let write = pattern("mcp:files/write_*");
        assert!(write.matches(ToolId::Mcp { server: "files", tool: "write_file" }));
        assert!(!write.matches(ToolId::Mcp { server: "other", tool: "write_file" }));
        assert!(write.may_match(&"mcp:files/*".parse().unwrap()));
        assert!(write.may_match(&"mcp:files/write_file".parse().unwrap()));
        assert!(!write.may_match(&"mcp:files/read_file".parse().unwrap()));
        assert!(pattern("sleep").matches(ToolId::Builtin(Builtin::Sleep)));
        assert!(!pattern("sleep").may_match(&"client:sleepy".parse().unwrap()));
        assert!(pattern("client:look*").may_match(&"client:lookup".parse().unwrap()));
        assert_eq!(pattern("mcp:files/*").to_string(), "mcp:files/*");
    }
}
