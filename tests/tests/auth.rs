//! Tenancy and auth from the outside: `turnstile dev --auth-tokens` (two tokens for two tenants) and
//! `--jwt-key`. A caller can read, write, list and watch only its own tenant's sessions; another
//! tenant's session is NOT_FOUND with the same message as a session that does not exist; a missing or
//! bad token is UNAUTHENTICATED. Auth off is refused on a non-loopback address.
//!
//! Reloads (decision 0035): a token removed from the `--auth-tokens` file is refused after SIGHUP and
//! accepted again once restored (the 2 s poll of the file sees that without a signal); a rewrite that does
//! not parse keeps the previous tokens working and is logged with the file and the fault; a rotated
//! `--jwt-key` admits tokens of the new key and refuses the old. Every step waits on what a caller
//! observes (a call accepted or refused, a log line), bounded by `RELOAD_WAIT`, never on a guessed sleep.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use turnstile_tests::v1::agent_client::AgentClient;
use turnstile_tests::v1::watch_item::Item;
use turnstile_tests::v1::{
    DeliverRequest, GetInboxRequest, GetSessionRequest, ListSessionsRequest, SessionRef, WatchRequest, WhenIdleRequest,
};
use turnstile_tests::{DevOptions, DevServer, user_msg};

const TOKEN_A: &str = "token-of-tenant-a-0123456789";
const TOKEN_B: &str = "token-of-tenant-b-9876543210";

fn authed<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

fn name(tenant: &str, id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: tenant.into(), id: id.into() })
}

async fn start_with_args(args: Vec<String>) -> DevServer {
    DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap()
}

async fn followup(
    client: &mut AgentClient<Channel>,
    token: &str,
    session: Option<SessionRef>,
    text: &str,
) -> Result<u64, Status> {
    let req = DeliverRequest {
        session,
        message: Some(user_msg(&uuid::Uuid::new_v4().to_string(), text)),
        output_schema: None,
    };
    client.followup(authed(req, Some(token))).await.map(|r| r.into_inner().seq)
}

async fn last_seq_when_idle(client: &mut AgentClient<Channel>, token: &str, id: &str) -> u64 {
    let req = WhenIdleRequest { session: name("", id), timeout_ms: 20_000 };
    client.when_idle(authed(req, Some(token))).await.unwrap().into_inner().last_seq
}

