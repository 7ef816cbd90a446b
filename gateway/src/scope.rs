//! The one tenancy rule (decision 0092): every RPC passes through [`Gateway::open`] (or, for a stream whose
//! tenant comes in its first message, [`Gateway::caller`] then [`Gateway::confine`]), which
//!
//! 1. authenticates the call ([`Authenticator::authenticate`](crate::auth::Authenticator::authenticate))
//!    and checks the role the request needs ([`Scoped::ROLE`]);
//! 2. resolves the tenant the call acts in ([`Scope::tenant`]): the caller's own when its token confines
//!    it ([`Caller::confined_to`]), else the tenant the request names, else the default tenant;
//! 3. confines what the request names to it: an empty `session.tenant` becomes the call's tenant; a
//!    session of another tenant is NOT_FOUND with the very message of a session that does not exist (a
//!    caller learns nothing about other tenants); a `tenant` field naming another tenant is
//!    PERMISSION_DENIED (the caller named it, so nothing is revealed by saying no);
//! 4. admits the call against the tenant's request quota.
//!
//! The resolved tenant is a [`Tenant`], so nothing after this point checks a tenant name again.

use tonic::{Request, Status};
use turnstile_model::Tenant;
use turnstile_proto::v1 as pb;

use crate::auth::{Caller, Role};
use crate::read;
use crate::service::Gateway;

/// Who made a call and the tenant it acts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Scope {
    pub(crate) caller: Caller,
    pub(crate) tenant: Tenant,
}

/// What a request names, so that [`Gateway::confine`] can confine it.
pub(crate) trait Scoped {
    /// The role a caller needs for this request.
    const ROLE: Role = Role::Member;

    /// The sessions the request names.
    fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
        Vec::new()
    }

    /// A tenant the request names outside any session (`ListSessions.tenant`, `GetUsage.tenant`, …).
    fn tenant(&mut self) -> Option<&mut String> {
        None
    }
}

impl Gateway {
    /// The tenancy rule for a unary request (and a stream whose first request names what it touches):
    /// the call's [`Scope`] and the request, confined to it.
    pub(crate) async fn open<T: Scoped>(&self, request: Request<T>) -> Result<(Scope, T), Status> {
        let caller = self.caller(request.metadata(), T::ROLE)?;
        let mut req = request.into_inner();
        let scope = self.confine(caller, &mut req).await?;
        Ok((scope, req))
    }

    /// The tenant a caller acts in when its request names nothing (the rule's steps 1, 2 and 4), for the
    /// agent protocols (SPEC §19), which answer per tenant: which agents a tenant may run, its tasks.
    pub async fn caller_tenant(&self, metadata: &tonic::metadata::MetadataMap) -> Result<String, Status> {
        let caller = self.caller(metadata, Role::Member)?;
        let scope = self.confine(caller, &mut NamesNothing).await?;
        Ok(scope.tenant.into_string())
    }

    /// Steps 1 of the rule alone, for a client stream whose tenant comes in its first message: the caller,
    /// UNAUTHENTICATED without valid credentials, PERMISSION_DENIED without `role`.
    pub(crate) fn caller(&self, metadata: &tonic::metadata::MetadataMap, role: Role) -> Result<Caller, Status> {
        let caller = self.auth.authenticate(metadata)?;
        if !caller.holds(role) {
            let how = match role {
                Role::Member => "a valid token",
                Role::Admin => {
                    "an administrator's token: a `TOKEN TENANT admin` line of --auth-tokens, or a JWT with \"admin\": true"
                }
                Role::ClusterAdmin => {
                    "a cluster administrator's token: a `TOKEN TENANT cluster_admin` line of --auth-tokens, or a JWT \
                     with \"cluster_admin\": true"
                }
            };
            return Err(Status::permission_denied(format!("this call needs {how}")));
        }
        Ok(caller)
    }

    /// Steps 2–4 of the rule: the tenant `caller`'s call acts in, with `req` confined to it and the call
    /// admitted by the tenant's quota.
    pub(crate) async fn confine(&self, caller: Caller, req: &mut impl Scoped) -> Result<Scope, Status> {
        let named = req.tenant().filter(|t| !t.is_empty()).cloned();
        let own = caller.confined_to().cloned();
        if let (Some(own), Some(named)) = (&own, &named)
            && named != own.as_str()
        {
            return Err(Status::permission_denied(format!(
                "tenant: your credentials are for tenant {own:?} and act only within it; leave tenant empty (only a \
                 cluster_admin token may name another tenant)"
            )));
        }
        // The call's own session (the first named); a second one (ReferenceSession's `from_session`) is
        // only confined.
        let first_session = req.sessions().first().map(|s| s.tenant.clone()).filter(|t| !t.is_empty());
        let name = match (own, named, first_session) {
            (Some(own), _, _) => own.into_string(),
            (None, Some(named), _) => named,
            (None, None, Some(session)) => session,
            (None, None, None) => match caller.tenant() {
                // A cluster admin naming nothing acts in its own tenant.
                Some(tenant) => tenant.as_str().to_owned(),
                None => self.config.default_tenant.clone(),
            },
        };
        let tenant = Tenant::new(name).map_err(|e| Status::invalid_argument(format!("tenant: {e}")))?;
        let confined = caller.confined_to().is_some();
        for raw in req.sessions() {
            if raw.tenant.is_empty() {
                raw.tenant = tenant.as_str().to_owned();
            } else if confined && raw.tenant != tenant.as_str() {
                // Malformed names are still INVALID_ARGUMENT, as for the caller's own tenant.
                let named = self.session(Some(raw.clone()))?;
                return Err(read::not_found(&named));
            }
        }
        self.quotas.admit(tenant.as_str()).await?;
        Ok(Scope { caller, tenant })
    }
}

