//! Who may call a public server: the files named by the auth options, loaded into an [`Authenticator`]
//! (with the server's TLS, [`crate::tls`], into a `ServerSecurity`). Every file is read when a role
//! starts, before anything listens, so a wrong path fails first. The auth files are read again on SIGHUP and
//! when their bytes change (`crate::reload`, decision 0035). The NATS credentials are the journal's
//! [`NatsSecurity`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use turnstile_gateway::auth::JwtAlg;
use turnstile_gateway::auth::{self, AuthSource, Authenticator, Reloadable};
pub use turnstile_journal::jetstream::NatsSecurity;

use crate::NodeError;
use crate::tls::ServerTls;

/// `--auth-tokens FILE | --jwt-key FILE [--jwt-alg]`: who may call the public API. Neither: auth is off,
/// which is allowed on loopback only.
#[derive(Clone, Debug, Default)]
pub struct AuthOptions {
    /// Bearer tokens: a file of `TOKEN TENANT` lines (`#` comments); each token acts as its tenant. Wins
    /// over `jwt_key`.
    pub auth_tokens: Option<PathBuf>,
    /// Bearer JWTs with a `tenant` and an `exp` claim, verified with this key: the HS256 secret, or the
    /// RS256/ES256 public key PEM.
    pub jwt_key: Option<PathBuf>,
    /// Signature algorithm of the JWTs.
    pub jwt_alg: JwtAlg,
    /// When set, a JWT's `aud` must be (or contain) this value.
    pub jwt_audience: Option<String>,
    /// When set, a JWT's `iss` must be this value.
    pub jwt_issuer: Option<String>,
}

impl AuthOptions {
    /// Whether calls will need a token.
    pub fn is_enabled(&self) -> bool {
        self.auth_tokens.is_some() || self.jwt_key.is_some()
    }

    pub(crate) async fn load(&self) -> Result<Authenticator, NodeError> {
        let (flag, source) = match (&self.auth_tokens, &self.jwt_key) {
            (Some(file), _) => ("--auth-tokens", AuthSource::TokenFile(file.clone())),
            (None, Some(key)) => (
                "--jwt-key",
                AuthSource::Jwt {
                    key: key.clone(),
                    alg: self.jwt_alg,
                    audience: self.jwt_audience.clone(),
                    issuer: self.jwt_issuer.clone(),
                },
            ),
            (None, None) => return Ok(Authenticator::Disabled),
        };
        let live = Reloadable::load(source).await.map_err(|cause| NodeError::Auth { flag, cause })?;
        Ok(Authenticator::Reloadable(Arc::new(live)))
    }
}

/// Refuses auth off on a non-loopback address, and says which mode is on (for the banner).
pub(crate) fn auth_line(auth: &Authenticator, bound: SocketAddr, listen: &str) -> Result<String, NodeError> {
    auth::check_exposure(auth, bound, listen).map_err(NodeError::Exposure)?;
    Ok(match auth {
        Authenticator::Disabled => "auth: off (loopback only)".to_owned(),
        other => format!("auth: {}", other.describe()),
    })
}

/// The authenticator and TLS acceptor of a public server, loaded.
pub(crate) struct ServerSecurity {
    pub(crate) auth: Authenticator,
    pub(crate) tls: Option<Arc<turnstile_ops::tls::LiveServerTls>>,
}

impl ServerSecurity {
    pub(crate) async fn load(auth: &AuthOptions, tls: Option<&ServerTls>) -> Result<Self, NodeError> {
        Ok(Self { auth: auth.load().await?, tls: tls.map(ServerTls::load).transpose()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_token_file_names_the_flag_and_the_file() {
        let auth = AuthOptions { auth_tokens: Some("/nonexistent/tokens".into()), ..AuthOptions::default() };
        assert!(auth.is_enabled());
        let err = auth.load().await.err().unwrap().to_string();
        assert!(err.starts_with("--auth-tokens: cannot read /nonexistent/tokens: "), "{err}");
    }

    #[test]
    fn auth_off_is_announced_on_loopback_and_refused_elsewhere() {
        let loopback: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(auth_line(&Authenticator::Disabled, loopback, "127.0.0.1:0").unwrap(), "auth: off (loopback only)");
        let anywhere: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let err = auth_line(&Authenticator::Disabled, anywhere, "0.0.0.0:0").unwrap_err().to_string();
        assert!(err.starts_with("refusing to serve without auth on 0.0.0.0:0"), "{err}");
    }
}
