//! Reloading (decision 0035): an authenticator read again from its [`AuthSource`] on SIGHUP or when the
//! file's bytes change; a reload that fails keeps the material in force.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};

use super::{AuthError, Authenticator, JwtAlg, JwtAuth, TokenFile, read_async};

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
