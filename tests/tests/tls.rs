//! TLS from the outside: `turnstile dev --tls-cert --tls-key` with a throwaway CA and a server
//! certificate for `localhost`/127.0.0.1 made here with rcgen. A client that trusts the CA makes a
//! followup over `https://` (the harness's own client, and the CLI with `--ca`); a client that trusts
//! another CA, or speaks plain HTTP/2, gets nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod pki;

use std::path::{Path, PathBuf};
use std::time::Duration;

use pki::make_ca;
use rcgen::{CertificateParams, DnType, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use turnstile_tests::v1::agent_client::AgentClient;
use turnstile_tests::v1::{DeliverRequest, GetSessionRequest, SessionRef};
use turnstile_tests::{DevOptions, DevServer, user_msg};

struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM files in `dir`.
fn make_pki(dir: &Path) -> Pki {
    let ca = make_ca("turnstile test CA");
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let pki = Pki { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") };
    std::fs::write(&pki.ca, ca.pem()).unwrap();
    std::fs::write(&pki.cert, cert.pem()).unwrap();
    std::fs::write(&pki.key, key.serialize_pem()).unwrap();
    pki
}

/// The body of `GET path` over a fresh HTTP/1.1 connection.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()
}

fn probe() -> GetSessionRequest {
    GetSessionRequest { session: Some(SessionRef { tenant: String::new(), id: "nobody".into() }) }
}

#[tokio::test]
async fn a_followup_over_tls_works_for_clients_that_trust_the_ca_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let args = ["--tls-cert", pki.cert.to_str().unwrap(), "--tls-key", pki.key.to_str().unwrap()];
    let opts =
        DevOptions { extra_args: args.map(str::to_owned).to_vec(), tls_ca: Some(pki.ca.clone()), ..Default::default() };
    let server = DevServer::start_with(opts).await.unwrap();
    assert!(server.url().starts_with("https://"), "{}", server.url());

    // The harness's client trusts the CA: a followup round trip, then its effect is read back.
    let session = server.session();
    let reply = session.followup(user_msg("m1", "over tls")).await.unwrap();
    assert!(reply.seq > 0);
    let info = session.when_idle().await.unwrap();
    assert!(info.last_seq >= reply.seq);

    // The CLI with --ca, on the address the server prints.
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let (url, ca) = (server.url(), pki.ca.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .args(["--addr", &url, "--ca", ca.to_str().unwrap(), "followup", "cli-tls", "hello", "over", "tls"])
            .env("NO_COLOR", "1")
            .output()
    });
    let out = out.await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The CLI on plain http:// to the TLS port says the server speaks TLS and how to reach it (it said
    // `INTERNAL: h2 protocol error` or `CANCELLED: operation was canceled`).
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let addr = server.addr();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin).args(["--addr", &format!("http://{addr}"), "session", "cli-tls"]).output()
    });
    let out = out.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: the server at {addr} speaks TLS, and --addr http://{addr} is plain http://: use --addr \
             https://{addr} with --ca FILE (the CA that signed its certificate)\n"
        )
    );

    // The certificate in use is on /metrics with its expiry (rcgen's default not_after: 4096-01-01).
    let metrics = http_get(server.http_addr().unwrap(), "/metrics").await;
    let series = format!("turnstile_certificate_expiry_timestamp_seconds{{file=\"{}\"}} ", pki.cert.display());
    let expiry = metrics.lines().find_map(|l| l.strip_prefix(series.as_str())).unwrap_or_else(|| panic!("{metrics}"));
    assert_eq!(expiry.parse::<f64>().unwrap(), 67_090_118_400.0, "{series}");

    // A client that trusts another CA cannot complete the handshake.
    let other = make_ca("someone else's CA");
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(other.pem())).domain_name("localhost");
    let endpoint = Endpoint::from_shared(format!("https://{}", server.addr()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .tls_config(tls)
        .unwrap();
    match endpoint.connect().await {
        Err(_) => {}
        Ok(channel) => {
            let err = AgentClient::new(channel).get_session(probe()).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        }
    }

    // Plain HTTP/2 to the TLS port gets no answer from the application either.
    let plain = Endpoint::from_shared(format!("http://{}", server.addr())).unwrap().timeout(Duration::from_secs(5));
    if let Ok(channel) = plain.connect().await {
        let req = DeliverRequest {
            session: Some(SessionRef { tenant: String::new(), id: "plain".into() }),
            message: Some(user_msg("m2", "in clear text")),
            output_schema: None,
        };
        assert!(AgentClient::new(channel).followup(req).await.is_err());
    }
}

#[tokio::test]
async fn unusable_tls_files_are_named_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    // The certificate where the key should be.
    let (cert, key) = (pki.cert.clone(), pki.cert.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .args(["dev", "--listen", "127.0.0.1:0", "--tls-cert", cert.to_str().unwrap()])
            .args(["--tls-key", key.to_str().unwrap()])
            .output()
    });
    let out = out.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.pem has no PEM private key"), "{stderr}");
}

// Reloads without a restart (decision 0159).

