//! JWT access tokens (`[auth.jwt]`): OIDC tokens signed by keys of a JWKS
//! (a file or a URL, refreshed every `jwks_refresh`), whose permissions
//! claim holds `"<tenant>:<role>"` grants (`"*:admin"`: the admin role).
//!
//! Only asymmetric keys are taken from the JWKS, and each key accepts only
//! the algorithms of its own type: a token signed with HMAC (a public key
//! used as the secret), `alg: none` or any algorithm the key was not made
//! for is refused before any signature is checked.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use jsonwebtoken::{
    jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm},
    Algorithm, DecodingKey, Validation,
};
use parking_lot::Mutex;
use serde::Deserialize;

use super::{AuthError, Cause, Principal, Role, Roles};
pub use crate::config::auth::{
    JwtConfig, DEFAULT_JWKS_REFRESH, DEFAULT_LEEWAY, DEFAULT_PERMISSIONS_CLAIM,
};

/// The header that picks one of a token's tenants.
pub const TENANT_HEADER: &str = "subagentd-tenant";
/// An unknown key id fetches the JWKS early at most this often.
pub const EARLY_REFETCH_EVERY: Duration = Duration::from_secs(60);

/// One verification key of the JWKS.
struct Key {
    key: DecodingKey,
    /// What it may verify: the algorithms of its type (or its `alg`).
    algorithms: Vec<Algorithm>,
}

/// The keys by key id.
#[derive(Default)]
struct Keys(HashMap<String, Key>);

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Why a JWT was refused.
#[derive(Debug)]
pub enum Refusal {
    /// Refuse with this.
    Auth(AuthError),
    /// Signed by a key id the JWKS does not hold (yet): worth one refetch.
    UnknownKey,
}

impl From<AuthError> for Refusal {
    fn from(e: AuthError) -> Self {
        Refusal::Auth(e)
    }
}

fn unauthenticated(cause: Cause) -> Refusal {
    Refusal::Auth(AuthError::Unauthenticated(cause))
}

/// Verifies tokens against the JWKS it holds; shared by every
/// authenticator built from the same `[auth.jwt]`.
#[derive(Debug)]
pub struct JwtVerifier {
    config: JwtConfig,
    keys: ArcSwap<Keys>,
    /// When the last early (unknown key id) fetch was asked for.
    last_early: Mutex<Option<Instant>>,
    /// Counts finished fetches; asks the refresh task for an early one.
    fetched: tokio::sync::watch::Sender<u64>,
    early: tokio::sync::Notify,
}

/// The claims subagentd reads (`exp`, `nbf`, `iss` and `aud` are checked
/// by the validation).
#[derive(Debug, Deserialize)]
struct Claims {
    #[serde(default)]
    sub: String,
    /// Seconds since the epoch. Required by the validation, which then
    /// answers a token without it (`invalid`), not the decoding.
    #[serde(default)]
    exp: u64,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

impl JwtVerifier {
    /// A verifier for a validated `[auth.jwt]`, holding no keys until the
    /// first [`JwtVerifier::load`].
    pub fn new(config: JwtConfig) -> Self {
        Self {
            config,
            keys: ArcSwap::from_pointee(Keys::default()),
            last_early: Mutex::new(None),
            fetched: tokio::sync::watch::Sender::new(0),
            early: tokio::sync::Notify::new(),
        }
    }

    /// Its config.
    pub fn config(&self) -> &JwtConfig {
        &self.config
    }

    /// Reads the JWKS (file or URL) and swaps its keys in; the old keys
    /// stay when it cannot be read. The number of usable keys.
    pub async fn load(&self, http: &reqwest::Client) -> Result<usize, String> {
        let text = if self.config.jwks_url.is_empty() {
            tokio::fs::read(&self.config.jwks_file)
                .await
                .map_err(|e| format!("reading {}: {e}", self.config.jwks_file))?
        } else {
            let response = http
                .get(&self.config.jwks_url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("fetching {}: {e}", self.config.jwks_url))?;
            response
                .bytes()
                .await
                .map_err(|e| format!("reading {}: {e}", self.config.jwks_url))?
                .to_vec()
        };
        self.install(&text)
    }

    /// Takes the keys of JWKS text `text` (keeping the old ones when it
    /// is not a JWKS); wakes the calls waiting for an early fetch.
    pub fn install(&self, text: &[u8]) -> Result<usize, String> {
        let result = self.parse_and_store(text);
        self.fetched.send_modify(|n| *n += 1);
        result
    }

