//! TLS for the public API, the internal gateway → worker hop and the CLI (rustls on ring, through tonic).
//!
//! The PEM files are read and checked here, before any listener or channel uses them, so a wrong path or
//! a key that is not a key fails at start-up with the file's name instead of at the first handshake.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::ClientTlsConfig;

/// A TLS file that cannot be used; the message names it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    // The io error is in the message, not a `source`, so `{:#}` chains do not print it twice.
    #[error("cannot read {}: {cause}", path.display())]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{} has no PEM certificate (`-----BEGIN CERTIFICATE-----`); {what}", path.display())]
    NoCertificate { path: PathBuf, what: &'static str },
    #[error("{} has no PEM private key (PKCS#8, PKCS#1 or SEC1): {detail}", path.display())]
    NoKey { path: PathBuf, detail: String },
    #[error("certificate {} and key {} cannot be used together: {detail}", cert.display(), key.display())]
    Identity { cert: PathBuf, key: PathBuf, detail: String },
    #[error("{} cannot verify client certificates: {detail}", path.display())]
    ClientCa { path: PathBuf, detail: String },
}

mod live;

pub use live::{ClientTlsFiles, LiveClientTls, LiveServerTls, Reloaded, ServerTlsFiles};

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|cause| TlsError::Read { path: path.to_owned(), cause })
}

/// `pem` (the bytes of `path`), checked to hold at least one certificate. The first one's expiry goes to
/// the gauge `turnstile_certificate_expiry_timestamp_seconds{file}`: the files are read at start and again
/// when they change ([`live`]), so that is the certificate this process uses now.
fn certificates(path: &Path, pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect();
    let Some(first) = certificates.first() else {
        return Err(TlsError::NoCertificate { path: path.to_owned(), what });
    };
    if let Some(expiry) = crate::expiry::not_after(first) {
        metrics::gauge!(crate::names::CERTIFICATE_EXPIRY, "file" => path.display().to_string()).set(expiry as f64);
    }
    Ok(certificates)
}

fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::NoKey { path: path.to_owned(), detail: e.to_string() })
}

/// A client's TLS: trust the CA in `ca`; `domain` overrides the name checked against the server's
/// certificate (default: the host of the URL dialled). `identity` is the client's own (cert, key) for mTLS.
pub fn client_config(
    ca: &Path,
    domain: Option<&str>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsError> {
    let files = ClientTlsFiles {
        ca: ca.to_owned(),
        domain: domain.map(str::to_owned),
        identity: identity.map(|(cert, key)| (cert.to_owned(), key.to_owned())),
    };
    live::client_config(&files, &live::ClientBytes::read(&files)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed dev certificates expire at Dec 1 18:37:28 2036 GMT (`openssl x509 -enddate`).
    #[test]
    fn the_expiry_of_a_real_certificate_is_read() {
        let pem = include_bytes!("../../deploy/k8s/overlays/dev/dev-cluster-tls/worker.crt");
        let der = CertificateDer::pem_slice_iter(pem).next().unwrap().unwrap();
        assert_eq!(crate::expiry::not_after(&der), Some(2_111_769_448));
    }

    #[test]
    fn missing_and_empty_files_are_named() {
        let dir = std::env::temp_dir().join(format!("turnstile-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a pem\n").unwrap();
        let files = ServerTlsFiles { cert: dir.join("nope.pem"), key: empty.clone(), client_ca: None };
        let err = LiveServerTls::load(files).unwrap_err();
        assert!(err.to_string().starts_with("cannot read ") && err.to_string().contains("nope.pem"), "{err}");
        let err = client_config(&empty, None, None).unwrap_err();
        assert!(err.to_string().contains("empty.pem has no PEM certificate"), "{err}");
    }
}
