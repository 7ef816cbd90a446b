//! Reading a [`Secret`] from the environment. The type itself is the model's: the same redaction holds for
//! the credentials the configuration names and those clients register at run time.

pub use turnstile_model::Secret;

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
