//! Throwaway certificate authorities (rcgen) for the TLS tests (`tls.rs`, `worker_auth.rs`) and for clusters
//! whose worker port is reached beyond loopback (the fault campaign's worker in a network namespace), which
//! the worker serves only with cluster credentials (issue 14 part 1).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::HarnessError;

/// A self-signed CA named `name` that may sign certificates.
// Test PKI: a failure to make a certificate is a broken test machine, said in the panic.
#[allow(clippy::unwrap_used)]
pub fn make_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A cluster CA, one worker certificate (server, for `hosts`) and one gateway certificate (client), written
/// to `dir`; [`ClusterPki::worker_args`] and [`ClusterPki::gateway_args`] are the flags that use them.
#[derive(Debug)]
pub struct ClusterPki {
    ca: PathBuf,
    worker: (PathBuf, PathBuf),
    gateway: (PathBuf, PathBuf),
}

fn issue(
    dir: &Path,
    ca: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    hosts: Vec<String>,
    server: bool,
) -> Result<(PathBuf, PathBuf), HarnessError> {
    let bad = |e: rcgen::Error| HarnessError::io(format!("making the {name} certificate"), std::io::Error::other(e));
    let mut params = CertificateParams::new(hosts).map_err(bad)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages =
        vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
    let key = KeyPair::generate().map_err(bad)?;
    let cert = params.signed_by(&key, ca).map_err(bad)?;
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).map_err(|e| HarnessError::io("writing a certificate", e))?;
    std::fs::write(&key_path, key.serialize_pem()).map_err(|e| HarnessError::io("writing a key", e))?;
    Ok((cert_path, key_path))
}

impl ClusterPki {
    /// Workers are named by `hosts` (IP addresses or names they are dialled by).
    pub fn create(dir: &Path, hosts: &[String]) -> Result<Self, HarnessError> {
        let ca = make_ca("turnstile test cluster CA");
        let ca_path = dir.join("cluster-ca.pem");
        std::fs::write(&ca_path, ca.pem()).map_err(|e| HarnessError::io("writing the CA", e))?;
        let worker = issue(dir, &ca, "worker", hosts.to_vec(), true)?;
        let gateway = issue(dir, &ca, "gateway", Vec::new(), false)?;
        Ok(Self { ca: ca_path, worker, gateway })
    }

    /// `--tls-cert --tls-key --tls-client-ca` of a worker.
    pub fn worker_args(&self) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        vec![
            "--tls-cert".into(),
            s(&self.worker.0),
            "--tls-key".into(),
            s(&self.worker.1),
            "--tls-client-ca".into(),
            s(&self.ca),
        ]
    }

    /// `--cluster-tls-ca --cluster-tls-cert --cluster-tls-key` of a gateway.
    pub fn gateway_args(&self) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        vec![
            "--cluster-tls-ca".into(),
            s(&self.ca),
            "--cluster-tls-cert".into(),
            s(&self.gateway.0),
            "--cluster-tls-key".into(),
            s(&self.gateway.1),
        ]
    }
}
