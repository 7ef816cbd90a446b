//! The gateway → worker command stream (decision 0185) between the real sides: the gateway's
//! `GrpcTransport` and the worker's `WorkerService` over tonic on loopback. Answers reach their own callers
//! whatever order the commands finish in; a deadline or a caller that goes away stops the command at the
//! worker; a broken connection fails every waiting call retryably (and stops them at the worker); a worker
//! without the stream (an older build) is called with unary `Execute` and remembered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::{Code, Status};
use turnstile_cluster::codec::{decode_command_reply, encode_execute_request};
use turnstile_cluster::status::command_error;
use turnstile_cluster::{CommandRouter, GrpcTransport, WorkerTransport};
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, SessionRef, Target, UserMessage};
use turnstile_model::{Command, CommandError, CommandReply};
use turnstile_proto::cluster::v1::worker_server::WorkerServer;
use turnstile_worker::cluster::service::WorkerService;

/// Bounds every wait of this file, so that a defect fails the test instead of hanging it; far above any
/// real wait here.
const WAIT: Duration = Duration::from_secs(20);

/// A router whose followups answer only when the test releases them: each one says it started (its
/// message id, with the sender that releases it) and answers `Sent { seq: N }` for message `mN`. A
/// followup whose future is dropped before it answered says so. Message `not-owner` is refused not-owner.
struct Scripted {
    started: mpsc::UnboundedSender<(String, oneshot::Sender<()>)>,
    dropped: mpsc::UnboundedSender<String>,
}

/// Sends its id on `dropped` when dropped while armed.
struct OnDrop(Option<(String, mpsc::UnboundedSender<String>)>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some((id, dropped)) = self.0.take() {
            let _ = dropped.send(id);
        }
    }
}

#[async_trait]
impl CommandRouter for Scripted {
    async fn execute(
        &self,
        session: &SessionRef,
        command: Command,
        _timeout: Option<Duration>,
    ) -> Result<CommandReply, CommandError> {
        let Command::Send { message, .. } = command else { return Ok(CommandReply::Written { seq: 0 }) };
        let id = message.id.0;
        if id == "not-owner" {
            return Err(CommandError::NotOwner { session: session.to_string(), owner: Some("10.0.0.2:7500".into()) });
        }
        let mut guard = OnDrop(Some((id.clone(), self.dropped.clone())));
        let (release, released) = oneshot::channel();
        self.started.send((id.clone(), release)).unwrap();
        if released.await.is_err() {
            std::future::pending::<()>().await;
        }
        guard.0 = None;
        Ok(CommandReply::Sent { seq: id.trim_start_matches('m').parse().unwrap(), turn: None })
    }
}

/// The worker's side: what started, what was dropped.
struct Worker {
    addr: SocketAddr,
    started: mpsc::UnboundedReceiver<(String, oneshot::Sender<()>)>,
    dropped: mpsc::UnboundedReceiver<String>,
}

impl Worker {
    async fn next_started(&mut self) -> (String, oneshot::Sender<()>) {
        tokio::time::timeout(WAIT, self.started.recv()).await.expect("a command started").unwrap()
    }

    async fn next_dropped(&mut self) -> String {
        tokio::time::timeout(WAIT, self.dropped.recv()).await.expect("a command dropped at the worker").unwrap()
    }
}

/// The methods a worker's server answers.
#[derive(Clone, Copy)]
enum Methods {
    /// Today's build.
    All,
    /// Only `ExecuteStream`, so that a call that passes shows it went on the stream.
    StreamOnly,
    /// Only `Execute`: a build that predates the stream.
    UnaryOnly,
}

/// The `Worker` server answering only some methods; every other one gets UNIMPLEMENTED exactly as tonic's
/// generated server answers a method it does not have (an older build's answer to `ExecuteStream`).
#[derive(Clone)]
struct Only {
    inner: WorkerServer<WorkerService>,
    methods: Methods,
}

impl tonic::server::NamedService for Only {
    const NAME: &'static str = "turnstile.cluster.v1.Worker";
}

impl Service<http::Request<tonic::body::Body>> for Only {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        let answered = match self.methods {
            Methods::All => true,
            Methods::StreamOnly => method == "ExecuteStream",
            Methods::UnaryOnly => method == "Execute",
        };
        if answered {
            return self.inner.call(request);
        }
        Box::pin(async {
            let mut response = http::Response::new(tonic::body::Body::default());
            let headers = response.headers_mut();
            headers.insert(Status::GRPC_STATUS, (Code::Unimplemented as i32).into());
            headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
            Ok(response)
        })
    }
}

