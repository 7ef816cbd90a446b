//! The agent profiles a protocol offers, as each tenant sees them: an MCP tool per profile, an A2A agent
//! per profile. A profile confined to other tenants (decision 0091) does not exist for the caller.

use turnstile_model::TenantScope;

/// One `[agents.NAME]` as the protocols show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// The profile's `description`, else a sentence naming its model.
    pub description: String,
    /// The tenants whose sessions may run it.
    pub tenants: TenantScope,
}

/// Every profile of the configuration, and whether callers bring tokens.
#[derive(Clone, Debug, Default)]
pub struct Profiles {
    pub list: Vec<Profile>,
    /// Whether the gateway requires bearer tokens; without them only loopback callers are answered, as
    /// for the console (decision 0029).
    pub auth_enabled: bool,
}

impl Profiles {
    /// The profiles `tenant` may run, in the configuration's order.
    pub fn for_tenant<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Profile> + 'a {
        self.list.iter().filter(move |p| p.tenants.allows(tenant))
    }

    /// The profile `name`, if `tenant` may run it.
    pub fn get(&self, name: &str, tenant: &str) -> Option<&Profile> {
        self.list.iter().find(|p| p.name == name && p.tenants.allows(tenant))
    }

    /// The names `tenant` may run, for messages that list them.
    pub fn names_for(&self, tenant: &str) -> String {
        self.for_tenant(tenant).map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// The description of a profile without one.
pub fn default_description(name: &str, model: &str) -> String {
    format!("Runs a turn of the Turnstile agent `{name}` (model `{model}`) and answers with its reply.")
}
