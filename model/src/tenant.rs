//! Tenants (SPEC §1): the owner of sessions, quotas, budgets and credentials, and the sets of tenants an
//! agent or a webhook serves.
//!
//! A [`Tenant`] is checked when it is built, so holding one proves the name is valid: code that takes a
//! `Tenant` never checks it again, and code that has only a string must build one first (the gateway does
//! so once per call, from the caller's credentials or the request).
//!
//! ```
//! use turnstile_model::tenant::{Tenant, TenantScope};
//! let acme = Tenant::new("acme").unwrap();
//! assert_eq!(acme.as_str(), "acme");
//! assert!(Tenant::new("a/b").is_err());
//! let only_acme = TenantScope::only([acme.clone()]);
//! assert!(only_acme.allows("acme") && !only_acme.allows("globex"));
//! assert!(TenantScope::All.allows("globex"));
//! ```

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A valid tenant name: `[A-Za-z0-9_-]{1,128}`, the same rule as a session id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Tenant(
    /// Checked by [`Tenant::new`] (crate::rules), the one way to make a `Tenant`.
    pub(crate) String,
);

impl Tenant {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Tenant {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Tenant {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Tenant {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for Tenant {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl From<Tenant> for String {
    fn from(tenant: Tenant) -> Self {
        tenant.0
    }
}

/// The tenants something serves: an agent profile's `tenants`, a webhook's (decision 0091).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum TenantScope {
    /// Every tenant (a profile or webhook without a `tenants` list).
    #[default]
    All,
    /// Only these.
    Only(BTreeSet<Tenant>),
}

impl TenantScope {
    /// Only `tenants`.
    pub fn only(tenants: impl IntoIterator<Item = Tenant>) -> Self {
        Self::Only(tenants.into_iter().collect())
    }

    /// Whether `tenant` is served.
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(tenants) => tenants.contains(tenant),
        }
    }

    /// The tenants both serve.
    pub fn intersect(&self, other: &Self) -> Self {
        match (self, other) {
            (Self::All, scope) | (scope, Self::All) => scope.clone(),
            (Self::Only(a), Self::Only(b)) => Self::Only(a.intersection(b).cloned().collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ValueError;

    #[test]
    fn a_tenant_is_checked_once_when_built() {
        assert!(matches!(Tenant::new(""), Err(ValueError::NameLength { .. })));
        assert!(matches!(Tenant::new("x".repeat(129)), Err(ValueError::NameLength { .. })));
        assert!(matches!(Tenant::new("a b"), Err(ValueError::NameChar { c: ' ', .. })));
        assert_eq!(Tenant::new("team-1_a").unwrap().to_string(), "team-1_a");
        let from_json: Result<Tenant, _> = serde_json::from_str("\"a,b\"");
        assert!(from_json.is_err(), "deserializing checks the name too");
    }

    #[test]
    fn scopes_allow_and_intersect() {
        let t = |n: &str| Tenant::new(n).unwrap();
        let ab = TenantScope::only([t("a"), t("b")]);
        let bc = TenantScope::only([t("b"), t("c")]);
        assert_eq!(ab.intersect(&bc), TenantScope::only([t("b")]));
        assert_eq!(TenantScope::All.intersect(&ab), ab);
        assert!(!TenantScope::only([]).allows("a"));
    }
}
