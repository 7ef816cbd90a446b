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
use std::sync::{Arc, Mutex, RwLock};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::metadata::MetadataMap;
use turnstile_model::Tenant;

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

/// The JWT signature algorithms accepted by `--jwt-alg`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JwtAlg {
    /// HMAC-SHA256 with a shared secret (the key file's bytes).
    #[default]
    Hs256,
    /// RSA PKCS#1 v1.5 with SHA-256; the key file is the RSA public key PEM.
    Rs256,
    /// ECDSA P-256 with SHA-256; the key file is the EC public key PEM.
    Es256,
}

impl std::str::FromStr for JwtAlg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "HS256" => Ok(Self::Hs256),
            "RS256" => Ok(Self::Rs256),
            "ES256" => Ok(Self::Es256),
            _ => Err(format!("JWT algorithm {s:?} is not supported; use HS256, RS256 or ES256")),
        }
    }
}

impl JwtAlg {
    fn algorithm(self) -> Algorithm {
        match self {
            Self::Hs256 => Algorithm::HS256,
            Self::Rs256 => Algorithm::RS256,
            Self::Es256 => Algorithm::ES256,
        }
    }
}

/// Seconds by which a JWT's `exp` may have passed, or its `nbf` not yet come, and it is still accepted:
/// the issuer's clock and this gateway's may disagree a little.
pub const JWT_LEEWAY_S: u64 = 30;

/// RFC 7518 §3.2: an HS256 key must be at least as long as the hash output.
const MIN_HS256_SECRET: usize = 32;

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

fn read(path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|cause| AuthError::Read { path: path.to_owned(), cause })
}

/// [`read`] for a server: the file is read on tokio's blocking pool, never on a thread that serves calls
/// (a slow or hung filesystem would otherwise stall every RPC on that thread).
async fn read_async(path: &Path) -> Result<Vec<u8>, AuthError> {
    tokio::fs::read(path).await.map_err(|cause| AuthError::Read { path: path.to_owned(), cause })
}

/// `TOKEN TENANT [ROLE]` lines, kept as digests.
pub struct TokenFile {
    entries: Vec<Entry>,
}

/// One token line: the digest of the token, its tenant and role.
struct Entry {
    digest: [u8; 32],
    tenant: Tenant,
    role: Role,
}

impl fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenFile").field("tokens", &self.entries.len()).finish_non_exhaustive()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        Self::from_bytes(path, read(path)?)
    }

    /// `bytes` read from `path` (named in errors).
    fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, AuthError> {
        let text = String::from_utf8(bytes)
            .map_err(|_| AuthError::Key { path: path.to_owned(), detail: "the token file is not UTF-8 text".into() })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, AuthError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split_once('#').map_or(raw, |(before, _)| before).trim();
            if line.is_empty() {
                continue;
            }
            let bad = |detail: String| AuthError::TokenLine { path: path.to_owned(), line: i + 1, detail };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (token, tenant, role) = match fields.as_slice() {
                [token, tenant] => (token, tenant, Role::Member),
                [token, tenant, "admin"] => (token, tenant, Role::Admin),
                [token, tenant, "cluster_admin"] => (token, tenant, Role::ClusterAdmin),
                [_, _, other] => {
                    return Err(bad(format!(
                        "the third field may only be `admin` (export and import of its own tenant) or \
                         `cluster_admin` (any call in any tenant), got {other:?}"
                    )));
                }
                _ => return Err(bad(format!("expected `TOKEN TENANT [ROLE]`, got {} fields", fields.len()))),
            };
            let tenant = Tenant::new(*tenant).map_err(|e| bad(format!("tenant {tenant:?} is not valid: {e}")))?;
            let d = digest(token);
            if entries.iter().any(|other| bool::from(other.digest.ct_eq(&d))) {
                return Err(bad(
                    "this token is already listed on an earlier line; each token maps to one tenant".into()
                ));
            }
            entries.push(Entry { digest: d, tenant, role });
        }
        if entries.is_empty() {
            return Err(AuthError::NoTokens { path: path.to_owned() });
        }
        Ok(Self { entries })
    }

    /// The tenant and role of `token`. Every entry is compared, whatever matches, so the time does not
    /// depend on where (or whether) the token is listed.
    fn lookup(&self, token: &str) -> Option<(&Tenant, Role)> {
        let d = digest(token);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&d)) {
                found = Some((&entry.tenant, entry.role));
            }
        }
        found
    }
}

/// JWT verification with one key and one algorithm.
pub struct JwtAuth {
    key: DecodingKey,
    validation: Validation,
    /// SHA-256 of the key file's bytes: tells a reload whether the key changed, without keeping or logging it.
    key_digest: [u8; 32],
}

impl fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtAuth").field("algorithms", &self.validation.algorithms).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Claims {
    tenant: String,
    /// A tenant administrator's token ([`Role::Admin`]); absent is false.
    #[serde(default)]
    admin: bool,
    /// A cluster administrator's token ([`Role::ClusterAdmin`]); absent is false.
    #[serde(default)]
    cluster_admin: bool,
}

