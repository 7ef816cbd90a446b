//! The worker's side of `ExecuteStream` (decision 0185): the calls one gateway sends on its command stream,
//! each run as a unary `Execute` would run it, concurrently, and answered with its id as it finishes.
//!
//! What a unary call gets from the server, a call on the stream gets here: its own task and span (child of
//! the caller's `traceparent`), its deadline, and an end when the caller goes away (a cancel frame, or the
//! connection lost). When the gateway closes its side, the calls already taken are finished and answered
//! before the stream ends. When the server stops, calls that arrive after are answered UNAVAILABLE without
//! being run (the gateway retries them), and the stream ends once the calls taken before are answered: a
//! stream never holds the server's graceful stop longer than a unary call in flight would.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};
use tracing::Instrument as _;
use turnstile_cluster::status::status_to_pb;
use turnstile_ops::trace::grpc_request_span;
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::execute_stream_reply::Result as Answered;
use turnstile_proto::cluster::v1::execute_stream_request::Frame;

use super::WorkerService;

/// The answers of one command stream, in the order their calls finish.
pub type CallAnswers = UnboundedReceiverStream<Result<cpb::ExecuteStreamReply, Status>>;

/// The span name of a call on the stream: the unary RPC's path, since it is the same command run the
/// same way (a trace looks the same whichever way the gateway sent it).
const CALL_SPAN: &str = "/turnstile.cluster.v1.Worker/Execute";

/// Runs the calls that arrive on `inbound` in a task of its own and returns their answers.
pub(super) fn serve(
    service: WorkerService,
    caller_api: Option<u32>,
    inbound: Streaming<cpb::ExecuteStreamRequest>,
    stopping: CancellationToken,
) -> CallAnswers {
    let (answers, outgoing) = mpsc::unbounded_channel();
    tokio::spawn(take_calls(service, caller_api, inbound, answers, stopping));
    UnboundedReceiverStream::new(outgoing)
}

/// How the reading of a stream ended.
enum End {
    /// The gateway closed its side, or the server stops and the calls taken are done: finish them, then end.
    Closed,
    /// The connection is gone: nobody can read an answer, so the calls stop as unary ones would.
    Broken,
}

async fn take_calls(
    service: WorkerService,
    caller_api: Option<u32>,
    mut inbound: Streaming<cpb::ExecuteStreamRequest>,
    answers: mpsc::UnboundedSender<Result<cpb::ExecuteStreamReply, Status>>,
    stopping: CancellationToken,
) {
    let mut running: HashMap<u64, AbortHandle> = HashMap::new();
    let mut tasks: JoinSet<u64> = JoinSet::new();
    let mut stopped = false;
    let end = loop {
        if stopped && tasks.is_empty() {
            break End::Closed;
        }
        tokio::select! {
            // First, so that no call read after the stop began is run.
            biased;
            () = stopping.cancelled(), if !stopped => stopped = true,
            frame = inbound.message() => match frame {
                Ok(Some(cpb::ExecuteStreamRequest { id, frame: Some(Frame::Call(_)) })) if stopped => {
                    // Not run: the gateway retries it (on the new owner once this worker has left).
                    let status = Status::unavailable("the worker is stopping: retry on the session's new owner");
                    let _ = answers.send(Ok(answer(id, Err(status))));
                }
                Ok(Some(cpb::ExecuteStreamRequest { id, frame: Some(Frame::Call(call)) })) => {
                    if running.contains_key(&id) {
                        let status = Status::invalid_argument(format!(
                            "call id {id} is already running on this stream: give each call its own id"
                        ));
                        let _ = answers.send(Ok(answer(id, Err(status))));
                        continue;
                    }
                    let task = run_call(service.clone(), caller_api, id, call, answers.clone());
                    running.insert(id, tasks.spawn(task));
                }
                Ok(Some(cpb::ExecuteStreamRequest { id, frame: Some(Frame::Cancel(_)) })) => {
                    if let Some(task) = running.remove(&id) {
                        task.abort();
                    }
                }
                Ok(Some(cpb::ExecuteStreamRequest { id, frame: None })) => {
                    // A newer gateway's kind of frame: say so under its id (a gateway ignores answers to
                    // ids it does not wait for).
                    let status = Status::unimplemented(format!("call {id}: a frame of a kind this worker does not know"));
                    let _ = answers.send(Ok(answer(id, Err(status))));
                }
                Ok(None) => break End::Closed,
                Err(status) => {
                    tracing::debug!(error = %status, "a gateway's command stream broke");
                    break End::Broken;
                }
            },
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                finished(&mut running, done, &answers);
            }
        }
    };
    match end {
        End::Broken => tasks.abort_all(),
        End::Closed => {
            while let Some(done) = tasks.join_next_with_id().await {
                finished(&mut running, done, &answers);
            }
        }
    }
    // Dropping `answers` (with the tasks' clones gone) ends the stream for the gateway.
}

/// Forgets a call whose task ended; one that panicked is answered, so that its caller does not wait for
/// its deadline.
fn finished(
    running: &mut HashMap<u64, AbortHandle>,
    done: Result<(tokio::task::Id, u64), tokio::task::JoinError>,
    answers: &mpsc::UnboundedSender<Result<cpb::ExecuteStreamReply, Status>>,
) {
    match done {
        Ok((_, id)) => {
            running.remove(&id);
        }
        // Cancelled calls were taken out when their cancel came.
        Err(e) if e.is_cancelled() => {}
        Err(e) => {
            let task = e.id();
            let Some(id) = running.iter().find(|(_, t)| t.id() == task).map(|(id, _)| *id) else { return };
            running.remove(&id);
            tracing::error!(call = id, error = %e, "a command's task panicked");
            let _ = answers.send(Ok(answer(id, Err(Status::internal("the worker's task for this command panicked")))));
        }
    }
}

/// Runs one call as a unary `Execute` runs: in the caller's trace, bounded by its deadline.
async fn run_call(
    service: WorkerService,
    caller_api: Option<u32>,
    id: u64,
    call: cpb::ExecuteCall,
    answers: mpsc::UnboundedSender<Result<cpb::ExecuteStreamReply, Status>>,
) -> u64 {
    let span = grpc_request_span(CALL_SPAN, Some(&call.traceparent));
    let result = async {
        let request =
            call.request.ok_or_else(|| Status::invalid_argument("call.request is missing: send the command"))?;
        let running = service.run(caller_api, request);
        match call.deadline_ms {
            // The gateway gives up at the same time; tonic's server answers a passed `grpc-timeout` so.
            Some(ms) => tokio::time::timeout(Duration::from_millis(ms), running)
                .await
                .unwrap_or_else(|_| Err(Status::cancelled(tonic::TimeoutExpired(()).to_string()))),
            None => running.await,
        }
    }
    .instrument(span)
    .await;
    let _ = answers.send(Ok(answer(id, result)));
    id
}

fn answer(id: u64, result: Result<cpb::ExecuteReply, Status>) -> cpb::ExecuteStreamReply {
    let result = match result {
        Ok(reply) => Answered::Reply(reply),
        Err(status) => Answered::Status(status_to_pb(&status)),
    };
    cpb::ExecuteStreamReply { id, result: Some(result) }
}
