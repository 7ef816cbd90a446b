//! [`Secret`]: a credential read from the environment, never printed.

use std::fmt;

/// A credential (an API key, a header value) resolved from an environment variable.
///
/// `Debug` and `Display` print `<redacted>`; only [`Secret::expose`] gives the value, at the one place
/// that sends it.
///
/// ```
/// use turnstile_config::Secret;
///
/// let key = Secret::new("sk-live-123".to_owned());
/// assert_eq!(format!("{key} {key:?}"), "<redacted> Secret(<redacted>)");
/// assert_eq!(key.expose(), "sk-live-123");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for the request that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads environment variable `variable` through `env` for the key at `key`, trimmed; an unset or blank
/// variable is an error naming both the key and the variable (never a value). `purpose` says what the
/// variable should hold.
pub(crate) fn from_env(
    key: &str,
    variable: &str,
    purpose: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Secret, crate::ConfigError> {
    let problem = match env(variable) {
        Some(value) if !value.trim().is_empty() => return Ok(Secret::new(value.trim().to_owned())),
        Some(_) => "is empty",
        None => "is not set",
    };
    Err(crate::ConfigError::Invalid {
        location: crate::Location::default(),
        key: key.to_owned(),
        message: format!("environment variable {variable} {problem}; set it to {purpose}, or remove this key"),
    })
}
