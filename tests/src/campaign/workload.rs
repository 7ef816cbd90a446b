//! The campaign's client workload: every delivery preset, cancels, edits and reads through either gateway,
//! each call with a deadline and retried with the same MessageId while its outcome is unknown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::cancel_cause::Cause;
use turnstile_proto::v1::{
    CancelCause, CancelRequest, ClearRequest, DeliverRequest, Empty, GetInboxRequest, GetSessionRequest, RemoveRequest,
    ReplaceRequest, SendRequest, SessionRef, SteerRequest, Target, UserMessage,
};

use super::history::{CallRecord, Outcome};
use super::{CALL_DEADLINE, GRACE, RETRY_BUDGET, unix_ms};
use crate::user_msg;

/// The clients' view of the gateways: a restarted gateway has a new port, so its channel is replaced here.
pub type Gateways = Arc<RwLock<Vec<Channel>>>;

/// Shared by the client tasks and the fault schedule.
pub(super) struct Shared {
    pub(super) gateways: Gateways,
    /// The gateways' URLs, replaced with the channels: the hostile tenant dials its own connections.
    pub(super) gateway_urls: Arc<RwLock<Vec<String>>>,
    pub(super) history: Mutex<Vec<CallRecord>>,
    pub(super) started: Instant,
    pub(super) stop: Arc<AtomicBool>,
}

impl Shared {
    pub(super) fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs one call through gateway `gateway` with the campaign's deadline, bounded by deadline + grace,
    /// and records it.
    pub(super) async fn call<F, Fut>(
        &self,
        client: usize,
        session: usize,
        kind: &'static str,
        id: Option<&str>,
        gateway: usize,
        f: F,
    ) -> Outcome
    where
        F: FnOnce(AgentClient<Channel>) -> Fut,
        Fut: Future<Output = Result<u64, Status>>,
    {
        let channel = match self.gateways.read() {
            Ok(g) => g[gateway].clone(),
            Err(_) => return Outcome::Err(Code::Internal, "the gateway list is poisoned".into()),
        };
        let (start_ms, start_unix_ms) = (self.ms(), unix_ms());
        let outcome = match tokio::time::timeout(CALL_DEADLINE + GRACE, f(AgentClient::new(channel))).await {
            Ok(Ok(seq)) => Outcome::Ok(seq),
            Ok(Err(status)) => Outcome::Err(status.code(), status.message().to_owned()),
            Err(_) => Outcome::Hung,
        };
        let record = CallRecord {
            client,
            session,
            kind,
            id: id.map(str::to_owned),
            gateway,
            start_ms,
            end_ms: self.ms(),
            start_unix_ms,
            deadline_ms: CALL_DEADLINE.as_millis() as u64,
            outcome: outcome.clone(),
        };
        if let Ok(mut history) = self.history.lock() {
            history.push(record);
        }
        outcome
    }
}

pub(super) fn req<M>(message: M) -> Request<M> {
    let mut request = Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

/// The delivery presets of the API.
#[derive(Clone, Copy, Debug)]
pub(super) enum Preset {
    SendNextTurn { wakeup: bool },
    SendNextStep { wakeup: bool },
    Followup,
    Queue,
    Steer,
    Inject,
    Interrupt,
}

impl Preset {
    const ALL: [Preset; 9] = [
        Preset::SendNextTurn { wakeup: true },
        Preset::SendNextTurn { wakeup: false },
        Preset::SendNextStep { wakeup: true },
        Preset::SendNextStep { wakeup: false },
        Preset::Followup,
        Preset::Queue,
        Preset::Steer,
        Preset::Inject,
        Preset::Interrupt,
    ];

    pub(super) fn kind(self) -> &'static str {
        match self {
            Preset::SendNextTurn { wakeup: true } => "send(next_turn, wakeup)",
            Preset::SendNextTurn { wakeup: false } => "send(next_turn)",
            Preset::SendNextStep { wakeup: true } => "send(next_step, wakeup)",
            Preset::SendNextStep { wakeup: false } => "send(next_step)",
            Preset::Followup => "followup",
            Preset::Queue => "queue",
            Preset::Steer => "steer",
            Preset::Inject => "inject",
            Preset::Interrupt => "interrupt",
        }
    }

    pub(super) async fn call(
        self,
        mut c: AgentClient<Channel>,
        session: SessionRef,
        m: UserMessage,
    ) -> Result<u64, Status> {
        let deliver = DeliverRequest { session: Some(session.clone()), message: Some(m.clone()), output_schema: None };
        let send = |target: Target, wakeup: bool| SendRequest {
            session: Some(session.clone()),
            message: Some(m.clone()),
            target: target as i32,
            wakeup,
        };
        let reply = match self {
            Preset::SendNextTurn { wakeup } => c.send(req(send(Target::NextTurn, wakeup))).await,
            Preset::SendNextStep { wakeup } => c.send(req(send(Target::NextStep, wakeup))).await,
            Preset::Followup => c.followup(req(deliver)).await,
            Preset::Queue => c.queue(req(deliver)).await,
            Preset::Steer => {
                let steer = SteerRequest { session: Some(session), message: Some(m), ..Default::default() };
                c.steer(req(steer)).await
            }
            Preset::Inject => c.inject(req(deliver)).await,
            Preset::Interrupt => c.interrupt(req(deliver)).await,
        };
        reply.map(|r| r.into_inner().seq)
    }
}

