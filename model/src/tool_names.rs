//! What a tool may be called, as the model sees it: one rule for MCP names (`SERVER__TOOL`), client tools
//! registered over `ServeTools`, and the built-ins.

/// The longest tool name the model providers accept (OpenAI and Anthropic: `^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_MODEL_TOOL_NAME: usize = 64;

/// The built-in tools' names (SPEC §9); a client tool may not take one.
pub const BUILTIN_TOOL_NAMES: [&str; 7] =
    ["clock", "echo", "memory_get", "memory_put", "memory_search", "sleep", "spawn_agent"];

/// The separator of an MCP tool's model-facing name, `SERVER__TOOL`; reserved, so a client tool may not
/// contain it.
pub const MCP_SEPARATOR: &str = "__";

/// A name a model can call a tool by: 1–64 ASCII letters, digits, `_` or `-` (what OpenAI and Anthropic
/// accept). MCP tools are offered as `SERVER__TOOL`, so the whole of that must fit.
///
/// ```
/// use turnstile_model::tool_names::is_model_tool_name;
///
/// assert!(is_model_tool_name("files__read_file"));
/// assert!(!is_model_tool_name("files__read file"));
/// assert!(!is_model_tool_name(&"x".repeat(65)));
/// ```
pub fn is_model_tool_name(name: &str) -> bool {
    (1..=MAX_MODEL_TOOL_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
