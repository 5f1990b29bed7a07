//! `[auth]`: credentials (API keys, client certificates, JWTs), tenants and
//! roles as the config names them, and their syntax rules. The checks of
//! credentials themselves live in `crate::auth`.

use std::{collections::BTreeMap, fmt, time::Duration};

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// `[auth] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No credential is asked for; every caller is the anonymous
    /// principal of tenant [`DEFAULT_TENANT`] with every role.
    #[default]
    None,
    /// Every call but health and reflection needs a credential one of the
    /// configured methods accepts.
    Required,
}

/// A role, as `[auth.keys.ID] roles` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Status, Await, WatchAgents.
    Viewer,
    /// Viewer, and Spawn, Cancel, Steer.
    Frontend,
    /// Viewer, and Approve.
    Approver,
    /// WorkerService.Connect for its agent types.
    Worker,
    /// Reads, watches, cancels and approves across tenants.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 5] = [
        Role::Viewer,
        Role::Frontend,
        Role::Approver,
        Role::Worker,
        Role::Admin,
    ];

    /// The name config and errors use.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Frontend => "frontend",
            Role::Approver => "approver",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[auth.keys.KEY_ID]`: one API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Lower-case hex SHA-256 of the whole key (`sa_<key_id>_<secret>`).
    pub sha256: String,
    /// The tenant the key acts in.
    pub tenant: String,
    /// What it may do.
    pub roles: Vec<Role>,
    /// For workers: the agent types it may serve (absent = every type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_types: Option<Vec<String>>,
}

/// `[[auth.certs]]`: the principal of client certificates with one SAN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertConfig {
    /// A subject alternative name, matched exactly: a URI (a SPIFFE id,
    /// `spiffe://cluster.local/ns/agents/sa/worker`) or a DNS name.
    pub san: String,
    /// The tenant its holder acts in.
    pub tenant: String,
    /// What it may do.
    pub roles: Vec<Role>,
    /// For workers: the agent types it may serve (absent = every type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_types: Option<Vec<String>>,
}

/// `[auth]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `"none"` (default) or `"required"`.
    pub mode: AuthMode,
    /// With mode `"none"`, allow listening on a non-loopback address.
    pub allow_unauthenticated: bool,
    /// API keys by key id.
    pub keys: BTreeMap<String, KeyConfig>,
    /// A directory with one file per key, named by its key id, holding the
    /// fields of `[auth.keys.KEY_ID]` as TOML (a mounted Kubernetes
    /// Secret). Re-read every few seconds and on SIGHUP. Empty: none.
    pub keys_dir: String,
    /// Client-certificate principals, by SAN (needs `[server.tls]
    /// client_auth`).
    pub certs: Vec<CertConfig>,
    /// `[auth.jwt]`: OIDC access tokens (absent: none accepted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtConfig>,
}

/// Longest accepted tenant name, in bytes.
pub const MAX_TENANT_BYTES: usize = 64;

/// Whether `name` is a valid tenant name: 1 to 64 ASCII letters, digits,
/// `-`, `_` or `.`.
pub fn is_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl KeyConfig {
    /// Checks the entry of key `id`; errors name `at` (its config key or
    /// file).
    pub fn check(&self, at: &str, id: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("{at}.{f}");
        if !is_key_id(id) {
            return Err(invalid(
                at,
                format!(
                    "key ids are 1 to {} ASCII letters and digits",
                    MAX_KEY_ID_BYTES
                ),
            ));
        }
        if !is_digest_hex(&self.sha256) {
            return Err(invalid(
                field("sha256"),
                "must be the 64 hex digits of the key's SHA-256 digest \
                 (`subagentd keys new` prints it)",
            ));
        }
        check_grant(at, &self.tenant, &self.roles, self.agent_types.as_deref())
    }
}

/// The rules a key's and a certificate's tenant, roles and agent types
/// share; errors name `at`.
fn check_grant(
    at: &str,
    tenant: &str,
    roles: &[Role],
    agent_types: Option<&[String]>,
) -> Result<(), ConfigError> {
    let field = |f: &str| format!("{at}.{f}");
    if !is_tenant_name(tenant) {
        return Err(invalid(
            field("tenant"),
            format!(
                "must be 1 to {MAX_TENANT_BYTES} ASCII letters, digits, '-', '_' or '.' \
                 (got {tenant:?})"
            ),
        ));
    }
    if roles.is_empty() {
        return Err(invalid(field("roles"), "must name at least one role"));
    }
    if agent_types.is_some_and(|t| t.is_empty()) {
        return Err(invalid(
            field("agent_types"),
            "must name at least one agent type (leave it out for every type)",
        ));
    }
    Ok(())
}

