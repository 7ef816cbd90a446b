//! The worker's internal API takes only callers with a certificate of the cluster CA (decision 0026):
//! a cluster whose workers run `--tls-client-ca` and whose gateway presents `--cluster-tls-cert` works
//! through the gateway, while a direct call to the worker port in plain text, over TLS without a client
//! certificate, or with a certificate of another CA, is refused and writes nothing. A worker refuses to
//! start off loopback without client certificates, the way the gateway refuses to without auth.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod pki;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pki::make_ca;
use rcgen::{CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, KeyPair};
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use turnstile_cluster::codec::encode_execute_request;
use turnstile_model::{Command, SessionRef as ModelRef, Target, UserMessage};
use turnstile_tests::cluster::{Cluster, ClusterOptions};
use turnstile_tests::user_msg;
use turnstile_tests::v1::GetSessionRequest;
use turnstile_tests::v1::SessionRef;

/// A certificate signed by `ca` (for 127.0.0.1 when `server`, else a client certificate), as PEM
/// (cert, key) files in `dir`.
fn issue(dir: &Path, ca: &CertifiedIssuer<'static, KeyPair>, name: &str, server: bool) -> (PathBuf, PathBuf) {
    let names = if server { vec!["127.0.0.1".to_owned(), "localhost".to_owned()] } else { Vec::new() };
    let mut params = CertificateParams::new(names).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages =
        vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// One `Worker.Execute` straight to the worker port: a followup on `session`.
async fn call_worker(addr: SocketAddr, tls: Option<ClientTlsConfig>, session: &ModelRef) -> Result<(), tonic::Status> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint =
        Endpoint::from_shared(format!("{scheme}://{addr}")).unwrap().connect_timeout(Duration::from_secs(10));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let channel = endpoint.connect().await.map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    let mut client = turnstile_proto::cluster::v1::worker_client::WorkerClient::new(channel);
    let message = UserMessage::user_text("intruder-1", "run this for me");
    let command =
        Command::Send { message, target: Target::NextTurn, wakeup: true, expected_turn: None, deadline: None };
    let mut request = tonic::Request::new(encode_execute_request(session, &command, None));
    request.set_timeout(Duration::from_secs(10));
    client.execute(request).await.map(|_| ())
}

#[tokio::test]
async fn the_worker_port_refuses_callers_without_a_cluster_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca("turnstile cluster CA");
    let ca_path = dir.path().join("cluster-ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let (worker_cert, worker_key) = issue(dir.path(), &ca, "worker", true);
    let (gateway_cert, gateway_key) = issue(dir.path(), &ca, "gateway", false);
    let mut opts = ClusterOptions::new(1, 1);
    opts.worker_args =
        vec!["--tls-cert", &s(&worker_cert), "--tls-key", &s(&worker_key), "--tls-client-ca", &s(&ca_path)]
            .into_iter()
            .map(str::to_owned)
            .collect();
    opts.gateway_args = vec![
        "--cluster-tls-ca",
        &s(&ca_path),
        "--cluster-tls-cert",
        &s(&gateway_cert),
        "--cluster-tls-key",
        &s(&gateway_key),
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let cluster = Cluster::start_with(opts).await.unwrap();

    // Through the gateway, which holds a cluster certificate: served.
    let session = cluster.session(0);
    session.followup(user_msg("m1", "hello")).await.unwrap();
    assert!(session.when_idle().await.unwrap().last_seq > 0);

    let addr = cluster.worker_addr(0);
    let victim = ModelRef::new("default", "victim").unwrap();
    let trusting = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem())).domain_name("127.0.0.1");

    let plain = call_worker(addr, None, &victim).await.unwrap_err();
    let anonymous = call_worker(addr, Some(trusting()), &victim).await.unwrap_err();
    let other_ca = make_ca("someone else's CA");
    let (other_cert, other_key) = issue(dir.path(), &other_ca, "stranger", false);
    let stranger = trusting()
        .identity(Identity::from_pem(std::fs::read(&other_cert).unwrap(), std::fs::read(&other_key).unwrap()));
    let forged = call_worker(addr, Some(stranger), &victim).await.unwrap_err();
    for (what, status) in [("plain text", &plain), ("no client certificate", &anonymous), ("another CA", &forged)] {
        // Refused by the transport (a failed handshake or a reset), never by a command: no kind metadata.
        assert!(status.metadata().get("turnstile-error").is_none(), "{what}: {status:?}");
        assert_ne!(status.code(), Code::Ok, "{what}");
    }
    // Nothing any of them sent was written.
    let mut client = cluster.client(0);
    let req = GetSessionRequest { session: Some(SessionRef { tenant: "default".into(), id: "victim".into() }) };
    assert_eq!(client.get_session(req).await.unwrap_err().code(), Code::NotFound);

    // The same call with the gateway's certificate is served: the refusals were about credentials only.
    let gateway = trusting()
        .identity(Identity::from_pem(std::fs::read(&gateway_cert).unwrap(), std::fs::read(&gateway_key).unwrap()));
    call_worker(addr, Some(gateway), &victim).await.unwrap();
}

