//! Who is calling: the bearer token of each call resolves to exactly one tenant and a [`Role`]; what the
//! call may then touch is decided in one place, `scope.rs` (every RPC passes through `Gateway::open`).
//!
//! Three ways to run:
//! - [`Authenticator::TokenFile`]: a file of `TOKEN TENANT [admin|cluster_admin]` lines (`#` starts a
//!   comment), for small setups.
//!   Tokens are kept only as SHA-256 digests and every digest is compared in constant time, so neither the
//!   memory of the process nor the timing of a refusal tells anything about a valid token.
//! - [`Authenticator::Jwt`]: a signed JWT whose `tenant` claim names the tenant (`admin` or `cluster_admin`
//!   claims, `true`, give it a role); `exp` is required and `nbf` honoured, both within [`JWT_LEEWAY_S`]. HS256
//!   with a shared secret file, or RS256/ES256 with a public key PEM. Only the configured algorithm is
//!   accepted, so `alg: none` or a switch from RS256 to HS256 (the public key used as a secret) is refused.
//! - [`Authenticator::Disabled`]: no credentials; allowed only on a loopback listener ([`check_exposure`]).
//! - [`Authenticator::Reloadable`]: one of the first two, read from an [`AuthSource`] again on demand
//!   ([`Reloadable::reload`]: the node calls it on SIGHUP and when the file's bytes change, decision 0035).
//!   A reload that fails keeps the material in force; calls already authenticated are unaffected.
//!
//! A missing, malformed or unknown token is UNAUTHENTICATED. Naming another tenant's session is handled
//! by the service as NOT_FOUND, exactly like a session that does not exist.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::Status;
use tonic::metadata::MetadataMap;
use turnstile_model::Tenant;

mod jwt;
mod reload;
mod token_file;

pub use jwt::{JWT_LEEWAY_S, JwtAlg, JwtAuth};
pub use reload::{AuthSource, ReloadSummary, Reloadable};
pub use token_file::TokenFile;

/// An auth configuration that cannot be used; the message names the file and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    // The io error is in the message, not a `source`, so `{:#}` chains do not print it twice.
    #[error("cannot read {}: {cause}", path.display())]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{}:{line}: {detail}", path.display())]
    TokenLine { path: PathBuf, line: usize, detail: String },
    #[error("{} has no tokens; add one `TOKEN TENANT` line per token", path.display())]
    NoTokens { path: PathBuf },
    #[error("{}: {detail}", path.display())]
    Key { path: PathBuf, detail: String },
    #[error("refusing to serve without auth on {listen}; pass --auth-tokens or --jwt-key, or listen on loopback")]
    Exposed { listen: String },
}

/// What a valid token may do besides acting on its tenant's sessions (docs/OPERATIONS.md "Admin roles",
/// decision 0092).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Its tenant's sessions, schedules, labels, usage and client tools.
    #[default]
    Member,
    /// Also export and import (SPEC §18), of its own tenant only: a `TOKEN TENANT admin` line, a JWT with
    /// `"admin": true`.
    Admin,
    /// Any call, in any tenant it names (its own when it names none): a `TOKEN TENANT cluster_admin` line,
    /// a JWT with `"cluster_admin": true`. For the operators of the cluster, never for a tenant.
    ClusterAdmin,
}

impl Role {
    /// The name written in a token file's third field and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Member => "member",
            Self::Admin => "admin",
            Self::ClusterAdmin => "cluster_admin",
        }
    }
}

/// Who the caller of one RPC is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Auth is off: the request's own tenant (or the default tenant) is used, and every call is allowed.
    Anonymous,
    /// Auth is on: a token of `tenant` with `role`.
    Tenant { tenant: Tenant, role: Role },
}

impl Caller {
    /// A member's token of `tenant`.
    pub fn member(tenant: Tenant) -> Self {
        Self::Tenant { tenant, role: Role::Member }
    }

    /// The tenant of the token, if there is one.
    pub fn tenant(&self) -> Option<&Tenant> {
        match self {
            Self::Anonymous => None,
            Self::Tenant { tenant, .. } => Some(tenant),
        }
    }

