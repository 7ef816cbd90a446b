//! Running any version of any agent (SPEC §20, decision 0122): what answers a step whose agent version is
//! not the one the file built at start (an agent put through the API, an older or newer version of a file
//! agent).
//!
//! Each request carries the content hash of the version its turn runs (`agent_hash`). A version whose hash
//! is the file agent's own runs on what [`crate::setup`] built for it, exactly as before; any other is
//! built on first use from its checked definition ([`Directory::definition`]) with the very pieces the file
//! agents are built from — the configuration's models (built on demand, keys read from the environment),
//! the tools the worker registered, the remote hooks — and kept by hash. [`VersionedModel`],
//! [`VersionedTools`] and [`VersionedHooks`] put this in front of the file's model, tools and hooks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use turnstile_config::{AgentConfig, Config, ToolId, ToolRef};
use turnstile_driver::ModelOutput;
use turnstile_model::UserMessage;
use turnstile_model::overrides::SessionOverrides;
use turnstile_worker::agent::{
    HookError, HookVerdict, Model, ModelError, ModelIdentity, ModelStep, PreStepHook, Proposal, ToolReturn, ToolRun,
    Tools,
};

use crate::built::{BuiltModel, built_model, waterfall};
use crate::directory::Directory;
use crate::hooks::run_waterfall;
use crate::llm::chat::{ChatProvider, ToolSpec};
use crate::tools::ToolRegistry;
use crate::tools::mcp::tool_name;
use crate::tools::registry::{listed, not_offered};

/// One version, built.
pub struct BuiltVersion {
    /// Its checked definition.
    pub config: AgentConfig,
    model: Arc<dyn Model>,
    compaction: Option<Arc<dyn Model>>,
    waterfall: Vec<Arc<dyn PreStepHook>>,
}

/// Builds and keeps the versions that are not the file's.
pub struct Versions {
    config: Arc<Config>,
    /// Each file agent's definition hash: those versions run on the file's build.
    file_hashes: HashMap<String, String>,
    /// The configuration's models built so far (those the file's agents use, then others on demand).
    models: Mutex<BTreeMap<String, BuiltModel>>,
    tools: ToolRegistry,
    directory: OnceLock<Arc<Directory>>,
    built: Mutex<HashMap<String, Arc<BuiltVersion>>>,
}

impl std::fmt::Debug for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let built: Vec<String> = turnstile_model::sync::lock(&self.built).keys().cloned().collect();
        f.debug_struct("Versions").field("built", &built).finish_non_exhaustive()
    }
}

impl Versions {
    pub(crate) fn new(config: Arc<Config>, models: BTreeMap<String, BuiltModel>, tools: ToolRegistry) -> Self {
        let file_hashes = config
            .agents
            .iter()
            .map(|(name, a)| (name.clone(), turnstile_journal::agents::definition_hash(&a.definition)))
            .collect();
        Self {
            config,
            file_hashes,
            models: Mutex::new(models),
            tools,
            directory: OnceLock::new(),
            built: Mutex::default(),
        }
    }

    /// Definitions are looked up in `directory` from now on (the first one set stays).
    pub fn attach(&self, directory: Arc<Directory>) {
        let _ = self.directory.set(directory);
    }

    /// The build of version `hash` of `agent`; `Ok(None)` when the file's build serves it (no hash, or the
    /// file agent's own).
    pub fn version(&self, agent: &str, hash: &str) -> Result<Option<Arc<BuiltVersion>>, String> {
        if hash.is_empty() || self.file_hashes.get(agent).is_some_and(|h| h == hash) {
            return Ok(None);
        }
        if let Some(built) = turnstile_model::sync::lock(&self.built).get(hash) {
            return Ok(Some(built.clone()));
        }
        let built = Arc::new(self.build(agent, self.definition_of(agent, hash)?)?);
        turnstile_model::sync::lock(&self.built).insert(hash.to_owned(), built.clone());
        Ok(Some(built))
    }

