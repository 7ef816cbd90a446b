//! How a server's connections are encrypted: `--tls-*` for the listener of every role ([`ServerTls`]) and
//! `--cluster-tls-*` for the hop to the workers ([`ClusterTls`]), loaded into rustls configs by
//! `turnstile_ops::tls` when a role starts, before anything listens.

use std::path::PathBuf;

use tonic::transport::{ClientTlsConfig, ServerTlsConfig};
use turnstile_ops::tls;

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
    pub(crate) fn load(&self) -> Result<ServerTlsConfig, NodeError> {
        tls::server_config(&self.cert, &self.key, self.client_ca.as_deref())
            .map_err(|cause| NodeError::Tls { flag: "--tls-cert/--tls-key", cause })
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
    pub(crate) fn load(&self) -> Result<ClientTlsConfig, NodeError> {
        let identity = self.identity.as_ref().map(|(cert, key)| (cert.as_path(), key.as_path()));
        tls::client_config(&self.ca, self.domain.as_deref(), identity)
            .map_err(|cause| NodeError::Tls { flag: "--cluster-tls-ca", cause })
    }
}
