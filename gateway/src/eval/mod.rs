//! `Evaluate` (SPEC §20, decision 0167): a tenant's recorded turns rerun on another agent version and
//! scored beside their recording.
//!
//! The request is checked and its turns selected here, before the stream opens (so a bad request is one
//! typed error, not a stream); then [`run::start`] runs them. Modules: [`turns`] reads what a turn was
//! from its events, [`scratch`] keeps the scratch sessions a run creates and deletes them, [`scorer`]
//! scores (with [`hook`] for the remote hook), [`summary`] totals the rows.
//!
//! Tenancy: the call acts in the tenant [`Gateway::open`] resolved. Sessions come from that tenant's
//! index entries or, when named, are confined to it like any session a request names; agents are looked
//! up as that tenant sees them; scratch sessions are created in it.

mod hook;
mod run;
mod scorer;
mod scratch;
mod summary;
mod turns;

use std::time::Duration;

use tonic::Status;
use turnstile_journal::log::read_all;
use turnstile_model::Tenant;
use turnstile_model::labels::Selector;
use turnstile_model::message::SessionRef;
use turnstile_proto::v1 as pb;

pub use scratch::EVAL_LABEL;

use crate::scope::Scoped;
use crate::service::Gateway;
use crate::{read, status};

/// `parallel` when the request says 0, and the most.
pub const DEFAULT_PARALLEL: u32 = 4;
pub const MAX_PARALLEL: u32 = 16;
/// `max_turns` when the request says 0, and the most.
pub const DEFAULT_MAX_TURNS: u32 = 100;
pub const MAX_TURNS: u32 = 1000;
/// `turn_timeout_ms` when the request says 0, and the most.
pub const DEFAULT_TURN_TIMEOUT_MS: u64 = 120_000;
pub const MAX_TURN_TIMEOUT_MS: u64 = 3_600_000;

/// The error of a row not run because the tenant's daily token budget is used up.
pub(crate) const BUDGET_USED_UP: &str =
    "not run: the tenant's daily token budget is used up (config tenants.NAME.token_budget; GetUsage shows it)";

impl Scoped for pb::EvaluateRequest {
    fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
        self.sessions.iter_mut().collect()
    }

    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.tenant)
    }
}

