//! The gateway's service as every protocol calls it: each method is the `turnstile.v1.Agent` RPC of the same
//! name, called in process with the HTTP caller's `authorization` as gRPC metadata, so the caller is
//! authenticated, confined to its tenant, rate limited and validated exactly as a gRPC client is (SPEC §19).
//!
//! [`Api`] is generic over the protocol's error type `E` (OpenAI's `ApiError`, a JSON-RPC error, …), which
//! each protocol builds from the gateway's [`tonic::Status`] through [`ProtocolError`].

use std::marker::PhantomData;

use axum::http::HeaderMap;
use tokio_stream::StreamExt;
use tonic::Request;
use tonic::metadata::MetadataValue;
use turnstile_gateway::Gateway;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::agent_server::Agent;

/// A Watch stream as the gateway serves it.
pub type Watch = turnstile_gateway::watch_buffer::ItemStream;

/// A protocol's error, made from the gateway's answer.
pub trait ProtocolError: From<tonic::Status> {
    /// The same error naming the request field it came from, where the protocol names fields.
    fn at(self, _param: &str) -> Self {
        self
    }
}

/// One HTTP caller's view of the gateway, answering errors as `E`.
pub struct Api<E> {
    gateway: Gateway,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    error: PhantomData<fn() -> E>,
}

impl<E> Clone for Api<E> {
    fn clone(&self) -> Self {
        Self { gateway: self.gateway.clone(), authorization: self.authorization.clone(), error: PhantomData }
    }
}

/// A session of the caller's tenant (the gateway fills the tenant in from the token).
pub fn session(id: &str) -> Option<pb::SessionRef> {
    Some(pb::SessionRef { tenant: String::new(), id: id.to_owned() })
}

