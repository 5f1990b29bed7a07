//! JWT access tokens over loopback gRPC: `[auth.jwt]` with a JWKS file of
//! keys made at test time; tokens signed here. Valid tokens act for their
//! grants' tenant and roles; expired, not yet valid, wrong issuer or
//! audience, unknown key id, wrong signature, `alg: none` and an HMAC token
//! signed with the public key are refused with their cause; a token with
//! several tenants needs `subagentd-tenant`; a new signing key is fetched
//! early, at most once a minute; an open stream ends when its token
//! expires.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::{bg, error_info, TestServer};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::KeyPair;
use subagentd::pb;
use tonic::{Code, Request};

const ISSUER: &str = "https://idp.test/";
const AUDIENCE: &str = "subagentd";

/// A signing key and its public JWK.
struct SigningKey {
    kid: String,
    pair: KeyPair,
}

impl SigningKey {
    fn new(kid: &str) -> Self {
        Self {
            kid: kid.into(),
            pair: KeyPair::generate().unwrap(),
        }
    }

    fn jwk(&self) -> serde_json::Value {
        let raw = self.pair.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
            "kid": self.kid, "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
        })
    }

    fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let key = EncodingKey::from_ec_pem(self.pair.serialize_pem().as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(permissions: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "user-1",
        "iat": now(), "exp": now() + 600, "permissions": permissions,
    })
}

fn jwks(keys: &[&SigningKey]) -> String {
    serde_json::json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() }).to_string()
}

struct Idp {
    key: SigningKey,
    dir: tempfile::TempDir,
}

impl Idp {
    fn new() -> Self {
        let idp = Self {
            key: SigningKey::new("k1"),
            dir: tempfile::tempdir().unwrap(),
        };
        idp.publish(&[&idp.key]);
        idp
    }

    fn jwks_path(&self) -> std::path::PathBuf {
        self.dir.path().join("jwks.json")
    }

    fn publish(&self, keys: &[&SigningKey]) {
        let tmp = self.dir.path().join(".jwks.tmp");
        std::fs::write(&tmp, jwks(keys)).unwrap();
        std::fs::rename(&tmp, self.jwks_path()).unwrap();
    }

    /// A server from a config file, so that a reload reads it again.
    async fn server(&self) -> TestServer {
        self.server_with("").await
    }

    /// [`Idp::server`] with `extra` at the end of its config (in
    /// `[auth.jwt]` until it opens a table of its own).
    async fn server_with(&self, extra: &str) -> TestServer {
        TestServer::start_with_file(&format!(
            r#"
[limits]
max_background_agents = 20

[agents.simulated]
runner = "simulated"

[auth]
mode = "required"

[auth.jwt]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = {:?}
{extra}"#,
            self.jwks_path().display().to_string()
        ))
        .await
    }
}

fn with_token<T>(message: T, token: &str, tenant: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(tenant) = tenant {
        request
            .metadata_mut()
            .insert("subagentd-tenant", tenant.parse().unwrap());
    }
    request
}

async fn status_with(s: &TestServer, token: &str) -> Result<pb::StatusResponse, tonic::Status> {
    s.client
        .clone()
        .status(with_token(pb::StatusRequest::default(), token, None))
        .await
        .map(|r| r.into_inner())
}

fn cause(status: &tonic::Status) -> String {
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, meta) = error_info(status);
    assert_eq!(reason, "UNAUTHENTICATED");
    meta["cause"].clone()
}