fn tokens_file(dir: &Path) -> String {
    let path = dir.join("tokens.txt");
    std::fs::write(&path, format!("# test tokens\n{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b  # the other team\n"))
        .unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn a_tenant_cannot_read_write_list_or_watch_another_tenants_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_args(vec!["--auth-tokens".into(), tokens_file(dir.path())]).await;
    let mut client = server.client();

    // B's session, named without a tenant: the token's tenant is used.
    followup(&mut client, TOKEN_B, name("", "b-secret"), "hello from b").await.unwrap();
    let b_seq = last_seq_when_idle(&mut client, TOKEN_B, "b-secret").await;
    let info = client.get_session(authed(GetSessionRequest { session: name("", "b-secret") }, Some(TOKEN_B))).await;
    let info = info.unwrap().into_inner();
    assert_eq!(info.session, name("tenant-b", "b-secret"), "the session belongs to the token's tenant");
    // Naming one's own tenant explicitly is the same session.
    let own = client.get_inbox(authed(GetInboxRequest { session: name("tenant-b", "b-secret") }, Some(TOKEN_B))).await;
    assert_eq!(own.unwrap().into_inner().seq, b_seq);

    // A's own session.
    followup(&mut client, TOKEN_A, name("", "a-own"), "hello from a").await.unwrap();
    last_seq_when_idle(&mut client, TOKEN_A, "a-own").await;

    // Read: NOT_FOUND, with the same message as a session that does not exist at all.
    let missing = client.get_session(authed(GetSessionRequest { session: name("tenant-b", "nobody") }, Some(TOKEN_B)));
    let missing = missing.await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    for id in ["b-secret", "nobody"] {
        let err = client.get_session(authed(GetSessionRequest { session: name("tenant-b", id) }, Some(TOKEN_A)));
        let err = err.await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
        assert_eq!(err.message(), missing.message().replace("nobody", id), "no existence leak");
        let err = client.get_inbox(authed(GetInboxRequest { session: name("tenant-b", id) }, Some(TOKEN_A))).await;
        let err = err.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(err.message(), missing.message().replace("nobody", id));
    }
    // A's token with no tenant reaches A's namespace, where B's id does not exist.
    let err = client.get_session(authed(GetSessionRequest { session: name("", "b-secret") }, Some(TOKEN_A))).await;
    assert_eq!(err.unwrap_err().code(), Code::NotFound);

    // Write: NOT_FOUND and nothing written, as B sees it.
    let err = followup(&mut client, TOKEN_A, name("tenant-b", "b-secret"), "intrusion").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), missing.message().replace("nobody", "b-secret"));
    let req = DeliverRequest {
        session: name("tenant-b", "b-secret"),
        message: Some(user_msg("m-x", "queued?")),
        output_schema: None,
    };
    assert_eq!(client.queue(authed(req, Some(TOKEN_A))).await.unwrap_err().code(), Code::NotFound);
    let after = client.get_session(authed(GetSessionRequest { session: name("", "b-secret") }, Some(TOKEN_B))).await;
    assert_eq!(after.unwrap().into_inner().last_seq, b_seq, "the intrusion wrote nothing");
    let inbox = client.get_inbox(authed(GetInboxRequest { session: name("", "b-secret") }, Some(TOKEN_B))).await;
    let inbox = inbox.unwrap().into_inner();
    assert!(inbox.next_turn.is_empty() && inbox.next_step.is_empty(), "{inbox:?}");

    // List: only A's sessions, whatever the filter; another tenant's filter is refused.
    let req = ListSessionsRequest {
        page_token: String::new(),
        page_size: 0,
        tenant: String::new(),
        parent: String::new(),
        ..Default::default()
    };
    let list = client.list_sessions(authed(req, Some(TOKEN_A))).await.unwrap().into_inner();
    let names: Vec<_> = list.sessions.iter().map(|s| s.session.clone().unwrap()).collect();
    assert!(names.iter().all(|s| s.tenant == "tenant-a"), "{names:?}");
    assert!(names.iter().any(|s| s.id == "a-own"), "{names:?}");
    let req = ListSessionsRequest {
        page_token: String::new(),
        page_size: 0,
        tenant: "tenant-b".into(),
        parent: String::new(),
        ..Default::default()
    };
    assert_eq!(client.list_sessions(authed(req, Some(TOKEN_A))).await.unwrap_err().code(), Code::PermissionDenied);

    // Watch: NOT_FOUND for B's session; A's own works.
    let req = WatchRequest { session: name("tenant-b", "b-secret"), after_seq: 0, live: true, resume: None };
    let err = client.watch(authed(req, Some(TOKEN_A))).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), missing.message().replace("nobody", "b-secret"));
    let req = WatchRequest { session: name("", "a-own"), after_seq: 0, live: false, resume: None };
    let mut stream = client.watch(authed(req, Some(TOKEN_A))).await.unwrap().into_inner();
    let caught_up = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(item) = stream.message().await.unwrap() {
            match item.item {
                Some(Item::Event(e)) => assert_eq!(e.session, name("tenant-a", "a-own")),
                Some(Item::CaughtUp(c)) => return c.seq,
                _ => {}
            }
        }
        panic!("the watch ended before caught-up");
    });
    assert!(caught_up.await.unwrap() > 0);
}

#[tokio::test]
async fn missing_or_unknown_tokens_are_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_args(vec!["--auth-tokens".into(), tokens_file(dir.path())]).await;
    let mut client = server.client();
    for token in [None, Some("not-a-token"), Some("")] {
        let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, token)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{token:?}: {err:?}");
        let req = DeliverRequest { session: name("", "s1"), message: Some(user_msg("m1", "hi")), output_schema: None };
        assert_eq!(client.followup(authed(req, token)).await.unwrap_err().code(), Code::Unauthenticated);
        let req = WatchRequest { session: name("", "s1"), after_seq: 0, live: true, resume: None };
        assert_eq!(client.watch(authed(req, token)).await.unwrap_err().code(), Code::Unauthenticated);
        let req = ListSessionsRequest {
            page_token: String::new(),
            page_size: 0,
            tenant: String::new(),
            parent: String::new(),
            ..Default::default()
        };
        assert_eq!(client.list_sessions(authed(req, token)).await.unwrap_err().code(), Code::Unauthenticated);
    }
    // A token-less write must not have created anything.
    let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(TOKEN_A))).await;
    assert_eq!(err.unwrap_err().code(), Code::NotFound);
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    tenant: &'a str,
    exp: u64,
}

fn sign(secret: &[u8], tenant: &str, exp: u64) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(secret);
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &Claims { tenant, exp }, &key)
        .unwrap()
}