    /// The tenant every call of this caller is confined to: its token's, unless it is a cluster admin (or
    /// auth is off), which may name any tenant.
    pub fn confined_to(&self) -> Option<&Tenant> {
        match self {
            Self::Tenant { tenant, role: Role::Member | Role::Admin } => Some(tenant),
            Self::Anonymous | Self::Tenant { role: Role::ClusterAdmin, .. } => None,
        }
    }

    /// Whether the caller holds `role` (or one above it); auth off holds every role.
    pub fn holds(&self, role: Role) -> bool {
        match self {
            Self::Anonymous => true,
            Self::Tenant { role: own, .. } => *own >= role,
        }
    }
}

/// Resolves a call's `authorization` metadata to a [`Caller`].
pub enum Authenticator {
    Disabled,
    TokenFile(TokenFile),
    Jwt(Box<JwtAuth>),
    Reloadable(Arc<Reloadable>),
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print digests or keys.
        f.write_str(self.describe())
    }
}

impl Authenticator {
    /// `auth: off`, `tokens`, `jwt`: for banners and logs.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Disabled => "off",
            Self::TokenFile(_) => "bearer tokens (token file)",
            Self::Jwt(_) => "bearer JWT (tenant claim)",
            Self::Reloadable(live) => live.current().describe(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        match self {
            Self::Disabled => false,
            Self::Reloadable(live) => live.current().is_enabled(),
            Self::TokenFile(_) | Self::Jwt(_) => true,
        }
    }

    /// The caller of a request with this metadata, with its tenant and role; UNAUTHENTICATED when auth is
    /// on and the token is missing or not valid. What the caller may then touch is the gateway's one
    /// scoping rule (`scope.rs`).
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, Status> {
        match self {
            Self::Disabled => Ok(Caller::Anonymous),
            Self::TokenFile(file) => {
                let (tenant, role) = file.lookup(bearer(metadata)?).ok_or_else(|| {
                    Status::unauthenticated("the bearer token is not valid; check --token (TURNSTILE_TOKEN)")
                })?;
                Ok(Caller::Tenant { tenant: tenant.clone(), role })
            }
            Self::Jwt(jwt) => {
                let (tenant, role) = jwt.claims(bearer(metadata)?)?;
                Ok(Caller::Tenant { tenant, role })
            }
            // The material in force when the call arrives decides it; a reload swaps it for later calls.
            Self::Reloadable(live) => live.current().authenticate(metadata),
        }
    }
}

/// The token of `authorization: Bearer <token>`.
fn bearer(metadata: &MetadataMap) -> Result<&str, Status> {
    let missing = || {
        Status::unauthenticated(
            "this gateway requires a bearer token: send `authorization: Bearer <token>` (turnstile --token)",
        )
    };
    let value = metadata.get("authorization").ok_or_else(missing)?;
    let value = value.to_str().map_err(|_| Status::unauthenticated("the authorization header is not ASCII"))?;
    let (scheme, token) = value.split_once(' ').ok_or_else(missing)?;
    // The scheme is case-insensitive (RFC 9110 §11.1).
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(missing());
    }
    Ok(token.trim())
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|cause| AuthError::Read { path: path.to_owned(), cause })
}

/// [`read`] for a server: the file is read on tokio's blocking pool, never on a thread that serves calls
/// (a slow or hung filesystem would otherwise stall every RPC on that thread).
pub(super) async fn read_async(path: &Path) -> Result<Vec<u8>, AuthError> {
    tokio::fs::read(path).await.map_err(|cause| AuthError::Read { path: path.to_owned(), cause })
}

/// Auth off is allowed only on loopback: anything else would let anyone on the network act as any tenant.
pub fn check_exposure(auth: &Authenticator, bound: SocketAddr, listen: &str) -> Result<(), AuthError> {
    if auth.is_enabled() || bound.ip().is_loopback() {
        return Ok(());
    }
    Err(AuthError::Exposed { listen: listen.to_owned() })
}

#[cfg(test)]
mod tests;