#[tokio::test]
async fn a_valid_token_acts_for_its_tenant_and_roles() {
    let idp = Idp::new();
    let s = idp.server().await;
    let mut c = s.client.clone();
    let frontend = idp.key.sign(&claims(&["team-a:frontend"]));
    let agent = c
        .spawn(with_token(bg("openai/gpt-4o", "by jwt"), &frontend, None))
        .await
        .expect("a frontend token may Spawn")
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.tenant, "team-a");

    // A viewer of another tenant: reads its own tenant only, may not Spawn.
    let viewer = idp.key.sign(&claims(&["team-b:viewer"]));
    assert!(status_with(&s, &viewer).await.unwrap().agents.is_empty());
    let err = c
        .spawn(with_token(bg("openai/gpt-4o", "no"), &viewer, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    // "*:admin" is the admin role: every tenant's agents.
    let admin = idp.key.sign(&claims(&["*:admin"]));
    let all = status_with(&s, &admin).await.unwrap();
    assert!(all.agents.iter().any(|a| a.id == agent.id));
}

#[tokio::test]
async fn bad_tokens_are_refused_with_their_cause() {
    let idp = Idp::new();
    let s = idp.server().await;
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = claims(&["team-a:viewer"]);
        f(&mut c);
        idp.key.sign(&c)
    };
    let expired = with(&|c| {
        c["exp"] = (now() - 3600).into();
        c["iat"] = (now() - 7200).into();
    });
    assert_eq!(
        cause(&status_with(&s, &expired).await.unwrap_err()),
        "expired"
    );
    let not_yet = with(&|c| c["nbf"] = (now() + 3600).into());
    assert_eq!(
        cause(&status_with(&s, &not_yet).await.unwrap_err()),
        "invalid"
    );
    let issuer = with(&|c| c["iss"] = "https://elsewhere.test/".into());
    assert_eq!(
        cause(&status_with(&s, &issuer).await.unwrap_err()),
        "invalid"
    );
    let audience = with(&|c| c["aud"] = "another-service".into());
    assert_eq!(
        cause(&status_with(&s, &audience).await.unwrap_err()),
        "invalid"
    );
    let no_exp = with(&|c| {
        c.as_object_mut().unwrap().remove("exp");
    });
    assert_eq!(
        cause(&status_with(&s, &no_exp).await.unwrap_err()),
        "invalid"
    );

    // Signed by another key under the same key id: a wrong signature.
    let impostor = SigningKey::new("k1").sign(&claims(&["team-a:admin"]));
    assert_eq!(
        cause(&status_with(&s, &impostor).await.unwrap_err()),
        "invalid"
    );

    // alg none, and HMAC with the public key (the JWK) as the secret.
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let body = b64(&claims(&["team-a:admin"]));
    let none = format!(
        "{}.{body}.",
        b64(&serde_json::json!({"alg": "none", "kid": "k1"}))
    );
    assert_eq!(cause(&status_with(&s, &none).await.unwrap_err()), "invalid");
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("k1".into());
    let public = idp.key.jwk().to_string();
    let hmac = jsonwebtoken::encode(
        &hs,
        &claims(&["team-a:admin"]),
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .unwrap();
    assert_eq!(cause(&status_with(&s, &hmac).await.unwrap_err()), "invalid");

    for malformed in ["a.b.c", "not-a-token", "x.y"] {
        assert_eq!(
            cause(&status_with(&s, malformed).await.unwrap_err()),
            "malformed",
            "{malformed}"
        );
    }
    // The server still serves good tokens.
    status_with(&s, &idp.key.sign(&claims(&["team-a:viewer"])))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_token_with_several_tenants_names_one_in_the_header() {
    let idp = Idp::new();
    let s = idp.server().await;
    let mut c = s.client.clone();
    let token = idp.key.sign(&claims(&[
        "team-a:frontend",
        "team-b:frontend",
        "team-b:approver",
    ]));
    let err = c
        .spawn(with_token(bg("openai/gpt-4o", "which"), &token, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "PERMISSION_DENIED");
    assert_eq!(meta["granted_tenants"], "team-a,team-b");
    assert_eq!(meta["header"], "subagentd-tenant");

    let b = c
        .spawn(with_token(
            bg("openai/gpt-4o", "in b"),
            &token,
            Some("team-b"),
        ))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(b.tenant, "team-b");
    let err = c
        .spawn(with_token(
            bg("openai/gpt-4o", "in c"),
            &token,
            Some("team-c"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn an_expiring_token_ends_its_open_watch_and_worker_session() {
    let idp = Idp::new();
    let s = idp
        .server_with("leeway = \"0s\"\n\n[agents.coder]\nrunner = \"worker\"\n")
        .await;
    let exp = now() + 2;
    let expiring = |permissions: &[&str]| {
        let mut c = claims(permissions);
        c["exp"] = exp.into();
        idp.key.sign(&c)
    };
    let mut c = s.client.clone();
    let mut watch = c
        .watch_agents(with_token(
            pb::WatchAgentsRequest::default(),
            &expiring(&["team-a:viewer"]),
            None,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut session =
        common::auth::open_worker(s.handle.addr(), &expiring(&["team-a:worker"]), &["coder"])
            .await
            .unwrap();
    // A token that outlives the test keeps its stream and sees a Spawn
    // made after the others expired.
    let lasting = idp.key.sign(&claims(&["team-a:frontend"]));
    let mut kept = c
        .watch_agents(with_token(
            pb::WatchAgentsRequest::default(),
            &lasting,
            None,
        ))
        .await
        .unwrap()
        .into_inner();

    let end_of = |status: Result<(), tonic::Status>| status.unwrap_err();
    let watch_end = end_of(
        async {
            loop {
                if watch.message().await?.is_none() {
                    panic!("the watch ended without a status");
                }
            }
        }
        .await,
    );
    assert_eq!(cause(&watch_end), "expired", "{watch_end:?}");
    assert!(now() > exp, "ended before the token expired");
    let session_end = end_of(
        async {
            loop {
                if session.message().await?.is_none() {
                    panic!("the session ended without a status");
                }
            }
        }
        .await,
    );
    assert_eq!(cause(&session_end), "expired", "{session_end:?}");

    let agent = c
        .spawn(with_token(bg("openai/gpt-4o", "after"), &lasting, None))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    loop {
        let event = kept
            .message()
            .await
            .unwrap()
            .expect("the lasting token's watch goes on");
        if event.agent.is_some_and(|a| a.id == agent.id) {
            break;
        }
    }
}

#[tokio::test]
async fn a_new_signing_key_is_fetched_early_at_most_once_a_minute() {
    let idp = Idp::new();
    let s = idp.server().await;
    // The issuer rotates: a new key is published, and tokens signed by it
    // arrive before the next scheduled refresh (5 minutes away).
    let k2 = SigningKey::new("k2");
    idp.publish(&[&idp.key, &k2]);
    let token = k2.sign(&claims(&["team-a:viewer"]));
    status_with(&s, &token)
        .await
        .expect("an unknown key id fetches the JWKS once, then verifies");

    // Another new key within the minute: no second early fetch.
    let k3 = SigningKey::new("k3");
    idp.publish(&[&idp.key, &k2, &k3]);
    let err = status_with(&s, &k3.sign(&claims(&["team-a:viewer"])))
        .await
        .unwrap_err();
    assert_eq!(cause(&err), "unknown");
    // A reload (SIGHUP) reads the file at once.
    s.handle.reload().expect("the config reloads");
    status_with(&s, &k3.sign(&claims(&["team-a:viewer"])))
        .await
        .expect("after SIGHUP the new key verifies");
    // Still authenticated after the reload: an unknown key is refused.
    let k4 = SigningKey::new("k4");
    assert_eq!(
        cause(
            &status_with(&s, &k4.sign(&claims(&["team-a:viewer"])))
                .await
                .unwrap_err()
        ),
        "unknown"
    );
    // The old key still works throughout.
    status_with(&s, &idp.key.sign(&claims(&["team-a:viewer"])))
        .await
        .unwrap();
}

#[test]
fn jwt_config_errors_name_the_key() {
    let check = |toml: &str| {
        subagentd::config::ConfigSource::from_toml_str(toml)
            .unwrap_err()
            .to_string()
    };
    assert!(check("[auth.jwt]\naudience = \"a\"\njwks_file = \"f\"\n").contains("auth.jwt.issuer"));
    assert!(check("[auth.jwt]\nissuer = \"i\"\njwks_file = \"f\"\n").contains("auth.jwt.audience"));
    assert!(check("[auth.jwt]\nissuer = \"i\"\naudience = \"a\"\n").contains("auth.jwt.jwks_file"));
    assert!(check(
        "[auth.jwt]\nissuer = \"i\"\naudience = \"a\"\njwks_file = \"f\"\njwks_url = \"https://x\"\n"
    )
    .contains("auth.jwt.jwks_file"));
    assert!(check(
        "[auth.jwt]\nissuer = \"i\"\naudience = \"a\"\njwks_file = \"f\"\nleeway = \"10m\"\n"
    )
    .contains("auth.jwt.leeway"));
}

#[tokio::test]
async fn a_jwks_url_is_fetched_again_every_jwks_refresh() {
    use std::sync::{Arc, Mutex};
    let k1 = SigningKey::new("k1");
    let published = Arc::new(Mutex::new(jwks(&[&k1])));
    let served = published.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let body = served.lock().unwrap().clone();
            async move { body }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let s = TestServer::start(&format!(
        r#"
[agents.simulated]
runner = "simulated"

[auth]
mode = "required"

[auth.jwt]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_url = "{url}"
jwks_refresh = "1s"
"#
    ))
    .await;
    status_with(&s, &k1.sign(&claims(&["team-a:viewer"])))
        .await
        .expect("the JWKS was fetched at start");

    // Spend the early fetch on a key nobody published...
    let stray = SigningKey::new("stray");
    let err = status_with(&s, &stray.sign(&claims(&["team-a:viewer"])))
        .await
        .unwrap_err();
    assert_eq!(cause(&err), "unknown");
    // ... so that a key published now arrives by the periodic refresh.
    let k2 = SigningKey::new("k2");
    *published.lock().unwrap() = jwks(&[&k1, &k2]);
    let token = k2.sign(&claims(&["team-a:viewer"]));
    let started = std::time::Instant::now();
    loop {
        match status_with(&s, &token).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(cause(&e), "unknown");
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(10),
                    "the new key never arrived"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}
