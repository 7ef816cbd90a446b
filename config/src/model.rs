//! `[models.NAME]`: model endpoints agents run on.

use std::time::Duration;

use serde::Deserialize;

use crate::ConfigError;
use crate::names::SCRIPTED;
use crate::names::{ENV_VAR_RULE, is_env_var, keyword_enum};
use crate::path::{Invalid, KeyPath, positive};
use crate::secret::{Secret, from_env};
use crate::url::HttpUrl;

keyword_enum! {
    /// The API a model speaks.
    pub enum Provider ("provider") {
        /// OpenAI Chat Completions, or any compatible server (llama.cpp, vLLM, Ollama, DeepSeek, …).
        OpenAi = "openai",
        /// Anthropic Messages.
        Anthropic = "anthropic",
        /// The deterministic scripted model of docs/API.md (no network).
        Scripted = "scripted",
    }
}

impl Provider {
    /// The endpoint used when a model gives no `base_url` (`None` for `scripted`, which has none).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            Self::OpenAi => Some("https://api.openai.com/v1"),
            Self::Anthropic => Some("https://api.anthropic.com/v1"),
            Self::Scripted => None,
        }
    }
}

/// One model endpoint (`[models.NAME]`).
///
/// ```
/// use turnstile_config::{Config, Provider};
///
/// let config = Config::from_toml_str(
///     "[models.local]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:8080/v1\"\nmodel = \"SmolLM2\"\n",
/// )
/// .unwrap();
/// let local = &config.models["local"];
/// assert_eq!(local.provider, Provider::OpenAi);
/// assert_eq!(local.max_tokens, 1024);
/// assert_eq!(local.resolve_api_key(|_| None).unwrap(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "ModelTable")]
pub struct ModelConfig {
    /// The table's name (`NAME` of `[models.NAME]`); set by the parser, not written in the file.
    #[serde(skip)]
    pub name: String,
    /// The API it speaks. Default `openai`.
    pub provider: Provider,
    /// The endpoint; the worker appends `/chat/completions` (openai) or `/messages` (anthropic).
    /// Default: [`Provider::default_base_url`]. Not allowed for `scripted`.
    pub base_url: Option<HttpUrl>,
    /// The model's name at the provider. Required for `openai` and `anthropic`.
    pub model: String,
    /// The *name* of the environment variable that holds the API key (never the key). Default: none,
    /// for servers that need no key.
    pub api_key_env: Option<String>,
    /// Output token limit of one request. Default 1024.
    pub max_tokens: u32,
    /// Limit on one whole request, in ms. Default 120,000.
    pub timeout_ms: u64,
    /// Limit on waiting for the first byte of the answer, in ms. Default 30,000, or `timeout_ms` when
    /// that is lower (a default follows the value the user wrote, never conflicts with it).
    pub first_byte_timeout_ms: u64,
    /// Limit on a pause of the answer's stream, in ms. Default 30,000, or `timeout_ms` when that is lower.
    pub idle_timeout_ms: u64,
    /// Retries of a request that failed before its first byte (connection failure, 429, 5xx). Default 3.
    pub retries: u32,
    /// Models tried in order when a request to this one fails `model_unavailable`, `model_rate_limited` or
    /// `model_timeout` before its first byte, after its own retries (SPEC §17). Default none.
    pub fallback: Vec<String>,
    /// Mark the system prompt, the tools and the end of the history with Anthropic `cache_control`
    /// (ephemeral), so a long history is read from the prompt cache. Anthropic models only. Default false.
    pub prompt_cache: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            provider: Provider::OpenAi,
            base_url: None,
            model: String::new(),
            api_key_env: None,
            max_tokens: 1024,
            timeout_ms: 120_000,
            first_byte_timeout_ms: STREAM_TIMEOUT_DEFAULT_MS,
            idle_timeout_ms: STREAM_TIMEOUT_DEFAULT_MS,
            retries: 3,
            fallback: Vec::new(),
            prompt_cache: false,
        }
    }
}

/// The two stream timeouts when the table does not set them: 30 s, but never above the whole request's
/// limit, so that `timeout_ms = 20000` alone is accepted (only values the user wrote can be refused).
const STREAM_TIMEOUT_DEFAULT_MS: u64 = 30_000;

/// `[models.NAME]` as written: the derived defaults need to know which keys are absent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelTable {
    #[serde(default)]
    provider: Option<Provider>,
    #[serde(default)]
    base_url: Option<HttpUrl>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    first_byte_timeout_ms: Option<u64>,
    #[serde(default)]
    idle_timeout_ms: Option<u64>,
    #[serde(default)]
    retries: Option<u32>,
    #[serde(default)]
    fallback: Vec<String>,
    #[serde(default)]
    prompt_cache: bool,
}

impl From<ModelTable> for ModelConfig {
    fn from(table: ModelTable) -> Self {
        let defaults = Self::default();
        let timeout_ms = table.timeout_ms.unwrap_or(defaults.timeout_ms);
        let stream_default = STREAM_TIMEOUT_DEFAULT_MS.min(timeout_ms);
        Self {
            name: String::new(),
            provider: table.provider.unwrap_or(defaults.provider),
            base_url: table.base_url,
            model: table.model.unwrap_or_default(),
            api_key_env: table.api_key_env,
            max_tokens: table.max_tokens.unwrap_or(defaults.max_tokens),
            timeout_ms,
            first_byte_timeout_ms: table.first_byte_timeout_ms.unwrap_or(stream_default),
            idle_timeout_ms: table.idle_timeout_ms.unwrap_or(stream_default),
            retries: table.retries.unwrap_or(defaults.retries),
            fallback: table.fallback,
            prompt_cache: table.prompt_cache,
        }
    }
}

