//! Fixtures shared by the crate's unit tests.

use turnstile_driver::ModelRequest;
use turnstile_model::{SessionRef, UserMessage};

/// The request of step 1 of turn 2 of session `default/s` for `agent`: `messages` and nothing else (no
/// system prompt, history, tool results or output schema).
pub(crate) fn model_request(agent: &str, messages: Vec<UserMessage>) -> ModelRequest {
    ModelRequest {
        agent_hash: String::new(),
        overrides: Default::default(),
        op: 1,
        session: SessionRef { tenant: "default".into(), id: "s".into() },
        turn: 2,
        step: 1,
        agent: agent.into(),
        system: None,
        history: vec![],
        messages,
        tool_results: vec![],
        interrupted_prompt: vec![],
        goal: None,
        summary: None,
        output: None,
        compaction: None,
    }
}