impl Claims {
    fn role(&self) -> Role {
        match (self.cluster_admin, self.admin) {
            (true, _) => Role::ClusterAdmin,
            (false, true) => Role::Admin,
            (false, false) => Role::Member,
        }
    }
}

impl JwtAuth {
    /// `key_file`: the HS256 secret (trailing newlines are not part of it) or the RS256/ES256 public key PEM.
    pub fn load(key_file: &Path, alg: JwtAlg) -> Result<Self, AuthError> {
        Self::from_bytes(key_file, &read(key_file)?, alg)
    }

    /// `bytes` read from `key_file` (named in errors).
    fn from_bytes(key_file: &Path, bytes: &[u8], alg: JwtAlg) -> Result<Self, AuthError> {
        let key_digest: [u8; 32] = Sha256::digest(bytes).into();
        let key_error = |detail: String| AuthError::Key { path: key_file.to_owned(), detail };
        let key = match alg {
            JwtAlg::Hs256 => {
                // `echo secret > file` adds a newline the signer does not use.
                let end = bytes.iter().rposition(|b| !matches!(b, b'\n' | b'\r')).map_or(0, |i| i + 1);
                let secret = &bytes[..end];
                if secret.len() < MIN_HS256_SECRET {
                    return Err(key_error(format!(
                        "an HS256 secret must be at least {MIN_HS256_SECRET} bytes, this one has {}; generate one \
                         with `openssl rand -hex 32`",
                        secret.len()
                    )));
                }
                DecodingKey::from_secret(secret)
            }
            JwtAlg::Rs256 => DecodingKey::from_rsa_pem(bytes)
                .map_err(|e| key_error(format!("not an RSA public key PEM ({e}); --jwt-alg RS256 needs one")))?,
            JwtAlg::Es256 => DecodingKey::from_ec_pem(bytes)
                .map_err(|e| key_error(format!("not an EC P-256 public key PEM ({e}); --jwt-alg ES256 needs one")))?,
        };
        let mut validation = Validation::new(alg.algorithm());
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_exp = true;
        // `nbf`, when present, is honoured like `exp`, with the same allowance for clocks that disagree.
        validation.validate_nbf = true;
        validation.leeway = JWT_LEEWAY_S;
        // Without a configured audience, tokens are scoped by their key and tenant claim only.
        validation.validate_aud = false;
        Ok(Self { key, validation, key_digest })
    }

    /// Also requires the tokens' `aud` and `iss` claims: `aud` must be or contain `audience`, `iss` must be
    /// `issuer`. A key shared by several services (an identity provider's) otherwise admits tokens minted
    /// for any of them.
    pub fn with_claims(mut self, audience: Option<&str>, issuer: Option<&str>) -> Self {
        let mut required = vec!["exp"];
        if let Some(audience) = audience {
            self.validation.set_audience(&[audience]);
            self.validation.validate_aud = true;
            required.push("aud");
        }
        if let Some(issuer) = issuer {
            self.validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        self.validation.set_required_spec_claims(&required);
        self
    }

    /// The configured audience and issuer, for messages.
    fn expected(&self, claim: &str) -> String {
        let values = match claim {
            "aud" => self.validation.aud.as_ref(),
            _ => self.validation.iss.as_ref(),
        };
        values.map(|set| set.iter().cloned().collect::<Vec<_>>().join(", ")).unwrap_or_default()
    }

    /// The tenant and role of a valid token.
    fn claims(&self, token: &str) -> Result<(Tenant, Role), Status> {
        use jsonwebtoken::errors::ErrorKind;
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| {
            let why = match e.kind() {
                ErrorKind::ExpiredSignature => "it has expired; get a new one".to_owned(),
                ErrorKind::ImmatureSignature => format!(
                    "it is not valid yet: its `nbf` is more than {JWT_LEEWAY_S} s in the future (check the clocks of \
                     the issuer and of this gateway)"
                ),
                ErrorKind::MissingRequiredClaim(c) => format!("it has no `{c}` claim"),
                ErrorKind::InvalidAlgorithm => "it is not signed with the configured algorithm".to_owned(),
                ErrorKind::InvalidSignature => "its signature does not match the configured key".to_owned(),
                ErrorKind::InvalidAudience => {
                    format!("its `aud` claim does not name this service (expected {})", self.expected("aud"))
                }
                ErrorKind::InvalidIssuer => {
                    format!("its `iss` claim is not the configured issuer (expected {})", self.expected("iss"))
                }
                ErrorKind::Json(_) => {
                    "its claims are not valid (a string `tenant` and a numeric `exp` are required)".to_owned()
                }
                _ => format!("it cannot be verified ({e})"),
            };
            Status::unauthenticated(format!("the bearer JWT is not valid: {why}"))
        })?;
        let role = data.claims.role();
        let tenant = Tenant::new(data.claims.tenant)
            .map_err(|e| Status::unauthenticated(format!("the bearer JWT's tenant claim is not valid: {e}")))?;
        Ok((tenant, role))
    }
}

