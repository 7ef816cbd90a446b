//! The gateway's service as this adapter calls it: each method is the `turnstile.v1.Agent` RPC of the same
//! name, called in process with the HTTP caller's `authorization` as gRPC metadata, so the caller is
//! authenticated, confined to its tenant, rate limited and validated exactly as a gRPC client is.

use axum::http::HeaderMap;
use tokio_stream::StreamExt;
use tonic::Request;
use tonic::metadata::MetadataValue;
use turnstile_gateway::Gateway;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::Agent;

use super::error::ApiError;

/// A Watch stream as the gateway serves it.
pub type Watch = turnstile_gateway::watch_buffer::ItemStream;

/// One HTTP caller's view of the gateway.
#[derive(Clone)]
pub struct Api {
    gateway: Gateway,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
}

/// A session of the caller's tenant (the gateway fills the tenant in from the token).
pub fn session(id: &str) -> Option<pb::SessionRef> {
    Some(pb::SessionRef { tenant: String::new(), id: id.to_owned() })
}

impl Api {
    /// `headers`' `Authorization` travels as is; a value that is not visible ASCII is as good as none.
    pub fn new(gateway: &Gateway, headers: &HeaderMap) -> Self {
        let authorization = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| MetadataValue::try_from(v).ok());
        Self { gateway: gateway.clone(), authorization }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request
    }

    pub async fn get_session(&self, id: &str) -> Result<pb::SessionInfo, ApiError> {
        let req = pb::GetSessionRequest { session: session(id) };
        Ok(self.gateway.get_session(self.request(req)).await?.into_inner())
    }

    /// The session's info, or `None` when it has no events yet.
    pub async fn find_session(&self, id: &str) -> Result<Option<pb::SessionInfo>, ApiError> {
        let req = pb::GetSessionRequest { session: session(id) };
        match self.gateway.get_session(self.request(req)).await {
            Ok(info) => Ok(Some(info.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status.into()),
        }
    }

    pub async fn configure(&self, id: &str, agent: &str, inject_mode: i32) -> Result<pb::SessionInfo, ApiError> {
        let req =
            pb::ConfigureSessionRequest { session: session(id), agent: agent.to_owned(), inject_mode, version: 0 };
        Ok(self.gateway.configure_session(self.request(req)).await?.into_inner())
    }

    pub async fn set_labels(
        &self,
        id: &str,
        labels: Vec<(String, String)>,
        remove_keys: Vec<String>,
    ) -> Result<pb::SessionInfo, ApiError> {
        let req = pb::SetLabelsRequest { session: session(id), labels: labels.into_iter().collect(), remove_keys };
        Ok(self.gateway.set_labels(self.request(req)).await.map_err(|s| ApiError::from(s).at("metadata"))?.into_inner())
    }

    /// Delivers `message` with `delivery`'s preset.
    pub async fn deliver(
        &self,
        id: &str,
        message: pb::UserMessage,
        delivery: Delivery,
    ) -> Result<pb::SendReply, ApiError> {
        let req = pb::DeliverRequest { session: session(id), message: Some(message) };
        let reply = match delivery {
            Delivery::Followup => self.gateway.followup(self.request(req)).await,
            Delivery::Queue => self.gateway.queue(self.request(req)).await,
            Delivery::Inject => self.gateway.inject(self.request(req)).await,
            Delivery::Interrupt => self.gateway.interrupt(self.request(req)).await,
            Delivery::Steer => {
                let steer = pb::SteerRequest { session: req.session, message: req.message, ..Default::default() };
                self.gateway.steer(self.request(steer)).await
            }
        };
        Ok(reply.map_err(|s| ApiError::from(s).at("input"))?.into_inner())
    }

    /// Decides a call awaiting approval (SPEC §9); answers the seq of the durable `tool/decision`.
    pub async fn decide(&self, id: &str, call_id: &str, approve: bool, reason: &str) -> Result<u64, ApiError> {
        let req =
            pb::DecideRequest { session: session(id), call_id: call_id.to_owned(), approve, reason: reason.to_owned() };
        Ok(self.gateway.decide(self.request(req)).await?.into_inner().seq)
    }

    pub async fn cancel(&self, id: &str) -> Result<u64, ApiError> {
        let req = pb::CancelRequest { session: session(id), cause: None, keep_inbox: true };
        Ok(self.gateway.cancel(self.request(req)).await?.into_inner().seq)
    }

    /// Removes a pending message; `false` when it is no longer pending.
    pub async fn remove(&self, id: &str, message_id: &str) -> Result<bool, ApiError> {
        let req = pb::RemoveRequest { session: session(id), id: message_id.to_owned() };
        match self.gateway.remove(self.request(req)).await {
            Ok(_) => Ok(true),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(status) => Err(status.into()),
        }
    }

    pub async fn delete_session(&self, id: &str) -> Result<(), ApiError> {
        let req = pb::DeleteSessionRequest { session: session(id) };
        self.gateway.delete_session(self.request(req)).await?;
        Ok(())
    }

    /// Authenticates the caller (and counts the request against its quota) without reading anything.
    pub async fn authenticate(&self) -> Result<(), ApiError> {
        let req = pb::ListSessionsRequest { page_size: 1, ..Default::default() };
        self.gateway.list_sessions(self.request(req)).await?;
        Ok(())
    }

    /// The session's events after `after_seq`, then `caught_up`, then (with `live`) the tail.
    pub async fn watch(&self, id: &str, after_seq: u64, live: bool) -> Result<Watch, ApiError> {
        let req = pb::WatchRequest { session: session(id), after_seq, live, resume: None };
        Ok(self.gateway.watch(self.request(req)).await?.into_inner())
    }
}

/// The next item of a Watch; its end is an error (the gateway ends streams only when shutting down).
pub async fn next(watch: &mut Watch) -> Result<pb::WatchItem, ApiError> {
    match watch.next().await {
        Some(item) => Ok(item?),
        None => Err(tonic::Status::unavailable("the session's stream ended; retry, the response is durable").into()),
    }
}

/// How a request's message is delivered (SPEC §2): `followup` unless the request's `delivery` field (or
/// `metadata.turnstile_delivery`) names another preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    Followup,
    Queue,
    Steer,
    Inject,
    Interrupt,
}

impl Delivery {
    pub fn parse(value: &str, param: &str) -> Result<Self, ApiError> {
        Ok(match value {
            "followup" => Self::Followup,
            "queue" => Self::Queue,
            "steer" => Self::Steer,
            "inject" => Self::Inject,
            "interrupt" => Self::Interrupt,
            other => {
                return Err(ApiError::invalid(
                    param,
                    format!("{param} is {other:?}; allowed: followup, queue, steer, inject, interrupt"),
                ));
            }
        })
    }
}
