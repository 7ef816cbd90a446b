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
