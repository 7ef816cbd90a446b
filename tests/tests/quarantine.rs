//! Logs that cannot be folded (issue 37; decisions 0083 and 0084), through the real `turnstile dev` on the
//! embedded journal and on JetStream:
//!
//! - `ImportSessions` refuses a stream whose log would not fold (a lone `turn/end`; a real log with an event
//!   left out and the rest renumbered) and epochs and times out of bounds, with INVALID_ARGUMENT, writing
//!   nothing of the session.
//! - A session planted straight into the journal with a log that cannot be folded is quarantined: `dev`
//!   starts again on that journal and serves the other sessions, the planted one answers FAILED_PRECONDITION
//!   naming the quarantine (commands and reads), is counted in `turnstile_sessions_quarantined`, its raw
//!   events still export, and `DeleteSession` removes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use tempfile::TempDir;
use tonic::Code;
use turnstile_journal::{EmbeddedLog, JetStreamConfig, JetStreamLog, SessionLog};
use turnstile_model::{Envelope, EventPayload, TurnEndReason};
use turnstile_proto::codec;
use turnstile_proto::v1::export_item::Item;
use turnstile_proto::v1::{self as pb, SessionRef};
use turnstile_tests::{Backend, DevOptions, DevServer, NatsServer, Session, user_msg};

const TENANT: &str = "tenanta";

fn sref(id: &str) -> SessionRef {
    SessionRef { tenant: TENANT.into(), id: id.into() }
}

fn domain(id: &str) -> turnstile_model::SessionRef {
    turnstile_model::SessionRef::new(TENANT, id).unwrap()
}

/// A lone `turn/end` at seq 1: no turn was ever started.
fn lone_turn_end(id: &str) -> Vec<Envelope> {
    let payload = EventPayload::TurnEnd { turn: 1, reason: TurnEndReason::Completed };
    vec![Envelope { session: domain(id), seq: 1, time_ms: 1_000, epoch: 1, payload }]
}

/// The export items of `events` (one session, one group).
fn export_of(events: &[Envelope]) -> Vec<pb::ExportItem> {
    let session = &events[0].session;
    let header = pb::ExportHeader { format: 1, tenant: session.tenant.clone(), exported_unix_ms: 1 };
    let group = pb::SessionEventGroup { events: events.iter().map(codec::encode_session_event).collect() };
    let end =
        pb::ExportedSession { session: Some(codec::encode_session_ref(session)), last_seq: events.last().unwrap().seq };
    [Item::Header(header), Item::Events(group), Item::End(end)]
        .into_iter()
        .map(|item| pb::ExportItem { item: Some(item) })
        .collect()
}

/// `events` moved to session `id`.
fn moved(events: &[Envelope], id: &str) -> Vec<Envelope> {
    events.iter().map(|e| Envelope { session: domain(id), ..e.clone() }).collect()
}

/// The items `ExportSessions` streams for session `id`.
async fn export(dev: &DevServer, id: &str) -> Vec<pb::ExportItem> {
    let request = pb::ExportSessionsRequest { tenant: TENANT.into(), sessions: vec![id.into()] };
    let mut stream = dev.client().export_sessions(request).await.unwrap().into_inner();
    let mut items = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        items.push(item);
    }
    items
}

/// The events of an export, decoded.
fn events_of(items: &[pb::ExportItem]) -> Vec<Envelope> {
    let groups = items.iter().filter_map(|i| match &i.item {
        Some(Item::Events(group)) => Some(group.events.clone()),
        _ => None,
    });
    groups.flatten().map(|e| codec::decode_session_event(e).unwrap()).collect()
}

async fn an_unfoldable_import_is_refused_with_invalid_argument(backend: Backend) {
    let dev = backend.start_dev().await.unwrap();
    let source = Session::with_ref(dev.client(), sref("source"));
    source.followup(user_msg("m1", "hello")).await.unwrap();
    source.when_idle().await.unwrap();
    let real = events_of(&export(&dev, "source").await);

    // A real log with its turn/start left out and the rest renumbered, so the seqs are contiguous.
    let mut renumbered = moved(&real, "renumbered");
    let start = renumbered.iter().position(|e| matches!(e.payload, EventPayload::TurnStart { .. })).unwrap();
    renumbered.remove(start);
    for (e, seq) in renumbered.iter_mut().zip(1..) {
        e.seq = seq;
    }
    let mut epoch = moved(&real, "epoch");
    epoch.last_mut().unwrap().epoch = 1 << 63;
    let mut time = moved(&real, "time");
    time.last_mut().unwrap().time_ms = u64::MAX;
    for (id, events) in [("lone", lone_turn_end("lone")), ("renumbered", renumbered), ("epoch", epoch), ("time", time)]
    {
        let err = dev.client().import_sessions(futures::stream::iter(export_of(&events))).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{id}: {err:?}");
        assert!(err.message().contains(&format!("{TENANT}/{id}")), "{id}: names the session: {}", err.message());
        let info = Session::with_ref(dev.client(), sref(id)).info().await.unwrap_err();
        assert_eq!(info.code(), Code::NotFound, "{id}: nothing of it was written: {info:?}");
    }
    // The real log itself imports, and goes on.
    let reply = dev.client().import_sessions(futures::stream::iter(export_of(&moved(&real, "copy")))).await.unwrap();
    assert_eq!(reply.into_inner().sessions, 1);
    let copy = Session::with_ref(dev.client(), sref("copy"));
    copy.followup(user_msg("m2", "again")).await.unwrap();
    assert_eq!(copy.when_idle().await.unwrap().last_turn, 2);
}

