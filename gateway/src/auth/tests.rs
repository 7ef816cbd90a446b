use tonic::metadata::MetadataValue;

use super::*;

fn with_auth(value: &str) -> MetadataMap {
    let mut m = MetadataMap::new();
    m.insert("authorization", MetadataValue::try_from(value).unwrap());
    m
}

fn tokens(text: &str) -> Result<TokenFile, AuthError> {
    TokenFile::parse(Path::new("tokens.txt"), text)
}

#[test]
fn token_file_maps_tokens_to_tenants_and_skips_comments() {
    let file = tokens("# ops\nalpha-token acme  # the acme team\n\n  beta-token   globex\n").unwrap();
    let auth = Authenticator::TokenFile(file);
    assert_eq!(auth.authenticate(&with_auth("Bearer alpha-token")).unwrap(), Caller::Tenant("acme".into()));
    assert_eq!(auth.authenticate(&with_auth("bearer beta-token")).unwrap(), Caller::Tenant("globex".into()));
    let err = auth.authenticate(&with_auth("Bearer gamma")).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = auth.authenticate(&MetadataMap::new()).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("--token"), "{}", err.message());
    assert_eq!(auth.authenticate(&with_auth("Basic alpha-token")).unwrap_err().code(), tonic::Code::Unauthenticated);
}

#[test]
fn only_admin_tokens_may_export_and_import() {
    let auth = Authenticator::TokenFile(tokens("root-token acme admin\nalpha-token acme\n").unwrap());
    let admin = auth.authorize_admin(&with_auth("Bearer root-token"), "ExportSessions").unwrap();
    assert_eq!(admin, Caller::Tenant("acme".into()), "an admin's own calls stay in its tenant");
    let err = auth.authorize_admin(&with_auth("Bearer alpha-token"), "ExportSessions").unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().starts_with("ExportSessions needs an administrator's token"), "{}", err.message());
    let err = auth.authorize_admin(&with_auth("Bearer nobody"), "ImportSessions").unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(Authenticator::Disabled.authorize_admin(&MetadataMap::new(), "x").unwrap(), Caller::Anonymous);
    let err = tokens("a acme root\n").unwrap_err();
    assert!(err.to_string().contains("the third field may only be `admin`"), "{err}");
}

#[test]
fn bad_token_files_name_the_line() {
    let err = tokens("a acme\nb\n").unwrap_err();
    assert_eq!(err.to_string(), "tokens.txt:2: expected `TOKEN TENANT`, got 1 fields");
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

#[test]
fn a_reload_swaps_valid_material_and_keeps_the_old_on_error() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokens.txt");
    std::fs::write(&path, "a acme\nb globex\n").unwrap();
    let live = Arc::new(Reloadable::load(AuthSource::TokenFile(path.clone())).unwrap());
    let auth = Authenticator::Reloadable(Arc::clone(&live));
    assert_eq!(auth.authenticate(&with_auth("Bearer a")).unwrap(), Caller::Tenant("acme".into()));
    assert!(live.reload(false).is_none(), "a poll of unchanged bytes does nothing");
    let forced = live.reload(true).unwrap().unwrap();
    assert_eq!(forced.0, "2 tokens for 2 tenants (0 added, 0 removed)");

    // A call that took the material before the swap keeps it.
    let before = live.current();
    std::fs::write(&path, "b globex\nc globex\n").unwrap();
    assert_eq!(live.reload(false).unwrap().unwrap().0, "2 tokens for 1 tenant (1 added, 1 removed)");
    assert!(before.authenticate(&with_auth("Bearer a")).is_ok());
    assert_eq!(auth.authenticate(&with_auth("Bearer a")).unwrap_err().code(), tonic::Code::Unauthenticated);
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok());

    std::fs::write(&path, "b\n").unwrap();
    let err = live.reload(false).unwrap().unwrap_err();
    assert!(err.to_string().ends_with("tokens.txt:1: expected `TOKEN TENANT`, got 1 fields"), "{err}");
    assert!(live.reload(false).is_none(), "a file left broken is reported once");
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok(), "the failed reload kept the tokens");
    std::fs::remove_file(&path).unwrap();
    assert!(live.reload(true).unwrap().unwrap_err().to_string().starts_with("cannot read "));
    assert!(auth.authenticate(&with_auth("Bearer c")).is_ok());
}

#[test]
fn a_key_reload_says_whether_the_key_changed_and_a_bad_pem_names_the_file() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-key-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hs.key");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    let source = AuthSource::Jwt { key: path.clone(), alg: JwtAlg::Hs256, audience: None, issuer: None };
    let live = Reloadable::load(source).unwrap();
    std::fs::write(&path, "fedcba9876543210fedcba9876543210\n").unwrap();
    assert_eq!(live.reload(false).unwrap().unwrap().0, "the HS256 key was replaced");
    assert_eq!(live.reload(true).unwrap().unwrap().0, "the HS256 key is unchanged");

    let source = AuthSource::Jwt { key: path.clone(), alg: JwtAlg::Es256, audience: None, issuer: None };
    std::fs::write(&path, "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n").unwrap();
    let err = Reloadable::load(source).err().unwrap().to_string();
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

#[test]
fn a_jwt_with_the_admin_claim_may_export() {
    let dir = std::env::temp_dir().join(format!("turnstile-auth-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hs.key");
    let secret = "0123456789abcdef0123456789abcdef";
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    let auth = Authenticator::Jwt(Box::new(JwtAuth::load(&path, JwtAlg::Hs256).unwrap()));
    let sign = |claims: serde_json::Value| {
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    let admin = sign(serde_json::json!({"tenant": "acme", "exp": 99_999_999_999_u64, "admin": true}));
    let plain = sign(serde_json::json!({"tenant": "acme", "exp": 99_999_999_999_u64}));
    let ok = auth.authorize_admin(&with_auth(&format!("Bearer {admin}")), "ImportSessions").unwrap();
    assert_eq!(ok, Caller::Tenant("acme".into()));
    let err = auth.authorize_admin(&with_auth(&format!("Bearer {plain}")), "ImportSessions").unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    std::fs::remove_dir_all(&dir).unwrap();
}
