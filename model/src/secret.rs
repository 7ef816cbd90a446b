//! [`Secret`]: a credential that no log, error or `Debug` output ever shows.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A credential: a model's API key, a header value, a webhook's signing key, a push notification's token.
///
/// `Debug` prints `<redacted>`, so a struct holding one may derive `Debug`; it has no `Display`, so no
/// `format!` can slip it into a message or a header. Only [`Secret::expose`] gives the value, at the one
/// place that sends or signs with it. It serializes as the
/// plain string, for the stores that must keep it (the webhook registry). Clones share the value.
///
/// ```
/// use turnstile_model::Secret;
///
/// let key = Secret::new("sk-live-123");
/// assert_eq!(format!("{key:?}"), "Secret(<redacted>)");
/// assert_eq!(key.expose(), "sk-live-123");
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The value, for the request that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no value was given (an optional credential left out).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Default for Secret {
    /// The empty secret: an optional credential not given.
    fn default() -> Self {
        Self::new("")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_the_plain_string_and_back() {
        let secret = Secret::new("whsec_1");
        let json = serde_json::to_string(&secret).unwrap();
        assert_eq!(json, "\"whsec_1\"");
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), secret);
        assert!(Secret::default().is_empty() && !secret.is_empty());
    }
}
