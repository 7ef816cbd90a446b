//! [`CommandStream`]: one `ExecuteStream` to a worker that carries every command a gateway sends it
//! (decision 0185), so that concurrent commands share HTTP/2 frames and flushes instead of paying a stream,
//! its headers and its trailers each.
//!
//! Each call gets an id unique on the stream; the worker answers with the id, in the order its commands
//! finish, and the answer is the reply or the status a unary `Execute` would have ended with. What the
//! transport keeps per call is only the sender of its answer: a call whose caller goes away or whose
//! deadline passes is taken out and a cancel goes to the worker, which stops running it. A stream that
//! breaks fails every call still waiting with UNAVAILABLE (no error kind: a transport failure, which the
//! router retries as it retries a unary call that lost its connection); the transport never sends a
//! command twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Status};
use turnstile_model::sync::lock;
use turnstile_proto::cluster::v1 as cpb;
use turnstile_proto::cluster::v1::execute_stream_reply::Result as Answered;
use turnstile_proto::cluster::v1::execute_stream_request::Frame;
use turnstile_proto::cluster::v1::worker_client::WorkerClient;

use crate::codec::{API_KEY, API_VERSION};
use crate::status::{copy_status, status_from_pb};

/// What a call on a [`CommandStream`] came to.
// Returned once per call and moved straight into the caller's result; boxing would allocate per call.
#[allow(clippy::large_enum_variant)]
pub(super) enum Answer {
    /// The worker's answer, or the status of a stream that failed or of a deadline that passed.
    Done(Result<cpb::ExecuteReply, Status>),
    /// The worker predates `ExecuteStream` (it answered UNIMPLEMENTED): nothing was sent, and the request
    /// goes back to the caller for a unary `Execute`.
    Unsupported(cpb::ExecuteRequest),
}

/// How far the stream's opening got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opened {
    Pending,
    Open,
    /// UNIMPLEMENTED: an older worker.
    Unsupported,
    /// The stream could not be opened or has ended; `Calls::ended` says why.
    Ended,
}

/// The calls waiting for an answer, and whether any more can be taken.
#[derive(Default)]
struct Calls {
    next_id: u64,
    waiting: HashMap<u64, oneshot::Sender<Result<cpb::ExecuteReply, Status>>>,
    /// Set once when the stream ends, under the same lock as `waiting` is drained: a call is either
    /// registered before (and answered by the end) or sees this, so none waits for an answer that cannot
    /// come.
    ended: Option<Status>,
}

impl Calls {
    /// Takes every waiting call out and refuses new ones with `status`.
    fn end(&mut self, status: &Status) -> Vec<oneshot::Sender<Result<cpb::ExecuteReply, Status>>> {
        self.ended.get_or_insert_with(|| copy_status(status));
        self.waiting.drain().map(|(_, answer)| answer).collect()
    }
}

/// One `ExecuteStream` to one worker address. Dropping it closes the stream's sending side once the calls
/// in flight (which hold it) are done: the worker finishes what it runs, then ends the stream.
pub(super) struct CommandStream {
    frames: mpsc::UnboundedSender<cpb::ExecuteStreamRequest>,
    calls: Arc<Mutex<Calls>>,
    opened: watch::Receiver<Opened>,
}

impl std::fmt::Debug for CommandStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandStream").field("opened", &*self.opened.borrow()).finish_non_exhaustive()
    }
}

impl CommandStream {
    /// Opens a stream to the worker at `addr` over `channel`, in a task of its own that reads the answers.
    /// Calls may be made at once; they wait for the opening.
    pub(super) fn open(channel: Channel, addr: &str) -> Self {
        let (frames, outgoing) = mpsc::unbounded_channel();
        let calls = Arc::new(Mutex::new(Calls::default()));
        let (opened_tx, opened) = watch::channel(Opened::Pending);
        tokio::spawn(read_answers(channel, addr.to_owned(), outgoing, calls.clone(), opened_tx));
        Self { frames, calls, opened }
    }

    /// Whether the stream has ended (or never opened): the transport opens a new one for the next call.
    pub(super) fn has_ended(&self) -> bool {
        matches!(*self.opened.borrow(), Opened::Ended)
    }

