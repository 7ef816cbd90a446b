//! The operations surface of `turnstile dev`: `/metrics` counts a scripted workload by exactly what its
//! logs hold, `/healthz` and `/readyz` answer, and gRPC reflection and health work without proto files.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{SessionEvent, SpliceOutcome, Target};
use turnstile_tests::{DEFAULT_WAIT, DevServer, Session, user_msg};

/// `GET path` over a fresh HTTP/1.1 connection: (status code, body).
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{response}"));
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

/// The value of the sample `name{labels}` (labels in any order, exactly these), 0 when absent: a counter
/// nobody incremented yet is not rendered.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let wanted: BTreeSet<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}').split(',').map(str::to_owned).collect()),
            None => (series, BTreeSet::new()),
        };
        if series_name == name && series_labels == wanted {
            return value.parse().unwrap();
        }
    }
    0.0
}

struct Metrics(String);

impl Metrics {
    async fn scrape(addr: SocketAddr) -> Self {
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200, "{body}");
        Self(body)
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        sample(&self.0, name, labels)
    }
}

/// Polls the gauge until it reads `want`.
async fn wait_gauge(addr: SocketAddr, name: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
    loop {
        let got = Metrics::scrape(addr).await.get(name, &[]);
        if got == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} stayed {got}, wanted {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the logs say the metrics must have counted.
#[derive(Debug, Default, PartialEq)]
struct FromLogs {
    events: u64,
    steps: u64,
    step_ends: u64,
    claims_next_turn: u64,
    claimed_messages_next_turn: u64,
    /// Steps with a claim since the previous step of their turn.
    claimed_steps: u64,
}

fn from_logs(logs: &[Vec<SessionEvent>]) -> FromLogs {
    let mut f = FromLogs::default();
    for log in logs {
        let mut claim_pending = false;
        for e in log {
            f.events += 1;
            match &e.payload {
                Some(Payload::InboxSpliced(s)) if s.outcome == SpliceOutcome::None as i32 && s.removed_count > 0 => {
                    assert_eq!(s.target, Target::NextTurn as i32, "this workload claims only from next-turn");
                    f.claims_next_turn += 1;
                    f.claimed_messages_next_turn += u64::from(s.removed_count);
                    claim_pending = true;
                }
                Some(Payload::StepStart(_)) => {
                    f.steps += 1;
                    f.claimed_steps += u64::from(std::mem::take(&mut claim_pending));
                }
                Some(Payload::StepEnd(_)) => f.step_ends += 1,
                Some(Payload::TurnEnd(_)) => claim_pending = false,
                _ => {}
            }
        }
    }
    f
}

async fn idle(s: &Session) {
    s.when_idle().await.unwrap();
}

#[tokio::test]
async fn metrics_count_a_scripted_workload_by_what_its_logs_hold() {
    let server = DevServer::start().await.unwrap();
    let http = server.http_addr().unwrap();

    // One Watch open is one on the gauge, and closing it takes it off again.
    wait_gauge(http, "turnstile_watch_streams_open", 0.0).await;
    let watched = server.session();
    let watch = watched.watch().await.unwrap();
    wait_gauge(http, "turnstile_watch_streams_open", 1.0).await;
    drop(watch);
    wait_gauge(http, "turnstile_watch_streams_open", 0.0).await;

    let before = Metrics::scrape(http).await;

    // Three followups on one session, a rejected proposal, a tool call, and a cancelled slow turn.
    let a = server.session();
    for (id, text) in [("a1", "one"), ("a2", "two"), ("a3", "three")] {
        a.followup(user_msg(id, text)).await.unwrap();
        idle(&a).await;
    }
    let b = server.session();
    b.followup(user_msg("b1", "[[reject]] no")).await.unwrap();
    idle(&b).await;
    let c = server.session();
    c.followup(user_msg("c1", "[[tool:echo hi]] call it")).await.unwrap();
    idle(&c).await;
    let d = server.session();
    let watch_d = d.watch().await.unwrap();
    d.followup(user_msg("d1", "[[delay:3000]] one two three four five six seven eight")).await.unwrap();
    watch_d.wait_line("L delta 1.1 *").await.unwrap();
    d.cancel(false).await.unwrap();
    idle(&d).await;
    drop(watch_d);

    let mut logs = Vec::new();
    for s in [&a, &b, &c, &d] {
        logs.push(s.replay(0).await.unwrap().0);
    }
    let expected = from_logs(&logs);
    let after = Metrics::scrape(http).await;
    let delta = |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);

    assert_eq!(delta("turnstile_deliveries_total", &[("preset", "followup"), ("outcome", "accepted")]), 6.0);
    assert_eq!(delta("turnstile_deliveries_total", &[("preset", "cancel"), ("outcome", "accepted")]), 1.0);
    assert_eq!(delta("turnstile_turns_total", &[("reason", "completed")]), 4.0, "{}", after.0);
    assert_eq!(delta("turnstile_turns_total", &[("reason", "blocked")]), 1.0);
    assert_eq!(delta("turnstile_turns_total", &[("reason", "aborted")]), 1.0);
    // a: 3 single-step turns; b: rejected before its step; c: the call and the answer; d: one step.
    assert_eq!(expected.steps, 6, "{expected:?}");
    assert_eq!(delta("turnstile_steps_total", &[]), expected.steps as f64);
    assert_eq!(expected.claims_next_turn, 6, "{expected:?}");
    assert_eq!(delta("turnstile_claims_total", &[("target", "next_turn")]), expected.claims_next_turn as f64);
    assert_eq!(
        delta("turnstile_claimed_messages_total", &[("target", "next_turn")]),
        expected.claimed_messages_next_turn as f64
    );
    assert_eq!(delta("turnstile_appended_events_total", &[]), expected.events as f64);
    assert_eq!(delta("turnstile_appends_total", &[("outcome", "conflict")]), 0.0);
    assert_eq!(delta("turnstile_appends_total", &[("outcome", "error")]), 0.0);
    let batches = delta("turnstile_appends_total", &[("outcome", "ok")]);
    assert!(batches >= 1.0 && batches <= expected.events as f64, "{batches} batches for {} events", expected.events);
    assert_eq!(delta("turnstile_append_duration_seconds_count", &[("outcome", "ok")]), batches);
    assert_eq!(delta("turnstile_step_duration_seconds_count", &[]), expected.step_ends as f64);
    assert_eq!(delta("turnstile_claim_to_step_seconds_count", &[]), expected.claimed_steps as f64);
    // The slow step of d ran for a while before it was cancelled.
    assert!(delta("turnstile_step_duration_seconds_sum", &[]) > 0.0);
    // The four sessions of the workload plus the watched one stay loaded (passivation is minutes away).
    assert!(after.get("turnstile_sessions_loaded", &[]) >= 4.0, "{}", after.0);
    for line in after.0.lines().filter(|l| l.starts_with("turnstile_")) {
        assert!(!line.contains(&a.reference().id), "a session id in a label: {line}");
    }

    assert_eq!(http_get(http, "/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(http_get(http, "/readyz").await, (200, "ready\n".to_owned()));
    assert_eq!(http_get(http, "/nope").await.0, 404);
    build_and_process_series(&after);
}

/// `turnstile_build_info` names the binary's version and commit, and the standard `process_*` series
/// describe this server: it has used CPU, holds memory and descriptors, and started during this test run.
fn build_and_process_series(m: &Metrics) {
    let builds: Vec<&str> = m.0.lines().filter(|l| l.starts_with("turnstile_build_info{")).collect();
    assert_eq!(builds.len(), 1, "{}", m.0);
    let commit = builds[0].split("commit=\"").nth(1).and_then(|c| c.split('"').next()).unwrap();
    // A commit from the build's checkout (`git rev-parse --short=12`) or the build's TURNSTILE_COMMIT.
    assert!(commit == "unknown" || (commit.chars().all(|c| c.is_ascii_hexdigit()) && commit.len() >= 7), "{commit}");
    assert_eq!(m.get("turnstile_build_info", &[("version", env!("CARGO_PKG_VERSION")), ("commit", commit)]), 1.0);

    assert!(m.get("process_cpu_seconds_total", &[]) > 0.0, "{}", m.0);
    assert!(m.get("process_resident_memory_bytes", &[]) > 1_000_000.0, "{}", m.0);
    // stdin/out/err, the listeners, the NATS or journal files: more than a handful, fewer than the limit.
    let fds = m.get("process_open_fds", &[]);
    assert!(fds > 3.0 && fds < m.get("process_max_fds", &[]), "{fds} open descriptors");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let started = m.get("process_start_time_seconds", &[]);
    // The server started after this test binary did: within the last hour, and (ticks are 10 ms) not later
    // than now.
    assert!(started <= now + 0.02 && started > now - 3600.0, "started {started}, now {now}");
}

#[tokio::test]
async fn reflection_lists_the_services_and_health_says_serving() {
    let server = DevServer::start().await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(server.url()).unwrap().connect().await.unwrap();

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("not a service list: {reply:?}")
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    let want: BTreeSet<String> = [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "turnstile.v1.Agent",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(names, want, "the internal Worker API is not advertised by the public server");

    // The descriptors resolve too, which is what grpcurl needs to call a method.
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol("turnstile.v1.Agent".into())),
    };
    let mut replies = reflection.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    assert!(
        matches!(&reply.message_response, Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty()),
        "{reply:?}"
    );

    let mut health = HealthClient::new(channel);
    for service in ["", "turnstile.v1.Agent"] {
        let reply = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "turnstile.v1.Nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}
