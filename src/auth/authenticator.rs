//! Who is calling: `[auth]` config, credentials, principals and the role
//! policy. Knows nothing of tonic: `api::auth` reads the request headers,
//! calls [`Authenticator::authenticate`] and answers the errors.

pub mod jwt;
pub mod keyring;
pub mod keys;
pub mod policy;
pub mod run_tokens;

pub use self::keyring::{Keyring, Revocation, SharedAuthenticator};

use std::{collections::BTreeMap, sync::Arc};

pub use crate::config::auth::{
    is_tenant_name, AuthConfig, AuthMode, CertConfig, KeyConfig, Role, MAX_TENANT_BYTES,
};

/// The role's bit in a [`Roles`] set.
fn bit(role: Role) -> u8 {
    1 << (role as u8)
}

/// A set of roles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Roles(u8);

impl Roles {
    /// Every role (the anonymous principal of mode `"none"`).
    pub fn all() -> Self {
        Role::ALL.into_iter().collect()
    }

    /// Whether `role` is in the set.
    pub fn has(self, role: Role) -> bool {
        self.0 & bit(role) != 0
    }

    /// Whether any of `roles` is in the set.
    pub fn any_of(self, roles: &[Role]) -> bool {
        roles.iter().any(|r| self.has(*r))
    }
}

impl FromIterator<Role> for Roles {
    fn from_iter<I: IntoIterator<Item = Role>>(iter: I) -> Self {
        Self(iter.into_iter().fold(0, |bits, r| bits | bit(r)))
    }
}

pub use crate::scheduler::DEFAULT_TENANT;

/// Who is calling: the tenant comes only from the credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant the caller acts in.
    pub tenant: Arc<str>,
    /// What it may do.
    pub roles: Roles,
    /// For logs: `key:<key id>`, or `anonymous`.
    pub name: Arc<str>,
    /// For workers: the agent types it may serve (None = every type).
    pub agent_types: Option<Arc<[String]>>,
    /// When the credential stops being accepted (a JWT's `exp` plus the
    /// leeway); None for what only a config change revokes.
    pub expires: Option<std::time::SystemTime>,
}

impl Principal {
    /// The caller of a server without authentication.
    pub fn anonymous() -> Self {
        Self {
            tenant: DEFAULT_TENANT.into(),
            roles: Roles::all(),
            name: "anonymous".into(),
            agent_types: None,
            expires: None,
        }
    }

    /// Whether a worker with this principal may serve `agent_type`.
    pub fn may_serve(&self, agent_type: &str) -> bool {
        self.agent_types
            .as_deref()
            .is_none_or(|types| types.iter().any(|t| t == agent_type))
    }
}

/// Why a credential was refused: the `cause` metadata of UNAUTHENTICATED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No credential.
    Missing,
    /// A well-formed credential nobody issued (or whose secret is wrong).
    Unknown,
    /// Not a credential of any accepted shape.
    Malformed,
    /// Past its expiry.
    Expired,
    /// Well-formed but not valid (signature, issuer, audience, …).
    Invalid,
}

impl Cause {
    /// The metadata value.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Missing => "missing",
            Cause::Unknown => "unknown",
            Cause::Malformed => "malformed",
            Cause::Expired => "expired",
            Cause::Invalid => "invalid",
        }
    }
}

/// A refused call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential or a bad one.
    #[error("{}", unauthenticated_message(*.0))]
    Unauthenticated(Cause),
    /// The principal lacks every role the method needs.
    #[error(
        "{method} needs one of the roles {}; the caller has none of them",
        join(required)
    )]
    PermissionDenied {
        /// The gRPC path.
        method: String,
        /// The roles that may call it (empty: nobody may).
        required: &'static [Role],
    },
    /// A JWT signed by a key id the JWKS does not hold: answered as an
    /// unknown credential, after one early refetch of the JWKS.
    #[error("{}", unauthenticated_message(Cause::Unknown))]
    UnknownSigningKey,
    /// A token granting several tenants without `subagentd-tenant`
    /// naming one of them, or naming one it does not grant.
    #[error("{}; its tenants: {}", tenant_refusal(asked.as_deref()), granted.join(", "))]
    TenantNotGranted {
        /// The tenant the header named.
        asked: Option<String>,
        /// The tenants the token grants.
        granted: Vec<String>,
    },
    /// A worker hello named agent types its credential does not cover.
    #[error("this worker's credential may not serve the agent types {}", .types.join(", "))]
    AgentTypesDenied {
        /// The types it may not serve.
        types: Vec<String>,
    },
}