#[tokio::test]
async fn a_jwt_names_its_tenant_and_expired_or_forged_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secret = b"an-hs256-secret-of-at-least-32-bytes!";
    let key = dir.path().join("jwt.key");
    // A trailing newline, as `echo` writes it, is not part of the secret.
    std::fs::write(&key, [secret.as_slice(), b"\n"].concat()).unwrap();
    let server =
        start_with_args(vec!["--jwt-key".into(), key.display().to_string(), "--jwt-alg".into(), "HS256".into()]).await;
    let mut client = server.client();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();

    let good = sign(secret, "jwt-tenant", now + 3600);
    followup(&mut client, &good, name("", "s1"), "hello").await.unwrap();
    let info = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&good))).await;
    assert_eq!(info.unwrap().into_inner().session, name("jwt-tenant", "s1"));
    // Another tenant's JWT does not see it.
    let other = sign(secret, "someone-else", now + 3600);
    let err = client.get_session(authed(GetSessionRequest { session: name("jwt-tenant", "s1") }, Some(&other))).await;
    assert_eq!(err.unwrap_err().code(), Code::NotFound);

    // Expired well past any leeway.
    let expired = sign(secret, "jwt-tenant", now - 3600);
    let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&expired))).await;
    let err = err.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("expired"), "{}", err.message());
    // Signed with another key.
    let forged = sign(b"another-secret-that-is-32-bytes-long!!", "jwt-tenant", now + 3600);
    let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&forged))).await;
    assert_eq!(err.unwrap_err().code(), Code::Unauthenticated);
    // `alg: none`, unsigned.
    let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.", good.split('.').nth(1).unwrap());
    let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&unsigned))).await;
    assert_eq!(err.unwrap_err().code(), Code::Unauthenticated);
}

#[derive(serde::Serialize)]
struct ScopedClaims<'a> {
    tenant: &'a str,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
}

#[tokio::test]
async fn a_configured_audience_and_issuer_refuse_tokens_minted_for_others() {
    let dir = tempfile::tempdir().unwrap();
    let secret = b"an-hs256-secret-of-at-least-32-bytes!";
    let key = dir.path().join("jwt.key");
    std::fs::write(&key, secret).unwrap();
    let args =
        ["--jwt-key", &key.display().to_string(), "--jwt-audience", "turnstile", "--jwt-issuer", "https://id.test"]
            .map(String::from)
            .to_vec();
    let server = start_with_args(args).await;
    let mut client = server.client();
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600;
    let sign = |aud: Option<&str>, iss: Option<&str>| {
        let claims = ScopedClaims { tenant: "scoped", exp, aud, iss };
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap()
    };

    let good = sign(Some("turnstile"), Some("https://id.test"));
    followup(&mut client, &good, name("", "s1"), "hello").await.unwrap();
    let cases = [
        (
            sign(Some("billing"), Some("https://id.test")),
            "its `aud` claim does not name this service (expected turnstile)",
        ),
        (sign(None, Some("https://id.test")), "it has no `aud` claim"),
        (
            sign(Some("turnstile"), Some("https://evil.test")),
            "its `iss` claim is not the configured issuer (expected https://id.test)",
        ),
        (sign(Some("turnstile"), None), "it has no `iss` claim"),
    ];
    for (token, why) in cases {
        let err = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&token))).await;
        let err = err.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{why}: {err:?}");
        assert_eq!(err.message(), format!("the bearer JWT is not valid: {why}"));
    }
    let info = client.get_session(authed(GetSessionRequest { session: name("", "s1") }, Some(&good))).await;
    assert_eq!(info.unwrap().into_inner().session, name("scoped", "s1"));
}

#[tokio::test]
async fn auth_off_is_refused_off_loopback_and_announced_on_loopback() {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    // It exits before serving, so a blocking run is bounded.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin).args(["dev", "--listen", "0.0.0.0:0"]).env("NO_COLOR", "1").output()
    });
    let out = out.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "refusing to serve without auth on 0.0.0.0:0; pass --auth-tokens or --jwt-key, or listen on loopback"
        ),
        "{stderr}"
    );

    let server = DevServer::start().await.unwrap();
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains("auth: off (loopback only)"), "{log}");
}

