//! Session labels and search on real servers (SPEC §16, issue 30), on both journals (`backend_tests!`): on
//! the embedded journal the index is in memory, on `--nats` it is the KV bucket `turnstile_index` mirrored
//! by the gateway.
//!
//! - `SetLabels` stores labels durably (`session/labeled` in the log) and `GetSession` reports them.
//! - `ListSessions` filters by label selector, status and agent, orders by id or by last activity, and pages
//!   with tokens that go on after the last session of the page.
//! - Bad label keys and bad selectors are answered precisely.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{ListSessionsRequest, SessionOrder, SessionRef, SessionStatus, SetLabelsRequest};
use turnstile_tests::{Backend, DevServer, Session, user_msg};

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn session(server: &DevServer, tenant: &str, id: &str) -> Session {
    Session::with_ref(server.client(), SessionRef { tenant: tenant.into(), id: id.into() })
}

/// Every page of `req`, following the tokens; the ids in order.
async fn list_all(server: &DevServer, mut req: ListSessionsRequest) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..100 {
        let reply = server.client().list_sessions(req.clone()).await.unwrap().into_inner();
        assert!(reply.sessions.len() <= req.page_size.max(1) as usize, "a page is at most page_size");
        ids.extend(reply.sessions.into_iter().map(|s| s.session.unwrap().id));
        if reply.next_page_token.is_empty() {
            return ids;
        }
        req.page_token = reply.next_page_token;
    }
    panic!("the pages never ended");
}

/// Lists until `want` (the index follows the log; on NATS through the bucket's watch), bounded.
async fn eventually(server: &DevServer, req: ListSessionsRequest, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = list_all(server, req.clone()).await;
        if got == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{req:?} lists {got:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn labels_filter_order_and_page(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
    for (i, id) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        let s = session(&server, &tenant, id);
        s.followup(user_msg(&format!("m-{id}"), "hello")).await.unwrap();
        s.when_idle().await.unwrap();
        let team = if i % 2 == 0 { "blue" } else { "red" };
        let mut set = labels(&[("team", team)]);
        if id == "c" {
            set.insert("vip".into(), "yes".into());
        }
        let req = SetLabelsRequest { session: Some(s.reference()), labels: set, remove_keys: vec![] };
        let info = s.client().set_labels(req).await.unwrap().into_inner();
        assert_eq!(info.labels.get("team").map(String::as_str), Some(team));
        // Distinct last activities, in id order.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let base = ListSessionsRequest { tenant: tenant.clone(), page_size: 2, ..Default::default() };
    let with = |selector: &str| ListSessionsRequest { label_selector: selector.into(), ..base.clone() };
    eventually(&server, with("team=blue"), &["a", "c", "e"]).await;
    eventually(&server, with("team!=blue"), &["b", "d"]).await;
    eventually(&server, with("team=blue,!vip"), &["a", "e"]).await;
    eventually(&server, with("vip"), &["c"]).await;
    eventually(&server, with("owner"), &[]).await;
    let recent = ListSessionsRequest { order_by: SessionOrder::LastActivity.into(), ..with("team=blue") };
    eventually(&server, recent.clone(), &["e", "c", "a"]).await;
    let idle = ListSessionsRequest { status: SessionStatus::Idle.into(), agent: "scripted".into(), ..base.clone() };
    eventually(&server, idle, &["a", "b", "c", "d", "e"]).await;
    let running = ListSessionsRequest { status: SessionStatus::Running.into(), ..base.clone() };
    eventually(&server, running, &[]).await;
    let other_agent = ListSessionsRequest { agent: "nobody".into(), ..base.clone() };
    eventually(&server, other_agent, &[]).await;

    // New activity moves a session to the front of the newest-first order.
    let a = session(&server, &tenant, "a");
    a.followup(user_msg("m-a2", "again")).await.unwrap();
    a.when_idle().await.unwrap();
    eventually(&server, recent, &["a", "e", "c"]).await;

    // Removing a label is durable and changes what matches.
    let req =
        SetLabelsRequest { session: Some(a.reference()), labels: HashMap::new(), remove_keys: vec!["team".into()] };
    let info = a.client().set_labels(req).await.unwrap().into_inner();
    assert!(info.labels.is_empty(), "{:?}", info.labels);
    eventually(&server, with("team=blue"), &["c", "e"]).await;
    let (events, _) = a.replay(0).await.unwrap();
    let labeled = events.iter().filter(|e| matches!(e.payload, Some(Payload::SessionLabeled(_)))).count();
    assert_eq!(labeled, 2, "each SetLabels that changed something is one session/labeled");
    server.stop().await;
}

async fn bad_labels_and_selectors_are_answered_precisely(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let mut client = s.client();
    let set = |pairs: &[(&str, &str)]| SetLabelsRequest {
        session: Some(s.reference()),
        labels: labels(pairs),
        remove_keys: vec![],
    };
    let err = client.set_labels(set(&[("Team", "x")])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("label key \"Team\" has the character 'T'"), "{}", err.message());
    let long = "v".repeat(300);
    let err = client.set_labels(set(&[("team", &long)])).await.unwrap_err();
    assert!(err.message().contains("300 bytes"), "{}", err.message());
    // Issue 37 item 6: values no selector could name are refused, saying which characters are allowed;
    // nothing is written.
    for value in ["a,b", "x!=y", "k=v", " padded", "padded "] {
        let err = client.set_labels(set(&[("team", value)])).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{value:?}: {err:?}");
        assert!(err.message().contains("any character but ',' and '='"), "{}", err.message());
    }
    assert_eq!(s.info().await.unwrap_err().code(), Code::NotFound, "no refused label was written");
    // A value with spaces inside, '!' and non-ASCII is stored and selected.
    client.set_labels(set(&[("team", "blue & green!")])).await.unwrap();
    let req = ListSessionsRequest {
        tenant: s.reference().tenant,
        label_selector: "team=blue & green!".into(),
        ..Default::default()
    };
    eventually(&server, req, &[s.reference().id.as_str()]).await;
    let bad = ListSessionsRequest { label_selector: "team=blue,,x".into(), ..Default::default() };
    let err = client.list_sessions(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("label_selector item \"\" is empty"), "{}", err.message());
    let bad = ListSessionsRequest { label_selector: "team in (a,b)".into(), ..Default::default() };
    let err = client.list_sessions(bad).await.unwrap_err();
    assert!(err.message().contains("k=v, k!=v, k or !k"), "{}", err.message());
    let bad = ListSessionsRequest {
        page_token: "@x:y/z".into(),
        order_by: SessionOrder::LastActivity.into(),
        ..Default::default()
    };
    let err = client.list_sessions(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("next_page_token"), "{}", err.message());
    server.stop().await;
}

turnstile_tests::backend_tests!(labels_filter_order_and_page, bad_labels_and_selectors_are_answered_precisely);
