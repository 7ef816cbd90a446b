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
