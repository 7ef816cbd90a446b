//! Pre-step hooks: the waterfall that decides each proposal (SPEC §4, §9).
//!
//! Each hook sees the batch as the hooks before it left it and either passes a (possibly rewritten)
//! batch on or rejects. The last batch standing is entered.
//!
//! Every agent has a waterfall of its own ([`AgentHooks`]), in this order: the built-in content guard,
//! the built-in step budget ([`budget::StepBudget`], when the agent sets `max_steps_per_turn`), then the
//! agent's remote hooks ([`remote::RemoteHook`]) in config order. [`AgentHooks`] is the worker's one
//! [`PreStepHook`]: it runs the waterfall of
//! [`PreStepRequest::agent`](turnstile_driver::PreStepRequest::agent) (docs/decisions/0014-remote-hooks.md).

pub mod budget;
pub mod remote;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use turnstile_model::UserMessage;
pub use turnstile_worker::agent::{HookError, HookVerdict, PreStepHook, Proposal};

pub use budget::StepBudget;
pub use remote::RemoteHook;

/// One agent's hooks, in waterfall order.
pub type Waterfall = Arc<[Arc<dyn PreStepHook>]>;

/// The waterfall of every agent, by agent name.
#[derive(Clone)]
pub struct AgentHooks {
    by_agent: HashMap<String, Waterfall>,
    default_agent: String,
    /// For an agent that is neither listed nor the default (a catalog and hooks built apart).
    fallback: Waterfall,
}

impl std::fmt::Debug for AgentHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<(&String, Vec<&str>)> =
            self.by_agent.iter().map(|(a, w)| (a, w.iter().map(|h| h.name()).collect())).collect();
        agents.sort();
        f.debug_struct("AgentHooks").field("agents", &agents).field("default_agent", &self.default_agent).finish()
    }
}

impl Default for AgentHooks {
    /// The content guard for every agent.
    fn default() -> Self {
        Self::uniform(vec![Arc::new(ContentGuard)])
    }
}

impl AgentHooks {
    /// The same `hooks` for every agent.
    pub fn uniform(hooks: Vec<Arc<dyn PreStepHook>>) -> Self {
        Self { by_agent: HashMap::new(), default_agent: String::new(), fallback: hooks.into() }
    }

    /// `by_agent`'s waterfalls; an agent it does not list runs the waterfall of `default_agent` (or only
    /// the content guard, when that is not listed either).
    pub fn new(by_agent: HashMap<String, Vec<Arc<dyn PreStepHook>>>, default_agent: impl Into<String>) -> Self {
        Self {
            by_agent: by_agent.into_iter().map(|(agent, hooks)| (agent, hooks.into())).collect(),
            default_agent: default_agent.into(),
            fallback: Arc::new([Arc::new(ContentGuard) as Arc<dyn PreStepHook>]),
        }
    }

    /// The waterfall that decides `agent`'s proposals.
    pub fn for_agent(&self, agent: &str) -> Waterfall {
        self.by_agent.get(agent).or_else(|| self.by_agent.get(&self.default_agent)).unwrap_or(&self.fallback).clone()
    }
}

/// The worker's one hook: the waterfall of the proposal's agent
/// ([`PreStepRequest::agent`](turnstile_driver::PreStepRequest::agent)).
#[async_trait]
impl PreStepHook for AgentHooks {
    fn name(&self) -> &str {
        "waterfall"
    }

    async fn decide(&self, proposal: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        run_waterfall(&self.for_agent(&proposal.request.agent), proposal, batch).await
    }
}

/// Runs `hooks` in order over `batch`: each sees the batch the one before it passed on; the first
/// rejection ends the waterfall.
pub async fn run_waterfall(
    hooks: &[Arc<dyn PreStepHook>],
    proposal: Proposal<'_>,
    mut batch: Vec<UserMessage>,
) -> Result<HookVerdict, HookError> {
    for hook in hooks {
        match hook.decide(proposal, batch).await? {
            HookVerdict::Pass(next) => batch = next,
            reject @ HookVerdict::Reject { .. } => return Ok(reject),
        }
    }
    Ok(HookVerdict::Pass(batch))
}

/// The built-in content guard, driven by the scripted directives `[[reject]]`, `[[drop]]`,
/// `[[rewrite:TEXT]]` and `[[hook-fail]]`.
#[derive(Clone, Debug, Default)]
pub struct ContentGuard;

