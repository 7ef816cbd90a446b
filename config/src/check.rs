//! Checking a parsed configuration: each section's numbers, every map key a usable name, and each agent
//! against the models and MCP servers the file defines. The types of the sections are plain data in their
//! own files; the checks that need the whole [`Config`] live here, above them, so none of them imports
//! `config.rs` back.

use turnstile_model::Tenant;

use crate::agent::AgentConfig;
use crate::config::{Config, MIN_DEDUP_HORIZON};
use crate::names::{NAME_RULE, is_name, known};
use crate::path::{Invalid, KeyPath, positive};
use crate::tenant::{TENANT_RULE, is_tenant};
use crate::tools::{Builtin, ToolRef, is_server_name};

impl Config {
    pub(crate) fn check(&self) -> Result<(), Invalid> {
        let root = KeyPath::root();
        if !self.agents.contains_key(&self.default_agent) {
            return Err(root.key("default_agent").invalid(format!(
                "no agent named {:?} (known: {})",
                self.default_agent,
                known(self.agents.keys())
            )));
        }
        if self.agents.get(&self.default_agent).is_some_and(|a| a.tenants.is_some()) {
            // Every tenant's sessions run the default agent until ConfigureSession names another.
            return Err(root.key("agents").key(&self.default_agent).key("tenants").invalid(format!(
                "{:?} is the default_agent, which every tenant's sessions run until ConfigureSession names \
                 another; remove tenants from it, or make another agent the default",
                self.default_agent
            )));
        }
        self.check_sections(&root)?;
        self.memory.check(&root.key("memory"))?;
        for (name, model) in &self.models {
            let path = root.key("models").key(name);
            check_name(&path, name, &model.name, is_name(name), NAME_RULE)?;
            model.check(&path)?;
            model.check_fallback(&path, &self.models)?;
        }
        for (name, server) in &self.mcp {
            let path = root.key("mcp").key(name);
            let rule = "1 to 64 letters, digits, '_' or '-', without \"__\" or a trailing '_', since tools are offered as NAME__TOOL";
            check_name(&path, name, &server.name, is_server_name(name), rule)?;
            server.check(&path)?;
        }
        for (name, agent) in &self.agents {
            let path = root.key("agents").key(name);
            check_name(&path, name, &agent.name, is_name(name), NAME_RULE)?;
            agent.check(&path, self)?;
        }
        for (name, tenant) in &self.tenants {
            let path = root.key("tenants").key(name);
            check_name(&path, name, &tenant.name, is_tenant(name), TENANT_RULE)?;
            tenant.check(&path)?;
        }
        Ok(())
    }

