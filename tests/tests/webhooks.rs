//! Webhooks on a real cluster (SPEC §15, issue 30): a receiver on loopback that answers 500 to its first 3
//! calls and is down (it takes each request and closes the connection without an answer) while the
//! session's owner is killed with SIGKILL mid-run still gets every `turn/end` of a 20-turn run, in seq order
//! (repeats allowed, none missing), each with a valid `Turnstile-Signature` and `Turnstile-Delivery`.
//! Webhooks registered at run time (SPEC §21, issue 41): one tenant's never receives another's events, on
//! `turnstile dev` and on a cluster.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use turnstile_proto::v1::session_event::Payload;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Cluster, ClusterOptions, DevOptions, DevServer, Session, user_msg};

const SECRET: &str = "webhook-test-secret";

/// One POST the receiver took.
#[derive(Clone, Debug)]
struct Received {
    delivery: String,
    signature: String,
    body: Vec<u8>,
    /// What it answered.
    answered: u16,
}

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ok,
    /// Takes the request and closes the connection without an answer.
    Down,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    calls: usize,
    down: bool,
    /// Calls answered 500 before the first 200.
    fail_first: usize,
}

/// A minimal HTTP/1.1 receiver on loopback (one request per connection, `Connection: close`).
#[derive(Clone)]
struct Receiver {
    state: Arc<Mutex<State>>,
    url: String,
}

impl Receiver {
    /// A receiver that refuses its first 3 calls (500).
    async fn start() -> Self {
        Self::refusing_first(3).await
    }

    async fn refusing_first(fail_first: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State { fail_first, ..State::default() }));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let Some((headers, body)) = read_request(&mut socket).await else { return };
                    let header = |name: &str| {
                        headers
                            .lines()
                            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)))
                            .map(|(_, v)| v.trim().to_owned())
                            .unwrap_or_default()
                    };
                    let answer = {
                        let mut s = state.lock().unwrap();
                        s.calls += 1;
                        let answer = if s.down {
                            None
                        } else if s.calls <= s.fail_first {
                            Some(500)
                        } else {
                            Some(200)
                        };
                        let received = Received {
                            delivery: header("turnstile-delivery"),
                            signature: header("turnstile-signature"),
                            body,
                            answered: answer.unwrap_or(0),
                        };
                        s.received.push(received);
                        answer
                    };
                    if let Some(code) = answer {
                        let reason = if code == 200 { "OK" } else { "Internal Server Error" };
                        let response =
                            format!("HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                        let _ = socket.write_all(response.as_bytes()).await;
                    }
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { state, url }
    }

    fn set(&self, mode: Mode) {
        self.state.lock().unwrap().down = mode == Mode::Down;
    }

    fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }
}

/// Reads one request: the head up to the blank line, then `content-length` bytes of body.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((head, buf[head_end..head_end + length].to_vec()))
}

fn valid_signature(body: &[u8], signature: &str) -> bool {
    signed_with(SECRET, body, signature)
}

fn signed_with(key: &str, body: &[u8], signature: &str) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    signature == format!("sha256={hex}")
}

/// The durable log, asked again only while UNAVAILABLE (the session moving after the kill).
async fn log_of(s: &Session) -> Vec<turnstile_proto::v1::SessionEvent> {
    match s.replay_while_unavailable(0, Duration::from_secs(20)).await {
        Ok((events, _)) => events,
        Err(e) => panic!("the log of {:?} could not be read: {e}", s.reference()),
    }
}

/// Tenancy of webhooks (issue 37 item 4, decision 0091) on `turnstile dev` with two tenants' tokens.
mod tenancy {
    use tonic::transport::Channel;
    use tonic::{Code, Request, Status};
    use turnstile_proto::v1::agent_client::AgentClient;
    use turnstile_proto::v1::{
        ConfigureSessionRequest, DeliverRequest, InjectMode, SessionInfo, SessionRef, WhenIdleRequest,
    };

    use super::*;

    pub(super) const TOKEN_A: &str = "webhook-tenant-a-0123456789";
    pub(super) const TOKEN_B: &str = "webhook-tenant-b-0123456789";