    fn parse_and_store(&self, text: &[u8]) -> Result<usize, String> {
        let set: JwkSet = serde_json::from_slice(text).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue; // tokens name their key; one without an id is never picked
            };
            let algorithms = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => vec![
                    Algorithm::RS256,
                    Algorithm::RS384,
                    Algorithm::RS512,
                    Algorithm::PS256,
                    Algorithm::PS384,
                    Algorithm::PS512,
                ],
                AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                    EllipticCurve::P256 => vec![Algorithm::ES256],
                    EllipticCurve::P384 => vec![Algorithm::ES384],
                    _ => continue,
                },
                AlgorithmParameters::OctetKeyPair(_) => vec![Algorithm::EdDSA],
                // A symmetric key in a published key set: never a verifier.
                AlgorithmParameters::OctetKey(_) => continue,
            };
            let algorithms = match jwk.common.key_algorithm.and_then(algorithm_of) {
                Some(alg) if algorithms.contains(&alg) => vec![alg],
                Some(_) => continue, // an alg that does not fit its key type
                None => algorithms,
            };
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            keys.insert(kid, Key { key, algorithms });
        }
        let count = keys.len();
        self.keys.store(Arc::new(Keys(keys)));
        Ok(count)
    }

    /// Resolves when the refresh task should fetch early (an unknown key
    /// id was seen).
    pub async fn early_fetch_wanted(&self) {
        self.early.notified().await;
    }

    /// Asks the refresh task to fetch now (a reload).
    pub fn fetch_soon(&self) {
        self.early.notify_one();
    }

    /// Asks for an early fetch, at most once per [`EARLY_REFETCH_EVERY`];
    /// returns a receiver that changes when the next fetch ends, or None
    /// when one was asked for too recently.
    pub fn request_early_fetch(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let mut last = self.last_early.lock();
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < EARLY_REFETCH_EVERY) {
            return None;
        }
        *last = Some(now);
        let mut fetched = self.fetched.subscribe();
        fetched.mark_unchanged();
        self.early.notify_one();
        Some(fetched)
    }

    /// The principal of `token`, acting in the tenant `tenant_header`
    /// picks among its grants.
    pub fn verify(&self, token: &str, tenant_header: Option<&[u8]>) -> Result<Principal, Refusal> {
        let header = header_of(token)?;
        let kid = header
            .kid
            .as_deref()
            .ok_or(unauthenticated(Cause::Invalid))?;
        let keys = self.keys.load();
        let key = keys.0.get(kid).ok_or(Refusal::UnknownKey)?;
        let alg = algorithm_named(&header.alg).ok_or(unauthenticated(Cause::Invalid))?;
        if !key.algorithms.contains(&alg) {
            return Err(unauthenticated(Cause::Invalid));
        }
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway.as_secs();
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                unauthenticated(match e.kind() {
                    K::ExpiredSignature => Cause::Expired,
                    K::Base64(_) | K::Json(_) | K::Utf8(_) | K::InvalidToken => Cause::Malformed,
                    _ => Cause::Invalid,
                })
            })?
            .claims;
        let grants = claims
            .rest
            .get(&self.config.permissions_claim)
            .and_then(serde_json::Value::as_array)
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(serde_json::Value::as_str)
                    .filter_map(parse_grant)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let mut principal =
            principal_of(&claims.sub, &grants, tenant_header).map_err(Refusal::Auth)?;
        // The validation refuses the token once the whole second after
        // `exp` + leeway has begun.
        principal.expires = Some(
            std::time::UNIX_EPOCH
                + Duration::from_secs(
                    claims
                        .exp
                        .saturating_add(validation.leeway)
                        .saturating_add(1),
                ),
        );
        Ok(principal)
    }
}

/// The JOSE header fields read before a key is chosen.
#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// The header of `token`, read without trusting it: `alg` is checked
/// against the key's own algorithms (so `none` and HMAC never verify).
fn header_of(token: &str) -> Result<RawHeader, Refusal> {
    use base64::Engine as _;
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(unauthenticated(Cause::Malformed));
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| unauthenticated(Cause::Malformed))?;
    serde_json::from_slice(&json).map_err(|_| unauthenticated(Cause::Malformed))
}