fn tenant_refusal(asked: Option<&str>) -> String {
    match asked {
        Some(t) => format!("this token grants no access to tenant {t:?} (header subagentd-tenant)"),
        None => {
            "this token grants several tenants: name one in the subagentd-tenant header".to_owned()
        }
    }
}

fn unauthenticated_message(cause: Cause) -> &'static str {
    match cause {
        Cause::Missing => "this call needs a credential: send `authorization: Bearer <key>`",
        Cause::Unknown => "the credential is not known (wrong key id or secret, or revoked)",
        Cause::Malformed => {
            "the credential is malformed: expected `authorization: Bearer sa_<key id>_<secret>`"
        }
        Cause::Expired => "the credential has expired",
        Cause::Invalid => "the credential is not valid",
    }
}

/// Comma-separated role names, as `required_roles` lists them.
pub fn join(roles: &[Role]) -> String {
    roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(",")
}

/// One API key as the server checks it.
#[derive(Debug)]
struct KeyEntry {
    digest: keys::KeyDigest,
    principal: Principal,
}

/// Checks credentials against a validated `[auth]` config. Cheap to share:
/// the server holds one behind an `Arc` and swaps it on reload.
#[derive(Debug)]
pub struct Authenticator {
    mode: AuthMode,
    keys: BTreeMap<String, KeyEntry>,
    /// `[[auth.certs]]` by SAN.
    certs: BTreeMap<Arc<str>, Principal>,
    /// `[auth.jwt]`'s verifier.
    jwt: Option<Arc<jwt::JwtVerifier>>,
    /// Mode `"none"`'s principal, made once (not per call).
    anonymous: Principal,
    /// The live runs' tokens: the same set in every authenticator a
    /// keyring builds.
    run_tokens: Arc<run_tokens::RunTokens>,
}

/// Compared against when a key id is unknown, so that an unknown id costs
/// what a wrong secret costs.
const NO_DIGEST: keys::KeyDigest = [0; 32];

impl Authenticator {
    /// An authenticator for `config` (already validated) and no keys
    /// directory.
    pub fn new(config: &AuthConfig) -> Self {
        let jwt = config
            .jwt
            .clone()
            .map(|c| Arc::new(jwt::JwtVerifier::new(c)));
        Self::with_dir_keys(config, &BTreeMap::new(), jwt, Arc::default())
    }

    /// An authenticator for `config` (already validated) and the valid
    /// entries read from its keys directory; `[auth.keys]` wins over a file
    /// of the same key id.
    pub fn with_dir_keys(
        config: &AuthConfig,
        dir_keys: &BTreeMap<String, KeyConfig>,
        jwt: Option<Arc<jwt::JwtVerifier>>,
        run_tokens: Arc<run_tokens::RunTokens>,
    ) -> Self {
        let keys = dir_keys
            .iter()
            .filter(|(id, _)| !config.keys.contains_key(*id))
            .chain(&config.keys)
            .filter_map(|(id, key)| {
                let digest = keys::parse_digest_hex(&key.sha256)?;
                let principal = Principal {
                    tenant: key.tenant.as_str().into(),
                    roles: key.roles.iter().copied().collect(),
                    name: format!("key:{id}").into(),
                    agent_types: key.agent_types.clone().map(Into::into),
                    expires: None,
                };
                Some((id.clone(), KeyEntry { digest, principal }))
            })
            .collect();
        let certs = config
            .certs
            .iter()
            .map(|c| {
                let principal = Principal {
                    tenant: c.tenant.as_str().into(),
                    roles: c.roles.iter().copied().collect(),
                    name: format!("cert:{}", c.san).into(),
                    agent_types: c.agent_types.clone().map(Into::into),
                    expires: None,
                };
                (Arc::from(c.san.as_str()), principal)
            })
            .collect();
        Self {
            mode: config.mode,
            keys,
            certs,
            jwt,
            anonymous: Principal::anonymous(),
            run_tokens,
        }
    }

    /// The live runs' tokens.
    pub fn run_tokens(&self) -> &Arc<run_tokens::RunTokens> {
        &self.run_tokens
    }

    /// `[auth.jwt]`'s verifier, if configured.
    pub fn jwt(&self) -> Option<&Arc<jwt::JwtVerifier>> {
        self.jwt.as_ref()
    }

