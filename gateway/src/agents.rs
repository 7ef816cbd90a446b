//! Agents as durable, versioned, tenant-scoped objects (SPEC §20, decision 0120): `PutAgent`, `GetAgent`,
//! `ListAgents`, `DeleteAgent`, `ListAgentVersions` and `MigrateSessions`, and the version
//! `ConfigureSession` records.
//!
//! A tenant sees its own agents and the file's agents that serve it; its own shadow a file agent of the
//! same name. Another tenant's agent does not exist for it: every call naming one answers exactly as for a
//! name nobody uses (NOT_FOUND). Definitions are checked by the configuration's own code
//! ([`turnstile_config::Config::agent_definition`]), so the API refuses what the file refuses, with the
//! same key and message.

use tonic::Status;
use turnstile_config::DefinitionFormat;
use turnstile_journal::agents::{self, AgentOwner, AgentRecord, AgentVersion};
use turnstile_model::message::SessionRef;
use turnstile_model::{Command, CommandError, Tenant};
use turnstile_proto::v1 as pb;

pub use crate::agent_definitions::AgentDefinitions;
use crate::service::Gateway;
use crate::status;

/// The one answer for an agent the caller cannot see, whether it exists elsewhere or nowhere.
fn not_found(name: &str) -> Status {
    Status::not_found(format!("agent {name:?} not found; ListAgents lists the agents you can use"))
}

/// A record the tenant may read: its own, or a file agent whose newest version serves it.
fn visible(record: &AgentRecord, tenant: &str) -> bool {
    if record.deleted {
        return false;
    }
    match &record.owner {
        AgentOwner::Tenant(owner) => owner == tenant,
        AgentOwner::File => {
            record.latest().is_some_and(|v| v.tenants.as_ref().is_none_or(|t| t.iter().any(|t| t == tenant)))
        }
    }
}

/// `version_policy` as a definition writes it (`latest` when it does not).
fn policy_of(definition: &str) -> String {
    serde_json::from_str::<serde_json::Value>(definition)
        .ok()
        .and_then(|v| v.get("version_policy").and_then(|p| p.as_str()).map(str::to_owned))
        .unwrap_or_else(|| "latest".to_owned())
}

/// One version of `record` on the wire.
pub(crate) fn encode(record: &AgentRecord, version: &AgentVersion) -> pb::AgentInfo {
    pb::AgentInfo {
        name: record.name.clone(),
        version: version.version,
        hash: version.hash.clone(),
        definition: version.definition.clone(),
        from_file: record.owner == AgentOwner::File,
        tenants: version.tenants.clone().unwrap_or_default(),
        created_unix_ms: version.created_unix_ms,
        version_policy: policy_of(&version.definition),
        deleted: record.deleted,
        latest_version: record.latest().map_or(0, |v| v.version),
    }
}