    /// The definition of version `hash` of `agent`: the file agent's own for its hash (or no hash), else the
    /// stored one.
    fn definition_of(&self, agent: &str, hash: &str) -> Result<AgentConfig, String> {
        if hash.is_empty() || self.file_hashes.get(agent).is_some_and(|h| h == hash) {
            return self.config.agents.get(agent).cloned().ok_or_else(|| format!("agent {agent:?} is not in the file"));
        }
        self.directory
            .get()
            .and_then(|d| d.definition(hash))
            .ok_or_else(|| format!("agent {agent:?}: version {hash} is not known to this worker"))
    }

    /// The build of version `hash` of `agent` as a session with `overrides` runs it (SPEC §20): another
    /// model of the agent's list, a subset of its tools. Built on first use and kept, like any version.
    pub fn overridden(
        &self,
        agent: &str,
        hash: &str,
        overrides: &SessionOverrides,
    ) -> Result<Arc<BuiltVersion>, String> {
        let key = format!("{agent}@{hash}|model={:?}|tools={:?}", overrides.model, overrides.tools);
        if let Some(built) = turnstile_model::sync::lock(&self.built).get(&key) {
            return Ok(built.clone());
        }
        let config = self.definition_of(agent, hash)?.overridden(overrides);
        let built = Arc::new(self.build(agent, config)?);
        turnstile_model::sync::lock(&self.built).insert(key, built.clone());
        Ok(built)
    }

    /// Whether a turn whose session narrowed the tools to `subset` offers the tool of `call_name`.
    fn subset_offers(&self, agent: &str, hash: &str, subset: &[String], call_name: &str) -> Result<bool, String> {
        let tools = SessionOverrides { tools: Some(subset.to_vec()), ..SessionOverrides::default() };
        Ok(self.definition_of(agent, hash)?.overridden(&tools).offers(ToolId::from_call_name(call_name)))
    }

    fn model(&self, agent: &str, name: &str) -> Result<BuiltModel, String> {
        let mut models = turnstile_model::sync::lock(&self.models);
        if let Some(model) = models.get(name) {
            return Ok(model.clone());
        }
        let config = self.config.models.get(name).ok_or_else(|| format!("agent {agent:?}: no model named {name:?}"))?;
        let built = built_model(name, config, &[agent], &|v: &str| std::env::var(v).ok()).map_err(|e| e.to_string())?;
        models.insert(name.to_owned(), built.clone());
        Ok(built)
    }

    /// The model's description of each tool `agent` lists that this worker has, and its client tools.
    fn tool_specs(&self, agent: &AgentConfig) -> (Vec<ToolSpec>, Vec<String>) {
        let mut specs: Vec<ToolSpec> = Vec::new();
        let mut clients = Vec::new();
        for tool in &agent.tools {
            let names: Vec<String> = match tool {
                ToolRef::Client(name) => {
                    clients.push(name.clone());
                    continue;
                }
                ToolRef::Builtin(builtin) => vec![builtin.as_str().to_owned()],
                ToolRef::Mcp { server, tool: Some(tool) } => vec![tool_name(server, tool)],
                ToolRef::Mcp { server, tool: None } => {
                    let prefix = tool_name(server, "");
                    self.tools.names().filter(|n| n.starts_with(&prefix)).map(str::to_owned).collect()
                }
            };
            for name in names {
                match self.tools.spec(&name) {
                    Some(spec) if !specs.iter().any(|s| s.name == spec.name) => specs.push(spec),
                    Some(_) => {}
                    // MCP servers are started for the file's agents; one no file agent uses is not running.
                    None => {
                        tracing::warn!(agent = %agent.name, tool = %name, "the tool is not running on this worker; it is not offered")
                    }
                }
            }
        }
        (specs, clients)
    }