/// Generous: the server polls its certificate and auth files every 2 s.
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// A server certificate for `localhost`/127.0.0.1 with a fresh key, signed by `ca`: (cert PEM, key PEM, DER).
fn server_cert(ca: &rcgen::CertifiedIssuer<'static, KeyPair>) -> (String, String, Vec<u8>) {
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

/// Replaces `path` as an operator should (and a Kubernetes Secret mount does): write aside, then rename.
fn replace(path: &Path, contents: &[u8]) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, contents).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

/// The leaf certificate (DER) a new TLS connection to `addr` is shown, trusting `ca`.
async fn leaf_seen(addr: std::net::SocketAddr, ca: &Path) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let (_, session) = tls.get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]), "the listener offers HTTP/2");
    session.peer_certificates().unwrap()[0].as_ref().to_vec()
}

/// Waits until a new connection is shown `want`; fails after [`RELOAD_WAIT`] with the server's log.
async fn until_leaf(server: &DevServer, ca: &Path, want: &[u8], step: &str) {
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    while leaf_seen(server.addr(), ca).await != want {
        assert!(tokio::time::Instant::now() < deadline, "{step}: not after {RELOAD_WAIT:?}\n{}", server.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the series `turnstile_reloads_total{outcome, what}` on /metrics (0 when absent).
async fn reloads(server: &DevServer, what: &str, outcome: &str) -> f64 {
    let metrics = http_get(server.http_addr().unwrap(), "/metrics").await;
    let series = format!("turnstile_reloads_total{{what=\"{what}\",outcome=\"{outcome}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(series.as_str())).map_or(0.0, |v| v.parse().unwrap())
}

/// The code of a GetSession call with `token` (NotFound: accepted, the session does not exist).
async fn call_with(server: &DevServer, token: &str) -> tonic::Code {
    let mut request = tonic::Request::new(probe());
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    match server.client().get_session(request).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

async fn until_code(server: &DevServer, token: &str, want: tonic::Code, step: &str) {
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    while call_with(server, token).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{step}: not {want:?} after {RELOAD_WAIT:?}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn until_logged(server: &DevServer, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    loop {
        let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            return line.to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "no {needle:?} after {RELOAD_WAIT:?}\n{}", server.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_rotated_certificate_and_token_file_take_effect_without_a_restart() {
    const OLD_TOKEN: &str = "old-token-0123456789abcdef";
    const NEW_TOKEN: &str = "new-token-fedcba9876543210";
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca("turnstile rotation CA");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let (cert_path, key_path, tokens) =
        (dir.path().join("server.pem"), dir.path().join("server.key"), dir.path().join("tokens.txt"));
    let (first_pem, first_key, first_der) = server_cert(&ca);
    std::fs::write(&cert_path, &first_pem).unwrap();
    std::fs::write(&key_path, &first_key).unwrap();
    std::fs::write(&tokens, format!("{OLD_TOKEN} tenant-a\n")).unwrap();
    let args = [
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
        "--auth-tokens",
        tokens.to_str().unwrap(),
    ];
    let opts = DevOptions {
        extra_args: args.map(str::to_owned).to_vec(),
        tls_ca: Some(ca_path.clone()),
        ..Default::default()
    };
    let server = DevServer::start_with(opts).await.unwrap();
    let pid = server.pid();
    assert_eq!(leaf_seen(server.addr(), &ca_path).await, first_der);
    assert_eq!(call_with(&server, OLD_TOKEN).await, tonic::Code::NotFound, "the old token is accepted");

    // The certificate renewed on disk (key first, then the certificate: between the two the pair does not
    // fit, which a poll may see and refuse; the next one takes the pair).
    let (second_pem, second_key, second_der) = server_cert(&ca);
    assert_ne!(first_der, second_der);
    replace(&key_path, second_key.as_bytes());
    replace(&cert_path, second_pem.as_bytes());
    until_leaf(&server, &ca_path, &second_der, "the renewed certificate").await;
    let line = until_logged(&server, "tls reloaded: certificate serial").await;
    assert!(line.contains(&cert_path.display().to_string()), "{line}");
    assert!(reloads(&server, "tls", "ok").await >= 1.0);
    // The connection opened before the renewal still works.
    assert_eq!(call_with(&server, OLD_TOKEN).await, tonic::Code::NotFound);

    // A certificate file that is not one: refused, logged and counted; the renewed certificate stays.
    let errors = reloads(&server, "tls", "error").await;
    replace(&cert_path, b"not a certificate\n");
    let line = until_logged(&server, "tls reload failed, the previous certificate stays in force").await;
    assert!(line.contains("server.pem has no PEM certificate"), "{line}");
    assert!(reloads(&server, "tls", "error").await > errors);
    assert_eq!(leaf_seen(server.addr(), &ca_path).await, second_der);

    // The token file rotated without a signal: the new token is accepted and the old one refused.
    replace(&tokens, format!("{NEW_TOKEN} tenant-a\n").as_bytes());
    until_code(&server, NEW_TOKEN, tonic::Code::NotFound, "the new token").await;
    assert_eq!(call_with(&server, OLD_TOKEN).await, tonic::Code::Unauthenticated, "the old token");
    assert!(reloads(&server, "auth", "ok").await >= 1.0);
    assert_eq!(server.pid(), pid, "the same process throughout");
    server.stop().await;
}