impl<E: ProtocolError> Api<E> {
    /// `headers`' `Authorization` travels as is; a value that is not visible ASCII is as good as none.
    pub fn new(gateway: &Gateway, headers: &HeaderMap) -> Self {
        let authorization = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| MetadataValue::try_from(v).ok());
        Self { gateway: gateway.clone(), authorization, error: PhantomData }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request
    }

    pub async fn get_session(&self, id: &str) -> Result<pb::SessionInfo, E> {
        let req = pb::GetSessionRequest { session: session(id) };
        Ok(self.gateway.get_session(self.request(req)).await?.into_inner())
    }

    /// The session's info, or `None` when it has no events yet.
    pub async fn find_session(&self, id: &str) -> Result<Option<pb::SessionInfo>, E> {
        let req = pb::GetSessionRequest { session: session(id) };
        match self.gateway.get_session(self.request(req)).await {
            Ok(info) => Ok(Some(info.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status.into()),
        }
    }

    pub async fn configure(&self, id: &str, agent: &str, inject_mode: i32) -> Result<pb::SessionInfo, E> {
        let req = pb::ConfigureSessionRequest {
            session: session(id),
            agent: agent.to_owned(),
            inject_mode,
            ..Default::default()
        };
        Ok(self.gateway.configure_session(self.request(req)).await?.into_inner())
    }

    pub async fn set_labels(
        &self,
        id: &str,
        labels: Vec<(String, String)>,
        remove_keys: Vec<String>,
    ) -> Result<pb::SessionInfo, E> {
        let req = pb::SetLabelsRequest { session: session(id), labels: labels.into_iter().collect(), remove_keys };
        Ok(self.gateway.set_labels(self.request(req)).await.map_err(|s| E::from(s).at("metadata"))?.into_inner())
    }

    /// Delivers `message` with `delivery`'s preset.
    pub async fn deliver(&self, id: &str, message: pb::UserMessage, delivery: Delivery) -> Result<pb::SendReply, E> {
        self.deliver_with(id, message, delivery, None).await
    }

    /// [`Api::deliver`] of a message whose turn must answer with `output_schema` (SPEC §20), taken from the
    /// request field `schema_param`: the gateway's refusal of the schema is answered naming that field.
    pub async fn deliver_with(
        &self,
        id: &str,
        message: pb::UserMessage,
        delivery: Delivery,
        output_schema: Option<(pb::OutputSchema, &str)>,
    ) -> Result<pb::SendReply, E> {
        let (output_schema, schema_param) = match output_schema {
            Some((schema, param)) => (Some(schema), param),
            None => (None, "input"),
        };
        // The gateway names a bad schema `output_schema.…`; everything else is the input's.
        let param = |s: &tonic::Status| {
            let schema = s.code() == tonic::Code::InvalidArgument && s.message().starts_with("output_schema.");
            if schema { schema_param } else { "input" }
        };
        let req = pb::DeliverRequest { session: session(id), message: Some(message), output_schema };
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
        Ok(reply
            .map_err(|s| {
                let at = param(&s);
                E::from(s).at(at)
            })?
            .into_inner())
    }

    /// Decides a call awaiting approval (SPEC §9); answers the seq of the durable `tool/decision`.
    pub async fn decide(&self, id: &str, call_id: &str, approve: bool, reason: &str) -> Result<u64, E> {
        let req =
            pb::DecideRequest { session: session(id), call_id: call_id.to_owned(), approve, reason: reason.to_owned() };
        Ok(self.gateway.decide(self.request(req)).await?.into_inner().seq)
    }

    /// Gives the call of a client tool of the turn its output (SPEC §19); answers the seq written.
    pub async fn complete_tool_call(
        &self,
        id: &str,
        call_id: &str,
        output: &str,
        error: Option<String>,
    ) -> Result<u64, E> {
        let req = pb::CompleteToolCallRequest {
            session: session(id),
            call_id: call_id.to_owned(),
            output: output.to_owned(),
            error,
        };
        Ok(self.gateway.complete_tool_call(self.request(req)).await?.into_inner().seq)
    }

    pub async fn cancel(&self, id: &str) -> Result<u64, E> {
        let req = pb::CancelRequest { session: session(id), cause: None, keep_inbox: true };
        Ok(self.gateway.cancel(self.request(req)).await?.into_inner().seq)
    }

    /// Removes a pending message; `false` when it is no longer pending.
    pub async fn remove(&self, id: &str, message_id: &str) -> Result<bool, E> {
        let req = pb::RemoveRequest { session: session(id), id: message_id.to_owned() };
        match self.gateway.remove(self.request(req)).await {
            Ok(_) => Ok(true),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(status) => Err(status.into()),
        }
    }

    pub async fn delete_session(&self, id: &str) -> Result<(), E> {
        let req = pb::DeleteSessionRequest { session: session(id) };
        self.gateway.delete_session(self.request(req)).await?;
        Ok(())
    }

    /// One page of the caller's tenant's sessions that run `agent`.
    pub async fn list_sessions(
        &self,
        agent: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListSessionsReply, E> {
        let req = pb::ListSessionsRequest {
            page_size,
            page_token: page_token.to_owned(),
            agent: agent.to_owned(),
            ..Default::default()
        };
        Ok(self.gateway.list_sessions(self.request(req)).await?.into_inner())
    }

    /// The names of the agents the caller's tenant may run (SPEC §20): the file's that serve it and its own,
    /// as `ListAgents` answers; `None` from a gateway that keeps no agent store (then only the file's exist).
    pub async fn agent_names(&self) -> Result<Option<Vec<String>>, E> {
        match self.gateway.list_agents(self.request(pb::ListAgentsRequest {})).await {
            Ok(reply) => Ok(Some(reply.into_inner().agents.into_iter().map(|a| a.name).collect())),
            Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
            Err(status) => Err(status.into()),
        }
    }

    /// Authenticates the caller (and counts the request against its quota) without reading anything.
    pub async fn authenticate(&self) -> Result<(), E> {
        let req = pb::ListSessionsRequest { page_size: 1, ..Default::default() };
        self.gateway.list_sessions(self.request(req)).await?;
        Ok(())
    }

    /// The tenant the caller acts in (authenticated and counted against its quota, as any call).
    pub async fn tenant(&self) -> Result<String, E> {
        let mut probe = Request::new(());
        if let Some(value) = &self.authorization {
            probe.metadata_mut().insert("authorization", value.clone());
        }
        Ok(self.gateway.caller_tenant(probe.metadata()).await?)
    }

    /// Stores a push configuration of a task of the caller's tenant (A2A, decision 0155).
    pub async fn create_task_push(
        &self,
        req: turnstile_gateway::webhooks::TaskPushRequest,
    ) -> Result<std::sync::Arc<turnstile_journal::RegisteredWebhook>, E> {
        let tenant = self.tenant().await?;
        let hook = self.gateway.create_task_push(&tenant, req).await.map_err(|s| E::from(s).at("url"))?;
        Ok(std::sync::Arc::new(hook))
    }

    /// The push configurations of the caller's tenant's task (the delivery of `message_id` in `session`).
    pub async fn task_pushes(
        &self,
        session: &str,
        message_id: &str,
    ) -> Result<Vec<std::sync::Arc<turnstile_journal::RegisteredWebhook>>, E> {
        let tenant = self.tenant().await?;
        Ok(self.gateway.task_pushes(&tenant, session, message_id)?)
    }

    /// Removes one; `false` when the task has none by that id.
    pub async fn delete_task_push(&self, session: &str, message_id: &str, config_id: &str) -> Result<bool, E> {
        let tenant = self.tenant().await?;
        Ok(self.gateway.delete_task_push(&tenant, session, message_id, config_id).await?)
    }

    /// The turn asked for by the delivery at `seq` of `session`, as the log has it now; `None` when there is
    /// no such delivery. A read that catches up before `seq` is looked at again a few times first (pauses
    /// double from 50 ms to 800 ms, about 1.5 s in all): the log may lag behind a write the caller saw (a
    /// replica on JetStream).
    pub async fn read_turn(&self, session: &str, seq: u64) -> Result<Option<crate::turn::TurnFold>, E> {
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let mut watch = self.watch(session, seq.saturating_sub(1), false).await?;
            let mut fold = crate::turn::TurnFold::new(seq, 0);
            loop {
                let item = next(&mut watch).await?;
                let caught_up = matches!(item.item, Some(pb::watch_item::Item::CaughtUp(_)));
                fold.apply(&item);
                if caught_up {
                    break;
                }
            }
            if !fold.missing() {
                return Ok(Some(fold));
            }
            if pause > LAG_WAIT {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    /// The session's events after `after_seq`, then `caught_up`, then (with `live`) the tail.
    pub async fn watch(&self, id: &str, after_seq: u64, live: bool) -> Result<Watch, E> {
        let req = pb::WatchRequest { session: session(id), after_seq, live, resume: None };
        Ok(self.gateway.watch(self.request(req)).await?.into_inner())
    }
}

/// The last pause of [`Api::read_turn`] before a delivery past the log's end is taken not to exist.
const LAG_WAIT: std::time::Duration = std::time::Duration::from_millis(800);

/// The next item of a Watch; its end is an error (the gateway ends streams only when shutting down).
pub async fn next(watch: &mut Watch) -> Result<pb::WatchItem, tonic::Status> {
    match watch.next().await {
        Some(item) => item,
        None => Err(tonic::Status::unavailable("the session's stream ended; retry, the turn is durable")),
    }
}

/// How a protocol's message is delivered (SPEC §2): `followup` unless the protocol (or a documented
/// extension field) names another preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    Followup,
    Queue,
    Steer,
    Inject,
    Interrupt,
}

impl Delivery {
    /// The preset names, as extension fields spell them.
    pub const NAMES: &str = "followup, queue, steer, inject, interrupt";

    /// The preset `name` spells, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "followup" => Self::Followup,
            "queue" => Self::Queue,
            "steer" => Self::Steer,
            "inject" => Self::Inject,
            "interrupt" => Self::Interrupt,
            _ => return None,
        })
    }
}
