//! TLS files read again while a process runs (decision 0159). A certificate renewed on disk (cert-manager
//! every 60 days, an operator's `openssl` run) is in force for the next connection without a restart:
//! [`LiveServerTls`] holds the rustls config a listener accepts with and swaps it when the files change,
//! [`LiveClientTls`] makes a new client config for the channels dialled after the change. A change is seen
//! by comparing the files' bytes (a SHA-256 of them together) with the last ones read; new files that are not
//! a usable pair (a key that does not fit, a half-written file) leave the config in force and are reported
//! once.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use sha2::{Digest, Sha256};
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::{TlsError, certificates, private_key, read};
use crate::error_chain;

/// What a reload read: the digest of the files' bytes, or why one could not be read. A poll that sees the
/// same again does nothing, so files left broken are reported once, not at every poll.
type Seen = Result<[u8; 32], String>;

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in parts {
        // Each part's length first, so moving bytes from one file to the next is a change.
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.finalize().into()
}

/// What a successful reload put in force: the new leaf certificate's serial and expiry, for the log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// Hex, as `openssl x509 -serial` prints it.
    pub serial: Option<String>,
    /// Unix seconds.
    pub not_after: Option<i64>,
}

impl Reloaded {
    fn of(leaf: Option<&[u8]>) -> Self {
        Self { serial: leaf.and_then(crate::expiry::serial), not_after: leaf.and_then(crate::expiry::not_after) }
    }
}

impl fmt::Display for Reloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.serial, self.not_after) {
            (Some(serial), Some(at)) => write!(f, "certificate serial {serial}, expires at {at} (Unix seconds)"),
            (Some(serial), None) => write!(f, "certificate serial {serial}"),
            _ => f.write_str("certificate replaced"),
        }
    }
}

/// `--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]`.
#[derive(Clone, Debug)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// Require client certificates signed by this PEM CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl ServerTlsFiles {
    fn read(&self) -> Result<ServerBytes, TlsError> {
        Ok(ServerBytes {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_deref().map(read).transpose()?,
        })
    }

    /// The files' bytes, or why one could not be read (a poll compares it with the last).
    fn seen(&self) -> (Seen, Option<ServerBytes>) {
        match self.read() {
            Ok(bytes) => (Ok(bytes.digest()), Some(bytes)),
            Err(e) => (Err(e.to_string()), None),
        }
    }
}

struct ServerBytes {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ServerBytes {
    fn digest(&self) -> [u8; 32] {
        digest(&[&self.cert, &self.key, self.client_ca.as_deref().unwrap_or_default()])
    }
}

/// The rustls config of a server with `files` (`bytes` read from them), checked whole: the key fits the
/// certificate, the client CA is a CA. ALPN offers h2 only: every listener that uses it serves gRPC.
fn server_config(files: &ServerTlsFiles, bytes: &ServerBytes) -> Result<(ServerConfig, Reloaded), TlsError> {
    let chain = certificates(&files.cert, &bytes.cert, "--tls-cert needs the server's certificate chain, leaf first")?;
    let key = private_key(&files.key, &bytes.key)?;
    let builder = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Identity { cert: files.cert.clone(), key: files.key.clone(), detail: e.to_string() })?;
    let builder = match (&files.client_ca, &bytes.client_ca) {
        (Some(path), Some(pem)) => {
            let cas = certificates(path, pem, "--tls-client-ca needs the CA that signs client certificates")?;
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(cas);
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| TlsError::ClientCa { path: path.clone(), detail: error_chain(&e) })?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let reloaded = Reloaded::of(chain.first().map(|c| c.as_ref()));
    let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Identity {
        cert: files.cert.clone(),
        key: files.key.clone(),
        detail: error_chain(&e),
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, reloaded))
}

/// A listener's TLS, read from its files at start and again by [`LiveServerTls::reload`]: each new
/// connection is accepted with the config in force when it arrives; connections already open keep theirs.
pub struct LiveServerTls {
    files: ServerTlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    seen: Mutex<Seen>,
}

