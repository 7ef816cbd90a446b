//! [`Directory`]: the agents of the store made into the drivers' catalog (SPEC §20, decision 0120).
//!
//! At start the configuration file's agents are imported as versions of file agents (an unchanged agent
//! writes nothing; one the file no longer has is deleted, its versions kept for the sessions pinned to
//! them). Then every record of the store — the file's and every tenant's — is read into one
//! [`AgentCatalog`], each version checked again by the configuration's own code; the catalog is built anew
//! whenever the store changes (on any node) and handed to the runners through [`Catalogs`].

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;
use turnstile_config::{AgentConfig, Config, DefinitionFormat, VersionPolicy};
use turnstile_driver::{AgentCatalog, AgentOwner as CatalogOwner, AgentProfile};
use turnstile_journal::JournalError;
use turnstile_journal::agents::{self, AgentOwner, AgentStore};
use turnstile_model::{Tenant, TenantScope};
use turnstile_worker::agent::{CatalogRefresh, Catalogs};

/// Turns one checked agent definition into what the driver knows of it.
pub type ProfileOf = dyn Fn(&AgentConfig) -> AgentProfile + Send + Sync;

/// The store's agents as a catalog that follows the store.
pub struct Directory {
    config: Arc<Config>,
    store: Arc<dyn AgentStore>,
    profile_of: Box<ProfileOf>,
    catalog: watch::Sender<AgentCatalog>,
    /// Every version's definition by content hash, checked (what models, tools and hooks of a version are
    /// built from).
    definitions: std::sync::RwLock<HashMap<String, AgentConfig>>,
    /// One reload at a time; a reload that waited finds the catalog already fresh.
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory").field("catalog", &*self.catalog.borrow()).finish_non_exhaustive()
    }
}

impl Directory {
    /// Imports the file's agents into `store`, reads every agent of it into a catalog and follows the store.
    pub async fn start(
        config: Arc<Config>,
        store: Arc<dyn AgentStore>,
        profile_of: Box<ProfileOf>,
    ) -> Result<Arc<Self>, JournalError> {
        import_file(&config, store.as_ref()).await?;
        let directory = Arc::new(Self {
            catalog: watch::channel(AgentCatalog::default()).0,
            definitions: std::sync::RwLock::default(),
            reloading: tokio::sync::Mutex::new(()),
            config,
            store,
            profile_of,
        });
        directory.reload().await?;
        let mut changes = directory.store.changes();
        let weak = Arc::downgrade(&directory);
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(directory) = weak.upgrade() else { return };
                if let Err(e) = directory.reload().await {
                    tracing::warn!(error = %e, "cannot read the agents after a change; keeping the last catalog");
                }
            }
        });
        Ok(directory)
    }

    /// The catalogs the worker's runners follow.
    pub fn catalogs(self: &Arc<Self>) -> Catalogs {
        Catalogs::new(self.catalog.subscribe(), self.clone())
    }

    /// The checked definition of the version whose content hash is `hash`.
    pub fn definition(&self, hash: &str) -> Option<AgentConfig> {
        turnstile_model::sync::read(&self.definitions).get(hash).cloned()
    }

    /// Reads every agent of the store into a new catalog.
    async fn reload(&self) -> Result<(), JournalError> {
        let _one = self.reloading.lock().await;
        let records = self.store.list().await?;
        let mut catalog = AgentCatalog::with_default(self.config.default_agent.clone());
        let mut definitions = HashMap::new();
        for record in records {
            let owner = match &record.owner {
                AgentOwner::File => CatalogOwner::Shared,
                AgentOwner::Tenant(t) => CatalogOwner::Tenant(t.clone()),
            };
            for version in &record.versions {
                let checked = match record.owner {
                    AgentOwner::File => self.config.file_agent_definition(&record.name, &version.definition),
                    AgentOwner::Tenant(_) => {
                        self.config.agent_definition(&record.name, DefinitionFormat::Json, &version.definition)
                    }
                };
                let agent = match checked {
                    Ok(agent) => agent,
                    Err(e) => {
                        // A model or MCP server this configuration does not have: the version cannot run here.
                        tracing::warn!(agent = %record.name, version = version.version, error = %e,
                                "an agent version does not check against this configuration; it is not offered");
                        continue;
                    }
                };
                let mut profile = (self.profile_of)(&agent);
                profile.version = version.version;
                profile.hash.clone_from(&version.hash);
                profile.pin = agent.version_policy == VersionPolicy::Pin;
                profile.tenants = match &version.tenants {
                    Some(tenants) => TenantScope::only(tenants.iter().filter_map(|t| Tenant::new(t).ok())),
                    None => TenantScope::All,
                };
                definitions.insert(version.hash.clone(), agent);
                catalog.add_version(owner.clone(), &record.name, profile);
            }
            catalog.set_deleted(&owner, &record.name, record.deleted);
        }
        *turnstile_model::sync::write(&self.definitions) = definitions;
        self.catalog.send_replace(catalog);
        Ok(())
    }
}

#[async_trait::async_trait]
impl CatalogRefresh for Directory {
    async fn refresh(&self) {
        if let Err(e) = self.reload().await {
            tracing::warn!(error = %e, "cannot read the agents; keeping the last catalog");
        }
    }
}

/// Puts each agent of the file as a version of its file agent (nothing when unchanged) and deletes the
/// file agents the file no longer has.
async fn import_file(config: &Config, store: &dyn AgentStore) -> Result<(), JournalError> {
    let now = turnstile_ops::clock::now_ms();
    for (name, agent) in &config.agents {
        let tenants = agent.tenants.as_ref().map(|t| t.iter().map(|t| t.as_str().to_owned()).collect());
        agents::put(store, &AgentOwner::File, name, &agent.definition, tenants, now).await?;
    }
    for record in store.list().await? {
        if record.owner == AgentOwner::File && !record.deleted && !config.agents.contains_key(&record.name) {
            agents::delete(store, &AgentOwner::File, &record.name).await?;
        }
    }
    Ok(())
}