    fn build(&self, agent: &str, config: AgentConfig) -> Result<BuiltVersion, String> {
        let fallback = |model: &str| -> Vec<Arc<dyn ChatProvider>> {
            let Some(m) = self.config.models.get(model) else { return Vec::new() };
            m.fallback
                .iter()
                .filter_map(|f| match self.model(agent, f) {
                    Ok(BuiltModel::Chat(provider)) => Some(provider),
                    _ => None,
                })
                .collect()
        };
        let (specs, clients) = self.tool_specs(&config);
        let slot = self.tools.client_slot();
        let model = self.model(agent, &config.model)?.for_agent(specs, clients, slot.clone(), fallback(&config.model));
        let compaction = match &config.compaction_model {
            Some(name) => Some(self.model(agent, name)?.for_agent(Vec::new(), Vec::new(), slot, fallback(name))),
            None => None,
        };
        let waterfall = waterfall(agent, &config).map_err(|e| e.to_string())?;
        Ok(BuiltVersion { config, model, compaction, waterfall })
    }
}

/// The file's model for its own versions, a version's own build for any other.
pub struct VersionedModel {
    pub base: Arc<dyn Model>,
    pub versions: Arc<Versions>,
}

#[async_trait]
impl Model for VersionedModel {
    fn identity(&self, agent: &str) -> ModelIdentity {
        self.base.identity(agent)
    }

    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
        let request = &step.request;
        let (agent, hash, overrides) = (&request.agent, &request.agent_hash, &request.overrides);
        let built = if overrides.model.is_some() || overrides.tools.is_some() {
            self.versions.overridden(agent, hash, overrides).map(Some)
        } else {
            self.versions.version(agent, hash)
        };
        match built {
            Ok(None) => self.base.step(step).await,
            Ok(Some(built)) => {
                let model = match (&request.compaction, &built.compaction) {
                    (Some(_), Some(compaction)) => compaction.clone(),
                    _ => built.model.clone(),
                };
                model.step(step).await
            }
            Err(message) => Err(ModelError::Failed { message, code: "model_unavailable".into() }),
        }
    }
}

/// The file's tool policy for its own versions; a version's own tool list and deadlines for any other.
pub struct VersionedTools {
    pub base: ToolRegistry,
    pub versions: Arc<Versions>,
}

#[async_trait]
impl Tools for VersionedTools {
    async fn call(&self, run: ToolRun<'_>) -> ToolReturn {
        let (request, call) = (run.request, &run.request.call);
        if let Some(subset) = &request.tools {
            match self.versions.subset_offers(&request.agent, &request.agent_hash, subset, &call.name) {
                Ok(true) => {}
                Ok(false) => {
                    let listed = listed(subset.iter().cloned());
                    return ToolReturn::failed(format!(
                        "tool {} is not available to this session (its tools: {listed}); call one of those",
                        call.name
                    ));
                }
                Err(message) => return ToolReturn::failed(message),
            }
        }
        match self.versions.version(&request.agent, &request.agent_hash) {
            Ok(None) => Tools::call(&self.base, run).await,
            Ok(Some(built)) => {
                let id = ToolId::from_call_name(&call.name);
                if !built.config.offers(id) {
                    return not_offered(&call.name, &request.agent, &built.config.tools);
                }
                let deadline = self.versions.config.tool_deadline(&built.config, id);
                let memory = built.config.memory.as_ref().map(|m| m.namespaces.clone()).unwrap_or_default();
                self.base.run_within(run, memory, deadline).await
            }
            Err(message) => ToolReturn::failed(message),
        }
    }
}

/// The file's waterfalls for its own versions; a version's own content guard, step budget and remote
/// hooks for any other.
pub struct VersionedHooks {
    pub base: Arc<dyn PreStepHook>,
    pub versions: Arc<Versions>,
}

#[async_trait]
impl PreStepHook for VersionedHooks {
    fn name(&self) -> &str {
        "waterfall"
    }

    async fn decide(&self, proposal: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        match self.versions.version(&proposal.request.agent, &proposal.request.agent_hash) {
            Ok(None) => self.base.decide(proposal, batch).await,
            Ok(Some(built)) => run_waterfall(&built.waterfall, proposal, batch).await,
            Err(message) => Err(HookError { hook: "agent version".into(), message }),
        }
    }
}