    /// Whether calls need a credential.
    pub fn required(&self) -> bool {
        self.mode == AuthMode::Required
    }

    /// How many keys it accepts.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The principal that may call `path` with the `authorization` header
    /// `authorization` (None: absent). With mode none nothing is checked:
    /// a method no service serves then reaches the router (UNIMPLEMENTED),
    /// while with mode required the policy refuses it first.
    pub fn check(&self, credential: Credential<'_>, path: &str) -> Result<Principal, AuthError> {
        let principal = self.authenticate_call(credential)?;
        if self.required() {
            authorize(&principal, path)?;
        }
        Ok(principal)
    }

    /// The principal of a call whose `authorization` header is
    /// `authorization` (None: absent), on a connection without a client
    /// certificate.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, AuthError> {
        self.authenticate_call(Credential {
            authorization,
            ..Credential::default()
        })
    }

    /// The principal of a call that presents `credential`: its
    /// `authorization` header when it sends one (a bearer credential
    /// speaks for the call), else its connection's client certificate.
    pub fn authenticate_call(&self, credential: Credential<'_>) -> Result<Principal, AuthError> {
        if self.mode == AuthMode::None {
            return Ok(self.anonymous.clone());
        }
        let Some(header) = credential.authorization else {
            return match credential.peer_sans {
                // A certificate the CA vouches for but no entry maps.
                Some(sans) => sans
                    .iter()
                    .find_map(|san| self.certs.get(san))
                    .cloned()
                    .ok_or(AuthError::Unauthenticated(Cause::Unknown)),
                None => Err(AuthError::Unauthenticated(Cause::Missing)),
            };
        };
        let token = std::str::from_utf8(header)
            .ok()
            .and_then(bearer_token)
            .ok_or(AuthError::Unauthenticated(Cause::Malformed))?;
        if token.starts_with(run_tokens::PREFIX) {
            return self.run_tokens.authenticate(token);
        }
        if !token.starts_with(keys::PREFIX) {
            if let Some(verifier) = &self.jwt {
                return verifier.verify(token, credential.tenant).map_err(
                    |refusal| match refusal {
                        jwt::Refusal::Auth(e) => e,
                        jwt::Refusal::UnknownKey => AuthError::UnknownSigningKey,
                    },
                );
            }
        }
        let parsed = keys::parse(token).ok_or(AuthError::Unauthenticated(Cause::Malformed))?;
        let presented = keys::digest(parsed.whole);
        let entry = self.keys.get(parsed.key_id);
        let expected = entry.map_or(&NO_DIGEST, |e| &e.digest);
        match entry {
            Some(entry) if keys::digests_equal(&presented, expected) => Ok(entry.principal.clone()),
            _ => {
                // Same work for an unknown id as for a wrong secret.
                let _ = keys::digests_equal(&presented, expected);
                Err(AuthError::Unauthenticated(Cause::Unknown))
            }
        }
    }
}

/// What a call presents to be authenticated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credential<'a> {
    /// The `authorization` header's value.
    pub authorization: Option<&'a [u8]>,
    /// The SANs (URIs and DNS names) of the connection's verified client
    /// certificate; None without one.
    pub peer_sans: Option<&'a [Arc<str>]>,
    /// The `subagentd-tenant` header: which of a JWT's tenants to act in.
    pub tenant: Option<&'a [u8]>,
}