    /// Sends `request` and waits for its answer, at most `timeout` (a unary call's `grpc-timeout`; past
    /// it, CANCELLED "Timeout expired" as tonic's own client timeout gives). `traceparent` joins the
    /// worker's span to the caller's trace. If the returned future is dropped first, the worker is told
    /// to stop running the command.
    pub(super) async fn call(
        &self,
        request: cpb::ExecuteRequest,
        timeout: Duration,
        traceparent: Option<String>,
    ) -> Answer {
        let deadline = Instant::now() + timeout;
        let mut opened = self.opened.clone();
        let state = match tokio::time::timeout_at(deadline, opened.wait_for(|o| *o != Opened::Pending)).await {
            Err(_) => return Answer::Done(Err(timeout_expired())),
            Ok(Ok(state)) => *state,
            // The reading task ended without saying how far it got; `Calls::ended` says why below.
            Ok(Err(_)) => Opened::Ended,
        };
        if state == Opened::Unsupported {
            return Answer::Unsupported(request);
        }
        let (answer, answered) = oneshot::channel();
        let id = {
            let mut calls = lock(&self.calls);
            if let Some(ended) = &calls.ended {
                return Answer::Done(Err(copy_status(ended)));
            }
            calls.next_id += 1;
            let id = calls.next_id;
            calls.waiting.insert(id, answer);
            id
        };
        let mut waiting = Waiting { id, stream: self, answered: false };
        let call = cpb::ExecuteCall {
            request: Some(request),
            deadline_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            traceparent: traceparent.unwrap_or_default(),
        };
        // A failed send means the stream is going away: its end answers this call (it is registered).
        let _ = self.frames.send(cpb::ExecuteStreamRequest { id, frame: Some(Frame::Call(call)) });
        let result = match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(result)) => result,
            // Every sender is answered or dropped with the stream's end, which answers first.
            Ok(Err(_)) => Err(Status::unavailable("the command stream to the worker ended without an answer")),
            Err(_) => return Answer::Done(Err(timeout_expired())),
        };
        waiting.answered = true;
        Answer::Done(result)
    }
}

/// tonic's status for a call whose `grpc-timeout` passed at the client.
fn timeout_expired() -> Status {
    Status::cancelled(tonic::TimeoutExpired(()).to_string())
}

/// A call registered on a stream; dropped before its answer (the caller went away, the deadline passed),
/// it takes the call out and tells the worker to stop running it.
struct Waiting<'a> {
    id: u64,
    stream: &'a CommandStream,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Still waiting means the worker has not answered yet: it may be running the command.
        if lock(&self.stream.calls).waiting.remove(&self.id).is_some() {
            let cancel = cpb::ExecuteStreamRequest { id: self.id, frame: Some(Frame::Cancel(cpb::ExecuteCancel {})) };
            let _ = self.stream.frames.send(cancel);
        }
    }
}

/// Opens the stream, then hands each answer to its call until the stream ends, and then fails every call
/// still waiting.
async fn read_answers(
    channel: Channel,
    addr: String,
    outgoing: mpsc::UnboundedReceiver<cpb::ExecuteStreamRequest>,
    calls: Arc<Mutex<Calls>>,
    opened: watch::Sender<Opened>,
) {
    let mut request = tonic::Request::new(UnboundedReceiverStream::new(outgoing));
    // The worker learns which internal API version asks, once for every call on the stream (SPEC §18).
    request.metadata_mut().insert(API_KEY, MetadataValue::from(API_VERSION));
    let ended = match WorkerClient::new(channel).execute_stream(request).await {
        Err(status) if status.code() == Code::Unimplemented => {
            tracing::debug!(worker = %addr, "the worker has no ExecuteStream (an older build): unary calls");
            let _ = opened.send(Opened::Unsupported);
            return;
        }
        Err(status) => status,
        Ok(response) => {
            let _ = opened.send(Opened::Open);
            let mut answers = response.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(answer)) => hand_over(&calls, answer),
                    Ok(None) => break Status::unavailable(format!("worker {addr} closed the command stream")),
                    Err(status) => {
                        break Status::unavailable(format!(
                            "the command stream to worker {addr} broke: {}",
                            status.message()
                        ));
                    }
                }
            }
        }
    };
    tracing::debug!(worker = %addr, reason = %ended.message(), "command stream ended");
    let waiting = lock(&calls).end(&ended);
    let _ = opened.send(Opened::Ended);
    for answer in waiting {
        let _ = answer.send(Err(copy_status(&ended)));
    }
}

/// Gives `answer` to the call it names, if that call still waits (one that gave up is gone).
fn hand_over(calls: &Mutex<Calls>, answer: cpb::ExecuteStreamReply) {
    let Some(waiting) = lock(calls).waiting.remove(&answer.id) else { return };
    let result = match answer.result {
        Some(Answered::Reply(reply)) => Ok(reply),
        Some(Answered::Status(status)) => Err(status_from_pb(status)),
        // A newer worker's kind of answer: this build cannot read it.
        None => Err(Status::internal(format!("worker answered call {} with nothing this build can read", answer.id))),
    };
    let _ = waiting.send(result);
}
