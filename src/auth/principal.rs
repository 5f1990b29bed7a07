//! Who is calling ([`Principal`]: a tenant, roles, a name) and why a call
//! was refused ([`AuthError`]); the vocabulary every part of `auth` and the
//! API's layer share.

use std::sync::Arc;

pub use crate::config::auth::Role;
use crate::scheduler::DEFAULT_TENANT;

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
