//! What every role shares: how its listeners are set up ([`Serving`]). (`dev` and `gateway`, which both
//! serve the public API, also share their handle, [`crate::gateway::Handle`].)

use std::path::PathBuf;

use crate::config::Loaded;
use crate::tls::ServerTls;

/// How every role serves: its gRPC listener, the ops HTTP endpoints, where the bound addresses go, TLS,
/// and the configuration.
#[derive(Clone, Debug)]
pub struct Serving {
    /// The role's gRPC address (port 0 picks a free one).
    pub listen: String,
    /// `/metrics`, `/healthz`, `/readyz` (`None`: [`crate::ops::DEFAULT_HTTP`], skipped if busy).
    pub http: Option<String>,
    /// Where the bound addresses are written once every listener is bound.
    pub ready_file: Option<PathBuf>,
    /// Serve TLS.
    pub tls: Option<ServerTls>,
    /// The configuration, flags applied.
    pub config: Loaded,
}

impl Serving {
    /// Listening on `listen`, with every other option at its default.
    pub fn new(listen: impl Into<String>) -> Self {
        Self { listen: listen.into(), http: None, ready_file: None, tls: None, config: Loaded::default() }
    }
}