impl AgentDefinitions {
    /// The agent `name` as `tenant` sees it: its own, else the file's that serves it.
    pub(crate) async fn find(&self, tenant: &str, name: &str) -> Result<Option<AgentRecord>, Status> {
        for owner in [AgentOwner::Tenant(tenant.to_owned()), AgentOwner::File] {
            let key = agents::agent_key(&owner, name);
            if let Some((record, _)) = self.store.load(&key).await.map_err(status::from_journal)?
                && visible(&record, tenant)
            {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }
}

impl Gateway {
    fn definitions(&self) -> Result<&AgentDefinitions, Status> {
        self.agents.as_ref().ok_or_else(|| {
            Status::unimplemented("this gateway keeps no agent definitions (it was started without an agent store)")
        })
    }

    pub(crate) async fn put_agent_in(
        &self,
        tenant: &Tenant,
        req: pb::PutAgentRequest,
    ) -> Result<pb::AgentInfo, Status> {
        let defs = self.definitions()?;
        let format = match pb::DefinitionFormat::try_from(req.format) {
            Ok(pb::DefinitionFormat::Toml) => DefinitionFormat::Toml,
            Ok(pb::DefinitionFormat::Json) => DefinitionFormat::Json,
            Ok(pb::DefinitionFormat::Unspecified) if req.definition.trim_start().starts_with('{') => {
                DefinitionFormat::Json
            }
            Ok(pb::DefinitionFormat::Unspecified) => DefinitionFormat::Toml,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "format: {} is not a format; use DEFINITION_FORMAT_TOML, DEFINITION_FORMAT_JSON or leave it \
                     unspecified",
                    req.format
                )));
            }
        };
        let agent = defs
            .config
            .agent_definition(&req.name, format, &req.definition)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Some(record) = defs.find(tenant.as_str(), &req.name).await?
            && record.owner == AgentOwner::File
        {
            return Err(Status::failed_precondition(format!(
                "agent {:?} is defined by the configuration file; change it there, or put an agent of another name",
                req.name
            )));
        }
        let owner = AgentOwner::Tenant(tenant.as_str().to_owned());
        let now = turnstile_ops::clock::now_ms();
        let put = agents::put(defs.store.as_ref(), &owner, &req.name, &agent.definition, None, now)
            .await
            .map_err(status::from_journal)?;
        let latest =
            put.record.latest().ok_or_else(|| Status::internal("a put agent has no version; this is a bug"))?;
        Ok(encode(&put.record, latest))
    }

    pub(crate) async fn get_agent_in(
        &self,
        tenant: &Tenant,
        req: pb::GetAgentRequest,
    ) -> Result<pb::AgentInfo, Status> {
        let defs = self.definitions()?;
        let record = defs.find(tenant.as_str(), &req.name).await?.ok_or_else(|| not_found(&req.name))?;
        let version = match req.version {
            0 => record.latest(),
            v => record.version(v),
        };
        let version = version.ok_or_else(|| {
            Status::not_found(format!(
                "agent {:?} has no version {}; ListAgentVersions lists its versions",
                req.name, req.version
            ))
        })?;
        Ok(encode(&record, version))
    }

    pub(crate) async fn list_agents_in(&self, tenant: &Tenant) -> Result<pb::ListAgentsReply, Status> {
        let defs = self.definitions()?;
        let all = defs.store.list().await.map_err(status::from_journal)?;
        let mut by_name: std::collections::BTreeMap<&str, &AgentRecord> = std::collections::BTreeMap::new();
        for record in all.iter().filter(|r| visible(r, tenant.as_str())) {
            // The tenant's own shadows the file's of the same name.
            let own = matches!(record.owner, AgentOwner::Tenant(_));
            by_name
                .entry(&record.name)
                .and_modify(|r| {
                    if own {
                        *r = record
                    }
                })
                .or_insert(record);
        }
        let agents = by_name.values().filter_map(|r| r.latest().map(|v| encode(r, v))).collect();
        Ok(pb::ListAgentsReply { agents })
    }

    pub(crate) async fn delete_agent_in(&self, tenant: &Tenant, name: &str) -> Result<pb::AgentInfo, Status> {
        let defs = self.definitions()?;
        let record = defs.find(tenant.as_str(), name).await?.ok_or_else(|| not_found(name))?;
        if record.owner == AgentOwner::File {
            return Err(Status::failed_precondition(format!(
                "agent {name:?} is defined by the configuration file; remove it there"
            )));
        }
        let deleted = agents::delete(defs.store.as_ref(), &record.owner, name).await.map_err(status::from_journal)?;
        let deleted = deleted.ok_or_else(|| not_found(name))?;
        let latest =
            deleted.latest().ok_or_else(|| Status::internal("a deleted agent has no version; this is a bug"))?;
        Ok(encode(&deleted, latest))
    }

    pub(crate) async fn list_agent_versions_in(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<pb::ListAgentVersionsReply, Status> {
        let defs = self.definitions()?;
        let record = defs.find(tenant.as_str(), name).await?.ok_or_else(|| not_found(name))?;
        Ok(pb::ListAgentVersionsReply { versions: record.versions.iter().map(|v| encode(&record, v)).collect() })
    }

    /// The version `ConfigureSession` records: the one asked for (which must exist), else the newest; `None`
    /// without an agent store, or for an agent the store does not hold (the driver answers for it).
    pub(crate) async fn version_to_configure(
        &self,
        tenant: &str,
        agent: &str,
        asked: u64,
    ) -> Result<Option<u64>, Status> {
        let Some(defs) = &self.agents else { return Ok((asked > 0).then_some(asked)) };
        let Some(record) = defs.find(tenant, agent).await? else { return Ok((asked > 0).then_some(asked)) };
        match asked {
            0 => Ok(record.latest().map(|v| v.version)),
            v if record.version(v).is_some() => Ok(Some(v)),
            v => Err(Status::invalid_argument(format!(
                "version: agent {agent:?} has no version {v}; ListAgentVersions lists its versions"
            ))),
        }
    }

    /// Refuses to configure a session with `agent` when the tenant deleted its own agent of that name. Called
    /// only when [`Self::version_to_configure`] found no version, so no file agent serves the name either
    /// (the file's would have shown through the tombstone). The store says so at once; the workers'
    /// catalogs hear of the deletion through their watch a moment later, and a `Configure` sent meanwhile
    /// would still find the agent there (`DeleteAgent` hides it from `ConfigureSession` as soon as it is
    /// answered: docs/API.md).
    pub(crate) async fn refuse_deleted(&self, tenant: &str, agent: &str) -> Result<(), Status> {
        let Some(defs) = &self.agents else { return Ok(()) };
        let key = agents::agent_key(&AgentOwner::Tenant(tenant.to_owned()), agent);
        match defs.store.load(&key).await.map_err(status::from_journal)? {
            Some((record, _)) if record.deleted => Err(Status::invalid_argument(format!(
                "agent: {agent:?} was deleted; PutAgent brings it back as a new version, or name another agent"
            ))),
            _ => Ok(()),
        }
    }

    /// `MigrateSessions`: each selected session running `agent` records `to_version` (SPEC §20).
    pub(crate) async fn migrate_in(
        &self,
        tenant: &Tenant,
        req: pb::MigrateSessionsRequest,
    ) -> Result<pb::MigrateSessionsReply, Status> {
        if req.agent.is_empty() {
            return Err(Status::invalid_argument("agent: is empty; name the agent whose sessions to migrate"));
        }
        let Some(version) = self.version_to_configure(tenant.as_str(), &req.agent, req.to_version).await? else {
            return Err(not_found(&req.agent));
        };
        let sessions = if req.sessions.is_empty() {
            self.select_sessions(tenant, &req.label_selector, &req.agent).await?
        } else {
            req.sessions.into_iter().map(|s| self.session(Some(s))).collect::<Result<Vec<_>, _>>()?
        };
        let mut reply = pb::MigrateSessionsReply::default();
        for session in sessions {
            let command = Command::Migrate { agent: req.agent.clone(), version };
            match self.router.execute(&session, command, None).await {
                Ok(_) => reply.migrated.push(turnstile_proto::codec::encode_session_ref(&session)),
                Err(CommandError::FailedPrecondition(_)) => {
                    reply.skipped.push(turnstile_proto::codec::encode_session_ref(&session));
                }
                Err(e) => return Err(status::from_command(e)),
            }
        }
        Ok(reply)
    }

    /// The sessions of `tenant` that `selector` selects and that run `agent`, from the session index.
    async fn select_sessions(&self, tenant: &Tenant, selector: &str, agent: &str) -> Result<Vec<SessionRef>, Status> {
        let index = self.index.as_ref().ok_or_else(|| {
            Status::failed_precondition("this gateway has no session index; name the sessions instead of a selector")
        })?;
        let selector = turnstile_model::labels::Selector::parse(selector)
            .map_err(|e| Status::invalid_argument(format!("label_selector: {e}")))?;
        let query = turnstile_journal::index::Query {
            tenant: Some(tenant.as_str().to_owned()),
            agent: Some(agent.to_owned()),
            selector,
            ..Default::default()
        };
        Ok(index.query(&query).into_iter().map(|e| e.session).collect())
    }
}