impl AuthConfig {
    /// Checks every rule; the error names the first broken key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (id, key) in &self.keys {
            key.check(&format!("auth.keys.{id}"), id)?;
        }
        let mut sans = std::collections::BTreeSet::new();
        for (i, cert) in self.certs.iter().enumerate() {
            let at = format!("auth.certs[{i}]");
            if cert.san.trim().is_empty() || cert.san.trim() != cert.san {
                return Err(invalid(
                    format!("{at}.san"),
                    "must be a URI or DNS name, without surrounding spaces",
                ));
            }
            if !sans.insert(cert.san.as_str()) {
                return Err(invalid(
                    format!("{at}.san"),
                    format!("{:?} is mapped twice; one SAN is one principal", cert.san),
                ));
            }
            check_grant(&at, &cert.tenant, &cert.roles, cert.agent_types.as_deref())?;
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate()?;
        }
        if self.mode == AuthMode::Required
            && self.keys.is_empty()
            && self.keys_dir.is_empty()
            && self.certs.is_empty()
            && self.jwt.is_none()
        {
            return Err(invalid(
                "auth.mode",
                "\"required\" needs a credential method: [auth.keys.KEY_ID] entries, \
                 [auth] keys_dir, [[auth.certs]] or [auth.jwt]",
            ));
        }
        Ok(())
    }
}

/// Longest accepted key id, in bytes.
pub const MAX_KEY_ID_BYTES: usize = 64;

/// Whether `id` is a valid key id: 1 to 64 ASCII letters and digits.
pub fn is_key_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_KEY_ID_BYTES && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `s` is the 64 hex digits of a SHA-256 digest (surrounding
/// whitespace ignored), as `[auth.keys.KEY_ID] sha256` holds it.
fn is_digest_hex(s: &str) -> bool {
    hex::decode_to_slice(s.trim(), &mut [0u8; 32]).is_ok()
}

/// Default `[auth.jwt] jwks_refresh`.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(5 * 60);
/// Default `[auth.jwt] permissions_claim` (Temporal's shape).
pub const DEFAULT_PERMISSIONS_CLAIM: &str = "permissions";
/// Default `[auth.jwt] leeway` (jsonwebtoken's too).
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);
/// The largest `[auth.jwt] leeway`: clocks minutes apart are a fault to fix,
/// not to tolerate.
const MAX_LEEWAY: Duration = Duration::from_secs(5 * 60);
/// `[auth.jwt]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// The `iss` every token carries.
    pub issuer: String,
    /// An `aud` every token carries.
    pub audience: String,
    /// A JWKS file (re-read every `jwks_refresh`).
    pub jwks_file: String,
    /// A JWKS URL (fetched every `jwks_refresh`).
    pub jwks_url: String,
    /// How often the JWKS is read again. Default 5 m.
    #[serde(with = "humantime_serde")]
    pub jwks_refresh: Duration,
    /// The claim holding `"<tenant>:<role>"` grants. Default `permissions`.
    pub permissions_claim: String,
    /// How far the issuer's clock may be from ours: a token is accepted
    /// until `exp` + leeway (and from `nbf` - leeway). Default 60 s.
    #[serde(with = "humantime_serde")]
    pub leeway: Duration,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            audience: String::new(),
            jwks_file: String::new(),
            jwks_url: String::new(),
            jwks_refresh: DEFAULT_JWKS_REFRESH,
            permissions_claim: DEFAULT_PERMISSIONS_CLAIM.to_owned(),
            leeway: DEFAULT_LEEWAY,
        }
    }
}

impl JwtConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.issuer.is_empty() {
            return Err(invalid(
                "auth.jwt.issuer",
                "must name the tokens' issuer (iss)",
            ));
        }
        if self.audience.is_empty() {
            return Err(invalid(
                "auth.jwt.audience",
                "must name this service's audience (aud)",
            ));
        }
        if self.jwks_file.is_empty() == self.jwks_url.is_empty() {
            return Err(invalid(
                "auth.jwt.jwks_file",
                "set exactly one of jwks_file and jwks_url",
            ));
        }
        let url = &self.jwks_url;
        if !url.is_empty() && !url.starts_with("https://") && !url.starts_with("http://") {
            return Err(invalid("auth.jwt.jwks_url", "must be an http(s) URL"));
        }
        if self.jwks_refresh < Duration::from_secs(1) {
            return Err(invalid("auth.jwt.jwks_refresh", "must be ≥ 1s"));
        }
        if self.permissions_claim.is_empty() {
            return Err(invalid("auth.jwt.permissions_claim", "must name a claim"));
        }
        if self.leeway > MAX_LEEWAY {
            return Err(invalid("auth.jwt.leeway", "must be ≤ 5m"));
        }
        Ok(())
    }
}
