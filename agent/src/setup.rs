//! The agents of a configuration, made runnable: [`from_config`] turns a [`turnstile_config::Config`] into
//! the driver's [`AgentCatalog`], one [`Model`] that serves every agent, and the [`ToolRegistry`].
//!
//! Each `[models.NAME]` becomes one model: `scripted` the [`ScriptedModel`], `openai` and `anthropic` one
//! HTTP provider ([`crate::llm::chat_model::connect`]) with the key read from the variable `api_key_env`
//! names. Each agent then gets a [`Model`] of its own over its model's provider, offering the model the JSON
//! Schemas of exactly the tools the agent lists ([`crate::llm::chat_model::ChatModel::with_tools`]).
//! [`AgentRouter`] picks the agent's model by `ModelRequest::agent` for every step.
//!
//! MCP tools (`mcp:SERVER/TOOL`, `mcp:SERVER/*`) need their servers running first: [`start_mcp`] starts
//! the servers the agents use and lists their tools, [`from_config_with_mcp`] then registers each tool as
//! `SERVER__TOOL`; [`setup`] does both (docs/decisions/0012-mcp-tools.md).
//!
//! ```
//! use turnstile_agent::setup::from_config;
//!
//! let setup = from_config(&turnstile_config::Config::default()).unwrap();
//! // With no agents configured, the default agent is the scripted model with every built-in tool.
//! assert_eq!(setup.catalog.default_agent(), "scripted");
//! let profile = setup.catalog.get("scripted").unwrap();
//! assert!(profile.tools.iter().any(|t| t == "clock"));
//! assert!(setup.tools.contains("clock"));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use turnstile_config::{Config, MAX_MODEL_TOOL_NAME, ToolId, ToolRef, is_model_tool_name};
use turnstile_driver::{AgentCatalog, AgentProfile, ApprovalTimeout, ToolRules};
use turnstile_worker::agent::{Agents, Model};

use crate::hooks::{AgentHooks, PreStepHook};
use crate::llm::chat::{ChatProvider, ToolSpec};
use crate::router::AgentRouter;
use crate::scripted::ScriptedModel;
use crate::tools::ToolRegistry;
use crate::tools::mcp::{McpError, McpServer, McpTool, McpToolDef, tool_name};

use crate::built::{BuiltModel, built_model, waterfall};
pub use crate::setup_error::AgentSetupError;

/// What a worker needs to run a configuration's agents. The node reaches the tools' slots through
/// [`AgentSetup::tools`] ([`ToolRegistry::set_client_tools`], [`ToolRegistry::set_child_sessions`]), then
/// hands the whole to the worker's host as its [`Agents`].
pub struct AgentSetup {
    /// Names, system prompts and history budgets of the agents, and the default one (for the driver).
    pub catalog: AgentCatalog,
    /// Serves every agent: an [`AgentRouter`] over the agents' models.
    pub model: Arc<dyn Model>,
    /// The tools the agents may call.
    pub tools: ToolRegistry,
    /// Each agent's pre-step waterfall: content guard, step budget, remote hooks (crate::hooks).
    pub hooks: AgentHooks,
    /// The agents' webhooks (SPEC §15) and the ones tenants register (SPEC §21):
    /// [`crate::webhooks::HttpWebhooks`].
    pub webhooks: Arc<dyn turnstile_worker::webhooks::WebhookSender>,
    /// Every other version of every agent (SPEC §20), built on first use once a directory is attached.
    pub versions: Arc<crate::versions::Versions>,
}

impl Default for AgentSetup {
    /// The scripted agent alone: the scripted model, the built-in tools with no policy, the content guard
    /// (what tests and benchmarks run on).
    fn default() -> Self {
        Self {
            catalog: AgentCatalog::default(),
            model: Arc::new(ScriptedModel::default()),
            tools: ToolRegistry::builtin(),
            hooks: AgentHooks::default(),
            webhooks: Arc::new(turnstile_worker::webhooks::NoWebhooks),
            versions: Arc::new(crate::versions::Versions::new(
                Arc::new(Config::default()),
                BTreeMap::new(),
                ToolRegistry::builtin(),
            )),
        }
    }
}

