//! Fuzzing the gateway's credential parsing (issue 14 part 6): any `authorization` value, any bearer
//! string (JWT-shaped or not, mutated valid JWTs included) and any token-file contents give a caller or a
//! typed refusal (UNAUTHENTICATED, [`AuthError`]), never a panic.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use serde::Serialize;
use tonic::Code;
use tonic::metadata::{MetadataMap, MetadataValue};
use turnstile_gateway::auth::{AuthError, Authenticator, Caller, JwtAlg, JwtAuth, TokenFile};

/// Modest and deterministic enough for CI: no persistence file is written into the tree.
fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
}

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-fuzz";

#[derive(Serialize)]
struct Claims {
    tenant: String,
    exp: u64,
}

/// A valid HS256 token for `acme`, expiring far in the future.
fn valid_jwt() -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET);
    let claims = Claims { tenant: "acme".into(), exp: 4_000_000_000 };
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap()
}

fn jwt_auth(dir: &Path) -> Authenticator {
    let path = dir.join("jwt.key");
    std::fs::write(&path, SECRET).unwrap();
    Authenticator::Jwt(Box::new(JwtAuth::load(&path, JwtAlg::Hs256).unwrap()))
}

fn token_auth(dir: &Path) -> Authenticator {
    let path = dir.join("tokens");
    std::fs::write(&path, "s3cret-token acme\nother-token beta # a comment\n").unwrap();
    Authenticator::TokenFile(TokenFile::load(&path).unwrap())
}

fn metadata(value: &[u8]) -> Option<MetadataMap> {
    let value = MetadataValue::try_from(value).ok()?;
    let mut metadata = MetadataMap::new();
    metadata.insert("authorization", value);
    Some(metadata)
}

/// The outcome of one call's credentials: a tenant, or UNAUTHENTICATED with a message.
fn check(auth: &Authenticator, value: &[u8]) -> Option<String> {
    let metadata = metadata(value)?;
    match auth.authenticate(&metadata) {
        Ok(Caller::Tenant { tenant, .. }) => Some(tenant.into_string()),
        Ok(Caller::Anonymous) => panic!("auth is on, yet {value:?} was let in anonymously"),
        Err(status) => {
            assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
            assert!(!status.message().is_empty());
            None
        }
    }
}

/// A bearer string: any text, or three dot-separated base64url-alphabet segments like a JWT.
fn bearer() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,80}",
        "[A-Za-z0-9_=-]{0,40}\\.[A-Za-z0-9_=-]{0,60}\\.[A-Za-z0-9_=-]{0,40}",
        "(eyJ[A-Za-z0-9_-]{0,30}\\.){0,3}[A-Za-z0-9_-]{0,20}",
    ]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn authenticating_never_panics_on_arbitrary_authorization_values(
        raw in proptest::collection::vec(any::<u8>(), 0..120),
        token in bearer(),
        scheme in prop_oneof![Just("Bearer "), Just("bearer "), Just("Basic "), Just(""), Just("Bearer  ")],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (jwt, tokens) = (jwt_auth(dir.path()), token_auth(dir.path()));
        for auth in [&jwt, &tokens] {
            check(auth, &raw);
            let header = format!("{scheme}{token}");
            prop_assert_eq!(check(auth, header.as_bytes()), None, "{} let in {:?}", auth.describe(), header);
        }
    }

    #[test]
    fn a_mutated_jwt_is_refused_never_a_panic(
        flips in proptest::collection::vec((any::<Index>(), any::<Index>()), 1..4),
        cut in proptest::option::of(any::<Index>()),
    ) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";
        let dir = tempfile::tempdir().unwrap();
        let auth = jwt_auth(dir.path());
        let valid = valid_jwt();
        prop_assert_eq!(check(&auth, format!("Bearer {valid}").as_bytes()), Some("acme".to_owned()));
        let mut token = valid.clone().into_bytes();
        for (at, with) in &flips {
            let at = at.index(token.len());
            token[at] = *with.get(ALPHABET);
        }
        if let Some(cut) = cut {
            token.truncate(cut.index(token.len() + 1));
        }
        let header = [b"Bearer ".as_slice(), &token].concat();
        let outcome = check(&auth, &header);
        // Base64 has slack bits, so a change may leave the decoded token identical: only then may it pass.
        if outcome.is_some() {
            prop_assert_eq!(outcome.as_deref(), Some("acme"));
        }
    }

    #[test]
    fn loading_a_token_file_never_panics_on_arbitrary_contents(
        contents in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            "([ -~\t]{0,30}\n){0,6}".prop_map(String::into_bytes),
            "(#?[a-z0-9]{0,8}[ \t]{1,2}[a-zA-Z0-9_.-]{0,8}( #.*)?\n){0,5}".prop_map(String::into_bytes),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, &contents).unwrap();
        match TokenFile::load(&path) {
            Ok(file) => {
                // A loaded file admits each token it lists, and only for its tenant.
                let auth = Authenticator::TokenFile(file);
                let text = String::from_utf8(contents).unwrap();
                for line in text.lines() {
                    let line = line.split_once('#').map_or(line, |(before, _)| before);
                    if let [token, tenant] = line.split_whitespace().collect::<Vec<_>>().as_slice() {
                        let header = format!("Bearer {token}");
                        prop_assert_eq!(check(&auth, header.as_bytes()), Some((*tenant).to_owned()));
                    }
                }
            }
            Err(err) => {
                prop_assert!(
                    matches!(err, AuthError::TokenLine { .. } | AuthError::NoTokens { .. } | AuthError::Key { .. }),
                    "{err:?}"
                );
                prop_assert!(err.to_string().contains("tokens"), "{err}");
            }
        }
    }
}