/// The token of `Bearer <token>` (the scheme is case-insensitive, RFC 9110).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim_start();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Checks that `principal` may call `path` ([`policy::POLICY`]).
pub fn authorize(principal: &Principal, path: &str) -> Result<(), AuthError> {
    let required = policy::roles_for(path);
    if principal.roles.any_of(required) {
        Ok(())
    } else {
        Err(AuthError::PermissionDenied {
            method: path.to_owned(),
            required,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(key: &str, roles: Vec<Role>) -> AuthConfig {
        let id = keys::parse(key).unwrap().key_id.to_owned();
        AuthConfig {
            mode: AuthMode::Required,
            allow_unauthenticated: false,
            keys_dir: String::new(),
            certs: Vec::new(),
            jwt: None,
            keys: BTreeMap::from([(
                id,
                KeyConfig {
                    sha256: keys::digest_hex(&keys::digest(key)),
                    tenant: "team-a".into(),
                    roles,
                    agent_types: None,
                },
            )]),
        }
    }

    #[test]
    fn a_configured_key_authenticates_as_its_principal() {
        let key = keys::generate("k1").unwrap();
        let config = config_with(&key, vec![Role::Frontend]);
        config.validate().unwrap();
        let auth = Authenticator::new(&config);
        let header = format!("Bearer {key}");
        let p = auth.authenticate(Some(header.as_bytes())).unwrap();
        assert_eq!(&*p.tenant, "team-a");
        assert_eq!(&*p.name, "key:k1");
        assert!(p.roles.has(Role::Frontend) && !p.roles.has(Role::Admin));
        let lower = format!("bearer {key}");
        assert!(auth.authenticate(Some(lower.as_bytes())).is_ok());
    }

    #[test]
    fn refusals_name_their_cause() {
        let key = keys::generate("k1").unwrap();
        let auth = Authenticator::new(&config_with(&key, vec![Role::Viewer]));
        let cause = |h: Option<&str>| match auth.authenticate(h.map(str::as_bytes)) {
            Err(AuthError::Unauthenticated(c)) => c,
            other => panic!("{other:?}"),
        };
        assert_eq!(cause(None), Cause::Missing);
        assert_eq!(cause(Some(&key)), Cause::Malformed, "no Bearer scheme");
        assert_eq!(cause(Some("Basic abc")), Cause::Malformed);
        assert_eq!(cause(Some("Bearer sa_k1_short")), Cause::Malformed);
        let other_secret = keys::generate("k1").unwrap();
        assert_eq!(
            cause(Some(&format!("Bearer {other_secret}"))),
            Cause::Unknown
        );
        let other_id = keys::generate("k2").unwrap();
        assert_eq!(cause(Some(&format!("Bearer {other_id}"))), Cause::Unknown);
    }

    #[test]
    fn mode_none_is_the_anonymous_principal_with_every_role() {
        let auth = Authenticator::new(&AuthConfig::default());
        let p = auth.authenticate(None).unwrap();
        assert_eq!(p, Principal::anonymous());
        for (path, _) in policy::POLICY {
            authorize(&p, path).unwrap();
        }
    }

    #[test]
    fn authorize_lists_the_roles_a_method_needs() {
        let p = Principal {
            roles: [Role::Viewer].into_iter().collect(),
            ..Principal::anonymous()
        };
        authorize(&p, "/subagents.v1.AgentService/Status").unwrap();
        let err = authorize(&p, "/subagents.v1.AgentService/Spawn").unwrap_err();
        assert_eq!(
            err,
            AuthError::PermissionDenied {
                method: "/subagents.v1.AgentService/Spawn".into(),
                required: &[Role::Frontend, Role::Admin],
            }
        );
        assert!(err.to_string().contains("frontend,admin"));
        assert!(authorize(&Principal::anonymous(), "/x.Y/Z").is_err());
    }

    #[test]
    fn config_rules() {
        let key = keys::generate("k1").unwrap();
        let good = config_with(&key, vec![Role::Worker]);
        good.validate().unwrap();
        let broken = |f: &dyn Fn(&mut KeyConfig)| {
            let mut c = good.clone();
            f(c.keys.get_mut("k1").unwrap());
            c.validate().unwrap_err().to_string()
        };
        assert!(broken(&|k| k.sha256 = "abc".into()).contains("auth.keys.k1.sha256"));
        assert!(broken(&|k| k.tenant = "a b".into()).contains("auth.keys.k1.tenant"));
        assert!(broken(&|k| k.roles.clear()).contains("auth.keys.k1.roles"));
        assert!(broken(&|k| k.agent_types = Some(vec![])).contains("agent_types"));
        let mut bad_id = good.clone();
        let entry = bad_id.keys.remove("k1").unwrap();
        bad_id.keys.insert("k-1".into(), entry);
        assert!(bad_id
            .validate()
            .unwrap_err()
            .to_string()
            .contains("auth.keys.k-1"));
        let empty = AuthConfig {
            mode: AuthMode::Required,
            ..AuthConfig::default()
        };
        assert!(empty
            .validate()
            .unwrap_err()
            .to_string()
            .contains("auth.mode"));
    }

    #[test]
    fn worker_agent_types_limit_what_it_serves() {
        let mut p = Principal::anonymous();
        assert!(p.may_serve("anything"));
        p.agent_types = Some(vec!["coder".to_owned()].into());
        assert!(p.may_serve("coder"));
        assert!(!p.may_serve("writer"));
    }
}
