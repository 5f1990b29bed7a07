//! Who is calling: credentials, principals and the role policy (the
//! `[auth]` config types live in `crate::config::auth`). Knows nothing of
//! tonic: `api::auth` reads the request headers, calls
//! [`Authenticator::authenticate`] and answers the errors.
//!
//! This root only declares modules and re-exports.

pub mod authenticator;
pub mod jwt;
pub mod keyring;
pub mod keys;
pub mod policy;
pub mod principal;
pub mod run_tokens;

pub use self::authenticator::{authorize, Authenticator, Credential};
pub use self::keyring::{Keyring, Revocation, SharedAuthenticator};
pub use self::principal::{join, AuthError, Cause, Principal, Roles};
pub use crate::config::auth::{
    is_tenant_name, AuthConfig, AuthMode, CertConfig, KeyConfig, Role, MAX_TENANT_BYTES,
};
pub use crate::scheduler::DEFAULT_TENANT;