impl ContentGuard {
    pub const NAME: &'static str = crate::scripted::CONTENT_GUARD;

    /// The guard's verdict, without IO.
    pub fn judge(batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        crate::scripted::judge(batch)
    }
}

#[async_trait]
impl PreStepHook for ContentGuard {
    fn name(&self) -> &str {
        Self::NAME
    }

    async fn decide(&self, _: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
        Self::judge(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;
    use turnstile_driver::PreStepRequest;
    use turnstile_model::SessionRef;

    fn msg(id: &str, text: &str) -> UserMessage {
        UserMessage::user_text(id, text)
    }

    /// A hook that prefixes every message with its name.
    struct Tag(&'static str);

    #[async_trait]
    impl PreStepHook for Tag {
        fn name(&self) -> &str {
            self.0
        }

        async fn decide(&self, _: Proposal<'_>, batch: Vec<UserMessage>) -> Result<HookVerdict, HookError> {
            Ok(HookVerdict::Pass(batch.into_iter().map(|m| msg(&m.id.0, &format!("{}{}", self.0, m.text()))).collect()))
        }
    }

    fn names(waterfall: &Waterfall) -> Vec<&str> {
        waterfall.iter().map(|h| h.name()).collect()
    }

    #[test]
    fn each_agent_gets_its_own_waterfall_and_unknown_agents_the_default_ones() {
        let hooks = AgentHooks::new(
            HashMap::from([
                ("a".to_owned(), vec![Arc::new(Tag("a1")) as Arc<dyn PreStepHook>, Arc::new(Tag("a2"))]),
                ("b".to_owned(), vec![Arc::new(Tag("b1")) as Arc<dyn PreStepHook>]),
            ]),
            "b",
        );
        assert_eq!(names(&hooks.for_agent("a")), ["a1", "a2"]);
        assert_eq!(names(&hooks.for_agent("b")), ["b1"]);
        assert_eq!(names(&hooks.for_agent("gone")), ["b1"]);
        assert_eq!(names(&AgentHooks::new(HashMap::new(), "x").for_agent("y")), [ContentGuard::NAME]);
    }

    #[tokio::test]
    async fn each_hook_sees_the_batch_the_previous_one_left() {
        let session = SessionRef { tenant: "t".into(), id: "s".into() };
        let request = PreStepRequest {
            op: 1,
            agent: "a".into(),
            turn: 1,
            step: 1,
            proposal: 1,
            messages: vec![msg("m", "x")],
            agent_hash: String::new(),
        };
        let hooks: Vec<Arc<dyn PreStepHook>> = vec![Arc::new(Tag("1:")), Arc::new(Tag("2:"))];
        let abort = CancellationToken::new();
        let decision = run_waterfall(&hooks, Proposal::new(&session, &request, &abort), request.messages.clone()).await;
        assert_eq!(decision, Ok(HookVerdict::Pass(vec![msg("m", "2:1:x")])));
        // The content guard rejects before later hooks run.
        let request = PreStepRequest { messages: vec![msg("m", "[[reject]]")], ..request };
        let hooks: Vec<Arc<dyn PreStepHook>> = vec![Arc::new(ContentGuard), Arc::new(Tag("never"))];
        let decision = run_waterfall(&hooks, Proposal::new(&session, &request, &abort), request.messages.clone()).await;
        assert_eq!(decision, Ok(HookVerdict::Reject { reason: None }));
    }

    #[test]
    fn passes_plain_messages() {
        let batch = vec![msg("a", "hi"), msg("b", "there")];
        assert_eq!(ContentGuard::judge(batch.clone()), Ok(HookVerdict::Pass(batch)));
    }

    #[test]
    fn rejects_drops_rewrites_and_fails() {
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "x"), msg("b", "[[reject]]")]),
            Ok(HookVerdict::Reject { reason: None })
        );
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "x"), msg("b", "[[drop]] y")]),
            Ok(HookVerdict::Pass(vec![msg("a", "x")]))
        );
        assert_eq!(
            ContentGuard::judge(vec![msg("a", "[[rewrite:clean]] dirty")]),
            Ok(HookVerdict::Pass(vec![msg("a", "clean")]))
        );
        assert!(ContentGuard::judge(vec![msg("a", "[[hook-fail]]")]).is_err());
    }
}
