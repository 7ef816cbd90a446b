//! Export and import (SPEC §18) and the two backups of docs/OPERATIONS.md, through the real binaries.
//!
//! - A tenant exported from `turnstile dev --nats` with `turnstile export` (an administrator's token; a
//!   plain one is refused) and imported with `turnstile import` from stdin into a fresh cluster: `Watch`
//!   from 0 of every session streams the same bytes, an old MessageId is answered as a retry with its first
//!   acceptance, the sessions go on where they were, another tenant's sessions stay behind, and a second
//!   import of the same file is ALREADY_EXISTS.
//! - An export cut short is refused (INVALID_ARGUMENT, truncated), naming the session left partly imported.
//! - JetStream's own backup, as far as the nats-server binary allows: a cold copy of a stopped server's
//!   store directory, started as another server, serves every session as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use prost::Message as _;
use tonic::{Code, Request};
use turnstile_proto::v1::export_item::Item;
use turnstile_proto::v1::{self as pb, ListSessionsRequest, SessionEvent, SessionRef};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Cluster, DevOptions, DevServer, NatsServer, Session, user_msg};

const ADMIN: &str = "admin-token-0123456789";
const PLAIN: &str = "plain-token-0123456789";

const AGENTS: &str = "default_agent = \"helper\"\n\n\
    [agents.helper]\ntools = [\"echo\", \"spawn_agent\"]\n\n\
    [agents.researcher]\ntools = [\"echo\"]\n";

fn sref(tenant: &str, id: &str) -> SessionRef {
    SessionRef { tenant: tenant.into(), id: id.into() }
}