/// A request that names no session and no tenant: the caller's own tenant.
struct NamesNothing;

impl Scoped for NamesNothing {}

/// Requests that name sessions in fields called `session` (and more, listed after `;`).
macro_rules! scoped {
    ($($t:ty $(; $extra:ident)*),+ $(,)?) => {
        $(impl Scoped for $t {
            fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
                [self.session.as_mut() $(, self.$extra.as_mut())*].into_iter().flatten().collect()
            }
        })+
    };
}

scoped!(
    pb::SendRequest,
    pb::DeliverRequest,
    pb::SteerRequest,
    pb::CancelRequest,
    pb::ReplaceRequest,
    pb::RemoveRequest,
    pb::SpliceRequest,
    pb::ClearRequest,
    pb::GetInboxRequest,
    pb::GetSessionRequest,
    pb::ConfigureSessionRequest,
    pb::DecideRequest,
    pb::SetGoalRequest,
    pb::UpdateGoalRequest,
    pb::WatchRequest,
    pb::WhenIdleRequest,
    pb::CompactRequest,
    pb::ForkSessionRequest,
    pb::ReferenceSessionRequest; from_session,
    // Session lifecycle (SPEC §12).
    pb::DeleteSessionRequest,
    // Schedules and labels (SPEC §15, §16).
    pb::CreateScheduleRequest,
    pb::DeleteScheduleRequest,
    pb::SetLabelsRequest,
    // What an application reads (SPEC §21).
    pb::GetTranscriptRequest,
    // Client tools of a turn (SPEC §19).
    pb::CompleteToolCallRequest,
);

impl Scoped for pb::ListSchedulesRequest {
    fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
        self.session.as_mut().into_iter().collect()
    }

    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.tenant)
    }
}

impl Scoped for pb::ListPendingApprovalsRequest {
    fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
        self.session.as_mut().into_iter().collect()
    }

    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.tenant)
    }
}

// A tenant's own, named by the request's `tenant` (empty: the caller's).
macro_rules! tenant_scoped {
    ($($request:ty),*) => {$(
        impl Scoped for $request {
            fn tenant(&mut self) -> Option<&mut String> {
                Some(&mut self.tenant)
            }
        }
    )*};
}

// Webhooks registered at run time (SPEC §21).
tenant_scoped!(pb::CreateWebhookRequest, pb::ListWebhooksRequest, pb::DeleteWebhookRequest);

// Memory (SPEC §20).
tenant_scoped!(
    pb::PutMemoryRequest,
    pb::GetMemoryRequest,
    pb::ListMemoryRequest,
    pb::SearchMemoryRequest,
    pb::DeleteMemoryRequest
);

// Sessions listed (SPEC §16) and token usage read (§17).
tenant_scoped!(pb::ListSessionsRequest, pb::GetUsageRequest);

// Agents (SPEC §20): in the caller's tenant, which names none of its own.
impl Scoped for pb::PutAgentRequest {}
impl Scoped for pb::GetAgentRequest {}
impl Scoped for pb::ListAgentsRequest {}
impl Scoped for pb::DeleteAgentRequest {}
impl Scoped for pb::ListAgentVersionsRequest {}

impl Scoped for pb::MigrateSessionsRequest {
    fn sessions(&mut self) -> Vec<&mut pb::SessionRef> {
        self.sessions.iter_mut().collect()
    }
}

impl Scoped for pb::ExportSessionsRequest {
    const ROLE: Role = Role::Admin;

    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.tenant)
    }
}

/// `ImportSessions`: the export's header names the tenant its sessions go into.
impl Scoped for pb::ExportHeader {
    const ROLE: Role = Role::Admin;

    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.tenant)
    }
}

/// `ServeTools`: the stream names no session; the `turnstile-tenant` header names a tenant (the only way
/// to name one when auth is off).
pub(crate) struct ToolsTenant(pub(crate) String);

impl Scoped for ToolsTenant {
    fn tenant(&mut self) -> Option<&mut String> {
        Some(&mut self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_session_names_both_of_its_sessions() {
        let mut req = pb::ReferenceSessionRequest {
            session: Some(pb::SessionRef { tenant: String::new(), id: "a".into() }),
            from_session: Some(pb::SessionRef { tenant: "t".into(), id: "b".into() }),
            ..Default::default()
        };
        let ids: Vec<String> = req.sessions().into_iter().map(|s| s.id.clone()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(req.tenant().is_none());
    }
}
