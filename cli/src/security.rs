//! The auth, TLS and NATS-credential flags shared by `turnstile dev`, `gateway` and `worker`, and the one
//! place that turns them into an [`Authenticator`], rustls configs and [`NatsSecurity`]. Every file is read
//! at start-up, so a wrong path fails before anything listens.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tonic::transport::{ClientTlsConfig, ServerTlsConfig};
use turnstile_gateway::auth::{self, Authenticator, JwtAlg, JwtAuth, TokenFile};
use turnstile_gateway::tls;
use turnstile_journal::jetstream::NatsSecurity;

/// `--auth-tokens FILE | --jwt-key FILE [--jwt-alg]`: who may call the public API.
#[derive(Args, Clone, Debug, Default)]
pub struct AuthArgs {
    /// Bearer tokens: a file of `TOKEN TENANT` lines (`#` comments); each token acts as its tenant.
    #[arg(long, env = "TURNSTILE_AUTH_TOKENS", value_name = "FILE", conflicts_with = "jwt_key")]
    pub auth_tokens: Option<PathBuf>,
    /// Bearer JWTs with a `tenant` and an `exp` claim, verified with this key: the HS256 secret, or the
    /// RS256/ES256 public key PEM.
    #[arg(long, env = "TURNSTILE_JWT_KEY", value_name = "FILE")]
    pub jwt_key: Option<PathBuf>,
    /// Signature algorithm of the JWTs: HS256, RS256 or ES256.
    #[arg(long, env = "TURNSTILE_JWT_ALG", default_value = "HS256", value_name = "ALG")]
    pub jwt_alg: JwtAlg,
}

impl AuthArgs {
    pub fn load(&self) -> Result<Authenticator> {
        Ok(match (&self.auth_tokens, &self.jwt_key) {
            (Some(file), _) => Authenticator::TokenFile(TokenFile::load(file).context("--auth-tokens")?),
            (None, Some(key)) => Authenticator::Jwt(Box::new(JwtAuth::load(key, self.jwt_alg).context("--jwt-key")?)),
            (None, None) => Authenticator::Disabled,
        })
    }
}

/// Refuses auth off on a non-loopback address, and says which mode is on (for the banner).
pub fn auth_line(auth: &Authenticator, bound: SocketAddr, listen: &str) -> Result<String> {
    auth::check_exposure(auth, bound, listen)?;
    Ok(match auth {
        Authenticator::Disabled => "auth: off (loopback only)".to_owned(),
        other => format!("auth: {}", other.describe()),
    })
}

/// `--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]`: serve TLS (and require client certificates).
#[derive(Args, Clone, Debug, Default)]
pub struct ServerTlsArgs {
    /// PEM certificate chain (leaf first) to serve TLS with.
    #[arg(long, env = "TURNSTILE_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "TURNSTILE_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (mutual TLS).
    #[arg(long, env = "TURNSTILE_TLS_CLIENT_CA", value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    pub fn load(&self) -> Result<Option<ServerTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        Ok(Some(tls::server_config(cert, key, self.tls_client_ca.as_deref()).context("--tls-cert/--tls-key")?))
    }
}

/// `--cluster-tls-ca FILE [--cluster-tls-domain NAME] [--cluster-tls-cert/--cluster-tls-key]`: the
/// gateway's hop to the workers.
#[derive(Args, Clone, Debug, Default)]
pub struct ClusterTlsArgs {
    /// Dial workers over TLS, trusting this PEM CA (workers serve with --tls-cert/--tls-key).
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_CA", value_name = "FILE")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// Name to check in the workers' certificates (default: the host of each advertised address).
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_DOMAIN", value_name = "NAME", requires = "cluster_tls_ca")]
    pub cluster_tls_domain: Option<String>,
    /// Client certificate for workers that require one (--tls-client-ca on the worker).
    #[arg(long, value_name = "FILE", requires_all = ["cluster_tls_ca", "cluster_tls_key"])]
    pub cluster_tls_cert: Option<PathBuf>,
    /// Private key of --cluster-tls-cert.
    #[arg(long, value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_tls_key: Option<PathBuf>,
}

impl ClusterTlsArgs {
    pub fn load(&self) -> Result<Option<ClientTlsConfig>> {
        let Some(ca) = &self.cluster_tls_ca else {
            return Ok(None);
        };
        let identity = self.cluster_tls_cert.as_deref().zip(self.cluster_tls_key.as_deref());
        Ok(Some(tls::client_config(ca, self.cluster_tls_domain.as_deref(), identity).context("--cluster-tls-ca")?))
    }
}

/// `--nats-creds FILE --nats-ca FILE [--nats-tls-cert FILE --nats-tls-key FILE]`.
#[derive(Args, Clone, Debug, Default)]
pub struct NatsSecurityArgs {
    /// NATS credentials file (user JWT + NKey seed, as written by `nsc`).
    #[arg(long, env = "TURNSTILE_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// PEM CA that signed the NATS servers' certificates; TLS is then required.
    #[arg(long, env = "TURNSTILE_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate for NATS servers that verify clients; TLS is then required.
    #[arg(long, env = "TURNSTILE_NATS_TLS_CERT", value_name = "FILE", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// Private key of --nats-tls-cert.
    #[arg(long, env = "TURNSTILE_NATS_TLS_KEY", value_name = "FILE", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

impl NatsSecurityArgs {
    pub fn security(&self) -> NatsSecurity {
        NatsSecurity {
            creds: self.nats_creds.clone(),
            ca: self.nats_ca.clone(),
            client_cert: self.nats_tls_cert.clone().zip(self.nats_tls_key.clone()),
        }
    }
}

/// What a server was asked to secure, loaded: the authenticator and the TLS acceptor config.
pub struct ServerSecurity {
    pub auth: Authenticator,
    pub tls: Option<ServerTlsConfig>,
}

impl ServerSecurity {
    pub fn load(auth: &AuthArgs, tls: &ServerTlsArgs) -> Result<Self> {
        Ok(Self { auth: auth.load()?, tls: tls.load()? })
    }
}