impl ModelConfig {
    /// The built-in model `scripted` (provider `scripted`).
    pub fn scripted() -> Self {
        Self { name: SCRIPTED.to_owned(), provider: Provider::Scripted, model: SCRIPTED.to_owned(), ..Self::default() }
    }

    /// The endpoint: `base_url`, else the provider's default (`None` for `scripted`).
    pub fn endpoint(&self) -> Option<HttpUrl> {
        self.base_url.clone().or_else(|| self.provider.default_base_url().and_then(|u| u.parse().ok()))
    }

    /// `timeout_ms` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// `first_byte_timeout_ms` as a duration.
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }

    /// `idle_timeout_ms` as a duration.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    /// The API key, read through `env` (pass `|v| std::env::var(v).ok()` in a server) from the variable
    /// `api_key_env` names: `None` when the model names no variable; an error naming the key and the
    /// variable (never the value) when the variable is unset or blank.
    ///
    /// ```
    /// use turnstile_config::Config;
    ///
    /// let config = Config::from_toml_str(
    ///     "[models.gpt]\nmodel = \"gpt-4o-mini\"\napi_key_env = \"OPENAI_API_KEY\"\n",
    /// )
    /// .unwrap();
    /// let gpt = &config.models["gpt"];
    /// let key = gpt.resolve_api_key(|v| (v == "OPENAI_API_KEY").then(|| "sk-1".to_owned())).unwrap();
    /// assert_eq!(key.unwrap().expose(), "sk-1");
    /// assert_eq!(
    ///     gpt.resolve_api_key(|_| None).unwrap_err().to_string(),
    ///     "models.gpt.api_key_env: environment variable OPENAI_API_KEY is not set; \
    ///      set it to the API key of model \"gpt\", or remove this key"
    /// );
    /// ```
    pub fn resolve_api_key(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<Secret>, ConfigError> {
        let Some(variable) = &self.api_key_env else { return Ok(None) };
        let key = KeyPath::root().key("models").key(&self.name).key("api_key_env").to_string();
        from_env(&key, variable, &format!("the API key of model {:?}", self.name), env).map(Some)
    }

    /// `fallback` names other models, each once, none of them itself.
    pub(crate) fn check_fallback(
        &self,
        path: &KeyPath,
        models: &std::collections::BTreeMap<String, ModelConfig>,
    ) -> Result<(), Invalid> {
        let key = path.key("fallback");
        if self.provider == Provider::Scripted && !self.fallback.is_empty() {
            return Err(key.invalid("the scripted model never fails over to another; remove the key"));
        }
        for (i, name) in self.fallback.iter().enumerate() {
            if *name == self.name {
                return Err(key.invalid(format!("names the model itself ({name:?}); list other models")));
            }
            if !models.contains_key(name) {
                return Err(
                    key.invalid(format!("no model named {name:?} (known: {})", crate::names::known(models.keys())))
                );
            }
            if models.get(name).is_some_and(|m| m.provider == Provider::Scripted) {
                return Err(key.invalid(format!(
                    "{name:?} is a scripted model, which cannot stand in for an HTTP one; list openai or anthropic models"
                )));
            }
            if self.fallback[..i].contains(name) {
                return Err(key.invalid(format!("lists {name:?} twice; each model is tried once")));
            }
        }
        Ok(())
    }

    pub(crate) fn check(&self, path: &KeyPath) -> Result<(), Invalid> {
        let scripted = self.provider == Provider::Scripted;
        if self.prompt_cache && self.provider != Provider::Anthropic {
            return Err(path.key("prompt_cache").invalid(format!(
                "is for anthropic models (this one is {}): OpenAI-compatible servers cache prompts by themselves; \
                 remove the key",
                self.provider
            )));
        }
        if scripted && self.base_url.is_some() {
            return Err(path.key("base_url").invalid("the scripted provider has no endpoint; remove base_url"));
        }
        if scripted && self.api_key_env.is_some() {
            return Err(path.key("api_key_env").invalid("the scripted provider needs no key; remove api_key_env"));
        }
        if !scripted && self.model.trim().is_empty() {
            return Err(path.key("model").invalid(format!(
                "missing; name the model at the provider, e.g. model = \"{}\"",
                if self.provider == Provider::Anthropic { "claude-sonnet-4-5" } else { "gpt-4o-mini" }
            )));
        }
        if let Some(variable) = &self.api_key_env
            && !is_env_var(variable)
        {
            // Never echo the value: it may be the key itself, written in the wrong place.
            return Err(path
                .key("api_key_env")
                .invalid(format!("must be {ENV_VAR_RULE}; put the key in that variable and name the variable here")));
        }
        positive(path, "max_tokens", u64::from(self.max_tokens), "0 would allow no answer")?;
        for (key, value) in [
            ("timeout_ms", self.timeout_ms),
            ("first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ] {
            positive(path, key, value, "a timeout of 0 would fail every request")?;
        }
        for (key, value) in
            [("first_byte_timeout_ms", self.first_byte_timeout_ms), ("idle_timeout_ms", self.idle_timeout_ms)]
        {
            if value > self.timeout_ms {
                return Err(path.key(key).invalid(format!(
                    "{value} is above timeout_ms ({}), so it could never fire; lower it or raise timeout_ms",
                    self.timeout_ms
                )));
            }
        }
        Ok(())
    }
}
