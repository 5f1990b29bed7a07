//! Checking credentials: [`Authenticator`] over a validated `[auth]`
//! config (API keys by constant-time digest comparison, certificate SANs,
//! JWTs through `jwt`, run tokens), and [`authorize`] against the role
//! policy.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    jwt, keys, policy,
    principal::{AuthError, Cause, Principal},
    run_tokens,
};
use crate::config::auth::{AuthConfig, AuthMode, KeyConfig};

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
pub(super) fn bearer_token(header: &str) -> Option<&str> {
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
    use crate::auth::Role;

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
