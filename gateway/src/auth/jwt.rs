//! Signed JWTs (`--jwt-key`): the `tenant` claim names the tenant, `admin`/`cluster_admin` give a role,
//! `exp` is required and `nbf` honoured within [`JWT_LEEWAY_S`]; only the configured algorithm is accepted.

use std::fmt;
use std::path::Path;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::Status;
use turnstile_model::Tenant;

use super::{AuthError, Role, read};
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

/// JWT verification with one key and one algorithm.
pub struct JwtAuth {
    key: DecodingKey,
    pub(super) validation: Validation,
    /// SHA-256 of the key file's bytes: tells a reload whether the key changed, without keeping or logging it.
    pub(super) key_digest: [u8; 32],
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
    pub(super) fn from_bytes(key_file: &Path, bytes: &[u8], alg: JwtAlg) -> Result<Self, AuthError> {
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
    pub(super) fn claims(&self, token: &str) -> Result<(Tenant, Role), Status> {
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
