//! The shard router against scripted transports and lease maps: routing, retries on not-owner, timeouts.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tonic::Status;
use turnstile_model::message::{ContentBlock, MessageId, MessageSource, Target, UserMessage};
use turnstile_proto::cluster::v1 as cpb;

use super::*;
use crate::kv::LeaseEntry;

const SHARDS: u32 = 8;
const FAR: u64 = u64::MAX / 2;

/// Answers per address from a script; an address with no script left refuses the connection.
#[derive(Default)]
struct FakeTransport {
    script: Mutex<HashMap<String, VecDeque<Result<cpb::ExecuteReply, Status>>>>,
    calls: Mutex<Vec<String>>,
}

impl FakeTransport {
    fn answer(&self, addr: &str, answer: Result<cpb::ExecuteReply, Status>) {
        self.script.lock().unwrap().entry(addr.to_owned()).or_default().push_back(answer);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl WorkerTransport for FakeTransport {
    async fn execute(
        &self,
        addr: &str,
        _request: cpb::ExecuteRequest,
        _timeout: Duration,
    ) -> Result<cpb::ExecuteReply, Status> {
        self.calls.lock().unwrap().push(addr.to_owned());
        let next = self.script.lock().unwrap().get_mut(addr).and_then(VecDeque::pop_front);
        next.unwrap_or_else(|| Err(Status::unavailable("tcp connect error: Connection refused")))
    }
}

fn session() -> SessionRef {
    SessionRef::new("acme", "s1").unwrap()
}

fn map_with(owner: Option<(&str, &str, u64)>) -> ShardMap {
    let shard = shard_of(&session(), SHARDS);
    let mut map = ShardMap { shards: SHARDS, complete: true, ..ShardMap::default() };
    if let Some((owner, addr, epoch)) = owner {
        let lease = ShardLease { owner: owner.into(), addr: addr.into(), epoch, expires_at_ms: FAR };
        map.leases.insert(shard, LeaseEntry { lease, revision: epoch });
    }
    map
}

/// `map` with every lease long expired.
fn expired(mut map: ShardMap) -> ShardMap {
    for entry in map.leases.values_mut() {
        entry.lease.expires_at_ms = 1;
    }
    map
}

fn sent(seq: u64) -> Result<cpb::ExecuteReply, Status> {
    let reply = crate::codec::encode_command_reply(&session(), &CommandReply::Sent { seq, turn: None });
    Ok(reply)
}

fn not_owner(owner: Option<&str>) -> Result<cpb::ExecuteReply, Status> {
    let err = CommandError::NotOwner { session: session().to_string(), owner: owner.map(str::to_owned) };
    Err(crate::status::command_status(&err))
}

fn followup() -> Command {
    let message = UserMessage {
        id: MessageId("m1".into()),
        content: vec![ContentBlock::text("hi")].into(),
        source: MessageSource::User,
    };
    Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None }
}

fn config(deadline_ms: u64) -> ClusterRouterConfig {
    ClusterRouterConfig {
        deadline: Duration::from_millis(deadline_ms),
        backoff: Duration::from_millis(5),
        ..ClusterRouterConfig::default()
    }
}

#[tokio::test]
async fn a_command_goes_to_the_owner_of_its_shard() {
    let (_tx, rx) = watch::channel(map_with(Some(("w1", "10.0.0.1:1", 1))));
    let transport = Arc::new(FakeTransport::default());
    transport.answer("10.0.0.1:1", sent(3));
    let router = ClusterRouter::with_transport(rx, transport.clone(), config(1000));
    assert_eq!(router.execute(&session(), followup(), None).await, Ok(CommandReply::Sent { seq: 3, turn: None }));
    assert_eq!(transport.calls(), ["10.0.0.1:1"]);
    assert_eq!(router.owner(&session()).await.as_deref(), Some("w1"));
}

/// A followup sent through `router` once its first attempt reached `transport`: that attempt has to fail (or
/// hang) before the map moves, or there is nothing to retry.
async fn first_attempted(
    router: &Arc<ClusterRouter>,
    transport: &FakeTransport,
) -> tokio::task::JoinHandle<Result<CommandReply, CommandError>> {
    let call = tokio::spawn({
        let router = router.clone();
        async move { router.execute(&session(), followup(), None).await }
    });
    while transport.calls().is_empty() {
        tokio::task::yield_now().await;
    }
    call
}

#[tokio::test]
async fn not_owner_waits_for_the_map_to_name_the_new_owner() {
    let (tx, rx) = watch::channel(map_with(Some(("w1", "a:1", 1))));
    let transport = Arc::new(FakeTransport::default());
    transport.answer("a:1", not_owner(Some("b:2")));
    transport.answer("b:2", sent(9));
    let router = Arc::new(ClusterRouter::with_transport(rx, transport.clone(), config(30_000)));
    let call = first_attempted(&router, &transport).await;
    tx.send(map_with(Some(("w2", "b:2", 2)))).unwrap();
    assert_eq!(call.await.unwrap(), Ok(CommandReply::Sent { seq: 9, turn: None }));
    assert_eq!(transport.calls(), ["a:1", "b:2"]);
}

#[tokio::test]
async fn a_refused_connection_is_retried_once_a_new_owner_appears() {
    let (tx, rx) = watch::channel(map_with(None));
    let transport = Arc::new(FakeTransport::default());
    transport.answer("b:2", sent(4));
    let router = Arc::new(ClusterRouter::with_transport(rx, transport.clone(), config(30_000)));
    tx.send(map_with(Some(("w1", "dead:1", 1)))).unwrap();
    let call = first_attempted(&router, &transport).await;
    tx.send(map_with(Some(("w2", "b:2", 2)))).unwrap();
    assert_eq!(call.await.unwrap(), Ok(CommandReply::Sent { seq: 4, turn: None }));
    assert_eq!(transport.calls().first().map(String::as_str), Some("dead:1"));
    assert_eq!(transport.calls().last().map(String::as_str), Some("b:2"));
}

#[tokio::test]
async fn no_owner_until_the_deadline_is_unavailable_naming_the_shard() {
    let (_tx, rx) = watch::channel(map_with(None));
    let transport = Arc::new(FakeTransport::default());
    let router = ClusterRouter::with_transport(rx, transport.clone(), config(100));
    let err = router.execute(&session(), followup(), None).await.unwrap_err();
    let shard = shard_of(&session(), SHARDS);
    let CommandError::Unavailable(message) = err else { panic!("not unavailable: {err:?}") };
    assert!(message.starts_with(&format!("no worker owns session acme/s1's shard {shard} yet")), "{message}");
    assert!(message.ends_with("retry"), "{message}");
    assert!(transport.calls().is_empty());
    assert_eq!(router.owner(&session()).await, None);
}

#[tokio::test]
async fn a_dead_owner_that_never_moves_ends_unavailable() {
    let (_tx, rx) = watch::channel(map_with(Some(("w1", "dead:1", 1))));
    let transport = Arc::new(FakeTransport::default());
    let router = ClusterRouter::with_transport(rx, transport.clone(), config(100));
    let err = router.execute(&session(), followup(), None).await.unwrap_err();
    let CommandError::Unavailable(message) = err else { panic!("not unavailable: {err:?}") };
    assert!(message.contains("dead:1 did not answer"), "{message}");
    assert!(!transport.calls().is_empty());
}

/// Never answers, like a SIGSTOPped owner whose connection stays open.
struct Hung {
    inner: FakeTransport,
}

#[async_trait]
impl WorkerTransport for Hung {
    async fn execute(
        &self,
        addr: &str,
        request: cpb::ExecuteRequest,
        timeout: Duration,
    ) -> Result<cpb::ExecuteReply, Status> {
        if addr == "paused:1" {
            self.inner.calls.lock().unwrap().push(addr.to_owned());
            std::future::pending::<()>().await;
        }
        self.inner.execute(addr, request, timeout).await
    }
}

#[tokio::test]
async fn a_call_to_an_owner_that_hangs_moves_to_the_new_owner() {
    let (tx, rx) = watch::channel(map_with(Some(("w1", "paused:1", 1))));
    let transport = Arc::new(Hung { inner: FakeTransport::default() });
    transport.inner.answer("b:2", sent(5));
    let router = Arc::new(ClusterRouter::with_transport(rx, transport.clone(), config(30_000)));
    let call = first_attempted(&router, &transport.inner).await;
    tx.send(map_with(Some(("w2", "b:2", 2)))).unwrap();
    assert_eq!(call.await.unwrap(), Ok(CommandReply::Sent { seq: 5, turn: None }));
    assert_eq!(transport.inner.calls(), ["paused:1", "b:2"]);
}

#[tokio::test]
async fn application_errors_are_returned_as_the_worker_gave_them() {
    let (_tx, rx) = watch::channel(map_with(Some(("w1", "a:1", 1))));
    let transport = Arc::new(FakeTransport::default());
    let precondition = CommandError::FailedPrecondition("session acme/s1 is idle".into());
    transport.answer("a:1", Err(crate::status::command_status(&precondition)));
    let router = ClusterRouter::with_transport(rx, transport.clone(), config(1000));
    assert_eq!(router.execute(&session(), followup(), None).await, Err(precondition));
    assert_eq!(transport.calls().len(), 1, "an application error is not retried");
}

#[tokio::test]
async fn the_owner_an_expired_lease_names_is_still_asked() {
    // While the lease bucket elects a leader nobody renews, yet the owner still serves (decision 0094).
    let (_tx, rx) = watch::channel(expired(map_with(Some(("w1", "a:1", 1)))));
    let transport = Arc::new(FakeTransport::default());
    transport.answer("a:1", sent(7));
    let router = ClusterRouter::with_transport(rx, transport.clone(), config(1000));
    assert_eq!(router.execute(&session(), followup(), None).await, Ok(CommandReply::Sent { seq: 7, turn: None }));
    assert_eq!(transport.calls(), ["a:1"]);
}

#[tokio::test]
async fn an_expired_lease_is_no_owner() {
    let (_tx, rx) = watch::channel(expired(map_with(Some(("w1", "a:1", 1)))));
    let router = ClusterRouter::with_transport(rx, Arc::new(FakeTransport::default()), config(50));
    assert_eq!(router.owner(&session()).await, None);
    assert!(matches!(router.execute(&session(), followup(), None).await, Err(CommandError::Unavailable(_))));
}
