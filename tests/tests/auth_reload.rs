//! Auth material reloaded while `turnstile dev` runs (decision 0035): a token removed from the
//! `--auth-tokens` file is refused after SIGHUP and accepted again once restored (a poll of the file sees
//! that without a signal); a rewrite that does not parse keeps the previous tokens working and is logged
//! with the file and the fault; a rotated `--jwt-key` admits tokens of the new key and refuses the old.
//! Every step waits on what a caller observes (a call accepted or refused, a log line), bounded by
//! [`WAIT`], never on a sleep of a guessed length.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::transport::Channel;
use tonic::{Code, Request};
use turnstile_tests::v1::ListSessionsRequest;
use turnstile_tests::v1::agent_client::AgentClient;
use turnstile_tests::{DevOptions, DevServer};

const TOKEN_A: &str = "reload-token-of-tenant-a-0123";
const TOKEN_B: &str = "reload-token-of-tenant-b-4567";

/// Generous: the server polls its auth file every 2 s; SIGHUP acts at once.
const WAIT: Duration = Duration::from_secs(60);

async fn start(args: &[&str]) -> DevServer {
    let extra_args = args.iter().map(|a| (*a).to_owned()).collect();
    DevServer::start_with(DevOptions { extra_args, ..DevOptions::default() }).await.unwrap()
}

/// Replaces `path` the way an operator should (and a Kubernetes secret mount does): write aside, then rename,
/// so the server never reads a half-written file.
fn replace(path: &Path, contents: &[u8]) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, contents).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// The code of a ListSessions call with `token` (`Code::Ok` when accepted).
async fn call(client: &mut AgentClient<Channel>, token: &str) -> Code {
    let mut request =
        Request::new(ListSessionsRequest { page_token: String::new(), page_size: 1, tenant: String::new() });
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    match client.list_sessions(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Calls with `token` until the answer is `want`; fails after [`WAIT`] with the server's log.
async fn until_answer(server: &DevServer, token: &str, want: Code, step: &str) {
    let mut client = server.client();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if call(&mut client, token).await == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{step}: still not {want:?} after {WAIT:?}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the log has more than `before` lines containing `needle`, and returns that line.
async fn until_logged(server: &DevServer, needle: &str, before: usize) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        if lines.len() > before {
            return lines[before].to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new log line with {needle:?} after {WAIT:?}\n{}",
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
    let server = start(&["--auth-tokens", file.to_str().unwrap()]).await;
    let mut client = server.client();
    assert_eq!(call(&mut client, TOKEN_A).await, Code::Ok);
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok);

    // Revoke A.
    let reloaded = logged(&server, "auth reloaded");
    replace(&file, format!("{TOKEN_B} tenant-b\n").as_bytes());
    server.hangup().unwrap();
    until_answer(&server, TOKEN_A, Code::Unauthenticated, "A revoked").await;
    assert_eq!(call(&mut client, TOKEN_B).await, Code::Ok, "B is still listed");
    let line = until_logged(&server, "auth reloaded", reloaded).await;
    assert!(line.contains("1 tokens for 1 tenants (0 added, 1 removed)"), "{line}");
    assert!(!line.contains(TOKEN_B) && !line.contains(TOKEN_A), "a reload must not log tokens: {line}");

    // A rewrite that does not parse: the error names the file and the line; B still works, A stays revoked.
    let failed = logged(&server, "auth reload failed");
    replace(&file, format!("{TOKEN_A} tenant-a\n{TOKEN_B}\n").as_bytes());
    server.hangup().unwrap();
    let line = until_logged(&server, "auth reload failed", failed).await;
    assert!(line.contains(&format!("{}:2: expected `TOKEN TENANT`, got 1 fields", file.display())), "{line}");
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
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    tenant: &'a str,
    exp: u64,
}

fn sign(secret: &[u8], tenant: &str) -> String {
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600;
    let key = jsonwebtoken::EncodingKey::from_secret(secret);
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &Claims { tenant, exp }, &key)
        .unwrap()
}

#[tokio::test]
async fn a_rotated_jwt_key_admits_the_new_keys_tokens_and_refuses_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("jwt.key");
    let old_secret = b"the-old-hs256-secret-of-32-bytes-or-more";
    let new_secret = b"the-new-hs256-secret-of-32-bytes-or-more";
    std::fs::write(&key, [old_secret.as_slice(), b"\n"].concat()).unwrap();
    let server = start(&["--jwt-key", key.to_str().unwrap(), "--jwt-alg", "HS256"]).await;
    let mut client = server.client();
    let old_token = sign(old_secret, "jwt-tenant");
    let new_token = sign(new_secret, "jwt-tenant");
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