/// Where an enabled authenticator's material is read from, so that it can be read again.
#[derive(Clone, Debug)]
pub enum AuthSource {
    /// `--auth-tokens FILE`.
    TokenFile(PathBuf),
    /// `--jwt-key FILE` with its algorithm and the claims it requires.
    Jwt { key: PathBuf, alg: JwtAlg, audience: Option<String>, issuer: Option<String> },
}

impl AuthSource {
    /// The file the material is read from.
    pub fn path(&self) -> &Path {
        match self {
            Self::TokenFile(path) | Self::Jwt { key: path, .. } => path,
        }
    }

    /// Reads (off the runtime's threads) and checks the material.
    pub async fn load(&self) -> Result<Authenticator, AuthError> {
        self.parse(read_async(self.path()).await?)
    }

    fn parse(&self, bytes: Vec<u8>) -> Result<Authenticator, AuthError> {
        Ok(match self {
            Self::TokenFile(path) => Authenticator::TokenFile(TokenFile::from_bytes(path, bytes)?),
            Self::Jwt { key, alg, audience, issuer } => Authenticator::Jwt(Box::new(
                JwtAuth::from_bytes(key, &bytes, *alg)?.with_claims(audience.as_deref(), issuer.as_deref()),
            )),
        })
    }
}

/// What the last reload attempt read: the digest of the bytes, or why they could not be read. A poll that
/// sees the same again does nothing, so a file left broken is reported once, not at every poll.
type Seen = Result<[u8; 32], String>;

/// Auth material that can be swapped while the server runs: each call reads the [`Arc`] in force when it
/// arrives (a read lock held only to clone it), and a successful [`Reloadable::reload`] replaces it.
pub struct Reloadable {
    source: AuthSource,
    current: RwLock<Arc<Authenticator>>,
    seen: Mutex<Option<Seen>>,
}

impl fmt::Debug for Reloadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloadable").field("path", &self.source.path()).finish_non_exhaustive()
    }
}

/// What a successful reload changed, in counts and never in secrets: `3 tokens for 2 tenants (1 added, 1 removed)`,
/// `the HS256 key was replaced`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadSummary(pub String);

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Reloadable {
    /// Loads `source` for the first time; an error here stops the server from starting.
    pub async fn load(source: AuthSource) -> Result<Self, AuthError> {
        let bytes = read_async(source.path()).await?;
        let seen = Ok(Sha256::digest(&bytes).into());
        let current = source.parse(bytes)?;
        Ok(Self { source, current: RwLock::new(Arc::new(current)), seen: Mutex::new(Some(seen)) })
    }

    pub fn source(&self) -> &AuthSource {
        &self.source
    }

    /// The material in force.
    pub fn current(&self) -> Arc<Authenticator> {
        // A poisoned lock still holds a whole `Arc` (the writer only assigns one), so it is safe to use.
        turnstile_model::sync::read(&self.current).clone()
    }

    /// Reads the file again and swaps the material in when it is valid. `force` (SIGHUP) reloads even when
    /// the bytes are those of the last attempt; otherwise (a poll) unchanged bytes answer `None`. An error
    /// leaves the material in force and names the file and what is wrong with it.
    pub async fn reload(&self, force: bool) -> Option<Result<ReloadSummary, AuthError>> {
        let path = self.source.path();
        let bytes = tokio::fs::read(path).await;
        let now: Seen = match &bytes {
            Ok(b) => Ok(Sha256::digest(b).into()),
            Err(e) => Err(e.to_string()),
        };
        {
            let mut seen = turnstile_model::sync::lock(&self.seen);
            if !force && seen.as_ref() == Some(&now) {
                return None;
            }
            *seen = Some(now);
        }
        let loaded = bytes
            .map_err(|cause| AuthError::Read { path: path.to_owned(), cause })
            .and_then(|bytes| self.source.parse(bytes));
        Some(loaded.map(|new| {
            let summary = summarize(&self.current(), &new);
            *turnstile_model::sync::write(&self.current) = Arc::new(new);
            summary
        }))
    }
}

fn summarize(old: &Authenticator, new: &Authenticator) -> ReloadSummary {
    ReloadSummary(match (old, new) {
        (Authenticator::TokenFile(old), Authenticator::TokenFile(new)) => {
            let listed = |file: &TokenFile, d: &[u8; 32]| file.entries.iter().any(|e| e.digest == *d);
            let added = new.entries.iter().filter(|e| !listed(old, &e.digest)).count();
            let removed = old.entries.iter().filter(|e| !listed(new, &e.digest)).count();
            let mut tenants: Vec<&str> = new.entries.iter().map(|e| e.tenant.as_str()).collect();
            tenants.sort_unstable();
            tenants.dedup();
            let count = |n: usize, noun: &str| if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") };
            format!(
                "{} for {} ({added} added, {removed} removed)",
                count(new.entries.len(), "token"),
                count(tenants.len(), "tenant")
            )
        }
        (Authenticator::Jwt(old), Authenticator::Jwt(new)) => {
            let alg = new.validation.algorithms.first().map_or_else(String::new, |a| format!("{a:?} "));
            if old.key_digest == new.key_digest {
                format!("the {alg}key is unchanged")
            } else {
                format!("the {alg}key was replaced")
            }
        }
        (_, new) => format!("now {}", new.describe()),
    })
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
