//! `agent put|get|list|versions|delete|migrate` (SPEC §20): agents as versioned objects of the tenant.

use anyhow::{Context, Result};
use turnstile_proto::v1 as pb;

use crate::args::{AgentMigrateArgs, AgentPutArgs};
use crate::client::Client;

fn agent_line(a: &pb::AgentInfo) -> String {
    let owner = if a.from_file { " (configuration file)" } else { "" };
    let deleted = if a.deleted { " deleted" } else { "" };
    format!(
        "{} v{} of {} {} policy={}{owner}{deleted} {}",
        a.name,
        a.version,
        a.latest_version,
        &a.hash[..a.hash.len().min(12)],
        a.version_policy,
        a.definition
    )
}

/// `agent put NAME FILE`: the file holds the keys of an `[agents.NAME]` table, as TOML or as a JSON object
/// (by its extension, `.json`, or a leading `{`); `-` reads stdin.
pub async fn put(client: &mut Client, a: AgentPutArgs) -> Result<()> {
    let definition = if a.file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the definition from stdin")?
    } else {
        std::fs::read_to_string(&a.file).with_context(|| format!("reading the definition {}", a.file))?
    };
    let format = if a.file.ends_with(".json") {
        pb::DefinitionFormat::Json
    } else if a.file.ends_with(".toml") {
        pb::DefinitionFormat::Toml
    } else {
        pb::DefinitionFormat::Unspecified
    };
    let request = pb::PutAgentRequest { name: a.name, definition, format: format.into() };
    let agent = client.api.put_agent(request).await?.into_inner();
    client.print(&agent, &[], agent_line)
}

pub async fn get(client: &mut Client, name: &str, version: u64) -> Result<()> {
    let agent = client.api.get_agent(pb::GetAgentRequest { name: name.to_owned(), version }).await?.into_inner();
    client.print(&agent, &[], agent_line)
}

pub async fn list(client: &mut Client) -> Result<()> {
    let reply = client.api.list_agents(pb::ListAgentsRequest {}).await?.into_inner();
    for agent in &reply.agents {
        client.print(agent, &[], agent_line)?;
    }
    Ok(())
}

pub async fn versions(client: &mut Client, name: &str) -> Result<()> {
    let reply =
        client.api.list_agent_versions(pb::ListAgentVersionsRequest { name: name.to_owned() }).await?.into_inner();
    for agent in &reply.versions {
        client.print(agent, &[], agent_line)?;
    }
    Ok(())
}

pub async fn delete(client: &mut Client, name: &str) -> Result<()> {
    let agent = client.api.delete_agent(pb::DeleteAgentRequest { name: name.to_owned() }).await?.into_inner();
    client.print(&agent, &[], agent_line)
}

/// `agent migrate AGENT --to N (--label SELECTOR | SESSION…)`.
pub async fn migrate(client: &mut Client, a: AgentMigrateArgs) -> Result<()> {
    let request = pb::MigrateSessionsRequest {
        sessions: a.sessions.iter().map(|s| client.session(s)).collect(),
        label_selector: a.label.unwrap_or_default(),
        agent: a.agent,
        to_version: a.to,
    };
    let reply = client.api.migrate_sessions(request).await?.into_inner();
    client.print(&reply, &[], |r| {
        let ids = |s: &[pb::SessionRef]| s.iter().map(|s| s.id.clone()).collect::<Vec<_>>().join(" ");
        format!("migrated: {}\nskipped: {}", ids(&r.migrated), ids(&r.skipped))
    })
}