impl From<AgentSetup> for Agents {
    fn from(setup: AgentSetup) -> Self {
        let versions = setup.versions;
        Agents {
            catalog: turnstile_worker::agent::Catalogs::fixed(setup.catalog),
            model: Arc::new(crate::output::StructuredOutput::new(Arc::new(crate::versions::VersionedModel {
                base: setup.model,
                versions: versions.clone(),
            }))),
            tools: Arc::new(crate::versions::VersionedTools { base: setup.tools, versions: versions.clone() }),
            hooks: Arc::new(crate::versions::VersionedHooks { base: Arc::new(setup.hooks), versions }),
            webhooks: setup.webhooks,
        }
    }
}

impl std::fmt::Debug for AgentSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSetup")
            .field("catalog", &self.catalog)
            .field("tools", &self.tools)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

/// The agents of `config`, ready to run; API keys are read from the process environment. An agent with
/// MCP tools needs [`setup`] (or [`start_mcp`] and [`from_config_with_mcp`]).
pub fn from_config(config: &Config) -> Result<AgentSetup, AgentSetupError> {
    from_config_with_env(config, |variable| std::env::var(variable).ok())
}

/// [`from_config`] with the environment given as a function (tests pass their own).
pub fn from_config_with_env(
    config: &Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<AgentSetup, AgentSetupError> {
    from_config_with_mcp(config, env, &McpServers::default())
}

/// Starts the MCP servers the agents use ([`start_mcp`]), then builds the agents with their tools
/// ([`from_config_with_mcp`]); API keys and header values are read from the process environment.
pub async fn setup(config: &Config) -> Result<AgentSetup, AgentSetupError> {
    let env = |variable: &str| std::env::var(variable).ok();
    let mcp = start_mcp_with_env(config, env).await?;
    from_config_with_mcp(config, env, &mcp)
}

/// The running MCP servers of a configuration, by `[mcp.NAME]` name.
#[derive(Clone, Debug, Default)]
pub struct McpServers {
    servers: BTreeMap<String, Arc<McpServer>>,
}

impl McpServers {
    /// Server `name`, when it was started.
    pub fn get(&self, name: &str) -> Option<&Arc<McpServer>> {
        self.servers.get(name)
    }

    /// The started servers' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }
}

/// Starts, at once, every `[mcp.NAME]` server some agent lists a tool of (servers no agent uses are not
/// started) and waits until each has listed its tools; the first that fails to start within
/// [`crate::tools::mcp::START_TIMEOUT`] is the error (the others are stopped). Header values are read from
/// the process environment.
pub async fn start_mcp(config: &Config) -> Result<McpServers, AgentSetupError> {
    start_mcp_with_env(config, |variable| std::env::var(variable).ok()).await
}

/// [`start_mcp`] with the environment given as a function.
pub async fn start_mcp_with_env(
    config: &Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<McpServers, AgentSetupError> {
    let used: std::collections::BTreeSet<&str> =
        config.agents.values().flat_map(|a| a.tools.iter().filter_map(ToolRef::mcp_server)).collect();
    let mut starting = Vec::new();
    for name in used {
        // The config crate refuses an agent naming a server that is not configured.
        let Some(server) = config.mcp.get(name) else { continue };
        starting.push(McpServer::spawn(server, &env)?);
    }
    let ready =
        futures::future::join_all(starting.iter().map(|server| server.ready(crate::tools::mcp::START_TIMEOUT))).await;
    for (server, ready) in starting.iter().zip(ready) {
        ready.map_err(|message| McpError::Start { server: server.name().to_owned(), message })?;
    }
    Ok(McpServers { servers: starting.into_iter().map(|s| (s.name().to_owned(), s)).collect() })
}

/// [`from_config_with_env`] with the started MCP servers whose tools the agents list: each tool is
/// registered as `SERVER__TOOL`, its calls bounded by [`Config::tool_deadline`] (the longest, when agents
/// with different deadlines list the same tool).
pub fn from_config_with_mcp(
    config: &Config,
    env: impl Fn(&str) -> Option<String>,
    mcp: &McpServers,
) -> Result<AgentSetup, AgentSetupError> {
    let mut tools = ToolRegistry::builtin();
    let spawn = crate::tools::SpawnLimits {
        max_depth: config.limits.max_spawn_depth,
        max_children: config.limits.max_children,
    };
    tools.offer_agents(config.agents.keys().cloned().collect(), spawn);
    let mut mcp_tools: BTreeMap<String, (Arc<McpServer>, McpToolDef, Duration)> = BTreeMap::new();
    // Only the models some agent runs on are set up, so a model no agent uses needs no key (decision 0045).
    let models = config
        .models
        .iter()
        .filter_map(|(name, model)| {
            let agents = config.agents_using_model(name);
            (!agents.is_empty()).then(|| Ok((name.as_str(), built_model(name, model, &agents, &env)?)))
        })
        .collect::<Result<BTreeMap<&str, BuiltModel>, AgentSetupError>>()?;
    // Each HTTP model's fallback providers, in order (SPEC §17). The config crate checked that every name is
    // another HTTP model, and `agents_using_model` counts a fallback as used, so each one is built.
    let fallbacks: HashMap<&str, Vec<Arc<dyn ChatProvider>>> = models
        .keys()
        .map(|name| {
            let chain = config.models[*name]
                .fallback
                .iter()
                .filter_map(|f| match models.get(f.as_str()) {
                    Some(BuiltModel::Chat(provider)) => Some(provider.clone()),
                    _ => None,
                })
                .collect();
            (*name, chain)
        })
        .collect();
    let fallback_of = |model: &str| fallbacks.get(model).cloned().unwrap_or_default();
    let mut profiles = Vec::new();
    let mut routes: HashMap<String, Arc<dyn Model>> = HashMap::new();
    let mut compaction_routes: HashMap<String, Arc<dyn Model>> = HashMap::new();
    let mut waterfalls: HashMap<String, Vec<Arc<dyn PreStepHook>>> = HashMap::new();
    for (name, agent) in &config.agents {
        let Some(model) = models.get(agent.model.as_str()) else {
            return Err(AgentSetupError::UnknownModel {
                agent: name.clone(),
                model: agent.model.clone(),
                known: config.models.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let mut specs = Vec::new();
        let mut client_tools = Vec::new();
        for tool in &agent.tools {
            if let ToolRef::Client(client) = tool {
                client_tools.push(client.clone());
                continue;
            }
            let ToolRef::Mcp { server, tool: wanted } = tool else {
                specs.push(tool_spec(name, tool, &tools)?);
                continue;
            };
            let unknown = |reason: String| AgentSetupError::UnknownTool {
                agent: name.clone(),
                tool: tool.to_string(),
                reason,
                available: tools.names().chain(mcp_tools.keys().map(String::as_str)).collect::<Vec<_>>().join(", "),
            };
            let Some(running) = mcp.get(server) else {
                return Err(unknown(format!("MCP server {server:?} is not started (setup::start_mcp)")));
            };
            let listed = running.tools();
            let chosen: Vec<McpToolDef> = match wanted {
                None => listed,
                Some(wanted) => match listed.into_iter().find(|t| &t.name == wanted) {
                    Some(def) => vec![def],
                    None => return Err(unknown(format!("MCP server {server:?} does not list it"))),
                },
            };
            for def in chosen {
                let deadline = config.tool_deadline(agent, ToolId::Mcp { server, tool: &def.name });
                let registered = tool_name(server, &def.name);
                if !is_model_tool_name(&registered) {
                    let reason = format!(
                        "the model would call it {registered:?}, which is not 1–{MAX_MODEL_TOOL_NAME} letters, digits, `_` or `-` (what OpenAI and Anthropic accept); use a shorter [mcp.*] name"
                    );
                    if wanted.is_some() {
                        return Err(AgentSetupError::UnknownTool {
                            agent: name.clone(),
                            tool: tool.to_string(),
                            reason,
                            available: tools.names().collect::<Vec<_>>().join(", "),
                        });
                    }
                    // `mcp:SERVER/*` takes what the server lists; one odd name must not stop the worker.
                    tracing::warn!(agent = %name, server = %server, tool = %def.name, "{reason}; the tool is not offered");
                    continue;
                }
                if specs.iter().any(|s: &ToolSpec| s.name == registered) {
                    continue; // listed both by name and through `mcp:SERVER/*`
                }
                specs.push(ToolSpec {
                    name: registered.clone(),
                    description: def.description.clone(),
                    input_schema: def.input_schema.clone(),
                });
                let entry = mcp_tools.entry(registered).or_insert_with(|| (running.clone(), def, deadline));
                entry.2 = entry.2.max(deadline);
            }
        }
        profiles.push((name.clone(), profile_of(agent)));
        let fallback = fallback_of(&agent.model);
        routes.insert(name.clone(), model.for_agent(specs, client_tools, tools.client_slot(), fallback));
        if let Some((compaction_name, compaction)) =
            agent.compaction_model.as_deref().and_then(|m| models.get(m).map(|built| (m, built)))
        {
            // Summaries need no tools: the compaction request offers none.
            let fallback = fallback_of(compaction_name);
            compaction_routes
                .insert(name.clone(), compaction.for_agent(Vec::new(), Vec::new(), tools.client_slot(), fallback));
        }
        waterfalls.insert(name.clone(), waterfall(name, agent)?);
    }
    for (registered, (server, def, deadline)) in mcp_tools {
        tools.register(registered, Arc::new(McpTool::new(server, def, deadline)));
    }
    let catalog = AgentCatalog::new(config.default_agent.clone(), profiles)?;
    let model = Arc::new(AgentRouter::new(routes, catalog.default_agent()).with_compaction(compaction_routes));
    let tools = tools.with_policy(Arc::new(config.clone()));
    let built: BTreeMap<String, BuiltModel> = models.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    let versions = Arc::new(crate::versions::Versions::new(Arc::new(config.clone()), built, tools.clone()));
    let hooks = AgentHooks::new(waterfalls, catalog.default_agent());
    let webhooks = crate::webhooks::HttpWebhooks::from_config(config, &env)?;
    // Always a sender: tenants may register webhooks at run time (SPEC §21) whatever the agents name.
    let webhooks: Arc<dyn turnstile_worker::webhooks::WebhookSender> = Arc::new(webhooks);
    Ok(AgentSetup { catalog, model, tools, hooks, webhooks, versions })
}

/// What the driver knows of `agent`: its system prompt, history budget, approval rules and deadline,
/// compaction budget, tenants, version policy, tools and what sessions may override (version 0, no hash: the [`crate::directory::Directory`]
/// sets those for a stored version).
pub fn profile_of(agent: &turnstile_config::AgentConfig) -> AgentProfile {
    let system = (!agent.system.trim().is_empty()).then(|| agent.system.clone());
    let approval = tool_rules(&agent.approval);
    AgentProfile {
        system,
        history_turns: agent.history_turns,
        approval,
        context_budget_tokens: agent.context_budget_tokens,
        tenants: agent.tenant_scope(),
        approval_timeout: agent.approval_timeout_ms.map(|after_ms| ApprovalTimeout {
            after_ms,
            approve: agent.on_timeout == turnstile_config::OnTimeout::Approve,
        }),
        version: 0,
        hash: String::new(),
        pin: agent.version_policy == turnstile_config::VersionPolicy::Pin,
        retry_after_repair: tool_rules(&agent.retry_after_repair),
        output: agent.output.as_ref().map(turnstile_config::output::OutputConfig::schema),
        tools: agent.tool_names(),
        overrides: agent.override_policy(),
    }
}

/// A rule that holds for the calls whose tool one of `patterns` matches (by the name the model calls it).
fn tool_rules(patterns: &[turnstile_config::ToolPattern]) -> ToolRules {
    if patterns.is_empty() {
        return ToolRules::default();
    }
    let patterns = patterns.to_vec();
    ToolRules::new(move |tool| {
        let id = ToolId::from_call_name(tool);
        patterns.iter().any(|p| p.matches(id))
    })
}

/// The model's description of `tool`, which `agent` lists; an error when this worker has no such tool.
fn tool_spec(agent: &str, tool: &ToolRef, tools: &ToolRegistry) -> Result<ToolSpec, AgentSetupError> {
    let reason = match tool {
        ToolRef::Builtin(builtin) => match tools.spec(builtin.as_str()) {
            Some(spec) => return Ok(spec),
            None => "this built-in is not implemented yet",
        },
        ToolRef::Mcp { .. } => "MCP tools need their servers started (setup::start_mcp)",
        ToolRef::Client(_) => "client tools are offered by their executors at request time",
    };
    Err(AgentSetupError::UnknownTool {
        agent: agent.to_owned(),
        tool: tool.to_string(),
        reason: reason.to_owned(),
        available: tools.names().collect::<Vec<_>>().join(", "),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::router::tests::{request, run};
    use turnstile_worker::agent::ModelError;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// The setup of the configuration `toml`, no environment variable set.
    fn setup_of(toml: &str) -> Result<AgentSetup, AgentSetupError> {
        from_config_with_env(&Config::from_toml_str(toml).unwrap(), no_env)
    }

    #[tokio::test]
    async fn the_default_config_is_the_scripted_agent_on_the_scripted_model() {
        let setup = from_config_with_env(&Config::default(), no_env).unwrap();
        // The built-in agent, with the tools sessions may take a subset of (SPEC §20).
        let tools = ["sleep", "echo", "clock"].map(String::from).to_vec();
        let scripted = AgentProfile { tools, ..AgentProfile::default() };
        assert_eq!(setup.catalog, AgentCatalog::new("scripted", [("scripted".to_owned(), scripted)]).unwrap());
        assert_eq!(
            setup.tools.names().collect::<Vec<_>>(),
            ["clock", "echo", "memory_get", "memory_put", "memory_search", "sleep", "spawn_agent"]
        );
        let out = run(setup.model.as_ref(), request("scripted", "hi")).await.unwrap();
        assert_eq!(out.text, "echo: hi");
    }

    #[test]
    fn agents_become_catalog_profiles() {
        let setup = setup_of(
            "default_agent = \"terse\"\n[agents.terse]\nsystem = \"Be terse.\"\nhistory_turns = 3\ntools = [\"clock\"]\n",
        )
        .unwrap();
        assert_eq!(setup.catalog.default_agent(), "terse");
        assert_eq!(
            setup.catalog.get("terse"),
            Some(&AgentProfile {
                system: Some("Be terse.".into()),
                history_turns: 3,
                tools: vec!["clock".into()],
                ..AgentProfile::default()
            })
        );
        assert_eq!(setup.catalog.names().collect::<Vec<_>>(), ["scripted", "terse"]);
    }

    #[test]
    fn each_agent_gets_the_guard_its_budget_and_its_remote_hooks_in_order() {
        let setup = setup_of(
            "[agents.a]\nmax_steps_per_turn = 4\nhooks = [{ url = \"http://127.0.0.1:9/\" }, \
             { url = \"http://127.0.0.1:10\", on_failure = \"skip\" }]\n[agents.b]\n",
        )
        .unwrap();
        let names =
            |agent: &str| -> Vec<String> { setup.hooks.for_agent(agent).iter().map(|h| h.name().to_owned()).collect() };
        assert_eq!(names("a"), ["content-guard", "step-budget", "http://127.0.0.1:9", "http://127.0.0.1:10"]);
        assert_eq!(names("b"), ["content-guard"]);
        // Unknown agents run the default agent's (`scripted`) waterfall.
        assert_eq!(names("gone"), ["content-guard"]);
    }

    #[test]
    fn spawn_agent_is_offered_naming_the_configured_agents_without_confining_the_choice_to_them() {
        let setup = setup_of("[agents.helper]\ntools = [\"echo\", \"spawn_agent\"]\n[agents.researcher]\n").unwrap();
        let spec = setup.tools.spec("spawn_agent").unwrap();
        assert_eq!(spec.input_schema["required"], serde_json::json!(["agent", "prompt"]));
        let agent = &spec.input_schema["properties"]["agent"];
        assert_eq!(
            agent["description"],
            "The agent profile the child runs (the configuration's: helper, researcher, scripted)."
        );
        assert!(agent.get("enum").is_none(), "a tenant's API agents (SPEC §20) are valid choices too");
    }

    #[test]
    fn a_builtin_the_registry_does_not_hold_names_the_agent_and_the_tool() {
        let tool = ToolRef::Builtin(turnstile_config::Builtin::Sleep);
        let err = tool_spec("helper", &tool, &ToolRegistry::default()).unwrap_err();
        assert!(matches!(&err, AgentSetupError::UnknownTool { agent, .. } if agent == "helper"), "{err:?}");
        assert_eq!(
            err.to_string(),
            "agent \"helper\": tool \"sleep\" is not available in this worker (this built-in is not implemented yet; \
             available: )"
        );
    }

    #[test]
    fn client_tools_are_accepted_and_only_listed_tools_may_be_called() {
        let setup = setup_of("[agents.helper]\ntools = [\"echo\", \"client:lookup\"]\n").unwrap();
        assert!(!setup.tools.contains("lookup"), "client tools are not registered: they are looked up per call");
    }

    #[test]
    fn mcp_tools_need_a_configured_and_started_server() {
        // The config crate refuses a server that is not configured.
        let err = Config::from_toml_str("[agents.a]\ntools = [\"mcp:files/*\"]\n").unwrap_err().to_string();
        assert!(err.contains("files"), "{err}");
        // A configured server that was not started (from_config without start_mcp) is named.
        let err = setup_of("[mcp.files]\ncommand = \"files-server\"\n[agents.a]\ntools = [\"mcp:files/read\"]\n")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent \"a\": tool \"mcp:files/read\" is not available in this worker (MCP server \"files\" is not \
             started (setup::start_mcp); available: clock, echo, memory_get, memory_put, memory_search, sleep, spawn_agent)"
        );
    }

    #[test]
    fn a_missing_api_key_variable_names_the_agent_the_model_and_the_variable() {
        let config = Config::from_toml_str(
            "[models.gpt]\nmodel = \"gpt-4o-mini\"\napi_key_env = \"TURNSTILE_TEST_KEY\"\n[agents.a]\nmodel = \"gpt\"\n",
        )
        .unwrap();
        let err = from_config_with_env(&config, no_env).unwrap_err();
        assert!(matches!(&err, AgentSetupError::ApiKey { model, agents, variable, .. }
            if model == "gpt" && agents == &["a"] && variable == "TURNSTILE_TEST_KEY"));
        let message = err.to_string();
        assert!(message.starts_with("agent \"a\" runs on model \"gpt\": models.gpt.api_key_env: "), "{message}");
        assert!(message.contains("TURNSTILE_TEST_KEY is not set"), "{message}");

        let key = |v: &str| (v == "TURNSTILE_TEST_KEY").then(|| "sk-test-secret".to_owned());
        let setup = from_config_with_env(&config, key).unwrap();
        assert!(!format!("{setup:?}").contains("sk-test-secret"));
    }

    #[test]
    fn only_the_models_agents_use_need_their_keys() {
        // The README's hosted-provider example: three models, one agent on one of them (issue 31).
        let config = Config::from_toml_str(
            "default_agent = \"assistant\"\n\
             [models.gpt]\nmodel = \"gpt-4o-mini\"\napi_key_env = \"TURNSTILE_TEST_OPENAI\"\n\
             [models.deepseek]\nbase_url = \"https://api.deepseek.com/v1\"\nmodel = \"deepseek-reasoner\"\n\
             api_key_env = \"TURNSTILE_TEST_DEEPSEEK\"\n\
             [models.claude]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-5\"\n\
             api_key_env = \"TURNSTILE_TEST_ANTHROPIC\"\n\
             [agents.assistant]\nmodel = \"claude\"\n\
             [agents.summarizer]\nmodel = \"claude\"\ncompaction_model = \"gpt\"\n",
        )
        .unwrap();
        let only = |set: &'static [&'static str]| move |v: &str| set.contains(&v).then(|| "sk-test".to_owned());
        // deepseek is unused: its variable is never needed.
        let setup = from_config_with_env(&config, only(&["TURNSTILE_TEST_ANTHROPIC", "TURNSTILE_TEST_OPENAI"]));
        assert!(setup.is_ok(), "{:?}", setup.err());
        // gpt is used only for compaction, and that agent is named.
        let err = from_config_with_env(&config, only(&["TURNSTILE_TEST_ANTHROPIC"])).unwrap_err();
        assert!(err.to_string().starts_with("agent \"summarizer\" runs on model \"gpt\": "), "{err}");
        let err = from_config_with_env(&config, only(&["TURNSTILE_TEST_OPENAI"])).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "agents \"assistant\", \"summarizer\" run on model \"claude\": models.claude.api_key_env: environment \
                 variable TURNSTILE_TEST_ANTHROPIC is not set"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn agents_on_two_models_are_routed_by_agent() {
        // "remote" points at a port where nothing listens: a request that reaches it fails fast.
        let setup = setup_of(
            "[models.remote]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\nretries = 0\n\
             [agents.local]\n[agents.far]\nmodel = \"remote\"\n",
        )
        .unwrap();
        assert_eq!(run(setup.model.as_ref(), request("local", "hi")).await.unwrap().text, "echo: hi");
        let err = run(setup.model.as_ref(), request("far", "hi")).await.unwrap_err();
        assert!(matches!(&err, ModelError::Failed { code, .. } if code == "model_unavailable"), "{err:?}");
    }
}
