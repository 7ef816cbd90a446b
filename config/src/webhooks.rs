//! `[webhooks]`: the rules for webhooks registered at run time (`CreateWebhook`, SPEC §21).

use serde::Deserialize;

/// What a tenant may register with `CreateWebhook`.
///
/// ```
/// use turnstile_config::Config;
///
/// assert!(!Config::default().webhooks.allow_private);
/// let config = Config::from_toml_str("[webhooks]\nallow_private = true\n").unwrap();
/// assert!(config.webhooks.allow_private);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Whether a registered webhook may target a loopback, private, link-local or cloud-metadata address
    /// (checked when it is created and again on each POST). Off by default: a tenant could otherwise make the
    /// cluster's nodes POST into their own network. The agents' `webhooks` in this file are the operator's
    /// and are not checked.
    pub allow_private: bool,
}
