//! The `--auth-tokens` file: `TOKEN TENANT [admin|cluster_admin]` lines, kept only as SHA-256 digests and
//! compared in constant time.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use turnstile_model::Tenant;

use super::{AuthError, Role, read};

/// `TOKEN TENANT [ROLE]` lines, kept as digests.
pub struct TokenFile {
    pub(super) entries: Vec<Entry>,
}

/// One token line: the digest of the token, its tenant and role.
pub(super) struct Entry {
    pub(super) digest: [u8; 32],
    pub(super) tenant: Tenant,
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
    pub(super) fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, AuthError> {
        let text = String::from_utf8(bytes)
            .map_err(|_| AuthError::Key { path: path.to_owned(), detail: "the token file is not UTF-8 text".into() })?;
        Self::parse(path, &text)
    }

    pub(super) fn parse(path: &Path, text: &str) -> Result<Self, AuthError> {
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
    pub(super) fn lookup(&self, token: &str) -> Option<(&Tenant, Role)> {
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