#[tokio::test]
async fn a_worker_refuses_to_serve_off_loopback_without_client_certificates() {
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    // It exits after binding and before it dials NATS (nothing listens at that URL), so a blocking run is
    // bounded.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .args(["worker", "--nats", "nats://127.0.0.1:1", "--listen", "0.0.0.0:0", "--http", "127.0.0.1:0"])
            .env("NO_COLOR", "1")
            .output()
    });
    let out = out.await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve the worker API on 0.0.0.0:0 without cluster credentials; pass --tls-cert"),
        "{stderr}"
    );
}

// Certificates renewed on disk without a restart (decision 0159).

/// Generous: every server polls its TLS files every 2 s.
const RELOAD_WAIT: Duration = Duration::from_secs(60);

/// Replaces `path` as a Secret mount does: write aside, then rename.
fn replace_with(path: &Path, from: &Path) {
    let aside = path.with_extension("new");
    std::fs::copy(from, &aside).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

fn der(pem: &Path) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::CertificateDer::pem_file_iter(pem).unwrap().next().unwrap().unwrap().as_ref().to_vec()
}

/// The leaf certificate a new mTLS connection to the worker at `addr` is shown, presenting `client`.
async fn worker_leaf(addr: SocketAddr, ca: &Path, client: (&Path, &Path)) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let chain = vec![rustls_pki_types::CertificateDer::from_pem_file(client.0).unwrap()];
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(client.1).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec()
}

/// `turnstile_reloads_total{what="cluster_tls",outcome="ok"}` on the server at `http`.
async fn cluster_tls_reloads(http: SocketAddr) -> f64 {
    let (_, metrics) = turnstile_tests::nats::http_get(http, "/metrics").await.unwrap_or_default();
    let series = "turnstile_reloads_total{what=\"cluster_tls\",outcome=\"ok\"} ";
    metrics.lines().find_map(|l| l.strip_prefix(series)).map_or(0.0, |v| v.parse().unwrap())
}

/// The code of a followup through the gateway (a new message id each time).
async fn followup_code(cluster: &Cluster, n: &mut u32) -> Code {
    *n += 1;
    match cluster.session(0).followup(user_msg(&format!("rot-{n}"), "after a rotation")).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn renewed_cluster_certificates_are_used_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca("turnstile cluster CA");
    let ca_path = dir.path().join("cluster-ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let (worker_cert, worker_key) = issue(dir.path(), &ca, "worker", true);
    let (gateway_cert, gateway_key) = issue(dir.path(), &ca, "gateway", false);
    let mut opts = ClusterOptions::new(1, 1);
    opts.worker_args = ["--tls-cert", &s(&worker_cert), "--tls-key", &s(&worker_key), "--tls-client-ca", &s(&ca_path)]
        .map(str::to_owned)
        .to_vec();
    opts.gateway_args = [
        "--cluster-tls-ca",
        &s(&ca_path),
        "--cluster-tls-cert",
        &s(&gateway_cert),
        "--cluster-tls-key",
        &s(&gateway_key),
    ]
    .map(str::to_owned)
    .to_vec();
    let cluster = Cluster::start_with(opts).await.unwrap();
    let mut n = 0;
    assert_eq!(followup_code(&cluster, &mut n).await, Code::Ok);
    let addr = cluster.worker_addr(0);
    let renewed = dir.path().join("renewed");
    std::fs::create_dir(&renewed).unwrap();

    // The worker's certificate renewed (key first, then certificate): the next connection is shown it.
    let (new_cert, new_key) = issue(&renewed, &ca, "worker", true);
    replace_with(&worker_key, &new_key);
    replace_with(&worker_cert, &new_cert);
    let want = der(&new_cert);
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    while worker_leaf(addr, &ca_path, (&gateway_cert, &gateway_key)).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker still shows its old certificate\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The gateway's client certificate replaced by one of another CA: once reloaded, the gateway dials with
    // it, and the worker refuses it, which shows the new certificate is the one in use.
    let http = cluster.gateway_http(0).unwrap();
    let before = cluster_tls_reloads(http).await;
    let stranger_ca = make_ca("someone else's CA");
    let (stranger_cert, stranger_key) = issue(&renewed, &stranger_ca, "stranger", false);
    replace_with(&gateway_key, &stranger_key);
    replace_with(&gateway_cert, &stranger_cert);
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    while followup_code(&cluster, &mut n).await != Code::Unavailable {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway still dials with its old certificate\n{}",
            cluster.logs()
        );
    }
    assert!(cluster_tls_reloads(http).await > before);

    // A renewed certificate of the cluster CA: followups are served again, with no restart.
    let (good_cert, good_key) = issue(&renewed, &ca, "gateway", false);
    replace_with(&gateway_key, &good_key);
    replace_with(&gateway_cert, &good_cert);
    let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
    while followup_code(&cluster, &mut n).await != Code::Ok {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed gateway certificate is not used\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
