//! What an agent can do: the models, tools and pre-step hooks a session's steps run on, and the
//! configuration that picks them per agent.
//!
//! Place in the architecture: `model` ← `driver` ← `worker` ← **`agent`** ← `node`. The worker's runner
//! performs the driver's pre-step, model and tool effects through the seam of `turnstile_worker::agent`
//! (`Model`, `Tools`, `PreStepHook`, bundled as `Agents`); this crate implements it, so the worker carries
//! no HTTP client and no MCP SDK (decision 0050). The node builds an [`AgentSetup`] from the configuration
//! ([`setup::setup`]), connects the tools that need the cluster (client tools, `spawn_agent`) and hands it
//! to the worker's host.
//!
//! - [`llm`]: the LLM providers (OpenAI-compatible Chat Completions, Anthropic Messages) over one HTTP
//!   engine, run as a `Model` by [`llm::chat_model::ChatModel`].
//! - [`scripted`]: the deterministic scripted model and its directives (`[[tool:echo hi]]`, `[[delay:500]]`,
//!   ...), pure at its core so the driver's scenario tests replay every SPEC §7 scenario with it.
//! - [`tools`]: the [`tools::Tool`] trait, the built-ins (`sleep`, `echo`, `clock`, `spawn_agent`), MCP
//!   servers' tools, client tools, and the [`tools::ToolRegistry`] that checks, bounds and measures calls.
//! - [`hooks`]: the per-agent pre-step waterfall: the content guard, the step budget, remote hooks.
//! - [`webhooks`]: the agents' webhooks over HTTP, signed (SPEC §15).
//! - [`setup`]: a configuration's agents made runnable ([`AgentSetup`]); [`router`] picks each step's
//!   model by its agent.

mod built;
pub mod directory;
#[cfg(test)]
mod fixtures;
pub mod hooks;
pub mod llm;
pub mod output;
pub mod router;
pub mod scripted;
pub mod setup;
mod setup_error;
pub mod tools;
pub mod versions;
pub mod webhooks;

pub use router::AgentRouter;
pub use setup::{AgentSetup, AgentSetupError};
