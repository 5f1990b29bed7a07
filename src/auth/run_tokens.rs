//! Run credentials: under `[auth] mode = "required"` every in-process run
//! gets a token of its own (`SUBAGENTD_TOKEN` for a command run's program),
//! so what it starts can call the API back — spawn children, await them —
//! as a frontend of the run's tenant, without a key of its own.
//!
//! A token is `sar_<id>_<secret>` (the id 32 hex digits, the secret 32
//! random bytes in base64url), held only by this server's memory as the
//! SHA-256 digest of the whole token, and valid exactly as long as its
//! [`RunCredential`] guard lives: the run's task drops it when the run
//! ends, for whatever reason, which also ends the streams it opened. A
//! restart forgets every token, as it interrupts every in-process run.

use std::{collections::HashMap, sync::Arc};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{
    keys::{self, KeyDigest},
    AuthError, Cause, Principal, Role,
};
use crate::scheduler::{AgentId, RunCredential};

/// Prefix of every run token (no API key or JWT starts with it).
pub const PREFIX: &str = "sar_";
/// How a run credential's principal is named: `run:<agent id>`.
pub const PRINCIPAL_PREFIX: &str = "run:";
/// Hex digits of a token's id.
const ID_CHARS: usize = 32;
/// Length of the secret's base64url text (no padding).
const SECRET_CHARS: usize = 43;

/// The tokens of the live runs. Shared by every authenticator the keyring
/// builds, so a reload keeps them.
#[derive(Debug, Default)]
pub struct RunTokens {
    live: Mutex<HashMap<[u8; ID_CHARS / 2], Entry>>,
}

#[derive(Debug)]
struct Entry {
    digest: KeyDigest,
    principal: Principal,
    /// Cancelled when the run ends: streams opened with the token end.
    ended: CancellationToken,
}

impl RunTokens {
    /// The principal of run token `token` (it starts with [`PREFIX`]).
    /// A token whose run ended and one that never existed get the same
    /// answer, after the same work.
    pub fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let (id, _) = parse(token).ok_or(AuthError::Unauthenticated(Cause::Malformed))?;
        let presented = keys::digest(token);
        let live = self.live.lock();
        match live.get(&id) {
            Some(entry) if keys::digests_equal(&presented, &entry.digest) => {
                Ok(entry.principal.clone())
            }
            _ => Err(AuthError::Unauthenticated(Cause::Unknown)),
        }
    }

    /// Cancelled when the run of `token` ends (already, for a token not
    /// live now); None for what is not a run token.
    pub fn ended(&self, token: &str) -> Option<CancellationToken> {
        let (id, _) = parse(token)?;
        Some(self.live.lock().get(&id).map_or_else(
            || {
                let gone = CancellationToken::new();
                gone.cancel();
                gone
            },
            |e| e.ended.clone(),
        ))
    }

    /// A new token for the run of `agent`, in `tenant`.
    pub(super) fn issue_for(
        self: &Arc<Self>,
        tenant: &Arc<str>,
        agent: AgentId,
    ) -> Option<RunCredential> {
        let mut random = [0u8; ID_CHARS / 2 + keys::SECRET_BYTES];
        // No randomness, no token: the program then runs without one (its
        // calls are refused) rather than with a guessable one.
        getrandom::fill(&mut random).ok()?;
        let (id, secret) = random.split_at(ID_CHARS / 2);
        let id: [u8; ID_CHARS / 2] = id.try_into().expect("split at the id's length");
        let token: Arc<str> = format!(
            "{PREFIX}{}_{}",
            hex::encode(id),
            URL_SAFE_NO_PAD.encode(secret)
        )
        .into();
        let principal = Principal {
            tenant: tenant.clone(),
            roles: [Role::Frontend].into_iter().collect(),
            name: format!("{PRINCIPAL_PREFIX}{agent}").into(),
            agent_types: None,
            expires: None,
        };
        let ended = CancellationToken::new();
        self.live.lock().insert(
            id,
            Entry {
                digest: keys::digest(&token),
                principal,
                ended: ended.clone(),
            },
        );
        let revoke = Revoke {
            tokens: Arc::clone(self),
            id,
            ended,
        };
        Some(RunCredential::new(token, Box::new(revoke)))
    }

    /// How many runs hold a token now.
    pub fn len(&self) -> usize {
        self.live.lock().len()
    }

    /// Whether no run holds a token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Revokes its token when dropped (the run ended).
struct Revoke {
    tokens: Arc<RunTokens>,
    id: [u8; ID_CHARS / 2],
    ended: CancellationToken,
}

impl Drop for Revoke {
    fn drop(&mut self) {
        self.tokens.live.lock().remove(&self.id);
        self.ended.cancel();
    }
}

/// The id of a token of the right shape, and its secret's text.
fn parse(token: &str) -> Option<([u8; ID_CHARS / 2], &str)> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id_hex, secret) = rest.split_at_checked(ID_CHARS)?;
    let secret = secret.strip_prefix('_')?;
    if secret.len() != SECRET_CHARS || URL_SAFE_NO_PAD.decode(secret).is_err() {
        return None;
    }
    let mut id = [0u8; ID_CHARS / 2];
    hex::decode_to_slice(id_hex, &mut id).ok()?;
    Some((id, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_acts_for_its_run_while_the_run_lives() {
        let tokens = Arc::new(RunTokens::default());
        let a = AgentId::new_v4();
        let credential = tokens.issue_for(&"team-a".into(), a).unwrap();
        let token = credential.token().to_string();
        assert!(token.starts_with(PREFIX));
        let p = tokens.authenticate(&token).unwrap();
        assert_eq!(&*p.tenant, "team-a");
        assert!(p.roles.has(Role::Frontend) && !p.roles.has(Role::Admin));
        assert_eq!(&*p.name, format!("run:{a}"));
        let ended = tokens.ended(&token).unwrap();
        assert!(!ended.is_cancelled());

        // Another secret under the same id is unknown, like a made-up id.
        // The secret's first character, not its last: the last one of an
        // unpadded base64 text carries fewer bits, and most replacements
        // there make a non-canonical encoding (malformed, not unknown).
        let at = PREFIX.len() + ID_CHARS + 1;
        let first = token[at..].chars().next().unwrap();
        let mut forged = token.clone();
        forged.replace_range(at..at + 1, if first == 'A' { "B" } else { "A" });
        assert_eq!(
            tokens.authenticate(&forged),
            Err(AuthError::Unauthenticated(Cause::Unknown))
        );

        drop(credential);
        assert!(ended.is_cancelled(), "the run's streams end with it");
        assert_eq!(
            tokens.authenticate(&token),
            Err(AuthError::Unauthenticated(Cause::Unknown))
        );
        assert!(tokens.ended(&token).unwrap().is_cancelled());
        assert!(tokens.is_empty());
    }

    #[test]
    fn what_is_not_a_run_token_is_malformed() {
        let tokens = RunTokens::default();
        for bad in [
            "sar_",
            "sar_abc_def",
            &format!("sar_{}_{}", "g".repeat(32), "A".repeat(43)),
            &format!("sar_{}_{}", "0".repeat(32), "A".repeat(42)),
            &format!("sar_{}-{}", "0".repeat(32), "A".repeat(43)),
        ] {
            assert_eq!(
                tokens.authenticate(bad),
                Err(AuthError::Unauthenticated(Cause::Malformed)),
                "{bad}"
            );
        }
        assert_eq!(
            tokens.authenticate(&format!("sar_{}_{}", "0".repeat(32), "A".repeat(43))),
            Err(AuthError::Unauthenticated(Cause::Unknown))
        );
    }
}