/// Runs the `turnstile` CLI with `args`, stdin from `stdin` (a file) or closed; (success, stdout, stderr).
async fn cli(args: &[&str], stdin: Option<&Path>) -> (bool, String, String) {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let mut command = tokio::process::Command::new(bin);
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    command.stdin(match stdin {
        Some(path) => Stdio::from(std::fs::File::open(path).unwrap()),
        None => Stdio::null(),
    });
    let out = tokio::time::timeout(turnstile_tests::DEFAULT_WAIT, command.output()).await.unwrap().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every event of `s` as `Watch` from 0 streams it, each as its bytes.
async fn log_bytes(s: &Session) -> Vec<Vec<u8>> {
    let (events, _) = s.replay(0).await.unwrap();
    events.iter().map(SessionEvent::encode_to_vec).collect()
}

/// Sessions of `tenant` as `ListSessions` names them.
async fn listed(
    client: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
    tenant: &str,
    token: Option<&str>,
) -> Vec<String> {
    let mut request =
        Request::new(ListSessionsRequest { tenant: tenant.into(), page_size: 1000, ..Default::default() });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let reply = client.list_sessions(request).await.unwrap().into_inner();
    reply.sessions.into_iter().map(|i| i.session.unwrap().id).collect()
}

/// `listed`, read again until it holds `want` sessions or 20 s have passed: the session index is written in a
/// 100 ms window and served from each node's mirror of it (decision 0177), so a listing lags the writes.
async fn listed_once_written(
    client: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
    tenant: &str,
    want: usize,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let ids = listed(client, tenant, None).await;
        if ids.len() >= want || tokio::time::Instant::now() > deadline {
            return ids;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The source: `acme` with a few kinds of session (tools, a child, a fork, a pending inbox), `globex` with one.
async fn populate(dev: &DevServer) -> pb::SendReply {
    let s1 = Session::with_ref(dev.client(), sref("acme", "s1"));
    let first = s1.followup(user_msg("a1", "hello")).await.unwrap();
    s1.when_idle().await.unwrap();
    s1.followup(user_msg("a2", "[[tool:echo hi]] a tool")).await.unwrap();
    s1.when_idle().await.unwrap();
    s1.fork(1, "s1-fork").await.unwrap();
    let s2 = Session::with_ref(dev.client(), sref("acme", "s2"));
    s2.followup(user_msg("b1", "[[tool:spawn_agent researcher look]] delegate")).await.unwrap();
    s2.when_idle().await.unwrap();
    s2.queue(user_msg("b2", "waiting in the inbox")).await.unwrap();
    let other = Session::with_ref(dev.client(), sref("globex", "g1"));
    other.followup(user_msg("g", "not exported")).await.unwrap();
    other.when_idle().await.unwrap();
    first
}

/// In the `cluster` test group (docs/TESTING.md): the destination is a cluster.
mod cluster {
    #[tokio::test]
    async fn a_tenant_exported_from_dev_nats_imports_into_a_fresh_cluster_byte_for_byte() {
        super::a_tenant_exported_from_dev_nats_imports_into_a_fresh_cluster_byte_for_byte().await;
    }
}

async fn a_tenant_exported_from_dev_nats_imports_into_a_fresh_cluster_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{ADMIN} acme admin\n{PLAIN} acme\n")).unwrap();
    let (_config_dir, config) = config_file(AGENTS);
    let nats = NatsServer::start().await.unwrap();
    let mut args = config_args(&config);
    args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
    // The source runs without auth to be populated, then with it to be exported.
    let source = DevServer::start_with(DevOptions { extra_args: config_args(&config), ..DevOptions::nats(nats.url()) })
        .await
        .unwrap();
    let first = populate(&source).await;
    let mut client = source.client();
    let acme = listed_once_written(&mut client, "acme", 4).await;
    assert_eq!(acme.len(), 4, "s1, its fork, s2 and s2's child: {acme:?}");
    let mut before = Vec::new();
    for id in &acme {
        before.push(log_bytes(&Session::with_ref(source.client(), sref("acme", id))).await);
    }
    assert!(before.iter().all(|log| !log.is_empty()), "every session has a log");
    source.stop().await;
    let source = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::nats(nats.url()) }).await.unwrap();

    // Export: an administrator's token only.
    let file = dir.path().join("acme.export");
    let out = file.display().to_string();
    let (ok, _, err) = cli(&["--addr", &source.url(), "--token", PLAIN, "export", "--out", &out], None).await;
    assert!(!ok && err.contains("PERMISSION_DENIED") && err.contains("administrator"), "a plain token: {err}");
    assert!(!file.exists() && !PathBuf::from(format!("{out}.partial")).exists(), "nothing written");
    let (ok, _, err) = cli(&["--addr", &source.url(), "--token", ADMIN, "export", "--out", &out], None).await;
    assert!(ok, "export: {err}");
    assert!(err.contains("exported 4 sessions") && err.contains("of tenant acme"), "{err}");
    source.stop().await;

    // Import into a fresh cluster (its own nats-server), from stdin.
    let cluster = Cluster::start(2, 1).await.unwrap();
    let (ok, stdout, err) = cli(&["--addr", &cluster.gateway_url(0), "import"], Some(&file)).await;
    assert!(ok, "import: {err}");
    assert!(stdout.starts_with("imported 4 sessions (") && stdout.contains("from stdin"), "{stdout}");
    let mut gateway = cluster.client(0);
    let mut imported = listed_once_written(&mut gateway, "acme", acme.len()).await;
    imported.sort();
    let mut want = acme.clone();
    want.sort();
    assert_eq!(imported, want);
    assert!(listed(&mut gateway, "globex", None).await.is_empty(), "only the exported tenant");
    for (id, bytes) in acme.iter().zip(&before) {
        let after = log_bytes(&Session::with_ref(cluster.client(0), sref("acme", id))).await;
        assert_eq!(&after, bytes, "session acme/{id}: Watch from 0 streams other bytes after the import");
    }

    // An old MessageId is a retry: the first acceptance, nothing written.
    let s1 = Session::with_ref(cluster.client(0), sref("acme", "s1"));
    let last = s1.info().await.unwrap().last_seq;
    let retry = s1.followup(user_msg("a1", "hello")).await.unwrap();
    assert_eq!((retry.seq, retry.turn), (first.seq, first.turn), "a retry answers its first acceptance");
    assert_eq!(s1.info().await.unwrap().last_seq, last, "a retry writes nothing");
    let conflict = s1.followup(user_msg("a1", "something else")).await.unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
    // The sessions go on where they were: s1 at turn 3, s2 with its queued message still pending.
    s1.followup(user_msg("a3", "and now?")).await.unwrap();
    assert_eq!(s1.when_idle().await.unwrap().last_turn, 3);
    let s2 = Session::with_ref(cluster.client(0), sref("acme", "s2"));
    assert_eq!(s2.inbox().await.unwrap().next_turn.len(), 1, "the pending message came along");

    // The same file again: every session exists.
    let (ok, _, err) = cli(&["--addr", &cluster.gateway_url(0), "import", &out], None).await;
    assert!(!ok && err.contains("ALREADY_EXISTS") && err.contains("0 sessions imported before it"), "{err}");
}