    fn check_sections(&self, root: &KeyPath) -> Result<(), Invalid> {
        let limits = root.key("limits");
        positive(&limits, "max_message_bytes", self.limits.max_message_bytes as u64, "0 would refuse every message")?;
        positive(&limits, "max_pending", self.limits.max_pending as u64, "0 would refuse every delivery")?;
        positive(&limits, "when_idle_timeout_ms", self.limits.when_idle_timeout_ms, "0 would time out every WhenIdle")?;
        positive(&limits, "max_goal_rounds", u64::from(self.limits.max_goal_rounds), "0 would refuse every goal")?;
        positive(
            &limits,
            "max_spawn_depth",
            u64::from(self.limits.max_spawn_depth),
            "0 would refuse every spawn_agent call; leave spawn_agent out of the agents' tools instead",
        )?;
        positive(
            &limits,
            "max_children",
            u64::from(self.limits.max_children),
            "0 would refuse every spawn_agent call; leave spawn_agent out of the agents' tools instead",
        )?;
        positive(
            &limits,
            "max_queued_commands",
            self.limits.max_queued_commands as u64,
            "0 would refuse every command",
        )?;
        positive(
            &limits,
            "watch_buffer_bytes",
            self.limits.watch_buffer_bytes as u64,
            "0 would cut every Watch stream whose client is one item behind",
        )?;
        if self.limits.watch_buffer_total_bytes < self.limits.watch_buffer_bytes {
            return Err(limits.key("watch_buffer_total_bytes").invalid(format!(
                "{} is below watch_buffer_bytes ({}): one stream could pass the gateway's total alone; raise it to \
                 at least watch_buffer_bytes",
                self.limits.watch_buffer_total_bytes, self.limits.watch_buffer_bytes
            )));
        }
        if self.limits.max_pending_bytes < self.limits.max_message_bytes {
            return Err(limits.key("max_pending_bytes").invalid(format!(
                "{} is below max_message_bytes ({}): a message of the largest allowed size could never be pending; \
                 raise it to at least max_message_bytes",
                self.limits.max_pending_bytes, self.limits.max_message_bytes
            )));
        }

        let c = &self.cluster;
        let cluster = root.key("cluster");
        positive(&cluster, "partitions", u64::from(c.partitions), "sessions need at least one stream")?;
        if c.shards < c.partitions {
            return Err(cluster.key("shards").invalid(format!(
                "{} is below partitions ({}); every partition needs at least one shard",
                c.shards, c.partitions
            )));
        }
        if !(1..=5).contains(&c.replicas) {
            return Err(cluster.key("replicas").invalid(format!(
                "{} is out of range (allowed: 1 to 5; 1 for one NATS server, 3 for a cluster)",
                c.replicas
            )));
        }
        if c.lease_ttl_ms < 100 {
            return Err(cluster.key("lease_ttl_ms").invalid(format!(
                "{} is below 100; a lease shorter than that lapses between renewals",
                c.lease_ttl_ms
            )));
        }
        if c.renew_ms < 10 {
            return Err(cluster.key("renew_ms").invalid(format!("{} is below 10 (allowed: 10 and above)", c.renew_ms)));
        }
        if c.renew_ms >= c.lease_ttl_ms {
            return Err(cluster.key("renew_ms").invalid(format!(
                "{} must be below lease_ttl_ms ({}), or leases lapse between renewals; try a third of it",
                c.renew_ms, c.lease_ttl_ms
            )));
        }
        if c.worker_ttl_ms <= c.renew_ms {
            return Err(cluster.key("worker_ttl_ms").invalid(format!(
                "{} must be above renew_ms ({}), or live workers drop out between heartbeats; try several times it",
                c.worker_ttl_ms, c.renew_ms
            )));
        }

        let journal = root.key("journal");
        positive(&journal, "snapshot_every", self.journal.snapshot_every, "0 would mean a snapshot before any event")?;
        positive(
            &journal,
            "passivate_after_ms",
            self.journal.passivate_after_ms,
            "0 would unload every session as soon as it idles; use a large value to keep sessions loaded",
        )?;
        if self.journal.max_age_ms > 0 && self.journal.max_age_ms <= self.journal.passivate_after_ms {
            return Err(journal.key("max_age_ms").invalid(format!(
                "{} is not above passivate_after_ms ({}): events of sessions still loaded would expire; \
                 use 0 (keep until deleted) or a much larger age",
                self.journal.max_age_ms, self.journal.passivate_after_ms
            )));
        }
        if self.journal.max_bytes > i64::MAX as u64 {
            return Err(journal
                .key("max_bytes")
                .invalid(format!("{} is larger than JetStream accepts; use 0 for unlimited", self.journal.max_bytes)));
        }
        if self.journal.dedup_horizon < MIN_DEDUP_HORIZON {
            return Err(journal.key("dedup_horizon").invalid(format!(
                "{} is below {MIN_DEDUP_HORIZON}, the least SPEC §2 promises for idempotent retries",
                self.journal.dedup_horizon
            )));
        }
        positive(&root.key("tools"), "deadline_ms", self.tools.deadline_ms, "a deadline of 0 would fail every call")
    }
}

