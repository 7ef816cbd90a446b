//! [`ConfigError`]: what is wrong with a configuration, where, and how to fix it.

use std::fmt;
use std::path::PathBuf;

/// Why a configuration was refused.
///
/// Every message names the key (`agents.assistant.model`) and says what is allowed; when the configuration
/// came from text it starts with where the key is (`turnstile.toml:12:9: ` or `line 12, column 9: `).
/// Messages never contain secrets: the values of environment variables are never read into an error, and
/// URLs are not echoed (they may carry credentials).
///
/// ```
/// use turnstile_config::Config;
///
/// let err = Config::from_toml_str("[agents.assistant]\nmodel = \"gpt\"\n").unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     r#"line 2, column 9: agents.assistant.model: no model named "gpt" (known: scripted)"#
/// );
/// assert_eq!(err.key(), Some("agents.assistant.model"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration file: {reason}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// The text is not TOML.
    #[error("{location}invalid TOML: {message}")]
    Syntax {
        /// Where the parser stopped.
        location: Location,
        /// The parser's reason.
        message: String,
    },
    /// A key is unknown, missing, or has a value that is not allowed.
    #[error("{location}{key}: {message}")]
    Invalid {
        /// Where the key is, when the configuration came from text.
        location: Location,
        /// The key path, e.g. `agents.assistant.tools[1]`.
        key: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

impl ConfigError {
    /// The key path the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Invalid { key, .. } => Some(key),
            Self::Read { .. } | Self::Syntax { .. } => None,
        }
    }

    /// Where in the text the error is, if known.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::Invalid { location, .. } | Self::Syntax { location, .. } => Some(location),
            Self::Read { .. } => None,
        }
    }

    /// Names the file the text came from.
    pub(crate) fn in_file(mut self, path: PathBuf) -> Self {
        if let Self::Invalid { location, .. } | Self::Syntax { location, .. } = &mut self {
            location.file = Some(path);
        }
        self
    }
}

/// Where in a configuration text something is. Lines and columns count from 1; columns count characters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    /// The file, when the text was read from one.
    pub file: Option<PathBuf>,
    /// Line and column.
    pub position: Option<(usize, usize)>,
}

impl Location {
    /// The location of byte `offset` of `text`.
    pub(crate) fn at(text: &str, offset: usize) -> Self {
        let offset = offset.min(text.len());
        let before = text.as_bytes().get(..offset).unwrap_or_default();
        let line_start = before.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = text.get(line_start..offset).map_or(offset - line_start, |s| s.chars().count()) + 1;
        Self { file: None, position: Some((line, column)) }
    }
}

/// Renders as a prefix: `FILE:LINE:COLUMN: `, `line LINE, column COLUMN: `, `FILE: ` or nothing.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.position) {
            (Some(file), Some((line, column))) => write!(f, "{}:{line}:{column}: ", file.display()),
            (Some(file), None) => write!(f, "{}: ", file.display()),
            (None, Some((line, column))) => write!(f, "line {line}, column {column}: "),
            (None, None) => Ok(()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The message `text`, a configuration that must not load, is refused with.
    pub(crate) fn load_error(text: &str) -> String {
        crate::Config::from_toml_str(text).unwrap_err().to_string()
    }

    #[test]
    fn locations_count_lines_and_characters_from_one() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(Location::at(text, 0).position, Some((1, 1)));
        assert_eq!(Location::at(text, 6).position, Some((2, 1)));
        // "bé = " is 6 bytes but 5 characters.
        assert_eq!(Location::at(text, 12).position, Some((2, 6)));
        // Past the end and inside a character never panic.
        assert_eq!(Location::at(text, 1000).position, Some((3, 1)));
        assert_eq!(Location::at(text, 8).position, Some((2, 3)));
    }

    #[test]
    fn locations_render_as_a_prefix() {
        let mut l = Location::at("x", 0);
        assert_eq!(l.to_string(), "line 1, column 1: ");
        l.file = Some("t.toml".into());
        assert_eq!(l.to_string(), "t.toml:1:1: ");
        l.position = None;
        assert_eq!(l.to_string(), "t.toml: ");
        assert_eq!(Location::default().to_string(), "");
    }
}