#[tokio::test]
async fn an_export_cut_short_is_refused_and_names_what_is_left() {
    let dev = DevServer::start().await.unwrap();
    let s = Session::with_ref(dev.client(), sref("acme", "cut"));
    s.followup(user_msg("m", "hello")).await.unwrap();
    s.when_idle().await.unwrap();
    let request = pb::ExportSessionsRequest { tenant: "acme".into(), sessions: vec!["cut".into()] };
    let mut stream = dev.client().export_sessions(request).await.unwrap().into_inner();
    let mut items = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        items.push(item);
    }
    assert!(matches!(items.last().and_then(|i| i.item.as_ref()), Some(Item::End(e)) if e.last_seq > 0));
    s.delete().await.unwrap();

    // Without its `end`: refused as truncated, the part written named.
    let cut: Vec<pb::ExportItem> = items[..items.len() - 1].to_vec();
    let err = dev.client().import_sessions(futures::stream::iter(cut)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("truncated") && err.message().contains("acme/cut"), "{}", err.message());
    // Not an export at all.
    let err = dev.client().import_sessions(futures::stream::iter(items[1..].to_vec())).await.unwrap_err();
    assert!(err.message().contains("first item must be the header"), "{}", err.message());
    // A session that is not listed there is NOT_FOUND on export.
    let request = pb::ExportSessionsRequest { tenant: "acme".into(), sessions: vec!["nobody".into()] };
    let mut stream = dev.client().export_sessions(request).await.unwrap().into_inner();
    let mut status = None;
    loop {
        match stream.message().await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                status = Some(e);
                break;
            }
        }
    }
    assert_eq!(status.map(|s| s.code()), Some(Code::NotFound));
}

/// Copies a directory tree (the store of a stopped nats-server).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test]
async fn a_cold_copy_of_the_jetstream_store_restores_every_session() {
    let (_config_dir, config) = config_file(AGENTS);
    let mut nats = NatsServer::start().await.unwrap();
    let options = |url: String| DevOptions { extra_args: config_args(&config), ..DevOptions::nats(url) };
    let dev = DevServer::start_with(options(nats.url())).await.unwrap();
    populate(&dev).await;
    let ids = ["s1", "s1-fork", "s2"];
    let mut before = Vec::new();
    for id in ids {
        before.push(log_bytes(&Session::with_ref(dev.client(), sref("acme", id))).await);
    }
    dev.stop().await;
    // The backup: the store directory of the stopped server, copied.
    nats.stop().await;
    let backup = tempfile::tempdir().unwrap();
    copy_tree(&nats.store_dir(), backup.path());
    drop(nats);

    // The restore: another server (its own ports and directory) started on the copy.
    let mut restored = NatsServer::start().await.unwrap();
    restored.stop().await;
    std::fs::remove_dir_all(restored.store_dir()).unwrap();
    copy_tree(backup.path(), &restored.store_dir());
    restored.restart().await.unwrap();
    let dev = DevServer::start_with(options(restored.url())).await.unwrap();
    for (id, bytes) in ids.iter().zip(&before) {
        let s = Session::with_ref(dev.client(), sref("acme", id));
        assert_eq!(&log_bytes(&s).await, bytes, "session acme/{id} after the restore");
    }
    let s1 = Session::with_ref(dev.client(), sref("acme", "s1"));
    s1.followup(user_msg("after", "still here?")).await.unwrap();
    assert_eq!(s1.when_idle().await.unwrap().last_turn, 3, "the restored session goes on");
}