impl Gateway {
    /// `Evaluate` in `tenant`: checks the request, selects its turns and starts the run.
    pub(crate) async fn evaluate_in(
        &self,
        tenant: &Tenant,
        req: pb::EvaluateRequest,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<pb::EvaluateItem, Status>>, Status> {
        if req.agent.is_empty() {
            return Err(Status::invalid_argument(
                "agent: is empty; name the agent to run the turns on (ListAgents lists yours)",
            ));
        }
        let scorer = scorer::Scorer::from_request(req.scorer.clone())?;
        let parallel = status::bounded("parallel", req.parallel, DEFAULT_PARALLEL, MAX_PARALLEL)?;
        let parallel = self.quotas.burst_of(tenant.as_str()).map_or(parallel, |burst| parallel.min(burst.max(1)));
        let max_turns = status::bounded("max_turns", req.max_turns, DEFAULT_MAX_TURNS, MAX_TURNS)?;
        let timeout_ms =
            status::bounded("turn_timeout_ms", req.turn_timeout_ms, DEFAULT_TURN_TIMEOUT_MS, MAX_TURN_TIMEOUT_MS)?;
        if req.last_turn > 0 && req.first_turn > req.last_turn {
            return Err(Status::invalid_argument(format!(
                "first_turn {} is after last_turn {}; no turn could be taken",
                req.first_turn, req.last_turn
            )));
        }
        let mut candidate = self.eval_profile(tenant, "agent", &req.agent, req.version).await?;
        // Another model is a session override: the agent must allow it (`[agents.NAME.overrides] models`), and
        // a scratch session's configure refuses it otherwise, naming `overrides.model`.
        candidate.model = (!req.model.is_empty()).then(|| req.model.clone());
        let judge = match &scorer {
            scorer::Scorer::Judge { agent, version, .. } => {
                Some(self.eval_profile(tenant, "scorer.judge.agent", agent, version.unwrap_or(0)).await?)
            }
            _ => None,
        };
        let hook = match &scorer {
            scorer::Scorer::Hook { url, timeout_ms } => {
                Some(hook::HookClient::new(url, *timeout_ms, self.config.allow_private_webhooks).await?)
            }
            _ => None,
        };
        let selected = self.select_turns(tenant, &req, max_turns as usize).await?;
        let run_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let plan = run::Plan {
            tenant: tenant.clone(),
            run_id,
            candidate,
            judge,
            scorer,
            hook,
            parallel: parallel as usize,
            turn_timeout: Duration::from_millis(timeout_ms),
            selected,
        };
        Ok(run::start(self.clone(), plan))
    }

    /// `agent` at `version` as `tenant` sees it: NOT_FOUND for one it cannot see, INVALID_ARGUMENT for a
    /// version it does not have (`field` names the request's field).
    async fn eval_profile(
        &self,
        tenant: &Tenant,
        field: &str,
        agent: &str,
        version: u64,
    ) -> Result<scratch::Profile, Status> {
        let record = match &self.agents {
            Some(defs) => Some(defs.find(tenant.as_str(), agent).await?.ok_or_else(|| {
                Status::not_found(format!(
                    "{field}: agent {agent:?} not found; ListAgents lists the agents you can use"
                ))
            })?),
            None => None,
        };
        let version = self.version_to_configure(tenant.as_str(), agent, version).await?;
        // A session runs a version other than the newest only when that version pins (SPEC §20): a scratch
        // session is no exception, and a run that silently took the newest would score the wrong version.
        if let (Some(record), Some(v)) = (&record, version)
            && record.latest().is_some_and(|latest| latest.version != v)
            && let Some(asked) = record.version(v)
            && crate::agents::encode(record, asked).version_policy != "pin"
        {
            return Err(Status::failed_precondition(format!(
                "{field}: version {v} of agent {agent:?} does not pin (version_policy = \"latest\"), so a session \
                 runs its newest version instead; evaluate the newest, or put versions with version_policy = \"pin\""
            )));
        }
        Ok(scratch::Profile { agent: agent.to_owned(), version, model: None })
    }

    /// The sessions the request names, else those its selector selects in `tenant` (never another run's
    /// scratch sessions), by id.
    async fn eval_sessions(&self, tenant: &Tenant, req: &pb::EvaluateRequest) -> Result<Vec<SessionRef>, Status> {
        if !req.sessions.is_empty() {
            return req.sessions.iter().map(|s| self.session(Some(s.clone()))).collect();
        }
        let index = self.index.as_ref().ok_or_else(|| {
            Status::failed_precondition("this gateway has no session index; name the sessions instead of a selector")
        })?;
        let selector = Selector::parse(&req.label_selector)
            .map_err(|e| Status::invalid_argument(format!("label_selector: {e}")))?;
        let query = turnstile_journal::index::Query {
            tenant: Some(tenant.as_str().to_owned()),
            selector,
            ..Default::default()
        };
        let mut sessions: Vec<SessionRef> = index
            .query(&query)
            .into_iter()
            .filter(|e| !e.summary.labels.contains_key(EVAL_LABEL))
            .map(|e| e.session)
            .collect();
        sessions.sort();
        Ok(sessions)
    }

    /// The ended turns of the selected sessions within the request's range, in session then turn order;
    /// INVALID_ARGUMENT when there are none or more than `max_turns`.
    async fn select_turns(
        &self,
        tenant: &Tenant,
        req: &pb::EvaluateRequest,
        max_turns: usize,
    ) -> Result<Vec<run::Selected>, Status> {
        let first = req.first_turn.max(1);
        let last = if req.last_turn == 0 { u64::MAX } else { req.last_turn };
        let mut selected = Vec::new();
        for session in self.eval_sessions(tenant, req).await? {
            let events = read_all(self.log.as_ref(), &session, 1).await.map_err(status::from_journal)?;
            if events.is_empty() && !req.sessions.is_empty() {
                return Err(read::not_found(&session));
            }
            for record in turns::ended_turns(&events).into_values() {
                if (first..=last).contains(&record.turn) && !record.input.is_empty() {
                    selected.push(run::Selected { session: session.clone(), record });
                }
            }
            if selected.len() > max_turns {
                return Err(Status::invalid_argument(format!(
                    "the selection holds more than max_turns ({max_turns}) turns; narrow label_selector or the turn \
                     range, or raise max_turns (at most {MAX_TURNS})"
                )));
            }
        }
        if selected.is_empty() {
            return Err(Status::invalid_argument(format!(
                "the selection holds no ended turn (turns {first} to {}); check label_selector, sessions and the \
                 turn range",
                if req.last_turn == 0 { "the last".to_owned() } else { req.last_turn.to_string() }
            )));
        }
        Ok(selected)
    }

    /// Whether `tenant` has a daily token budget (SPEC §17) and has used it up today.
    pub(crate) async fn budget_used_up(&self, tenant: &Tenant) -> bool {
        let (Some(ledger), Some(budget)) = (&self.usage, self.config.token_budgets.get(tenant.as_str())) else {
            return false;
        };
        let now = turnstile_ops::clock::now_ms();
        match crate::usage::tenant_usage(ledger.as_ref(), tenant, now, *budget, now).await {
            Ok(usage) => usage.used_today >= *budget,
            // Unknown usage does not stop a run: the owners check the budget before each model request.
            Err(_) => false,
        }
    }
}
