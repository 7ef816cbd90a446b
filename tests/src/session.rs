//! A small client DSL for one session: every call is one public RPC, nothing more.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Code, Status};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::cancel_cause::Cause;
use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{
    CancelCause, CancelReply, CancelRequest, ClearRequest, ConfigureSessionRequest, DeliverRequest, EditReply, Empty,
    GetInboxRequest, GetSessionRequest, GoalAction, GoalInfo, InboxSnapshot, InjectMode, RemoveRequest, ReplaceRequest,
    SendReply, SendRequest, SessionEvent, SessionInfo, SessionRef, SetGoalRequest, SpliceRequest, SteerRequest, Target,
    UpdateGoalRequest, UserMessage, WatchRequest, WhenIdleRequest,
};

use crate::watch::{IdleSeq, WatchRecorder};
use crate::{DEFAULT_WAIT, HarnessError, new_session_ref};

/// One session, reached through one server or, for a cluster, through several gateways in turn.
#[derive(Clone, Debug)]
pub struct Session {
    clients: Arc<[AgentClient<Channel>]>,
    /// Which client the next call uses: calls alternate between gateways.
    next: Arc<AtomicUsize>,
    session: SessionRef,
}

impl Session {
    /// A session with a fresh unique id.
    pub fn new(client: AgentClient<Channel>) -> Self {
        Self::with_ref(client, new_session_ref())
    }

    pub fn with_ref(client: AgentClient<Channel>, session: SessionRef) -> Self {
        Self::alternating(vec![client], session)
    }

    /// A session whose calls go to `clients` in turn (round robin), e.g. the gateways of a cluster.
    pub fn alternating(clients: Vec<AgentClient<Channel>>, session: SessionRef) -> Self {
        assert!(!clients.is_empty(), "a session needs at least one client");
        Self { clients: clients.into(), next: Arc::new(AtomicUsize::new(0)), session }
    }

    pub fn reference(&self) -> SessionRef {
        self.session.clone()
    }

