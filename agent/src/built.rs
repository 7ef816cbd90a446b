//! One `[models.NAME]` and one agent's pre-step waterfall, built from the configuration: what
//! [`crate::setup`] builds for the file's agents and [`crate::versions`] for every other version.

use std::sync::Arc;

use turnstile_config::{ModelConfig, Provider};
use turnstile_worker::agent::Model;

use crate::hooks::{ContentGuard, PreStepHook, RemoteHook, StepBudget};
use crate::llm::chat::{ChatProvider, ToolSpec};
use crate::llm::chat_model::{self, ChatModel};
use crate::llm::endpoint::{ModelEndpoint, ProviderKind};
use crate::scripted::ScriptedModel;
use crate::setup_error::AgentSetupError;
use crate::tools::ClientBusSlot;

/// `agent`'s pre-step waterfall: the content guard, its step budget, then its remote hooks in config order.
pub(crate) fn waterfall(
    name: &str,
    agent: &turnstile_config::AgentConfig,
) -> Result<Vec<Arc<dyn PreStepHook>>, AgentSetupError> {
    let mut hooks: Vec<Arc<dyn PreStepHook>> = vec![Arc::new(ContentGuard)];
    if let Some(max) = agent.max_steps_per_turn {
        hooks.push(Arc::new(StepBudget::new(max)));
    }
    for hook in &agent.hooks {
        let remote =
            RemoteHook::new(hook).map_err(|source| AgentSetupError::Hook { agent: name.to_owned(), source })?;
        hooks.push(Arc::new(remote));
    }
    Ok(hooks)
}

/// One `[models.NAME]`, built: the scripted model, or a connected provider that agents wrap with their tools.
#[derive(Clone)]
pub(crate) enum BuiltModel {
    Scripted(Arc<ScriptedModel>),
    Chat(Arc<dyn ChatProvider>),
}

impl BuiltModel {
    pub(crate) fn for_agent(
        &self,
        tools: Vec<ToolSpec>,
        client_tools: Vec<String>,
        bus: ClientBusSlot,
        fallback: Vec<Arc<dyn ChatProvider>>,
    ) -> Arc<dyn Model> {
        match self {
            Self::Scripted(model) => model.clone(),
            Self::Chat(provider) => Arc::new(
                ChatModel::new(provider.clone())
                    .with_fallback(fallback)
                    .with_tools(tools)
                    .with_client_tools(client_tools, bus),
            ),
        }
    }
}

pub(crate) fn built_model(
    name: &str,
    model: &ModelConfig,
    agents: &[&str],
    env: &impl Fn(&str) -> Option<String>,
) -> Result<BuiltModel, AgentSetupError> {
    let provider = match model.provider {
        Provider::Scripted => return Ok(BuiltModel::Scripted(Arc::new(ScriptedModel::named(name)))),
        Provider::OpenAi => ProviderKind::OpenAi,
        Provider::Anthropic => ProviderKind::Anthropic,
    };
    let api_key = model.resolve_api_key(env).map_err(|source| AgentSetupError::ApiKey {
        model: name.to_owned(),
        agents: agents.iter().map(|a| (*a).to_owned()).collect(),
        variable: model.api_key_env.clone().unwrap_or_default(),
        source: Box::new(source),
    })?;
    let mut endpoint = ModelEndpoint::new(provider, model.model.clone());
    if let Some(url) = model.endpoint() {
        endpoint.base_url = url.as_str().to_owned();
    }
    endpoint.api_key = api_key;
    endpoint.max_tokens = Some(model.max_tokens);
    endpoint.timeout = model.timeout();
    endpoint.first_byte_timeout = model.first_byte_timeout();
    endpoint.idle_timeout = model.idle_timeout();
    endpoint.retries = model.retries;
    endpoint.prompt_cache = model.prompt_cache;
    let provider =
        chat_model::connect(endpoint).map_err(|source| AgentSetupError::Endpoint { model: name.to_owned(), source })?;
    Ok(BuiltModel::Chat(provider))
}
