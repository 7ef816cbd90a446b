//! [`AgentDefinitions`]: where a gateway keeps agents. Its own file so that the [`crate::service::Gateway`]
//! holding it and the agent RPCs of [`crate::agents`] do not import each other.

use std::sync::Arc;

use turnstile_config::Config;
use turnstile_journal::agents::AgentStore;

/// Where a gateway keeps agents, and the configuration definitions are checked against.
#[derive(Clone)]
pub struct AgentDefinitions {
    pub store: Arc<dyn AgentStore>,
    pub config: Arc<Config>,
}

impl std::fmt::Debug for AgentDefinitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDefinitions").finish_non_exhaustive()
    }
}