/// SPEC §13 history operations keep tenants apart: tenant B cannot fork or reference tenant A's session
/// (NOT_FOUND, as for a session that does not exist) and nothing is written; tenant A can.
#[tokio::test]
async fn history_operations_cannot_cross_tenants() {
    use turnstile_tests::v1::{ForkSessionRequest, ReferenceSessionRequest};
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_args(vec!["--auth-tokens".into(), tokens_file(dir.path())]).await;
    let mut client = server.client();
    followup(&mut client, TOKEN_A, name("", "secret"), "a's plans").await.unwrap();
    last_seq_when_idle(&mut client, TOKEN_A, "secret").await;

    let fork = |token: &str, tenant: &str| {
        let req = ForkSessionRequest { session: name(tenant, "secret"), at_turn: 1, new_session: "copy".into() };
        authed(req, Some(token))
    };
    for tenant in ["", "tenant-a"] {
        let err = client.fork_session(fork(TOKEN_B, tenant)).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    }
    let reference = |token: &str, from_tenant: &str| {
        let req = ReferenceSessionRequest {
            session: name("", "mine"),
            from_session: name(from_tenant, "secret"),
            upto_turn: None,
            message_id: "ref-1".into(),
        };
        authed(req, Some(token))
    };
    let err = client.reference_session(reference(TOKEN_B, "tenant-a")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(err.message().contains("does not exist"), "{}", err.message());
    // B's own `secret` does not exist either: the same answer, nothing written for B.
    let err = client.reference_session(reference(TOKEN_B, "")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    for id in ["copy", "mine"] {
        let err = client.get_session(authed(GetSessionRequest { session: name("", id) }, Some(TOKEN_B))).await;
        assert_eq!(err.unwrap_err().code(), Code::NotFound);
    }
    // A forks its own session.
    let info = client.fork_session(fork(TOKEN_A, "")).await.unwrap().into_inner();
    assert_eq!((info.last_seq, info.session.unwrap().tenant.as_str()), (1, "tenant-a"));
}

// Reloads of the auth material (decision 0035).

/// Generous: the server polls its auth file every 2 s; SIGHUP acts at once.
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// Replaces `path` the way an operator should (and a Kubernetes secret mount does): write aside, then rename,
/// so the server never reads a half-written file.
fn replace(path: &Path, contents: &[u8]) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, contents).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// The code of a ListSessions call with `token` (`Code::Ok` when accepted).
async fn call(client: &mut AgentClient<Channel>, token: &str) -> Code {
    let request = ListSessionsRequest {
        page_token: String::new(),
        page_size: 1,
        tenant: String::new(),
        parent: String::new(),
        ..Default::default()
    };
    match client.list_sessions(authed(request, Some(token))).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Calls with `token` until the answer is `want`; fails after [`RELOAD_WAIT`] with the server's log.
async fn until_answer(server: &DevServer, token: &str, want: Code, step: &str) {
    let mut client = server.client();
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        if call(&mut client, token).await == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{step}: still not {want:?} after {RELOAD_WAIT:?}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the log has more than `before` lines containing `needle`, and returns that line.
async fn until_logged(server: &DevServer, needle: &str, before: usize) -> String {
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        if lines.len() > before {
            return lines[before].to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new log line with {needle:?} after {RELOAD_WAIT:?}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn logged(server: &DevServer, needle: &str) -> usize {
    std::fs::read_to_string(server.log_path()).unwrap_or_default().lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test]
async fn a_token_removed_from_the_file_is_refused_after_sighup_and_a_bad_rewrite_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.txt");
    let both = format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n");
    std::fs::write(&file, &both).unwrap();
    let pid_file = dir.path().join("turnstile.pid");
    let server = start_with_args(vec![
        "--auth-tokens".into(),
        file.display().to_string(),
        "--pid-file".into(),
        pid_file.display().to_string(),
    ])
    .await;
    let mut client = server.client();
    assert_eq!(call(&mut client, TOKEN_A).await, Code::Ok);
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok);

    // Revoke A, signalling the process the pid file names (docs/OPERATIONS.md's step).
    let pid = until_pid_file(&pid_file).await;
    assert_eq!(Some(pid), server.pid(), "the pid file names the server");
    let reloaded = logged(&server, "auth reloaded");
    replace(&file, format!("{TOKEN_B} tenant-b\n").as_bytes());
    let hup = std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap();
    assert!(hup.success());
    until_answer(&server, TOKEN_A, Code::Unauthenticated, "A revoked").await;
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok, "B is still listed");
    let line = until_logged(&server, "auth reloaded", reloaded).await;
    assert!(line.contains("1 token for 1 tenant (0 added, 1 removed)"), "{line}");
    assert!(!line.contains(TOKEN_B) && !line.contains(TOKEN_A), "a reload must not log tokens: {line}");

    // A rewrite that does not parse: the error names the file and the line; B still works, A stays revoked.
    let failed = logged(&server, "auth reload failed");
    replace(&file, format!("{TOKEN_A} tenant-a\n{TOKEN_B}\n").as_bytes());
    server.hangup().unwrap();
    let line = until_logged(&server, "auth reload failed", failed).await;
    assert!(line.contains(&format!("{}:2: expected `TOKEN TENANT [ROLE]`, got 1 fields", file.display())), "{line}");
    assert!(!line.contains(TOKEN_B), "a failed reload must not log tokens: {line}");
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok, "a bad rewrite keeps the tokens in force");
    assert_eq!(call(&mut client, TOKEN_A).await, Code::Unauthenticated, "nor does it bring back a revoked one");

    // An unreadable file is the same: logged, nothing changes.
    let failed = logged(&server, "auth reload failed");
    std::fs::remove_file(&file).unwrap();
    server.hangup().unwrap();
    let line = until_logged(&server, "auth reload failed", failed).await;
    assert!(line.contains(&format!("cannot read {}", file.display())), "{line}");
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok, "a missing file keeps the tokens in force");

    // Restored without a signal: the poll of the file's bytes sees it.
    replace(&file, both.as_bytes());
    until_answer(&server, TOKEN_A, Code::Ok, "A restored").await;
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok);
    server.stop().await;
    assert!(!pid_file.exists(), "a server that stopped removes its pid file");
}