    /// The client of the next call (the same one each time unless the session alternates).
    pub fn client(&self) -> AgentClient<Channel> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        self.clients[i].clone()
    }

    fn some_ref(&self) -> Option<SessionRef> {
        Some(self.session.clone())
    }

    fn deliver(&self, message: UserMessage) -> DeliverRequest {
        DeliverRequest { session: self.some_ref(), message: Some(message), output_schema: None }
    }

    pub async fn send(&self, message: UserMessage, target: Target, wakeup: bool) -> Result<SendReply, Status> {
        let req = SendRequest { session: self.some_ref(), message: Some(message), target: target as i32, wakeup };
        self.client().send(req).await.map(tonic::Response::into_inner)
    }

    pub async fn followup(&self, message: UserMessage) -> Result<SendReply, Status> {
        self.client().followup(self.deliver(message)).await.map(tonic::Response::into_inner)
    }

    pub async fn queue(&self, message: UserMessage) -> Result<SendReply, Status> {
        self.client().queue(self.deliver(message)).await.map(tonic::Response::into_inner)
    }

    pub async fn steer(&self, message: UserMessage, expected_turn: Option<u64>) -> Result<SendReply, Status> {
        let req =
            SteerRequest { session: self.some_ref(), message: Some(message), expected_turn, ..Default::default() };
        self.client().steer(req).await.map(tonic::Response::into_inner)
    }

    /// A steer with a deadline (SPEC §11): `on_deadline` is a `turnstile.v1.OnDeadline` value.
    pub async fn steer_with_deadline(
        &self,
        message: UserMessage,
        deadline_ms: Option<u64>,
        on_deadline: i32,
    ) -> Result<SendReply, Status> {
        let req = SteerRequest {
            session: self.some_ref(),
            message: Some(message),
            expected_turn: None,
            deadline_ms,
            on_deadline,
        };
        self.client().steer(req).await.map(tonic::Response::into_inner)
    }

    pub async fn inject(&self, message: UserMessage) -> Result<SendReply, Status> {
        self.client().inject(self.deliver(message)).await.map(tonic::Response::into_inner)
    }

    pub async fn interrupt(&self, message: UserMessage) -> Result<SendReply, Status> {
        self.client().interrupt(self.deliver(message)).await.map(tonic::Response::into_inner)
    }

    /// Cancel with cause `user`.
    pub async fn cancel(&self, keep_inbox: bool) -> Result<CancelReply, Status> {
        self.cancel_with(Cause::User(Empty {}), keep_inbox).await
    }

    pub async fn cancel_with(&self, cause: Cause, keep_inbox: bool) -> Result<CancelReply, Status> {
        let req =
            CancelRequest { session: self.some_ref(), cause: Some(CancelCause { cause: Some(cause) }), keep_inbox };
        self.client().cancel(req).await.map(tonic::Response::into_inner)
    }

    pub async fn replace(&self, id: &str, message: UserMessage) -> Result<EditReply, Status> {
        let req = ReplaceRequest { session: self.some_ref(), id: id.into(), message: Some(message) };
        self.client().replace(req).await.map(tonic::Response::into_inner)
    }

    pub async fn remove(&self, id: &str) -> Result<EditReply, Status> {
        let req = RemoveRequest { session: self.some_ref(), id: id.into() };
        self.client().remove(req).await.map(tonic::Response::into_inner)
    }

    pub async fn splice(
        &self,
        target: Target,
        start: u32,
        delete_count: u32,
        inserted: Vec<UserMessage>,
    ) -> Result<EditReply, Status> {
        let req = SpliceRequest { session: self.some_ref(), target: target as i32, start, delete_count, inserted };
        self.client().splice(req).await.map(tonic::Response::into_inner)
    }

    pub async fn clear(&self) -> Result<EditReply, Status> {
        self.client().clear(ClearRequest { session: self.some_ref() }).await.map(tonic::Response::into_inner)
    }

    /// `ConfigureSession(agent, inject_mode)`; `inject_mode` is a `turnstile.v1.InjectMode` value.
    pub async fn configure(&self, agent: &str, inject_mode: InjectMode) -> Result<SessionInfo, Status> {
        let req = ConfigureSessionRequest {
            session: self.some_ref(),
            agent: agent.to_owned(),
            inject_mode: inject_mode as i32,
            ..Default::default()
        };
        self.client().configure_session(req).await.map(tonic::Response::into_inner)
    }

    /// `Decide(call_id, approve, reason)` (SPEC §9).
    pub async fn decide(&self, call_id: &str, approve: bool, reason: &str) -> Result<EditReply, Status> {
        let req = turnstile_proto::v1::DecideRequest {
            session: self.some_ref(),
            call_id: call_id.to_owned(),
            approve,
            reason: reason.to_owned(),
        };
        self.client().decide(req).await.map(tonic::Response::into_inner)
    }

    /// `Compact` (SPEC §13).
    pub async fn compact(&self) -> Result<EditReply, Status> {
        let req = turnstile_proto::v1::CompactRequest { session: self.some_ref() };
        self.client().compact(req).await.map(tonic::Response::into_inner)
    }

    /// `ForkSession(at_turn, new_session)` (SPEC §13); `new_session` is an id in this session's tenant.
    pub async fn fork(&self, at_turn: u64, new_session: &str) -> Result<SessionInfo, Status> {
        let req = turnstile_proto::v1::ForkSessionRequest {
            session: self.some_ref(),
            at_turn,
            new_session: new_session.to_owned(),
        };
        self.client().fork_session(req).await.map(tonic::Response::into_inner)
    }

    /// `ReferenceSession(from_session, upto_turn)` (SPEC §13) as message `id`.
    pub async fn reference_session(
        &self,
        from: SessionRef,
        upto_turn: Option<u64>,
        id: &str,
    ) -> Result<SendReply, Status> {
        let req = turnstile_proto::v1::ReferenceSessionRequest {
            session: self.some_ref(),
            from_session: Some(from),
            upto_turn,
            message_id: id.to_owned(),
        };
        self.client().reference_session(req).await.map(tonic::Response::into_inner)
    }

    /// `SetGoal(objective, max_rounds)` (SPEC §10).
    pub async fn set_goal(&self, objective: &str, max_rounds: u32) -> Result<GoalInfo, Status> {
        let req = SetGoalRequest { session: self.some_ref(), objective: objective.to_owned(), max_rounds };
        self.client().set_goal(req).await.map(tonic::Response::into_inner)
    }

    /// `UpdateGoal(goal_id, action)` (SPEC §10).
    pub async fn update_goal(&self, goal_id: &str, action: GoalAction) -> Result<GoalInfo, Status> {
        let req = UpdateGoalRequest { session: self.some_ref(), goal_id: goal_id.to_owned(), action: action as i32 };
        self.client().update_goal(req).await.map(tonic::Response::into_inner)
    }

    /// `DeleteSession` (SPEC §12).
    pub async fn delete(&self) -> Result<EditReply, Status> {
        let req = turnstile_proto::v1::DeleteSessionRequest { session: self.some_ref() };
        self.client().delete_session(req).await.map(tonic::Response::into_inner)
    }

    pub async fn inbox(&self) -> Result<InboxSnapshot, Status> {
        let req = GetInboxRequest { session: self.some_ref() };
        self.client().get_inbox(req).await.map(tonic::Response::into_inner)
    }

    pub async fn info(&self) -> Result<SessionInfo, Status> {
        let req = GetSessionRequest { session: self.some_ref() };
        self.client().get_session(req).await.map(tonic::Response::into_inner)
    }

    /// `WhenIdle` with the harness's default bound.
    pub async fn when_idle(&self) -> Result<SessionInfo, Status> {
        self.when_idle_within(DEFAULT_WAIT).await
    }

    /// `WhenIdle` with the server's wait bounded by `wait` (DEADLINE_EXCEEDED after it).
    pub async fn when_idle_within(&self, wait: std::time::Duration) -> Result<SessionInfo, Status> {
        let timeout_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let req = WhenIdleRequest { session: self.some_ref(), timeout_ms };
        self.client().when_idle(req).await.map(tonic::Response::into_inner)
    }

    /// Starts recording `Watch(after_seq = 0, live = true)`; returns once `caught_up` arrived, so every
    /// command sent afterwards is seen live.
    pub async fn watch(&self) -> Result<WatchRecorder, HarnessError> {
        WatchRecorder::start(self.client(), self.reference(), 0, true).await
    }

    /// The durable log as a fresh `Watch(after_seq, live = false)` replays it up to `caught_up`.
    pub async fn replay(&self, after_seq: u64) -> Result<(Vec<SessionEvent>, u64), HarnessError> {
        let req = WatchRequest { session: self.some_ref(), after_seq, live: false, resume: None };
        let mut stream = self.client().watch(req).await?.into_inner();
        let read = async move {
            let mut events = Vec::new();
            while let Some(item) = stream.message().await? {
                match item.item {
                    Some(Item::Event(e)) => events.push(e),
                    Some(Item::CaughtUp(c)) => return Ok((events, c.seq)),
                    Some(Item::Live(_)) => {
                        return Err(HarnessError::Inconsistent("live event on a live = false watch".into()));
                    }
                    None => {}
                }
            }
            Err(HarnessError::Inconsistent("watch ended before caught_up".into()))
        };
        let (events, seq) =
            tokio::time::timeout(DEFAULT_WAIT, read).await.map_err(|_| HarnessError::WaitTimeout {
                what: "caught_up on a replay".into(),
                waited: DEFAULT_WAIT,
                recorded: String::new(),
            })??;
        Ok((events, seq))
    }

    /// [`Session::replay`], asked again while the server answers UNAVAILABLE (a shard or a stream leader
    /// moving, a NATS node away, a full store refusing a new reader for a moment), for at most `within`.
    /// Any other error, or the last UNAVAILABLE, is returned: a real read error is not taken for slowness.
    pub async fn replay_while_unavailable(
        &self,
        after_seq: u64,
        within: Duration,
    ) -> Result<(Vec<SessionEvent>, u64), HarnessError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.replay(after_seq).await {
                Err(HarnessError::Status(s))
                    if s.code() == Code::Unavailable && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                read => return read,
            }
        }
    }
}

impl IdleSeq for Session {
    async fn idle_last_seq(&self) -> Result<u64, HarnessError> {
        match self.when_idle().await {
            Ok(_) => Ok(self.info().await?.last_seq),
            Err(status) if status.code() == Code::NotFound => Ok(0),
            Err(status) => Err(status.into()),
        }
    }
}
