//! One model endpoint: the `[models.NAME]` table of docs/CONFIGURATION.md, with the API key already
//! read from the variable `api_key_env` names.
//!
//! ```
//! use std::time::Duration;
//! use turnstile_agent::llm::endpoint::{ModelEndpoint, ProviderKind};
//! use turnstile_model::Secret;
//!
//! let mut endpoint = ModelEndpoint::new(ProviderKind::OpenAi, "SmolLM2-135M-Instruct");
//! endpoint.base_url = "http://127.0.0.1:8080/v1".into();
//! endpoint.api_key = Some(Secret::new("sk-secret"));
//! endpoint.first_byte_timeout = Duration::from_secs(30);
//! // The key never reaches a log line.
//! assert!(!format!("{endpoint:?}").contains("sk-secret"));
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use turnstile_model::Secret;

use super::retry::Backoff;

/// Which wire protocol an endpoint speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (`POST {base_url}/chat/completions`), any compatible server.
    OpenAi,
    /// Anthropic Messages (`POST {base_url}/messages`).
    Anthropic,
}

impl ProviderKind {
    /// The configuration spelling, also the `provider` label of metrics and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// Where the provider's public API lives, for a configuration without `base_url`.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com/v1",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A provider name the HTTP providers do not speak (`scripted` is built in, not an endpoint).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown model provider {0:?} (known: openai, anthropic)")]
pub struct UnknownProvider(pub String);

impl FromStr for ProviderKind {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "openai" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(UnknownProvider(other.to_owned())),
        }
    }
}

/// One model endpoint. Durations replace the configuration's `*_ms` keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelEndpoint {
    pub provider: ProviderKind,
    /// Without the operation's path: `http://127.0.0.1:8080/v1`, `https://api.anthropic.com/v1`.
    pub base_url: String,
    pub model: String,
    /// `None`: no key header is sent (local servers).
    pub api_key: Option<Secret>,
    /// The output limit when the request names none. Anthropic requires one: [`DEFAULT_ANTHROPIC_MAX_TOKENS`]
    /// when neither names it; OpenAI-compatible servers use their own default then.
    pub max_tokens: Option<u32>,
    /// The whole request, retries and their waits included (`timeout_ms`).
    pub timeout: Duration,
    /// From sending a request to the first byte of a successful response body (`first_byte_timeout_ms`).
    pub first_byte_timeout: Duration,
    /// The longest silence between two pieces of a stream once it has started (`idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Retries after the first attempt (`retries`).
    pub retries: u32,
    pub backoff: Backoff,
    /// Anthropic only: mark the system prompt, the tools and the end of the history with `cache_control`
    /// (`prompt_cache`, SPEC §17).
    pub prompt_cache: bool,
}

/// `max_tokens` sent to Anthropic when neither the request nor the endpoint names one.
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;

impl ModelEndpoint {
    /// An endpoint with the provider's public base URL, no key, and the defaults: timeout 120 s, first
    /// byte 30 s, idle 60 s, 3 retries, [`Backoff::default`].
    pub fn new(provider: ProviderKind, model: impl Into<String>) -> Self {
        Self {
            provider,
            base_url: provider.default_base_url().to_owned(),
            model: model.into(),
            api_key: None,
            max_tokens: None,
            timeout: Duration::from_secs(120),
            first_byte_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            retries: 3,
            backoff: Backoff::default(),
            prompt_cache: false,
        }
    }

    /// The API key as a request header's value, after `scheme` (`"Bearer "`, or `""` for the bare key),
    /// marked sensitive so that no debug output shows it. `None` without a key; [`EndpointError::ApiKey`]
    /// when the key holds characters a header cannot carry.
    pub(crate) fn key_header(&self, scheme: &str) -> Result<Option<reqwest::header::HeaderValue>, EndpointError> {
        let Some(key) = &self.api_key else { return Ok(None) };
        let mut value = reqwest::header::HeaderValue::from_str(&format!("{scheme}{}", key.expose()))
            .map_err(|_| EndpointError::ApiKey { model: self.model.clone() })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

/// An endpoint that cannot be used; found when the provider is built, before any request.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("model endpoint base_url {url:?} is not an http(s) URL: {reason}")]
    BaseUrl { url: String, reason: String },
    /// The key holds characters an HTTP header cannot carry (the key itself is not in the message).
    #[error("the API key of model {model:?} is not a valid HTTP header value")]
    ApiKey { model: String },
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}
