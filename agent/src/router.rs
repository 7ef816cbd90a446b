//! [`AgentRouter`]: one [`Model`] for every agent of a worker, picking each step's model by its agent.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use turnstile_driver::ModelOutput;
use turnstile_worker::agent::{Model, ModelError, ModelIdentity, ModelStep};

/// A [`Model`] that runs each step on the model of the step's agent
/// ([`ModelRequest::agent`](turnstile_driver::ModelRequest::agent)); an agent it does not know (a catalog and
/// router built apart) runs on the default agent's model.
pub struct AgentRouter {
    agents: HashMap<String, Arc<dyn Model>>,
    /// Each agent's `compaction_model`, where it names one (SPEC §13); others compact on their model.
    compaction: HashMap<String, Arc<dyn Model>>,
    default_agent: String,
}

impl std::fmt::Debug for AgentRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<&String> = self.agents.keys().collect();
        agents.sort();
        f.debug_struct("AgentRouter").field("agents", &agents).field("default_agent", &self.default_agent).finish()
    }
}

impl AgentRouter {
    /// Routes to `agents` by name; `default_agent` should be one of them.
    pub fn new(agents: HashMap<String, Arc<dyn Model>>, default_agent: impl Into<String>) -> Self {
        Self { agents, compaction: HashMap::new(), default_agent: default_agent.into() }
    }

    /// Routes the compaction requests of these agents to their `compaction_model`.
    pub fn with_compaction(mut self, compaction: HashMap<String, Arc<dyn Model>>) -> Self {
        self.compaction = compaction;
        self
    }

    /// The model that serves `agent`.
    pub fn model_of(&self, agent: &str) -> Option<&Arc<dyn Model>> {
        self.agents.get(agent).or_else(|| self.agents.get(&self.default_agent))
    }
}

#[async_trait]
impl Model for AgentRouter {
    fn identity(&self, agent: &str) -> ModelIdentity {
        self.model_of(agent).map_or_else(|| ModelIdentity::new("none", "none"), |m| m.identity(agent))
    }

    async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
        let agent = &step.request.agent;
        let compaction = step.request.compaction.is_some().then(|| self.compaction.get(agent)).flatten();
        match compaction.or_else(|| self.model_of(agent)) {
            Some(model) => model.step(step).await,
            None => Err(ModelError::Failed {
                message: format!("no model serves agent {agent:?} (and no default agent)"),
                code: "model_unavailable".into(),
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;
    use turnstile_driver::ModelRequest;
    use turnstile_model::UserMessage;
    use turnstile_worker::agent::DeltaSink;

    pub(crate) fn request(agent: &str, text: &str) -> ModelRequest {
        crate::fixtures::model_request(agent, vec![UserMessage::user_text("m1", text)])
    }

    pub(crate) async fn run(model: &dyn Model, request: ModelRequest) -> Result<ModelOutput, ModelError> {
        let (tx, mut rx) = mpsc::channel(64);
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let out = model.step(ModelStep::new(request, DeltaSink::new(tx), CancellationToken::new())).await;
        drain.await.unwrap();
        out
    }

    /// A model that answers with its own name.
    struct Named(&'static str);

    #[async_trait]
    impl Model for Named {
        async fn step(&self, step: ModelStep) -> Result<ModelOutput, ModelError> {
            let text = format!("{} answers {}", self.0, step.request.agent);
            step.deltas.send(text.clone()).await;
            Ok(ModelOutput::text(text))
        }
    }

    #[tokio::test]
    async fn the_router_picks_the_model_of_the_requests_agent() {
        let router = AgentRouter::new(
            HashMap::from([
                ("a".to_owned(), Arc::new(Named("first")) as Arc<dyn Model>),
                ("b".to_owned(), Arc::new(Named("second")) as Arc<dyn Model>),
            ]),
            "a",
        );
        assert_eq!(run(&router, request("a", "x")).await.unwrap().text, "first answers a");
        assert_eq!(run(&router, request("b", "x")).await.unwrap().text, "second answers b");
        // An agent the router does not know runs on the default agent's model.
        assert_eq!(run(&router, request("gone", "x")).await.unwrap().text, "first answers gone");
    }
}
