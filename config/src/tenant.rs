//! `[tenants.NAME]`: what one tenant may spend and how fast it may call (SPEC §17).

use serde::Deserialize;

use crate::path::{Invalid, KeyPath, positive};

/// One tenant's budget and quotas (`[tenants.NAME]`). Every key is optional: a tenant without a table, or
/// a key left out, gets the `[limits]` quota (`tenant_requests_per_minute`, `tenant_request_burst`,
/// `tenant_max_watches`) and no token budget.
///
/// ```
/// use turnstile_config::Config;
///
/// let config = Config::from_toml_str(
///     "[tenants.acme]\ntoken_budget = 1000000\nrequests_per_s = 20\nwatch_limit = 50\n",
/// )
/// .unwrap();
/// let acme = &config.tenants["acme"];
/// assert_eq!(acme.token_budget, Some(1_000_000));
/// assert_eq!(acme.request_burst(), Some(20));
/// assert!(config.tenants.get("other").is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// The table's name; set by the parser.
    #[serde(skip)]
    pub name: String,
    /// Model tokens (input + output, all models) the tenant may use per UTC day; a model request is not
    /// sent once the day's usage reached it. `None`: no budget.
    pub token_budget: Option<u64>,
    /// Requests per second the tenant may make, across all gateways of the cluster; replaces
    /// `[limits] tenant_requests_per_minute` for this tenant.
    pub requests_per_s: Option<u32>,
    /// Requests the tenant may make at once after being idle; default `requests_per_s` (one second's worth).
    pub request_burst: Option<u32>,
    /// Watch streams the tenant may hold open, across all gateways; replaces `[limits] tenant_max_watches`.
    pub watch_limit: Option<usize>,
}

impl TenantConfig {
    /// The burst that goes with `requests_per_s`: `request_burst`, else `requests_per_s`.
    pub fn request_burst(&self) -> Option<u32> {
        self.request_burst.or(self.requests_per_s)
    }

    pub(crate) fn check(&self, path: &KeyPath) -> Result<(), Invalid> {
        if let Some(budget) = self.token_budget {
            positive(
                path,
                "token_budget",
                budget,
                "a budget of 0 would refuse every model request; remove the key for none",
            )?;
        }
        if let Some(rate) = self.requests_per_s {
            positive(
                path,
                "requests_per_s",
                u64::from(rate),
                "0 would refuse every request; remove the key for no limit",
            )?;
        }
        if let Some(burst) = self.request_burst {
            positive(path, "request_burst", u64::from(burst), "0 would refuse every request")?;
            if self.requests_per_s.is_none() {
                return Err(path.key("request_burst").invalid("needs requests_per_s, the rate it bursts above"));
            }
        }
        if let Some(watches) = self.watch_limit {
            positive(path, "watch_limit", watches as u64, "0 would refuse every Watch; remove the key for no limit")?;
        }
        Ok(())
    }
}

/// A tenant as sessions name it: the model's one rule ([`turnstile_model::Tenant`]).
pub(crate) fn is_tenant(s: &str) -> bool {
    turnstile_model::Tenant::validate(s).is_ok()
}

/// The rule [`is_tenant`] checks, for messages.
pub(crate) const TENANT_RULE: &str = "1 to 128 letters, digits, '_' or '-', as in a session's tenant";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::Config;
    use crate::error::tests::load_error;

    #[test]
    fn bad_tenant_tables_name_the_key_and_what_to_do() {
        assert!(
            load_error("[tenants.acme]\ntoken_budget = 0\n").contains("tenants.acme.token_budget: must be at least 1")
        );
        assert!(load_error("[tenants.acme]\nrequest_burst = 5\n").contains("needs requests_per_s"));
        assert!(
            load_error("[tenants.\"a.b\"]\ntoken_budget = 5\n").contains("not a valid name (allowed: 1 to 128 letters")
        );
        assert!(load_error("[tenants.acme]\nbudget = 5\n").contains("tenants.acme.budget: unknown key"));
    }

    #[test]
    fn fallback_names_other_known_models_once() {
        let base = "[models.a]\nmodel = \"m\"\n[models.b]\nmodel = \"n\"\n";
        assert!(
            load_error(&format!("{base}[models.c]\nmodel = \"o\"\nfallback = [\"zz\"]\n"))
                .contains("models.c.fallback: no model named \"zz\"")
        );
        assert!(
            load_error(&format!("{base}[models.c]\nmodel = \"o\"\nfallback = [\"c\"]\n"))
                .contains("names the model itself")
        );
        assert!(load_error(&format!("{base}[models.c]\nmodel = \"o\"\nfallback = [\"a\", \"a\"]\n")).contains("twice"));
        let config = Config::from_toml_str(&format!(
            "{base}[models.c]\nmodel = \"o\"\nfallback = [\"a\", \"b\"]\n[agents.x]\nmodel = \"c\"\n"
        ))
        .unwrap();
        assert_eq!(config.models["c"].fallback, ["a", "b"]);
        // The fallbacks are used by the agent, so their keys are needed (decision 0045).
        assert_eq!(config.agents_using_model("b"), ["x"]);
    }

    #[test]
    fn prompt_cache_is_for_anthropic_models() {
        assert!(
            load_error("[models.a]\nmodel = \"m\"\nprompt_cache = true\n")
                .contains("models.a.prompt_cache: is for anthropic")
        );
        let config =
            Config::from_toml_str("[models.a]\nprovider = \"anthropic\"\nmodel = \"m\"\nprompt_cache = true\n")
                .unwrap();
        assert!(config.models["a"].prompt_cache);
    }
}