impl AgentConfig {
    /// Checks the agent against the rest of the configuration: models and MCP servers it names exist,
    /// approval patterns can match one of its tools, numbers are in range.
    pub(crate) fn check(&self, path: &KeyPath, config: &Config) -> Result<(), Invalid> {
        let known_model = |key: &str, name: &str| {
            if config.models.contains_key(name) {
                Ok(())
            } else {
                Err(path
                    .key(key)
                    .invalid(format!("no model named {name:?} (known: {})", crate::names::known(config.models.keys()))))
            }
        };
        known_model("model", &self.model)?;
        if let Some(name) = &self.compaction_model {
            known_model("compaction_model", name)?;
        }
        self.overrides.check(
            &path.key("overrides"),
            &|name| config.models.contains_key(name),
            &crate::names::known(config.models.keys()),
        )?;
        let known_server = |key: KeyPath, entry: &dyn std::fmt::Display, server: Option<&str>| match server {
            Some(server) if !config.mcp.contains_key(server) => Err(key.invalid(format!(
                "\"{entry}\": no MCP server named {server:?} (known: {})",
                crate::names::known(config.mcp.keys())
            ))),
            _ => Ok(()),
        };
        for (i, tool) in self.tools.iter().enumerate() {
            known_server(path.key("tools").index(i), tool, tool.mcp_server())?;
            if let Some(first) = self.tools[..i].iter().position(|t| t == tool) {
                return Err(path
                    .key("tools")
                    .index(i)
                    .invalid(format!("\"{tool}\" is already listed (tools[{first}])")));
            }
        }
        let patterns = self.approval.iter().enumerate().map(|(i, p)| (path.key("approval").index(i), p));
        let retried = self.retry_after_repair.iter().enumerate();
        for (key, pattern) in patterns.chain(retried.map(|(i, p)| (path.key("retry_after_repair").index(i), p))) {
            known_server(key.clone(), pattern, pattern.mcp_server())?;
            if !self.tools.iter().any(|t| pattern.may_match(t)) {
                let tools: Vec<String> = self.tools.iter().map(ToString::to_string).collect();
                let tools = if tools.is_empty() { "none".to_owned() } else { tools.join(", ") };
                return Err(key.invalid(format!(
                    "\"{pattern}\" matches none of this agent's tools (tools: {tools}); add the tool to tools or remove the pattern"
                )));
            }
        }
        for (i, hook) in self.hooks.iter().enumerate() {
            positive(
                &path.key("hooks").index(i),
                "deadline_ms",
                hook.deadline_ms,
                "a deadline of 0 would fail every step",
            )?;
        }
        if let Some(memory) = &self.memory {
            memory.check(&path.key("memory"))?;
        } else if let Some((i, tool)) = self.tools.iter().enumerate().find(|(_, t)| {
            matches!(t, ToolRef::Builtin(Builtin::MemoryGet | Builtin::MemoryPut | Builtin::MemorySearch))
        }) {
            return Err(path.key("tools").index(i).invalid(format!(
                "\"{tool}\" needs the namespaces it may reach: add memory = {{ namespaces = [\"NAME\"] }} to this agent"
            )));
        }
        if self.tenants.as_ref().is_some_and(Vec::is_empty) {
            return Err(path
                .key("tenants")
                .invalid("is empty, so no tenant could run this agent; list its tenants, or remove the key for all"));
        }
        let serves = self.tenant_scope();
        for (i, hook) in self.webhooks.iter().enumerate() {
            let key = path.key("webhooks").index(i);
            match &hook.tenants {
                Some(tenants) if tenants.is_empty() => {
                    return Err(key.key("tenants").invalid(
                        "is empty, so this webhook would receive nothing; list its tenants, or remove the key for \
                         every tenant of the agent",
                    ));
                }
                Some(tenants) => {
                    if let Some((j, tenant)) = tenants.iter().enumerate().find(|(_, t)| !serves.allows(t.as_str())) {
                        return Err(key.key("tenants").index(j).invalid(format!(
                            "tenant {:?} cannot run this agent (its tenants: {}); a webhook only receives \
                             events of the agent's tenants",
                            tenant.as_str(),
                            self.tenants.iter().flatten().map(Tenant::as_str).collect::<Vec<_>>().join(", ")
                        )));
                    }
                }
                None => {}
            }
            if hook.events.is_empty() {
                return Err(key
                    .key("events")
                    .invalid("is empty; list the durable types to deliver, e.g. [\"turn/end\"]"));
            }
            for (j, event) in hook.events.iter().enumerate() {
                if !turnstile_model::event::DURABLE_TYPES.contains(&event.as_str()) {
                    return Err(key.key("events").index(j).invalid(format!(
                        "{event:?} is not a durable event type (known: {})",
                        turnstile_model::event::DURABLE_TYPES.join(", ")
                    )));
                }
            }
            positive(&key, "max_age_ms", hook.max_age_ms, "0 would give up every delivery at once")?;
        }
        if let Some(output) = &self.output {
            crate::output::check(&output.schema())
                .map_err(|problem| path.key("output").key(&problem.part.to_string()).invalid(problem.why))?;
        }
        if let Some(ms) = self.tool_deadline_ms {
            positive(path, "tool_deadline_ms", ms, "a deadline of 0 would fail every call")?;
        }
        if let Some(ms) = self.approval_timeout_ms {
            positive(path, "approval_timeout_ms", ms, "0 would decide every call before anyone could")?;
        }
        if let Some(n) = self.max_steps_per_turn {
            positive(path, "max_steps_per_turn", u64::from(n), "0 would end every turn before its first step")?;
        }
        if let Some(n) = self.context_budget_tokens {
            positive(
                path,
                "context_budget_tokens",
                n,
                "0 would compact before every step; leave it out to never compact",
            )?;
        }
        Ok(())
    }
}

/// A map key must be a usable name, and an entry built in code must carry its key as its name.
fn check_name(path: &KeyPath, key: &str, name: &str, ok: bool, rule: &str) -> Result<(), Invalid> {
    if !ok {
        return Err(path.invalid(format!("not a valid name (allowed: {rule})")));
    }
    if name != key {
        return Err(path.invalid(format!(
            "the entry's name is {name:?} but its key is {key:?}; call Config::normalize after building a configuration in code"
        )));
    }
    Ok(())
}
