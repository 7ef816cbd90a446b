use tonic::metadata::MetadataValue;

use super::*;

fn with_auth(value: &str) -> MetadataMap {
    let mut m = MetadataMap::new();
    m.insert("authorization", MetadataValue::try_from(value).unwrap());
    m
}

fn member(tenant: &str) -> Caller {
    Caller::member(Tenant::new(tenant).unwrap())
}

fn role_of(auth: &Authenticator, token: &str) -> Role {
    match auth.authenticate(&with_auth(&format!("Bearer {token}"))).unwrap() {
        Caller::Tenant { role, .. } => role,
        Caller::Anonymous => panic!("auth is on"),
    }
}

fn tokens(text: &str) -> Result<TokenFile, AuthError> {
    TokenFile::parse(Path::new("tokens.txt"), text)
}

#[test]
fn token_file_maps_tokens_to_tenants_and_skips_comments() {
    let file = tokens("# ops\nalpha-token acme  # the acme team\n\n  beta-token   globex\n").unwrap();
    let auth = Authenticator::TokenFile(file);
    assert_eq!(auth.authenticate(&with_auth("Bearer alpha-token")).unwrap(), member("acme"));
    assert_eq!(auth.authenticate(&with_auth("bearer beta-token")).unwrap(), member("globex"));
    let err = auth.authenticate(&with_auth("Bearer gamma")).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = auth.authenticate(&MetadataMap::new()).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("--token"), "{}", err.message());
    assert_eq!(auth.authenticate(&with_auth("Basic alpha-token")).unwrap_err().code(), tonic::Code::Unauthenticated);
}

#[test]
fn token_lines_give_roles_and_only_cluster_admins_leave_their_tenant() {
    let auth = Authenticator::TokenFile(
        tokens("root-token acme admin\nalpha-token acme\nops-token ops cluster_admin\n").unwrap(),
    );
    assert_eq!(role_of(&auth, "alpha-token"), Role::Member);
    assert_eq!(role_of(&auth, "root-token"), Role::Admin);
    assert_eq!(role_of(&auth, "ops-token"), Role::ClusterAdmin);
    let admin = auth.authenticate(&with_auth("Bearer root-token")).unwrap();
    assert_eq!(admin.confined_to().map(Tenant::as_str), Some("acme"), "a tenant admin stays in its tenant");
    assert!(admin.holds(Role::Admin) && !admin.holds(Role::ClusterAdmin));
    let ops = auth.authenticate(&with_auth("Bearer ops-token")).unwrap();
    assert_eq!(ops.confined_to(), None, "a cluster admin may name any tenant");
    assert_eq!(ops.tenant().map(Tenant::as_str), Some("ops"));
    assert!(!member("acme").holds(Role::Admin));
    assert!(Caller::Anonymous.holds(Role::ClusterAdmin), "auth off allows every call");
    let err = tokens("a acme root\n").unwrap_err();
    assert!(err.to_string().contains("the third field may only be `admin`"), "{err}");
}

#[test]
fn bad_token_files_name_the_line() {
    let err = tokens("a acme\nb\n").unwrap_err();
    assert_eq!(err.to_string(), "tokens.txt:2: expected `TOKEN TENANT [ROLE]`, got 1 fields");
    let err = tokens("a acme\na globex\n").unwrap_err();
    assert!(err.to_string().starts_with("tokens.txt:2: this token is already listed"), "{err}");
    let err = tokens("a ac/me\n").unwrap_err();
    assert!(err.to_string().starts_with("tokens.txt:1: tenant \"ac/me\""), "{err}");
    assert!(matches!(tokens("# nothing\n").unwrap_err(), AuthError::NoTokens { .. }));
}

#[test]
fn disabled_auth_ignores_tokens_and_is_refused_off_loopback() {
    let auth = Authenticator::Disabled;
    assert_eq!(auth.authenticate(&with_auth("Bearer x")).unwrap(), Caller::Anonymous);
    assert!(check_exposure(&auth, "127.0.0.1:7400".parse().unwrap(), "127.0.0.1:7400").is_ok());
    assert!(check_exposure(&auth, "[::1]:7400".parse().unwrap(), "[::1]:7400").is_ok());
    let err = check_exposure(&auth, "0.0.0.0:7400".parse().unwrap(), "0.0.0.0:7400").unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing to serve without auth on 0.0.0.0:7400; pass --auth-tokens or --jwt-key, or listen on loopback"
    );
    let on = Authenticator::TokenFile(tokens("a acme").unwrap());
    assert!(check_exposure(&on, "0.0.0.0:7400".parse().unwrap(), "0.0.0.0:7400").is_ok());
}

#[test]
fn jwt_algorithms_parse_case_insensitively() {
    assert_eq!("hs256".parse::<JwtAlg>().unwrap(), JwtAlg::Hs256);
    assert_eq!("ES256".parse::<JwtAlg>().unwrap(), JwtAlg::Es256);
    assert!("none".parse::<JwtAlg>().unwrap_err().contains("HS256, RS256 or ES256"));
}

#[test]
fn short_hs256_secrets_are_refused() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("short.key");
    std::fs::write(&path, "too-short\n").unwrap();
    let err = JwtAuth::load(&path, JwtAlg::Hs256).err().unwrap();
    assert!(err.to_string().contains("at least 32 bytes, this one has 9"), "{err}");
    let err = JwtAuth::load(&dir.join("missing.key"), JwtAlg::Hs256).err().unwrap();
    assert!(err.to_string().starts_with("cannot read "), "{err}");
}