fn algorithm_named(name: &str) -> Option<Algorithm> {
    Some(match name {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        // none, HS*, and anything unknown.
        _ => return None,
    })
}

fn algorithm_of(alg: KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// A grant `"<tenant>:<role>"`; `*` as the tenant means every tenant.
fn parse_grant(entry: &str) -> Option<(&str, Role)> {
    let (tenant, role) = entry.rsplit_once(':')?;
    let role = Role::ALL.into_iter().find(|r| r.name() == role)?;
    (tenant == "*" || super::is_tenant_name(tenant)).then_some((tenant, role))
}

/// The principal of grants `grants`: its tenant is the one tenant they
/// name, or among several the one `tenant_header` names; `*` grants add
/// their roles in every tenant.
fn principal_of(
    sub: &str,
    grants: &[(&str, Role)],
    tenant_header: Option<&[u8]>,
) -> Result<Principal, AuthError> {
    let named: BTreeSet<&str> = grants
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t != "*")
        .collect();
    let wildcard = grants.iter().any(|(t, _)| *t == "*");
    let asked = tenant_header
        .map(|h| std::str::from_utf8(h).map(str::trim).unwrap_or(""))
        .filter(|h| !h.is_empty());
    let tenant = match asked {
        Some(asked) if named.contains(asked) || (wildcard && super::is_tenant_name(asked)) => {
            asked.to_owned()
        }
        Some(asked) => {
            return Err(AuthError::TenantNotGranted {
                asked: Some(asked.to_owned()),
                granted: named.iter().map(|t| t.to_string()).collect(),
            })
        }
        None if named.len() == 1 => named
            .iter()
            .next()
            .map(|t| t.to_string())
            .unwrap_or_default(),
        None if named.is_empty() && wildcard => super::DEFAULT_TENANT.to_owned(),
        None => {
            return Err(AuthError::TenantNotGranted {
                asked: None,
                granted: named.iter().map(|t| t.to_string()).collect(),
            })
        }
    };
    let roles: Roles = grants
        .iter()
        .filter(|(t, _)| *t == "*" || *t == tenant)
        .map(|(_, r)| *r)
        .collect();
    Ok(Principal {
        tenant: tenant.into(),
        roles,
        name: format!("jwt:{sub}").into(),
        agent_types: None,
        expires: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_pick_the_tenant_and_its_roles() {
        let grants = [("team-a", Role::Frontend), ("*", Role::Viewer)];
        let p = principal_of("u1", &grants, None).unwrap();
        assert_eq!(&*p.tenant, "team-a");
        assert!(p.roles.has(Role::Frontend) && p.roles.has(Role::Viewer));
        assert_eq!(&*p.name, "jwt:u1");

        let two = [("team-a", Role::Frontend), ("team-b", Role::Approver)];
        assert!(matches!(
            principal_of("u", &two, None),
            Err(AuthError::TenantNotGranted { asked: None, .. })
        ));
        let b = principal_of("u", &two, Some(b"team-b")).unwrap();
        assert_eq!(&*b.tenant, "team-b");
        assert!(b.roles.has(Role::Approver) && !b.roles.has(Role::Frontend));
        assert!(principal_of("u", &two, Some(b"team-c")).is_err());

        let admin = [("*", Role::Admin)];
        let p = principal_of("ops", &admin, None).unwrap();
        assert_eq!(&*p.tenant, crate::scheduler::DEFAULT_TENANT);
        assert!(p.roles.has(Role::Admin));
        assert_eq!(
            &*principal_of("ops", &admin, Some(b"ops")).unwrap().tenant,
            "ops"
        );
    }

    #[test]
    fn grants_parse_tenant_and_role() {
        assert_eq!(
            parse_grant("team-a:frontend"),
            Some(("team-a", Role::Frontend))
        );
        assert_eq!(parse_grant("*:admin"), Some(("*", Role::Admin)));
        assert_eq!(parse_grant("team-a:root"), None);
        assert_eq!(parse_grant("a b:viewer"), None);
        assert_eq!(parse_grant("viewer"), None);
    }

    #[test]
    fn only_asymmetric_algorithms_are_named() {
        for refused in ["none", "HS256", "HS512", "", "rs256"] {
            assert_eq!(algorithm_named(refused), None, "{refused}");
        }
        assert_eq!(algorithm_named("ES256"), Some(Algorithm::ES256));
    }
}