async fn serving(methods: Methods) -> Worker {
    stoppable(methods, std::future::pending()).await.0
}

/// A worker whose server stops gracefully (tonic's own stop, which waits for every stream to end) once
/// `stop` resolves; the handle ends with the server.
async fn stoppable(
    methods: Methods,
    stop: impl Future<Output = ()> + Send + 'static,
) -> (Worker, WorkerService, JoinHandle<Result<(), tonic::transport::Error>>) {
    let (started_tx, started) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let service = WorkerService::new(Arc::new(Scripted { started: started_tx, dropped: dropped_tx }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let only = Only { inner: service.clone().into_server(), methods };
    let server = tonic::transport::Server::builder().add_service(only);
    let stopping = service.stopping();
    let stop = async move {
        stop.await;
        stopping.cancel();
    };
    let server = tokio::spawn(server.serve_with_incoming_shutdown(turnstile_ops::grpc::incoming(listener), stop));
    (Worker { addr, started, dropped }, service, server)
}

fn session() -> SessionRef {
    SessionRef::new("acme", "s1").unwrap()
}

fn followup(id: &str) -> turnstile_proto::cluster::v1::ExecuteRequest {
    let message = UserMessage {
        id: MessageId(id.into()),
        content: vec![ContentBlock::text("hi")].into(),
        source: MessageSource::User,
    };
    let send = Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    encode_execute_request(&session(), &send, None)
}

/// Sends followup `id` to `addr` in a task of its own, bounded by `timeout`.
fn send(
    transport: &Arc<GrpcTransport>,
    addr: &str,
    id: &str,
    timeout: Duration,
) -> JoinHandle<Result<CommandReply, Status>> {
    let (transport, addr, request) = (transport.clone(), addr.to_owned(), followup(id));
    tokio::spawn(async move {
        let reply = transport.execute(&addr, request, timeout).await?;
        Ok(decode_command_reply(reply).unwrap())
    })
}

async fn answer(call: JoinHandle<Result<CommandReply, Status>>) -> Result<CommandReply, Status> {
    tokio::time::timeout(WAIT, call).await.expect("the call answered").unwrap()
}

fn sent(seq: u64) -> CommandReply {
    CommandReply::Sent { seq, turn: None }
}

#[tokio::test]
async fn answers_reach_their_own_callers_in_whatever_order_the_commands_finish() {
    let mut worker = serving(Methods::StreamOnly).await;
    let addr = worker.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    let calls: Vec<_> = ["m1", "m2", "m3"].iter().map(|id| send(&transport, &addr, id, WAIT)).collect();
    let mut releases = std::collections::HashMap::new();
    for _ in 0..3 {
        let (id, release) = worker.next_started().await;
        releases.insert(id, release);
    }
    // The last sent finishes first, then the first, then the second.
    let mut calls = calls.into_iter();
    let (c1, c2, c3) = (calls.next().unwrap(), calls.next().unwrap(), calls.next().unwrap());
    releases.remove("m3").unwrap().send(()).unwrap();
    assert_eq!(answer(c3).await.unwrap(), sent(3));
    releases.remove("m1").unwrap().send(()).unwrap();
    assert_eq!(answer(c1).await.unwrap(), sent(1));
    releases.remove("m2").unwrap().send(()).unwrap();
    assert_eq!(answer(c2).await.unwrap(), sent(2));

    // An error keeps its code, message and kind, as a unary call's status does: the router re-routes.
    let status = answer(send(&transport, &addr, "not-owner", WAIT)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let owner = Some("10.0.0.2:7500".to_owned());
    assert_eq!(command_error(&status), Some(CommandError::NotOwner { session: "acme/s1".into(), owner }));
    assert!(!transport.is_unary(&addr));
}

#[tokio::test]
async fn a_call_past_its_deadline_is_cancelled_and_stopped_at_the_worker() {
    let mut worker = serving(Methods::StreamOnly).await;
    let addr = worker.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    let late = send(&transport, &addr, "m1", Duration::from_millis(300));
    // Held, never released: only the deadline ends it.
    let _held = worker.next_started().await;
    let status = answer(late).await.unwrap_err();
    // What tonic's client gives a unary call whose `grpc-timeout` passed (the router retries it).
    assert_eq!((status.code(), status.message()), (Code::Cancelled, "Timeout expired"));
    assert_eq!(command_error(&status), None);
    assert_eq!(worker.next_dropped().await, "m1");

    // The stream goes on serving.
    let next = send(&transport, &addr, "m2", WAIT);
    let (id, release) = worker.next_started().await;
    assert_eq!(id, "m2");
    release.send(()).unwrap();
    assert_eq!(answer(next).await.unwrap(), sent(2));
}

#[tokio::test]
async fn a_caller_that_goes_away_stops_its_command_at_the_worker() {
    let mut worker = serving(Methods::StreamOnly).await;
    let addr = worker.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    // A deadline far past this test's waits: only the cancel can stop it in time.
    let call = send(&transport, &addr, "m1", Duration::from_secs(600));
    let _held = worker.next_started().await;
    call.abort();
    assert_eq!(worker.next_dropped().await, "m1");
}

/// A TCP proxy whose connections the test cuts at once, as a worker's death does.
struct Proxy {
    addr: SocketAddr,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(Mutex::new(Vec::new()));
        let kept = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Ok(mut outbound) = TcpStream::connect(upstream).await else { continue };
                let copy = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                kept.lock().unwrap().push(copy);
            }
        });
        Self { addr, connections }
    }

    /// Closes every connection open now, both ways.
    fn cut(&self) {
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

#[tokio::test]
async fn a_broken_stream_fails_every_waiting_call_retryably_and_the_next_call_opens_a_new_one() {
    let mut worker = serving(Methods::StreamOnly).await;
    let proxy = Proxy::start(worker.addr).await;
    let addr = proxy.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    let calls = [send(&transport, &addr, "m1", WAIT), send(&transport, &addr, "m2", WAIT)];
    let _held = [worker.next_started().await, worker.next_started().await];
    proxy.cut();
    for call in calls {
        let status = answer(call).await.unwrap_err();
        // A transport failure without an error kind: the router retries it, as a lost unary call.
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(command_error(&status), None);
    }
    // The worker stopped both, as it stops unary calls whose connection is gone.
    let mut dropped = [worker.next_dropped().await, worker.next_dropped().await];
    dropped.sort();
    assert_eq!(dropped, ["m1", "m2"]);

    let next = send(&transport, &addr, "m3", WAIT);
    let (id, release) = worker.next_started().await;
    assert_eq!(id, "m3");
    release.send(()).unwrap();
    assert_eq!(answer(next).await.unwrap(), sent(3));
}

#[tokio::test]
async fn a_worker_without_the_stream_is_called_unary_and_remembered() {
    let mut worker = serving(Methods::UnaryOnly).await;
    let addr = worker.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    assert!(!transport.is_unary(&addr));
    for (id, seq) in [("m1", 1), ("m2", 2)] {
        let call = send(&transport, &addr, id, WAIT);
        let (started, release) = worker.next_started().await;
        assert_eq!(started, id, "the command ran once");
        release.send(()).unwrap();
        assert_eq!(answer(call).await.unwrap(), sent(seq));
        assert!(transport.is_unary(&addr));
    }
    // And a build with both answers on the stream.
    let mut both = serving(Methods::All).await;
    let addr = both.addr.to_string();
    let call = send(&transport, &addr, "m4", WAIT);
    both.next_started().await.1.send(()).unwrap();
    assert_eq!(answer(call).await.unwrap(), sent(4));
    assert!(!transport.is_unary(&addr));
}

#[tokio::test]
async fn a_stopping_worker_answers_the_calls_it_took_refuses_new_ones_and_ends_its_streams() {
    let (stop, stopped) = oneshot::channel::<()>();
    let (mut worker, service, server) = stoppable(Methods::All, async {
        let _ = stopped.await;
    })
    .await;
    let addr = worker.addr.to_string();
    let transport = Arc::new(GrpcTransport::new(Duration::from_secs(5)));
    let taken = send(&transport, &addr, "m1", WAIT);
    let (_, release) = worker.next_started().await;
    // The stop begins (as `serve_draining` begins it with the server's): a call sent after is not run.
    service.stopping().cancel();
    let status = answer(send(&transport, &addr, "m2", WAIT)).await.unwrap_err();
    assert_eq!((status.code(), command_error(&status)), (Code::Unavailable, None), "{status:?}");
    // The call taken before is answered.
    release.send(()).unwrap();
    assert_eq!(answer(taken).await.unwrap(), sent(1));
    // And the stream ends: tonic's graceful stop, which waits for every stream, completes.
    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, server).await.expect("the server stopped").unwrap().unwrap();
    assert!(worker.started.try_recv().is_err(), "m2 never ran");
}