/// One client task: a seeded random sequence of calls over its sessions until the schedule ends.
pub(super) async fn client_task(shared: Arc<Shared>, client: usize, seed: u64, sessions: Vec<(usize, SessionRef)>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Ids this client got acknowledged per session (the edit targets).
    let mut acked: HashMap<usize, Vec<String>> = HashMap::new();
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let (si, session) = sessions[rng.usize(..sessions.len())].clone();
        let gateway = rng.usize(..2);
        let roll = rng.u32(..100);
        let pick_id = |rng: &mut fastrand::Rng, acked: &HashMap<usize, Vec<String>>| {
            acked.get(&si).filter(|v| !v.is_empty()).map(|v| v[v.len() - 1 - rng.usize(..v.len().min(4))].clone())
        };
        match roll {
            0..=59 => {
                let preset = Preset::ALL[rng.usize(..Preset::ALL.len())];
                n += 1;
                let id = format!("{}-c{client}-{n}", session.id);
                let text = if rng.u32(..3) == 0 { format!("[[tool:sleep 300]] {id}") } else { format!("hi {id}") };
                let message = user_msg(&id, &text);
                let began = Instant::now();
                let mut gw = gateway;
                loop {
                    let (s, m) = (session.clone(), message.clone());
                    let outcome = shared.call(client, si, preset.kind(), Some(&id), gw, |c| preset.call(c, s, m)).await;
                    match outcome {
                        Outcome::Ok(_) => {
                            acked.entry(si).or_default().push(id.clone());
                            break;
                        }
                        o if o.maybe() && began.elapsed() < RETRY_BUDGET && !shared.stop.load(Ordering::Relaxed) => {
                            tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
                            gw = rng.usize(..2);
                        }
                        _ => break,
                    }
                }
            }
            60..=69 => {
                let keep_inbox = rng.bool();
                let s = session.clone();
                let kind = if keep_inbox { "cancel(keep_inbox)" } else { "cancel" };
                shared
                    .call(client, si, kind, None, gateway, |mut c| async move {
                        let cause = Some(CancelCause { cause: Some(Cause::User(Empty {})) });
                        c.cancel(req(CancelRequest { session: Some(s), cause, keep_inbox }))
                            .await
                            .map(|r| r.into_inner().seq)
                    })
                    .await;
            }
            70..=77 => {
                if let Some(id) = pick_id(&mut rng, &acked) {
                    let s = session.clone();
                    let message = user_msg(&id, &format!("replaced {id} {}", rng.u32(..1000)));
                    let target = id.clone();
                    shared
                        .call(client, si, "replace", Some(&id), gateway, |mut c| async move {
                            let r = ReplaceRequest { session: Some(s), id: target, message: Some(message) };
                            c.replace(req(r)).await.map(|r| r.into_inner().seq)
                        })
                        .await;
                }
            }
            78..=85 => {
                if let Some(id) = pick_id(&mut rng, &acked) {
                    let (s, target) = (session.clone(), id.clone());
                    shared
                        .call(client, si, "remove", Some(&id), gateway, |mut c| async move {
                            c.remove(req(RemoveRequest { session: Some(s), id: target }))
                                .await
                                .map(|r| r.into_inner().seq)
                        })
                        .await;
                }
            }
            86..=87 => {
                let s = session.clone();
                shared
                    .call(client, si, "clear", None, gateway, |mut c| async move {
                        c.clear(req(ClearRequest { session: Some(s) })).await.map(|r| r.into_inner().seq)
                    })
                    .await;
            }
            88..=93 => {
                let s = session.clone();
                shared
                    .call(client, si, "get_inbox", None, gateway, |mut c| async move {
                        c.get_inbox(req(GetInboxRequest { session: Some(s) })).await.map(|r| r.into_inner().seq)
                    })
                    .await;
            }
            _ => {
                let s = session.clone();
                shared
                    .call(client, si, "get_session", None, gateway, |mut c| async move {
                        c.get_session(req(GetSessionRequest { session: Some(s) }))
                            .await
                            .map(|r| r.into_inner().last_seq)
                    })
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(30..250))).await;
    }
}
