//! The auth, TLS and NATS-credential flags shared by `turnstile dev`, `gateway` and `worker`, turned into
//! the options of [`turnstile_node`], which reads the files when a role starts (before anything listens).

use std::path::PathBuf;

use clap::Args;
use turnstile_node::NatsOptions;
use turnstile_node::security::{AuthOptions, JwtAlg, NatsSecurity};
use turnstile_node::tls::{ClusterTls, ServerTls};

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
    /// Require JWTs whose `aud` claim is (or contains) this value, e.g. the gateway's URL.
    #[arg(long, env = "TURNSTILE_JWT_AUDIENCE", value_name = "AUD", requires = "jwt_key")]
    pub jwt_audience: Option<String>,
    /// Require JWTs whose `iss` claim is this value (the identity provider that mints them).
    #[arg(long, env = "TURNSTILE_JWT_ISSUER", value_name = "ISS", requires = "jwt_key")]
    pub jwt_issuer: Option<String>,
}

impl AuthArgs {
    pub fn options(&self) -> AuthOptions {
        AuthOptions {
            auth_tokens: self.auth_tokens.clone(),
            jwt_key: self.jwt_key.clone(),
            jwt_alg: self.jwt_alg,
            jwt_audience: self.jwt_audience.clone(),
            jwt_issuer: self.jwt_issuer.clone(),
        }
    }
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
    /// `None` without `--tls-cert` (clap requires `--tls-key` with it and the other way round).
    pub fn options(&self) -> Option<ServerTls> {
        let (cert, key) = self.tls_cert.clone().zip(self.tls_key.clone())?;
        Some(ServerTls { cert, key, client_ca: self.tls_client_ca.clone() })
    }
}

/// `--cluster-tls-ca FILE [--cluster-tls-domain NAME] [--cluster-tls-cert/--cluster-tls-key]`: the
/// gateway's hop to the workers, and a worker's hop to the owners of `spawn_agent`'s child sessions.
#[derive(Args, Clone, Debug, Default)]
pub struct ClusterTlsArgs {
    /// Dial workers over TLS, trusting this PEM CA (workers serve with --tls-cert/--tls-key).
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_CA", value_name = "FILE")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// Name to check in the workers' certificates (default: the host of each advertised address).
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_DOMAIN", value_name = "NAME", requires = "cluster_tls_ca")]
    pub cluster_tls_domain: Option<String>,
    /// Client certificate for workers that require one (--tls-client-ca on the worker).
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_CERT", value_name = "FILE", requires_all = ["cluster_tls_ca", "cluster_tls_key"])]
    pub cluster_tls_cert: Option<PathBuf>,
    /// Private key of --cluster-tls-cert.
    #[arg(long, env = "TURNSTILE_CLUSTER_TLS_KEY", value_name = "FILE", requires = "cluster_tls_cert")]
    pub cluster_tls_key: Option<PathBuf>,
}

impl ClusterTlsArgs {
    pub fn options(&self) -> Option<ClusterTls> {
        Some(ClusterTls {
            ca: self.cluster_tls_ca.clone()?,
            domain: self.cluster_tls_domain.clone(),
            identity: self.cluster_tls_cert.clone().zip(self.cluster_tls_key.clone()),
        })
    }
}

/// The TLS of a cluster member (`gateway`, `worker`): what it serves with, how it dials workers, and how it
/// reaches NATS.
#[derive(Args, Clone, Debug, Default)]
pub struct MemberSecurityArgs {
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    #[command(flatten)]
    pub cluster_tls: ClusterTlsArgs,
    #[command(flatten)]
    pub nats_security: NatsSecurityArgs,
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
    /// The connection to `url` with these credentials.
    pub fn nats(&self, url: String) -> NatsOptions {
        let security = NatsSecurity {
            creds: self.nats_creds.clone(),
            ca: self.nats_ca.clone(),
            client_cert: self.nats_tls_cert.clone().zip(self.nats_tls_key.clone()),
        };
        NatsOptions { url, security }
    }
}
