//! `[agents.NAME.overrides]`: what a session may override of the agent with `ConfigureSession` (SPEC §20,
//! decision 0171).
//!
//! ```
//! use turnstile_config::Config;
//!
//! let config = Config::from_toml_str(
//!     "[models.large]\nprovider = \"scripted\"\n\
//!      [agents.helper]\ntools = [\"clock\", \"echo\"]\n\
//!      [agents.helper.overrides]\nsystem_prompt = true\nmodels = [\"large\"]\ntools = true\n",
//! )
//! .unwrap();
//! let policy = config.agents["helper"].override_policy();
//! assert!(policy.system_prompt && policy.tools);
//! assert_eq!(policy.models, ["large"]);
//!
//! let err = Config::from_toml_str("[agents.helper.overrides]\nmodels = [\"huge\"]\n").unwrap_err();
//! assert!(err.to_string().contains("agents.helper.overrides.models[0]: no model named \"huge\""));
//! ```

use serde::Deserialize;
use turnstile_model::overrides::OverridePolicy;

use crate::path::{Invalid, KeyPath};

/// `[agents.NAME.overrides]`. Every key defaults to allowing nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OverridesConfig {
    /// A session may add a system prompt after the agent's. Default false.
    pub system_prompt: bool,
    /// The models (`[models.NAME]`) a session may run instead of the agent's `model`. Default none.
    pub models: Vec<String>,
    /// A session may narrow the agent's tools to a subset of them. Default false.
    pub tools: bool,
}

impl OverridesConfig {
    /// The policy the driver checks `ConfigureSession` against.
    pub fn policy(&self) -> OverridePolicy {
        OverridePolicy { system_prompt: self.system_prompt, models: self.models.clone(), tools: self.tools }
    }

    /// Each model is one of the configuration's, listed once.
    pub(crate) fn check(&self, path: &KeyPath, known: &dyn Fn(&str) -> bool, names: &str) -> Result<(), Invalid> {
        let models = path.key("models");
        for (i, model) in self.models.iter().enumerate() {
            if !known(model) {
                return Err(models.index(i).invalid(format!("no model named {model:?} (known: {names})")));
            }
            if let Some(first) = self.models[..i].iter().position(|m| m == model) {
                return Err(models.index(i).invalid(format!("{model:?} is already listed (models[{first}])")));
            }
        }
        Ok(())
    }
}