/// The pid `--pid-file` holds, once the server has written it (after it reported its addresses).
async fn until_pid_file(path: &Path) -> u32 {
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        if let Some(pid) = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()) {
            return pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rotated_jwt_key_admits_the_new_keys_tokens_and_refuses_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("jwt.key");
    let old_secret = b"the-old-hs256-secret-of-32-bytes-or-more";
    let new_secret = b"the-new-hs256-secret-of-32-bytes-or-more";
    std::fs::write(&key, [old_secret.as_slice(), b"\n"].concat()).unwrap();
    let server =
        start_with_args(vec!["--jwt-key".into(), key.display().to_string(), "--jwt-alg".into(), "HS256".into()]).await;
    let mut client = server.client();
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600;
    let old_token = sign(old_secret, "jwt-tenant", exp);
    let new_token = sign(new_secret, "jwt-tenant", exp);
    assert_eq!(call(&mut client, &old_token).await, Code::Ok);
    assert_eq!(call(&mut client, &new_token).await, Code::Unauthenticated);

    // A bad key (too short for HS256) keeps the old one in force.
    let failed = logged(&server, "auth reload failed");
    replace(&key, b"short\n");
    server.hangup().unwrap();
    let line = until_logged(&server, "auth reload failed", failed).await;
    assert!(line.contains(&format!("{}: an HS256 secret must be at least 32 bytes", key.display())), "{line}");
    assert_eq!(call(&mut client, &old_token).await, Code::Ok, "a bad key keeps the old key in force");
    assert_eq!(call(&mut client, &new_token).await, Code::Unauthenticated);

    // The rotation.
    let reloaded = logged(&server, "auth reloaded");
    replace(&key, [new_secret.as_slice(), b"\n"].concat().as_slice());
    server.hangup().unwrap();
    until_answer(&server, &new_token, Code::Ok, "new key in force").await;
    assert_eq!(call(&mut client, &old_token).await, Code::Unauthenticated, "the old key's tokens are refused");
    let line = until_logged(&server, "auth reloaded", reloaded).await;
    assert!(line.contains("the HS256 key was replaced"), "{line}");
    assert!(!line.contains("the-new-hs256"), "a reload must not log the secret: {line}");
    server.stop().await;
}

#[derive(serde::Serialize)]
struct TimedClaims<'a> {
    tenant: &'a str,
    exp: u64,
    nbf: u64,
}

/// Issue 37 item 6: a JWT whose `nbf` is in the future (beyond the 30 s leeway) is refused, UNAUTHENTICATED;
/// the same token valid from a minute ago is accepted.
#[tokio::test]
async fn a_jwt_not_valid_yet_is_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let secret = b"an-hs256-secret-of-at-least-32-bytes!";
    let key = dir.path().join("jwt.key");
    std::fs::write(&key, secret).unwrap();
    let server =
        start_with_args(vec!["--jwt-key".into(), key.display().to_string(), "--jwt-alg".into(), "HS256".into()]).await;
    let mut client = server.client();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let sign_nbf = |nbf: u64| {
        let claims = TimedClaims { tenant: "jwt-tenant", exp: now + 3600, nbf };
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap()
    };
    let early = sign_nbf(now + 600);
    let err = followup(&mut client, &early, name("", "s1"), "too early").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("`nbf`"), "{}", err.message());
    let ready = sign_nbf(now - 60);
    followup(&mut client, &ready, name("", "s1"), "on time").await.unwrap();
}