#[tokio::test]
async fn a_reload_swaps_valid_material_and_keeps_the_old_on_error() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokens.txt");
    std::fs::write(&path, "a acme\nb globex\n").unwrap();
    let live = Arc::new(Reloadable::load(AuthSource::TokenFile(path.clone())).await.unwrap());
    let auth = Authenticator::Reloadable(Arc::clone(&live));
    assert_eq!(auth.authenticate(&with_auth("Bearer a")).unwrap(), member("acme"));
    assert!(live.reload(false).await.is_none(), "a poll of unchanged bytes does nothing");
    let forced = live.reload(true).await.unwrap().unwrap();
    assert_eq!(forced.0, "2 tokens for 2 tenants (0 added, 0 removed)");

    // A call that took the material before the swap keeps it.
    let before = live.current();
    std::fs::write(&path, "b globex\nc globex\n").unwrap();
    assert_eq!(live.reload(false).await.unwrap().unwrap().0, "2 tokens for 1 tenant (1 added, 1 removed)");
    assert!(before.authenticate(&with_auth("Bearer a")).is_ok());
    assert_eq!(auth.authenticate(&with_auth("Bearer a")).unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok());

    std::fs::write(&path, "b\n").unwrap();
    let err = live.reload(false).await.unwrap().unwrap_err();
    assert!(err.to_string().ends_with("tokens.txt:1: expected `TOKEN TENANT [ROLE]`, got 1 fields"), "{err}");
    assert!(live.reload(false).await.is_none(), "a file left broken is reported once");
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok(), "the failed reload kept the tokens");
    std::fs::remove_file(&path).unwrap();
    assert!(live.reload(true).await.unwrap().unwrap_err().to_string().starts_with("cannot read "));
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok());
}

#[tokio::test]
async fn a_key_reload_says_whether_the_key_changed_and_a_bad_pem_names_the_file() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-key-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hs.key");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    let source = AuthSource::Jwt { key: path.clone(), alg: JwtAlg::Hs256, audience: None, issuer: None };
    let live = Reloadable::load(source).await.unwrap();
    std::fs::write(&path, "fedcba9876543210fedcba9876543210\n").unwrap();
    assert_eq!(live.reload(false).await.unwrap().unwrap().0, "the HS256 key was replaced");
    assert_eq!(live.reload(true).await.unwrap().unwrap().0, "the HS256 key is unchanged");

    let source = AuthSource::Jwt { key: path.clone(), alg: JwtAlg::Es256, audience: None, issuer: None };
    std::fs::write(&path, "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n").unwrap();
    let err = Reloadable::load(source).await.err().unwrap().to_string();
    assert!(err.starts_with(&format!("{}: not an EC P-256 public key PEM", path.display())), "{err}");
}

#[test]
fn unsigned_jwts_are_refused() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hs.key");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    let auth = Authenticator::Jwt(Box::new(JwtAuth::load(&path, JwtAlg::Hs256).unwrap()));
    // {"alg":"none","typ":"JWT"} . {"tenant":"acme","exp":99999999999} . (no signature)
    let token = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJ0ZW5hbnQiOiJhY21lIiwiZXhwIjo5OTk5OTk5OTk5OX0.";
    let err = auth.authenticate(&with_auth(&format!("Bearer {token}"))).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

/// An HS256 authenticator over a fresh key file, and a signer of claims with that key.
fn hs256(name: &str) -> (Authenticator, impl Fn(serde_json::Value) -> String) {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hs.key");
    let secret = "0123456789abcdef0123456789abcdef";
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    let auth = Authenticator::Jwt(Box::new(JwtAuth::load(&path, JwtAlg::Hs256).unwrap()));
    let sign = move |claims: serde_json::Value| {
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    (auth, sign)
}

#[test]
fn jwt_claims_give_roles() {
    let (auth, sign) = hs256("roles");
    let exp = 99_999_999_999_u64;
    let admin = sign(serde_json::json!({"tenant": "acme", "exp": exp, "admin": true}));
    let plain = sign(serde_json::json!({"tenant": "acme", "exp": exp}));
    let ops = sign(serde_json::json!({"tenant": "ops", "exp": exp, "cluster_admin": true}));
    assert_eq!(role_of(&auth, &admin), Role::Admin);
    assert_eq!(role_of(&auth, &plain), Role::Member);
    assert_eq!(role_of(&auth, &ops), Role::ClusterAdmin);
}

#[test]
fn a_jwt_not_valid_yet_is_refused_beyond_the_leeway() {
    let (auth, sign) = hs256("nbf");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let exp = now + 3600;
    let early = sign(serde_json::json!({"tenant": "acme", "exp": exp, "nbf": now + 600}));
    let err = auth.authenticate(&with_auth(&format!("Bearer {early}"))).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("`nbf`"), "{}", err.message());
    // Within the leeway (a clock a few seconds ahead of ours) and in the past: accepted.
    let skewed = sign(serde_json::json!({"tenant": "acme", "exp": exp, "nbf": now + JWT_LEEWAY_S / 2}));
    assert_eq!(auth.authenticate(&with_auth(&format!("Bearer {skewed}"))).unwrap(), member("acme"));
    let past = sign(serde_json::json!({"tenant": "acme", "exp": exp, "nbf": now - 60}));
    assert_eq!(auth.authenticate(&with_auth(&format!("Bearer {past}"))).unwrap(), member("acme"));
}