/// Where a test's `dev` keeps its sessions across restarts, and how a log is planted there by hand.
enum Store {
    Embedded(TempDir),
    Nats(Box<NatsServer>),
}

impl Store {
    async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Embedded => Store::Embedded(tempfile::tempdir().unwrap()),
            Backend::Nats => Store::Nats(Box::new(NatsServer::start().await.unwrap())),
        }
    }

    fn options(&self) -> DevOptions {
        match self {
            Store::Embedded(dir) => DevOptions::data_dir(dir.path()),
            Store::Nats(nats) => DevOptions::nats(nats.url()),
        }
    }

    /// Writes `events` as a new session's log straight into the journal, past every check of the API. On
    /// the embedded journal the server must be stopped (it owns the directory).
    async fn plant(&self, events: &[Envelope]) {
        let log: Arc<dyn SessionLog> = match self {
            Store::Embedded(dir) => Arc::new(EmbeddedLog::open(dir.path()).unwrap()),
            Store::Nats(nats) => Arc::new(JetStreamLog::connect(JetStreamConfig::new(nats.url())).await.unwrap()),
        };
        log.append_first(&events[0].session, events, None).await.unwrap();
    }
}

/// `turnstile_sessions_quarantined` on `dev`'s `/metrics`.
async fn quarantined_gauge(dev: &DevServer) -> Option<u64> {
    let (status, body) = turnstile_tests::nats::http_get(dev.http_addr()?, "/metrics").await?;
    assert_eq!(status, 200);
    let value = body.lines().find_map(|line| line.strip_prefix("turnstile_sessions_quarantined "))?;
    Some(value.trim().parse::<f64>().unwrap() as u64)
}

fn assert_quarantined(status: &tonic::Status, id: &str) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // The message is the contract here: it names the quarantine and the session.
    assert!(
        status.message().contains("quarantined") && status.message().contains(&format!("{TENANT}/{id}")),
        "{status:?}"
    );
}

async fn a_planted_unfoldable_session_is_quarantined_while_dev_restarts_and_serves_others(backend: Backend) {
    let store = Store::new(backend).await;
    let dev = DevServer::start_with(store.options()).await.unwrap();
    let good = Session::with_ref(dev.client(), sref("good"));
    good.followup(user_msg("g1", "hello")).await.unwrap();
    good.when_idle().await.unwrap();
    dev.stop().await;
    store.plant(&lone_turn_end("sem")).await;

    // `dev` starts again on that journal (it used to exit 1) and serves the other session.
    let dev = DevServer::start_with(store.options()).await.unwrap();
    let good = Session::with_ref(dev.client(), sref("good"));
    good.followup(user_msg("g2", "still there?")).await.unwrap();
    assert_eq!(good.when_idle().await.unwrap().last_turn, 2);

    // The planted one: its commands and reads name the quarantine, and it is counted.
    let sem = Session::with_ref(dev.client(), sref("sem"));
    assert_quarantined(&sem.followup(user_msg("s1", "hello?")).await.unwrap_err(), "sem");
    assert_quarantined(&sem.info().await.unwrap_err(), "sem");
    assert_eq!(quarantined_gauge(&dev).await, Some(1));
    // Its raw log is still readable.
    let items = export(&dev, "sem").await;
    assert_eq!(events_of(&items), lone_turn_end("sem"), "the raw events, as planted");
    assert!(matches!(items.last().and_then(|i| i.item.as_ref()), Some(Item::End(end)) if end.last_seq == 1));

    // On JetStream a log can also be planted while the server runs: its first command finds it.
    if let Store::Nats(_) = &store {
        store.plant(&lone_turn_end("later")).await;
        let later = Session::with_ref(dev.client(), sref("later"));
        assert_quarantined(&later.followup(user_msg("l1", "hello?")).await.unwrap_err(), "later");
        assert_quarantined(&later.followup(user_msg("l2", "again?")).await.unwrap_err(), "later");
        assert_eq!(quarantined_gauge(&dev).await, Some(2));
        later.delete().await.unwrap();
    }

    // Deleting removes it; the id is then a new session.
    sem.delete().await.unwrap();
    assert_eq!(sem.info().await.unwrap_err().code(), Code::NotFound);
    assert_eq!(quarantined_gauge(&dev).await, Some(0));
    sem.followup(user_msg("s2", "a new session")).await.unwrap();
    assert_eq!(sem.when_idle().await.unwrap().last_turn, 1);
}

turnstile_tests::backend_tests!(
    an_unfoldable_import_is_refused_with_invalid_argument,
    a_planted_unfoldable_session_is_quarantined_while_dev_restarts_and_serves_others,
);
