//! The internal `turnstile.cluster.v1.Worker` service: how a gateway reaches the driver that owns a
//! session.
//!
//! It is a thin adapter over any [`CommandRouter`] (the worker's `SessionHost`): decode the request with
//! the cluster codec, `execute`, encode the reply. Ownership is the router's business: a host that does
//! not own the session answers [`CommandError::NotOwner`], which goes back as UNAVAILABLE with the
//! metadata of [`turnstile_cluster::codec`] (`turnstile-error: not-owner`, `turnstile-owner`),
//! so the gateway can refresh its shard map and retry rather than fail the client.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};
use turnstile_cluster::CommandRouter;
use turnstile_cluster::codec::{
    API_KEY, API_VERSION, api_version, decode_execute_request, encode_command_reply, reply_for_caller, unknown_command,
};
use turnstile_cluster::status::command_status;
use turnstile_model::CommandError;
use turnstile_ops::tls::LiveServerTls;
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::worker_server::{Worker, WorkerServer};

mod calls;

use calls::CallAnswers;

/// The `Worker` service over a command router.
#[derive(Clone)]
pub struct WorkerService {
    router: Arc<dyn CommandRouter>,
    /// The largest encoded `ExecuteRequest` decoded; `None` keeps tonic's default of 4 MiB.
    max_request_bytes: Option<usize>,
    /// Cancelled when the server stops: command streams take no more calls and end once theirs are done,
    /// as the server's graceful stop waits for unary calls in flight.
    stopping: CancellationToken,
}

impl std::fmt::Debug for WorkerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerService").finish_non_exhaustive()
    }
}

impl WorkerService {
    pub fn new(router: Arc<dyn CommandRouter>) -> Self {
        Self { router, max_request_bytes: None, stopping: CancellationToken::new() }
    }

    /// Decodes requests up to `bytes` (config `limits.max_request_bytes()`, decision 0033), so that every
    /// request the gateway admitted also crosses the gateway→worker hop.
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = Some(bytes);
        self
    }

    /// Cancelled, it ends the service's command streams once the calls they took are answered (calls that
    /// arrive after are refused UNAVAILABLE); [`serve_draining`] cancels it when its server stops. A server
    /// built from [`Self::into_server`] by hand cancels it itself.
    pub fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// The tonic server of this service, to add to a `tonic::transport::Server`.
    pub fn into_server(self) -> WorkerServer<Self> {
        let limit = self.max_request_bytes;
        let server = WorkerServer::new(self);
        match limit {
            Some(bytes) => server.max_decoding_message_size(bytes),
            None => server,
        }
    }
}

impl WorkerService {
    /// One command from a caller of internal API version `caller_api`: the reply, or the status it ends
    /// with. The same for a unary `Execute` and a call on an `ExecuteStream`.
    pub(super) async fn run(
        &self,
        caller_api: Option<u32>,
        request: cpb::ExecuteRequest,
    ) -> Result<cpb::ExecuteReply, Status> {
        if let Some(theirs) = caller_api.filter(|v| *v > API_VERSION && request.command.is_none()) {
            return Err(versioned(command_status(&unknown_command(theirs))));
        }
        let (session, command, timeout) = decode_execute_request(request)
            .map_err(|e| versioned(command_status(&CommandError::InvalidArgument(e.to_string()))))?;
        let name = command.name();
        match self.router.execute(&session, command, timeout).await {
            Ok(reply) => Ok(encode_command_reply(&session, &reply_for_caller(reply, caller_api))),
            Err(err) => {
                tracing::debug!(%session, command = name, error = %err, "command refused");
                Err(versioned(command_status(&err)))
            }
        }
    }
}

/// The internal API version a call's metadata names.
fn caller_api(metadata: &tonic::metadata::MetadataMap) -> Option<u32> {
    api_version(metadata.get(API_KEY).and_then(|v| v.to_str().ok()))
}

#[tonic::async_trait]
impl Worker for WorkerService {
    async fn execute(&self, request: Request<cpb::ExecuteRequest>) -> Result<Response<cpb::ExecuteReply>, Status> {
        let caller_api = caller_api(request.metadata());
        let mut response = Response::new(self.run(caller_api, request.into_inner()).await?);
        response.metadata_mut().insert(API_KEY, MetadataValue::from(API_VERSION));
        Ok(response)
    }

    type ExecuteStreamStream = CallAnswers;