impl fmt::Debug for LiveServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveServerTls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl LiveServerTls {
    /// Reads and checks `files`; an error here stops the server from starting, naming the file.
    pub fn load(files: ServerTlsFiles) -> Result<Self, TlsError> {
        let bytes = files.read()?;
        let (config, _) = server_config(&files, &bytes)?;
        let seen = Mutex::new(Ok(bytes.digest()));
        Ok(Self { files, current: RwLock::new(Arc::new(config)), seen })
    }

    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// The acceptor for a connection arriving now.
    pub fn acceptor(&self) -> TlsAcceptor {
        // A poisoned lock still holds a whole `Arc` (the writer only assigns one), so it is safe to use.
        TlsAcceptor::from(Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner)))
    }

    /// Reads the files again (blocking: call it off the runtime's threads) and swaps the config in when they
    /// are a usable pair. `force` (SIGHUP) rebuilds even when the bytes are those of the last attempt;
    /// otherwise (a poll) unchanged bytes answer `None`. An error leaves the config in force.
    pub fn reload(&self, force: bool) -> Option<Result<Reloaded, TlsError>> {
        let (now, bytes) = self.files.seen();
        if !changed(&self.seen, now, force) {
            return None;
        }
        let loaded = match bytes {
            Some(bytes) => server_config(&self.files, &bytes),
            // Read again for the typed error (the digest kept only its text).
            None => self.files.read().and_then(|bytes| server_config(&self.files, &bytes)),
        };
        Some(loaded.map(|(config, reloaded)| {
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
            reloaded
        }))
    }
}

/// Records `now` as seen and says whether to reload: always when forced, else when it differs.
fn changed(seen: &Mutex<Seen>, now: Seen, force: bool) -> bool {
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    if !force && *seen == now {
        return false;
    }
    *seen = now;
    true
}

/// `--cluster-tls-ca FILE [--cluster-tls-domain NAME] [--cluster-tls-cert FILE --cluster-tls-key FILE]`.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    /// Trust servers whose certificates this PEM CA signed.
    pub ca: PathBuf,
    /// Name to check in the servers' certificates (default: the host dialled).
    pub domain: Option<String>,
    /// The client's own certificate chain and key, for servers that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

pub(super) struct ClientBytes {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientBytes {
    pub(super) fn read(files: &ClientTlsFiles) -> Result<Self, TlsError> {
        let identity = match &files.identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(Self { ca: read(&files.ca)?, identity })
    }

    fn digest(&self) -> [u8; 32] {
        let (cert, key) = self.identity.as_ref().map_or((&[][..], &[][..]), |(c, k)| (c, k));
        digest(&[&self.ca, cert, key])
    }
}

/// tonic's client config for `files` (`bytes` read from them), checked: the CA holds a certificate, the
/// client key is a key.
pub(super) fn client_config(files: &ClientTlsFiles, bytes: &ClientBytes) -> Result<ClientTlsConfig, TlsError> {
    client_config_reporting(files, bytes).map(|(config, _)| config)
}

fn client_config_reporting(
    files: &ClientTlsFiles,
    bytes: &ClientBytes,
) -> Result<(ClientTlsConfig, Reloaded), TlsError> {
    let cas = certificates(&files.ca, &bytes.ca, "pass the CA certificate that signed the server's certificate")?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&bytes.ca));
    if let Some(domain) = &files.domain {
        config = config.domain_name(domain);
    }
    let mut reloaded = Reloaded::of(cas.first().map(|c| c.as_ref()));
    if let (Some((cert_path, key_path)), Some((cert, key))) = (&files.identity, &bytes.identity) {
        let chain = certificates(cert_path, cert, "the client certificate chain, leaf first")?;
        private_key(key_path, key)?;
        reloaded = Reloaded::of(chain.first().map(|c| c.as_ref()));
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok((config, reloaded))
}

/// A client's TLS files, watched: [`LiveClientTls::reload`] answers a new config when they changed, for
/// the channels dialled from then on (the caller swaps it in, `GrpcTransport::set_tls`).
#[derive(Debug)]
pub struct LiveClientTls {
    files: ClientTlsFiles,
    seen: Mutex<Seen>,
}

impl LiveClientTls {
    /// Reads and checks `files`, and the config to dial with now.
    pub fn load(files: ClientTlsFiles) -> Result<(Self, ClientTlsConfig), TlsError> {
        let bytes = ClientBytes::read(&files)?;
        let config = client_config(&files, &bytes)?;
        let seen = Mutex::new(Ok(bytes.digest()));
        Ok((Self { files, seen }, config))
    }

    pub fn files(&self) -> &ClientTlsFiles {
        &self.files
    }

    /// Reads the files again (blocking) and answers the new config when they changed (always when `force`);
    /// `None` when unchanged. Files that are not usable answer the error, and the caller keeps its config.
    pub fn reload(&self, force: bool) -> Option<Result<(ClientTlsConfig, Reloaded), TlsError>> {
        let read = ClientBytes::read(&self.files);
        let now = read.as_ref().map(ClientBytes::digest).map_err(ToString::to_string);
        if !changed(&self.seen, now, force) {
            return None;
        }
        Some(read.and_then(|bytes| client_config_reporting(&self.files, &bytes)))
    }
}
