//! How a server's connections are encrypted: `--tls-*` for the listener of every role ([`ServerTls`]) and
//! `--cluster-tls-*` for the hop to the workers ([`ClusterTls`]), loaded into rustls configs by
//! `turnstile_ops::tls` when a role starts, before anything listens, and read again when they change
//! (`crate::reload`, decision 0159).

use std::path::PathBuf;
use std::sync::Arc;

use tonic::transport::ClientTlsConfig;
use turnstile_ops::tls::{ClientTlsFiles, LiveClientTls, LiveServerTls, ServerTlsFiles};

use crate::NodeError;

/// `--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]`: serve TLS (and require client certificates).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of `cert`.
    pub key: PathBuf,
    /// Require client certificates signed by this PEM CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    pub(crate) fn load(&self) -> Result<Arc<LiveServerTls>, NodeError> {
        let files =
            ServerTlsFiles { cert: self.cert.clone(), key: self.key.clone(), client_ca: self.client_ca.clone() };
        LiveServerTls::load(files).map(Arc::new).map_err(|cause| NodeError::Tls { flag: "--tls-cert/--tls-key", cause })
    }
}

/// `--cluster-tls-ca FILE [--cluster-tls-domain NAME] [--cluster-tls-cert/--cluster-tls-key]`: the hop to
/// the workers (a gateway's, and a worker's for `spawn_agent`'s child sessions).
#[derive(Clone, Debug)]
pub struct ClusterTls {
    /// Dial workers over TLS, trusting this PEM CA.
    pub ca: PathBuf,
    /// Name to check in the workers' certificates (default: the host of each advertised address).
    pub domain: Option<String>,
    /// Client certificate and key, for workers that require one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClusterTls {
    /// The files, watched, and the config to dial with now.
    pub(crate) fn load(&self) -> Result<(LiveClientTls, ClientTlsConfig), NodeError> {
        let files =
            ClientTlsFiles { ca: self.ca.clone(), domain: self.domain.clone(), identity: self.identity.clone() };
        LiveClientTls::load(files).map_err(|cause| NodeError::Tls { flag: "--cluster-tls-ca", cause })
    }
}