const TENANT_ADMIN: &str = "admin-of-tenant-a-0123456789";
const CLUSTER_ADMIN: &str = "cluster-admin-0123456789";

fn role_tokens(dir: &Path) -> String {
    let path = dir.join("roles.txt");
    std::fs::write(
        &path,
        format!(
            "{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n{TENANT_ADMIN} tenant-a admin\n{CLUSTER_ADMIN} ops cluster_admin\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// Every item of an `ExportSessions` call, or its refusal.
async fn export(
    client: &mut AgentClient<Channel>,
    token: &str,
    tenant: &str,
) -> Result<Vec<turnstile_tests::v1::ExportItem>, Status> {
    let req = turnstile_tests::v1::ExportSessionsRequest { tenant: tenant.into(), sessions: vec![] };
    let mut stream = client.export_sessions(authed(req, Some(token))).await?.into_inner();
    let mut items = Vec::new();
    while let Some(item) = stream.message().await? {
        items.push(item);
    }
    Ok(items)
}

async fn import(
    client: &mut AgentClient<Channel>,
    token: &str,
    items: Vec<turnstile_tests::v1::ExportItem>,
) -> Result<turnstile_tests::v1::ImportReply, Status> {
    client.import_sessions(authed(tokio_stream::iter(items), Some(token))).await.map(tonic::Response::into_inner)
}

/// Issue 37 item 4: an `admin` token administers its own tenant only (another tenant's export or import is
/// PERMISSION_DENIED); a `cluster_admin` token exports and imports any tenant.
#[tokio::test]
async fn a_tenant_admin_stays_in_its_tenant_and_a_cluster_admin_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = role_tokens(dir.path());
    let server = start_with_args(vec!["--auth-tokens".into(), tokens.clone()]).await;
    let mut client = server.client();
    followup(&mut client, TOKEN_B, name("", "b-secret"), "b's words").await.unwrap();
    let b_seq = last_seq_when_idle(&mut client, TOKEN_B, "b-secret").await;
    followup(&mut client, TOKEN_A, name("", "a-own"), "a's words").await.unwrap();
    last_seq_when_idle(&mut client, TOKEN_A, "a-own").await;

    // The tenant admin: its own tenant (named or not) exports; another tenant's is refused.
    let own = export(&mut client, TENANT_ADMIN, "").await.unwrap();
    assert_eq!(own.len(), 3, "header, one group, end: {own:?}");
    let err = export(&mut client, TENANT_ADMIN, "tenant-b").await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // A member is refused export, even of its own tenant.
    assert_eq!(export(&mut client, TOKEN_B, "").await.unwrap_err().code(), Code::PermissionDenied);

    // The cluster admin exports tenant-b.
    let b_export = export(&mut client, CLUSTER_ADMIN, "tenant-b").await.unwrap();
    let events: usize = b_export
        .iter()
        .filter_map(|i| match &i.item {
            Some(turnstile_tests::v1::export_item::Item::Events(g)) => Some(g.events.len()),
            _ => None,
        })
        .sum();
    assert_eq!(events as u64, b_seq, "tenant-b's whole session");

    // Into a fresh server with the same tokens: the tenant admin cannot import tenant-b's sessions, the
    // cluster admin can, and tenant-b then reads them.
    let target = start_with_args(vec!["--auth-tokens".into(), tokens]).await;
    let mut fresh = target.client();
    let err = import(&mut fresh, TENANT_ADMIN, b_export.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let missing = fresh.get_session(authed(GetSessionRequest { session: name("", "b-secret") }, Some(TOKEN_B))).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound, "the refused import wrote nothing");
    let reply = import(&mut fresh, CLUSTER_ADMIN, b_export).await.unwrap();
    assert_eq!((reply.sessions, reply.events), (1, b_seq));
    let info = fresh.get_session(authed(GetSessionRequest { session: name("", "b-secret") }, Some(TOKEN_B))).await;
    assert_eq!(info.unwrap().into_inner().last_seq, b_seq);
}