    async fn execute_stream(
        &self,
        request: Request<Streaming<cpb::ExecuteStreamRequest>>,
    ) -> Result<Response<CallAnswers>, Status> {
        let caller_api = caller_api(request.metadata());
        let answers = calls::serve(self.clone(), caller_api, request.into_inner(), self.stopping.clone());
        let mut response = Response::new(answers);
        response.metadata_mut().insert(API_KEY, MetadataValue::from(API_VERSION));
        Ok(response)
    }
}

/// `status` with this worker's internal API version in its metadata (SPEC §18).
fn versioned(mut status: Status) -> Status {
    status.metadata_mut().insert(API_KEY, MetadataValue::from(API_VERSION));
    status
}

/// Serves `service` on an already bound listener (port 0 in tests) until `shutdown` resolves; in-flight
/// calls are drained first.
pub async fn serve(
    service: WorkerService,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(service, listener, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is set (gateways then dial with `--cluster-tls-ca`).
pub async fn serve_with(
    service: WorkerService,
    listener: TcpListener,
    tls: Option<Arc<LiveServerTls>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_draining(service, listener, tls, CancellationToken::new(), shutdown).await
}

/// [`serve_with`], and gRPC health turns NOT_SERVING (the server and the Worker service) once `draining`
/// is cancelled: the worker is handing its shards over, and the server keeps answering (not-owner for
/// released shards) until `shutdown`.
pub async fn serve_draining(
    service: WorkerService,
    listener: TcpListener,
    tls: Option<Arc<LiveServerTls>>,
    draining: CancellationToken,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    const SERVED: [&str; 1] = [<WorkerServer<WorkerService> as tonic::server::NamedService>::NAME];
    let stopping = service.stopping.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.cancel();
    };
    let (router, health) = turnstile_ops::grpc::server(&SERVED).await;
    // Ends with the server (the drop guard), so nothing outlives a server that stopped without draining.
    let reporting = CancellationToken::new();
    let stop_reporting = reporting.clone().drop_guard();
    tokio::spawn(async move {
        tokio::select! {
            () = draining.cancelled() => turnstile_ops::grpc::report_draining(&health, &SERVED).await,
            () = reporting.cancelled() => {}
        }
    });
    let served = turnstile_ops::grpc::serve(router.add_service(service.into_server()), listener, tls, shutdown).await;
    drop(stop_reporting);
    served
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use turnstile_cluster::codec::encode_execute_request;
    use turnstile_model::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};
    use turnstile_model::{Command, CommandReply};
    use turnstile_proto::cluster::v1::worker_client::WorkerClient;

    use super::*;
    use tonic::Code;

    /// Answers every command with what it was asked, or the error it was told to give.
    struct Echo {
        error: Option<CommandError>,
    }

    #[async_trait::async_trait]
    impl CommandRouter for Echo {
        async fn execute(
            &self,
            _session: &SessionRef,
            command: Command,
            timeout: Option<Duration>,
        ) -> Result<CommandReply, CommandError> {
            if let Some(e) = &self.error {
                return Err(e.clone());
            }
            Ok(match command {
                Command::Send { expected_turn, .. } => CommandReply::Sent { seq: 7, turn: expected_turn },
                _ => CommandReply::Written { seq: timeout.map_or(0, |t| t.as_millis() as u64) },
            })
        }
    }

    async fn client(error: Option<CommandError>) -> WorkerClient<tonic::transport::Channel> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = WorkerService::new(Arc::new(Echo { error }));
        tokio::spawn(serve(service, listener, std::future::pending()));
        WorkerClient::connect(format!("http://{addr}")).await.unwrap()
    }

    use turnstile_cluster::status::command_error as rebuild;

    #[tokio::test]
    async fn commands_and_replies_cross_the_hop() {
        let mut c = client(None).await;
        let session = SessionRef::new("acme", "s1").unwrap();
        let message = UserMessage {
            id: MessageId("m1".into()),
            content: vec![ContentBlock::text("hi")].into(),
            source: MessageSource::User,
        };
        let send =
            Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: Some(4), deadline: None };
        let reply = c.execute(encode_execute_request(&session, &send, None)).await.unwrap().into_inner();
        let reply = turnstile_cluster::codec::decode_command_reply(reply).unwrap();
        assert_eq!(reply, CommandReply::Sent { seq: 7, turn: Some(4) });
        let request = encode_execute_request(&session, &Command::WhenIdle, Some(Duration::from_millis(250)));
        let reply = turnstile_cluster::codec::decode_command_reply(c.execute(request).await.unwrap().into_inner());
        assert_eq!(reply.unwrap(), CommandReply::Written { seq: 250 });
    }

    #[tokio::test]
    async fn errors_keep_their_kind_owner_and_message() {
        let not_owner = CommandError::NotOwner { session: "acme/s1".into(), owner: Some("127.0.0.1:7501".into()) };
        let mut c = client(Some(not_owner.clone())).await;
        let session = SessionRef::new("acme", "s1").unwrap();
        let status = c.execute(encode_execute_request(&session, &Command::Clear, None)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(rebuild(&status), Some(not_owner));

        let precondition = CommandError::FailedPrecondition("session acme/s1 is running turn 3, not 2".into());
        let mut c = client(Some(precondition.clone())).await;
        let status = c.execute(encode_execute_request(&session, &Command::Clear, None)).await.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "session acme/s1 is running turn 3, not 2");
        assert_eq!(rebuild(&status), Some(precondition));
    }

    #[tokio::test]
    async fn a_malformed_request_is_invalid_argument_naming_the_field() {
        let mut c = client(None).await;
        let status = c.execute(cpb::ExecuteRequest::default()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("session"), "{}", status.message());
        assert!(matches!(rebuild(&status), Some(CommandError::InvalidArgument(_))));
    }

    #[tokio::test]
    async fn a_command_unknown_here_from_a_newer_caller_is_retryable() {
        // SPEC §18: during a rolling upgrade a newer gateway may send a command this worker cannot decode.
        let mut c = client(None).await;
        let session = SessionRef::new("acme", "s1").unwrap();
        let unknown = cpb::ExecuteRequest {
            session: Some(turnstile_proto::codec::encode_session_ref(&session)),
            ..Default::default()
        };
        let mut newer = tonic::Request::new(unknown.clone());
        newer.metadata_mut().insert(API_KEY, MetadataValue::from(API_VERSION + 1));
        let status = c.execute(newer).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("being upgraded"), "{}", status.message());
        assert_eq!(api_version(status.metadata().get(API_KEY).and_then(|v| v.to_str().ok())), Some(API_VERSION));
        // The same request from a caller of this version (or one that says none) is malformed.
        let status = c.execute(unknown).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        // Every reply names this worker's version.
        let reply = c.execute(encode_execute_request(&session, &Command::Clear, None)).await.unwrap();
        assert_eq!(api_version(reply.metadata().get(API_KEY).and_then(|v| v.to_str().ok())), Some(API_VERSION));
    }

    #[tokio::test]
    async fn health_is_not_serving_once_draining_while_commands_are_still_answered() {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
        let service = WorkerService::new(Arc::new(Echo { error: None }));
        let server =
            tokio::spawn(serve_draining(service, listener, None, draining.clone(), stop.clone().cancelled_owned()));
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut health = HealthClient::new(channel.clone());
        let worker = "turnstile.cluster.v1.Worker";
        let status = |service: &str| HealthCheckRequest { service: service.into() };
        for service in ["", worker] {
            let reply = health.check(status(service)).await.unwrap().into_inner();
            assert_eq!(reply.status, ServingStatus::Serving as i32, "service {service:?} before the drain");
        }

        // A health Watch sees the change as it happens (no polling on time).
        let mut changes = health.watch(status(worker)).await.unwrap().into_inner();
        draining.cancel();
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(reply) = changes.message().await.unwrap() {
                if reply.status == ServingStatus::NotServing as i32 {
                    return;
                }
            }
            panic!("the health watch ended before NOT_SERVING");
        })
        .await
        .expect("NOT_SERVING once draining");
        let whole = health.check(status("")).await.unwrap().into_inner();
        assert_eq!(whole.status, ServingStatus::NotServing as i32, "the whole server is draining");

        // The server still answers while it drains (released shards say not-owner to the gateways).
        let session = SessionRef::new("acme", "s1").unwrap();
        let mut c = WorkerClient::new(channel);
        let reply = c.execute(encode_execute_request(&session, &Command::Clear, None)).await.unwrap().into_inner();
        assert!(turnstile_cluster::codec::decode_command_reply(reply).is_ok());
        drop(changes);
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