    pub(super) fn authed<T>(message: T, token: &str) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    }

    pub(super) fn own(id: &str) -> Option<SessionRef> {
        Some(SessionRef { tenant: String::new(), id: id.into() })
    }

    async fn configure(
        client: &mut AgentClient<Channel>,
        token: &str,
        id: &str,
        agent: &str,
    ) -> Result<SessionInfo, Status> {
        let req = ConfigureSessionRequest {
            session: own(id),
            agent: agent.into(),
            inject_mode: InjectMode::Pending as i32,
            ..Default::default()
        };
        client.configure_session(authed(req, token)).await.map(tonic::Response::into_inner)
    }

    pub(super) async fn run_turn(client: &mut AgentClient<Channel>, token: &str, id: &str, text: &str) {
        let message = user_msg(&uuid::Uuid::new_v4().to_string(), text);
        client
            .followup(authed(DeliverRequest { session: own(id), message: Some(message), output_schema: None }, token))
            .await
            .unwrap();
        let idle = WhenIdleRequest { session: own(id), timeout_ms: 20_000 };
        client.when_idle(authed(idle, token)).await.unwrap();
    }

    /// The deliveries `receiver` answered 200 whose `Turnstile-Delivery` starts with `prefix`.
    pub(super) fn delivered(receiver: &Receiver, prefix: &str) -> usize {
        receiver.received().iter().filter(|x| x.answered == 200 && x.delivery.starts_with(prefix)).count()
    }

    pub(super) async fn until_delivered(receiver: &Receiver, prefix: &str, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while delivered(receiver, prefix) < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{count} deliveries of {prefix}: {:?}",
                receiver.received()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Tenant B cannot run an agent confined to tenant A (it answers as an agent that does not exist, so B
    /// learns nothing of it), and a webhook of a shared agent set up for tenant A only never receives B's
    /// events: B's turns reach the webhook meant for every tenant, A's reach A's, B's never reach A's.
    #[tokio::test]
    async fn a_tenants_events_never_reach_another_tenants_webhook() {
        let for_a = Receiver::refusing_first(0).await;
        let for_all = Receiver::refusing_first(0).await;
        let config = format!(
            "[agents.only-a]\ntenants = [\"tenant-a\"]\n\n[agents.shared]\nwebhooks = [\n  \
             {{ url = \"{}\", events = [\"turn/end\"], tenants = [\"tenant-a\"] }},\n  \
             {{ url = \"{}\", events = [\"turn/end\"] }},\n]\n",
            for_a.url, for_all.url
        );
        let (dir, path) = config_file(&config);
        let tokens = dir.path().join("tokens.txt");
        std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
        let mut args = config_args(&path);
        args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
        let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
        let mut client = server.client();

        // The confined agent: refused to B exactly as an unknown agent is, allowed to A.
        let confined = configure(&mut client, TOKEN_B, "b1", "only-a").await.unwrap_err();
        let unknown = configure(&mut client, TOKEN_B, "b1", "no-such-agent").await.unwrap_err();
        assert_eq!(confined.code(), Code::InvalidArgument, "{confined:?}");
        assert_eq!(confined.message(), unknown.message().replace("no-such-agent", "only-a"), "no existence leak");
        assert!(!unknown.message().contains("only-a"), "B's list of agents leaves A's out: {}", unknown.message());
        assert_eq!(configure(&mut client, TOKEN_A, "a0", "only-a").await.unwrap().agent, "only-a");

        // B's turns on the shared agent reach the webhook for every tenant…
        configure(&mut client, TOKEN_B, "b1", "shared").await.unwrap();
        for i in 0..3 {
            run_turn(&mut client, TOKEN_B, "b1", &format!("b's secret {i}")).await;
        }
        until_delivered(&for_all, "tenant-b/b1/", 3).await;
        // …and A's reach A's webhook, after B's were all delivered.
        configure(&mut client, TOKEN_A, "a1", "shared").await.unwrap();
        run_turn(&mut client, TOKEN_A, "a1", "a's words").await;
        until_delivered(&for_a, "tenant-a/a1/", 1).await;
        until_delivered(&for_all, "tenant-a/a1/", 1).await;
        let leaked: Vec<String> =
            for_a.received().iter().map(|x| x.delivery.clone()).filter(|d| !d.starts_with("tenant-a/")).collect();
        assert!(leaked.is_empty(), "tenant A's webhook received another tenant's events: {leaked:?}");
        assert!(
            for_a.received().iter().all(|x| !String::from_utf8_lossy(&x.body).contains("b's secret")),
            "no text of B's"
        );
    }
}

/// Issue 30's webhook "done when", on a cluster (one at a time with the other cluster tests).
mod cluster {
    use super::*;

    #[tokio::test]
    async fn every_turn_end_of_a_20_turn_run_reaches_a_failing_receiver_across_a_kill_9() {
        let receiver = Receiver::start().await;
        let config = format!(
            "default_agent = \"hooked\"\n\n[agents.hooked]\ntools = [\"sleep\", \"echo\"]\n\
             webhooks = [{{ url = \"{}\", events = [\"turn/end\"], secret_env = \"HOOK_SECRET\", max_age_ms = 600000 }}]\n",
            receiver.url
        );
        let (_dir, path) = config_file(&config);
        let mut opts = ClusterOptions::new(2, 1);
        opts.worker_args = config_args(&path);
        opts.worker_args.extend(["--lease-ttl-ms", "1000", "--renew-ms", "250"].map(String::from));
        opts.gateway_args = config_args(&path);
        opts.worker_env = vec![("HOOK_SECRET".into(), SECRET.into())];
        let mut cluster = Cluster::start_with(opts).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        let s = cluster.session(0);
        // Twenty turns queued at once: each runs about 300 ms.
        for i in 1..=20 {
            let message = user_msg(&format!("m{i}"), &format!("[[delay:300]] turn {i}"));
            let mut tries = 0;
            while let Err(e) = s.followup(message.clone()).await {
                tries += 1;
                assert!(tries < 50, "followup {i} failed: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // A few turns in, the receiver goes down and the owner is killed; the receiver comes back 3 s later.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ended = log_of(&s).await.iter().filter(|e| matches!(e.payload, Some(Payload::TurnEnd(_)))).count();
            if ended >= 6 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the run did not get going");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let owner = s.info().await.unwrap().owner;
        let victim = cluster.worker_index(&owner).unwrap_or_else(|| panic!("no worker {owner:?}"));
        receiver.set(Mode::Down);
        cluster.kill9_worker(victim);
        tokio::time::sleep(Duration::from_secs(3)).await;
        receiver.set(Mode::Ok);

        // Every turn/end of the log, whatever its number (the kill cuts a turn: `interrupted`, then the run
        // resumes), delivered at least once, in seq order.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let (expected, delivered) = loop {
            let events = log_of(&s).await;
            let ends: Vec<u64> =
                events.iter().filter(|e| matches!(e.payload, Some(Payload::TurnEnd(_)))).map(|e| e.seq).collect();
            let run_over = events
                .iter()
                .rev()
                .find_map(|e| match &e.payload {
                    Some(Payload::TurnEnd(t)) => Some(t.turn),
                    _ => None,
                })
                .is_some_and(|_| {
                    events.iter().filter(|e| matches!(e.payload, Some(Payload::UserMessage(_)))).count() >= 20
                })
                && matches!(events.last().and_then(|e| e.payload.as_ref()), Some(Payload::Status(_)));
            let r = s.reference();
            let prefix = format!("{}/{}/", r.tenant, r.id);
            let delivered: Vec<u64> = receiver
                .received()
                .iter()
                .filter(|x| x.answered == 200)
                .filter_map(|x| x.delivery.strip_prefix(&prefix)?.parse().ok())
                .collect();
            let mut unique = delivered.clone();
            unique.sort_unstable();
            unique.dedup();
            if run_over && unique == ends {
                break (ends, delivered);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "turn/ends {ends:?} (run over: {run_over}), delivered {delivered:?}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert!(expected.len() >= 20, "20 turns ended: {expected:?}");
        // In order: a repeat may come back (a delivery the killed owner made but had not recorded), but a
        // new seq never comes before an earlier one.
        let mut seen = Vec::new();
        for seq in &delivered {
            if !seen.contains(seq) {
                assert!(seen.last().is_none_or(|last| last < seq), "out of order: {delivered:?}");
                seen.push(*seq);
            }
        }
        let received = receiver.received();
        let new_owner = s.info().await.unwrap().owner;
        assert_ne!(new_owner, owner, "another worker owns the session after the kill");
        eprintln!(
            "{} turn/ends delivered through {} POSTs ({} answered 500, {} found the receiver down); owner {owner} → {new_owner}",
            expected.len(),
            received.len(),
            received.iter().filter(|x| x.answered == 500).count(),
            received.iter().filter(|x| x.answered == 0).count(),
        );
        assert!(received.iter().take(3).all(|x| x.answered == 500), "the first three calls were refused");
        assert!(received.iter().any(|x| x.answered == 0), "some calls found the receiver down");
        for x in &received {
            assert!(valid_signature(&x.body, &x.signature), "bad signature on {}: {}", x.delivery, x.signature);
            let body: serde_json::Value = serde_json::from_slice(&x.body).unwrap();
            let seq = x.delivery.rsplit('/').next().unwrap();
            assert_eq!(body["event"]["seq"].as_str(), Some(seq), "the body is the delivery's event: {body}");
            assert_eq!(body["event"]["type"].as_str(), Some("turn/end"), "{body}");
        }
    }
}

/// Webhooks registered at run time (SPEC §21) on `turnstile dev` with two tenants' tokens.
mod registered {
    use tonic::Code;
    use turnstile_proto::v1::agent_client::AgentClient;
    use turnstile_proto::v1::{
        CreateWebhookRequest, DeleteWebhookRequest, ListWebhooksRequest, SetLabelsRequest, Webhook,
    };

    use super::tenancy::{TOKEN_A, TOKEN_B, authed, delivered, own, run_turn, until_delivered};
    use super::*;

    /// `turnstile dev` with tenants `tenant-a` and `tenant-b`, and `[webhooks] allow_private` as given
    /// (the receivers of these tests listen on loopback).
    async fn dev(allow_private: bool) -> (DevServer, tempfile::TempDir) {
        let (dir, path) = config_file(&format!("[webhooks]\nallow_private = {allow_private}\n"));
        let tokens = dir.path().join("tokens.txt");
        std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
        let mut args = config_args(&path);
        args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
        let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
        (server, dir)
    }

    async fn create(
        client: &mut AgentClient<tonic::transport::Channel>,
        token: &str,
        url: &str,
        label_selector: &str,
    ) -> Result<Webhook, tonic::Status> {
        let req = CreateWebhookRequest {
            url: url.into(),
            events: vec!["turn/end".into()],
            label_selector: label_selector.into(),
            ..Default::default()
        };
        client.create_webhook(authed(req, token)).await.map(tonic::Response::into_inner)
    }

    async fn list(client: &mut AgentClient<tonic::transport::Channel>, token: &str) -> Vec<Webhook> {
        client.list_webhooks(authed(ListWebhooksRequest::default(), token)).await.unwrap().into_inner().webhooks
    }

    /// Each tenant registers a webhook; both run turns. Each receiver gets its own tenant's `turn/end`s,
    /// signed with the secret `CreateWebhook` returned (and that only `CreateWebhook` shows), never the
    /// other tenant's. A tenant cannot list or delete the other's; a label selector narrows the sessions;
    /// a new webhook does not replay older events; a deleted one gets no further POST.
    #[tokio::test]
    async fn a_tenants_registered_webhook_receives_only_its_own_tenants_events() {
        let (server, _dir) = dev(true).await;
        let mut client = server.client();
        let (for_a, for_b, for_blue) =
            (Receiver::refusing_first(0).await, Receiver::refusing_first(0).await, Receiver::refusing_first(0).await);
        let hook_a = create(&mut client, TOKEN_A, &for_a.url, "").await.unwrap();
        let hook_b = create(&mut client, TOKEN_B, &for_b.url, "").await.unwrap();
        let blue = create(&mut client, TOKEN_A, &for_blue.url, "team=blue").await.unwrap();
        assert!(hook_a.secret.starts_with("whsec_") && hook_a.secret != hook_b.secret, "{hook_a:?}");
        assert_eq!((hook_a.tenant.as_str(), hook_b.tenant.as_str()), ("tenant-a", "tenant-b"));

        // Listing shows the caller's own webhooks, without secrets.
        let listed = list(&mut client, TOKEN_A).await;
        assert_eq!(listed.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), [hook_a.id.as_str(), blue.id.as_str()]);
        assert!(listed.iter().all(|w| w.secret.is_empty()), "the secret is shown only once: {listed:?}");
        assert_eq!(list(&mut client, TOKEN_B).await.len(), 1);
        // B cannot delete A's (it is not found, as one that does not exist), nor name A's tenant.
        let req = DeleteWebhookRequest { id: hook_a.id.clone(), ..Default::default() };
        let err = client.delete_webhook(authed(req, TOKEN_B)).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
        let req = ListWebhooksRequest { tenant: "tenant-a".into() };
        assert_eq!(client.list_webhooks(authed(req, TOKEN_B)).await.unwrap_err().code(), Code::PermissionDenied);

        // Turns in both tenants; A's blue session also reaches the selector's receiver.
        let labels = SetLabelsRequest {
            session: own("a-blue"),
            labels: [("team".to_owned(), "blue".to_owned())].into(),
            ..Default::default()
        };
        client.set_labels(authed(labels, TOKEN_A)).await.unwrap();
        for i in 0..2 {
            run_turn(&mut client, TOKEN_B, "b1", &format!("b's secret {i}")).await;
            run_turn(&mut client, TOKEN_A, "a1", &format!("a's words {i}")).await;
        }
        run_turn(&mut client, TOKEN_A, "a-blue", "blue words").await;
        until_delivered(&for_b, "tenant-b/b1/", 2).await;
        until_delivered(&for_a, "tenant-a/a1/", 2).await;
        until_delivered(&for_a, "tenant-a/a-blue/", 1).await;
        until_delivered(&for_blue, "tenant-a/a-blue/", 1).await;
        let foreign = |r: &Receiver, own: &str| -> Vec<String> {
            r.received().iter().map(|x| x.delivery.clone()).filter(|d| !d.starts_with(own)).collect()
        };
        assert_eq!(foreign(&for_a, "tenant-a/"), Vec::<String>::new(), "A's webhook got another tenant's events");
        assert_eq!(foreign(&for_b, "tenant-b/"), Vec::<String>::new(), "B's webhook got another tenant's events");
        assert_eq!(foreign(&for_blue, "tenant-a/a-blue/"), Vec::<String>::new(), "the selector let in others");
        for (receiver, hook) in [(&for_a, &hook_a), (&for_b, &hook_b), (&for_blue, &blue)] {
            for x in receiver.received() {
                assert!(signed_with(&hook.secret, &x.body, &x.signature), "{} not signed with its key", x.delivery);
                let body: serde_json::Value = serde_json::from_slice(&x.body).unwrap();
                assert_eq!(body["event"]["type"].as_str(), Some("turn/end"), "{body}");
            }
        }
        assert!(for_a.received().iter().all(|x| !String::from_utf8_lossy(&x.body).contains("b's secret")));

        // A webhook created now starts from now: a1's next turn is its first delivery.
        let late_receiver = Receiver::refusing_first(0).await;
        let late = create(&mut client, TOKEN_A, &late_receiver.url, "").await.unwrap();
        // A deleted webhook gets nothing more: a1's next turn reaches the others, never it.
        let req = DeleteWebhookRequest { id: hook_a.id.clone(), ..Default::default() };
        assert_eq!(client.delete_webhook(authed(req, TOKEN_A)).await.unwrap().into_inner().id, hook_a.id);
        let before = delivered(&for_a, "tenant-a/a1/");
        run_turn(&mut client, TOKEN_A, "a1", "after the delete").await;
        until_delivered(&late_receiver, "tenant-a/a1/", 1).await;
        let firsts: Vec<String> = late_receiver.received().iter().map(|x| x.delivery.clone()).collect();
        assert_eq!(firsts.len(), 1, "the new webhook got only the turn after its creation: {firsts:?}");
        assert!(!late.secret.is_empty());
        assert_eq!(delivered(&for_a, "tenant-a/a1/"), before, "the deleted webhook got a POST");
        assert_eq!(list(&mut client, TOKEN_A).await.len(), 2, "blue and the late one remain");
    }

    /// Without `[webhooks] allow_private`, loopback, private and metadata targets are refused with
    /// INVALID_ARGUMENT naming `url`; bad event types and selectors name their fields.
    #[tokio::test]
    async fn internal_targets_and_bad_fields_are_refused_naming_the_field() {
        let (server, _dir) = dev(false).await;
        let mut client = server.client();
        for url in [
            "http://127.0.0.1:9/hook",
            "http://localhost:8080/hook",
            "http://10.0.0.8/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/hook",
            "http://[fd00:ec2::254]/",
        ] {
            let err = create(&mut client, TOKEN_A, url, "").await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{url}: {err:?}");
            assert!(err.message().starts_with("url: "), "{url}: {}", err.message());
        }
        let err = create(&mut client, TOKEN_A, "ftp://example.com/x", "").await.unwrap_err();
        assert_eq!((err.code(), err.message().starts_with("url: ")), (Code::InvalidArgument, true), "{err:?}");
        let req = CreateWebhookRequest {
            url: "https://93.184.215.14/hook".into(),
            events: vec!["turn/ended".into()],
            ..Default::default()
        };
        let err = client.create_webhook(authed(req, TOKEN_A)).await.unwrap_err();
        assert_eq!((err.code(), err.message().starts_with("events: ")), (Code::InvalidArgument, true), "{err:?}");
        let err = create(&mut client, TOKEN_A, "https://93.184.215.14/hook", "Team=x").await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with("label_selector"), "{}", err.message());
        assert!(list(&mut client, TOKEN_A).await.is_empty(), "nothing refused was stored");
        // A public target is accepted (nothing is sent until a session of the tenant writes).
        let ok = create(&mut client, TOKEN_A, "https://93.184.215.14/hook", "").await.unwrap();
        assert_eq!(list(&mut client, TOKEN_A).await.iter().map(|w| w.id.clone()).collect::<Vec<_>>(), [ok.id]);
    }
}

/// Registered webhooks on a cluster: created through one gateway (kept in the KV bucket), delivered by the
/// worker that owns the session, still there when a gateway restarts.
mod registered_cluster {
    use turnstile_proto::v1::{CreateWebhookRequest, ListWebhooksRequest};

    use super::*;

    #[tokio::test]
    async fn a_webhook_created_at_one_gateway_is_delivered_by_the_owner_and_listed_by_another() {
        let receiver = Receiver::refusing_first(0).await;
        let (_dir, path) = config_file("[webhooks]\nallow_private = true\n");
        let mut opts = ClusterOptions::new(1, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let cluster = Cluster::start_with(opts).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        let s = cluster.session(0);
        let tenant = s.reference().tenant.clone();
        let req = CreateWebhookRequest {
            tenant: tenant.clone(),
            url: receiver.url.clone(),
            events: vec!["turn/end".into()],
            ..Default::default()
        };
        let hook = cluster.client(0).create_webhook(req).await.unwrap().into_inner();
        // The other gateway lists it once its mirror has it (a KV watch away).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let req = ListWebhooksRequest { tenant: tenant.clone() };
            let listed = cluster.client(1).list_webhooks(req).await.unwrap().into_inner().webhooks;
            if listed.iter().any(|w| w.id == hook.id && w.secret.is_empty()) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "gateway 1 never listed {}: {listed:?}", hook.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s.followup(user_msg("m1", "hello hooks")).await.unwrap();
        let r = s.reference();
        let prefix = format!("{}/{}/", r.tenant, r.id);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !receiver.received().iter().any(|x| x.delivery.starts_with(&prefix)) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no delivery: {:?}\n{}",
                receiver.received(),
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for x in receiver.received() {
            assert!(x.delivery.starts_with(&prefix), "{}", x.delivery);
            assert!(signed_with(&hook.secret, &x.body, &x.signature), "signed with the registered key");
        }
    }
}
