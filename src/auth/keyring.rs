//! The keys a server accepts now: `[auth.keys]` plus the files of `[auth]
//! keys_dir`, rebuilt into a fresh [`Authenticator`] whenever either
//! changes and swapped in whole, so a call sees one consistent set.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::scheduler::{AgentId, RunCredential, RunCredentials};

use super::{
    jwt::JwtVerifier, AuthConfig, AuthError, Authenticator, Credential, KeyConfig, Principal,
};

/// How often the keys directory is read again: twice within the 10 s in
/// which a changed Secret must take effect.
pub const KEYS_DIR_POLL: Duration = Duration::from_secs(5);

/// The current authenticator, read by every call, and a signal of each
/// change, on which open streams check their credential again.
#[derive(Debug, Clone)]
pub struct SharedAuthenticator(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    current: ArcSwap<Authenticator>,
    changes: tokio::sync::watch::Sender<u64>,
}

impl SharedAuthenticator {
    /// Shares `auth` until the first change.
    pub fn new(auth: Authenticator) -> Self {
        Self(Arc::new(Shared {
            current: ArcSwap::from_pointee(auth),
            changes: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// The authenticator now.
    pub fn load(&self) -> arc_swap::Guard<Arc<Authenticator>> {
        self.0.current.load()
    }

    fn store(&self, auth: Authenticator) {
        self.0.current.store(Arc::new(auth));
        self.0.changes.send_modify(|n| *n += 1);
    }

    /// Follows `credential` (a call's, accepted as `principal`) through
    /// later changes and to its expiry, for a stream that must end when
    /// the credential is no longer accepted.
    pub fn follow(&self, credential: Credential<'_>, principal: &Principal) -> Revocation {
        Revocation {
            auth: self.clone(),
            authorization: credential.authorization.map(Box::from),
            peer_sans: credential.peer_sans.map(Arc::from),
            tenant: credential.tenant.map(Box::from),
            changes: self.0.changes.subscribe(),
            expires: principal.expires,
            run_ended: credential
                .authorization
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(super::authenticator::bearer_token)
                .and_then(|token| self.load().run_tokens().ended(token)),
        }
    }
}

/// A stream's credential, watched for revocation (see
/// [`SharedAuthenticator::follow`]).
#[derive(Debug, Clone)]
pub struct Revocation {
    auth: SharedAuthenticator,
    authorization: Option<Box<[u8]>>,
    peer_sans: Option<Arc<[Arc<str>]>>,
    tenant: Option<Box<[u8]>>,
    changes: tokio::sync::watch::Receiver<u64>,
    /// When to check again without a change: the credential's expiry.
    expires: Option<SystemTime>,
    /// A run token's: cancelled when its run ends.
    run_ended: Option<CancellationToken>,
}

impl Revocation {
    /// Resolves, with the refusal a new call would get, once the
    /// credential is no longer accepted: its key removed or changed, or
    /// (a JWT) its expiry passed. Never, while it still is.
    pub async fn revoked(&mut self) -> AuthError {
        loop {
            let expiry = async {
                match self.expires {
                    Some(at) => {
                        let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                        tokio::time::sleep(left).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let run_ended = async {
                match &self.run_ended {
                    Some(ended) => ended.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = run_ended => {}
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        // The keyring is gone (the server is stopping).
                        return std::future::pending().await;
                    }
                }
                () = expiry => {}
            }
            match self.auth.load().authenticate_call(Credential {
                authorization: self.authorization.as_deref(),
                peer_sans: self.peer_sans.as_deref(),
                tenant: self.tenant.as_deref(),
            }) {
                Err(refusal) => return refusal,
                // Still accepted (a token refreshed under the same keys
                // keeps its own expiry; the wall clock may have stepped).
                Ok(principal) => self.expires = principal.expires,
            }
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Keyring {
    state: Mutex<State>,
    current: SharedAuthenticator,
}

#[derive(Debug)]
struct State {
    config: AuthConfig,
    /// What the keys directory held at the last read (valid entries).
    dir_keys: BTreeMap<String, KeyConfig>,
    /// The files refused at the last read, by name, so each problem is
    /// logged once, not at every poll.
    refused: BTreeMap<String, String>,
    /// `[auth.jwt]`'s verifier, kept across rebuilds while that section
    /// stays the same (its keys were fetched once).
    jwt: Option<Arc<JwtVerifier>>,
}

impl Keyring {
    /// The keyring of a validated `[auth]`, with its directory read now.
    pub fn new(config: &AuthConfig) -> Self {
        let (dir_keys, refused) = read_dir(&config.keys_dir);
        log_refused(&BTreeMap::new(), &refused);
        let jwt = config.jwt.clone().map(|c| Arc::new(JwtVerifier::new(c)));
        let current = SharedAuthenticator::new(Authenticator::with_dir_keys(
            config,
            &dir_keys,
            jwt.clone(),
            Arc::default(),
        ));
        Self {
            state: Mutex::new(State {
                config: config.clone(),
                dir_keys,
                refused,
                jwt,
            }),
            current,
        }
    }

    /// The authenticator calls use; it follows every change.
    pub fn shared(&self) -> SharedAuthenticator {
        self.current.clone()
    }

    /// The JWT verifier of the current `[auth.jwt]`, if any (the refresh
    /// task loads its keys).
    pub fn jwt(&self) -> Option<Arc<JwtVerifier>> {
        self.state.lock().jwt.clone()
    }

    /// A reloaded `[auth]` (SIGHUP): applied with its directory read again.
    /// A changed `[auth.jwt]` gets a new verifier (a JWKS file is read at
    /// once; a URL at the refresh task's next turn).
    pub fn reconfigure(&self, config: &AuthConfig) {
        let (dir_keys, refused) = read_dir(&config.keys_dir);
        let mut state = self.state.lock();
        log_refused(&state.refused, &refused);
        if state.jwt.as_ref().map(|v| v.config()) != config.jwt.as_ref() {
            state.jwt = config.jwt.clone().map(|c| Arc::new(JwtVerifier::new(c)));
        }
        // SIGHUP reads the JWKS again at once: a file here, a URL by the
        // refresh task.
        if let Some(verifier) = &state.jwt {
            if verifier.config().jwks_file.is_empty() {
                verifier.fetch_soon();
            } else {
                let read = std::fs::read(&verifier.config().jwks_file)
                    .map_err(|e| e.to_string())
                    .and_then(|text| verifier.install(&text));
                if let Err(e) = read {
                    warn!(error = %e, "JWKS file not usable; keeping the keys in use");
                }
            }
        }
        state.config = config.clone();
        state.dir_keys = dir_keys;
        state.refused = refused;
        self.current.store(Authenticator::with_dir_keys(
            &state.config,
            &state.dir_keys,
            state.jwt.clone(),
            self.current.load().run_tokens().clone(),
        ));
    }

    /// Reads the keys directory again; swaps in a new authenticator when
    /// what it holds changed. Returns whether it did.
    pub fn refresh(&self) -> bool {
        let dir = self.state.lock().config.keys_dir.clone();
        if dir.is_empty() {
            return false;
        }
        // Read without the lock: a slow volume must not stall a reload.
        let (dir_keys, refused) = read_dir(&dir);
        let mut state = self.state.lock();
        if state.config.keys_dir != dir {
            return false; // reconfigured meanwhile; that read is newer
        }
        log_refused(&state.refused, &refused);
        state.refused = refused;
        if state.dir_keys == dir_keys {
            return false;
        }
        state.dir_keys = dir_keys;
        let auth = Authenticator::with_dir_keys(
            &state.config,
            &state.dir_keys,
            state.jwt.clone(),
            self.current.load().run_tokens().clone(),
        );
        info!(keys = auth.key_count(), dir = %dir, "API keys changed in the keys directory");
        self.current.store(auth);
        true
    }
}

fn log_refused(before: &BTreeMap<String, String>, now: &BTreeMap<String, String>) {
    for (file, why) in now {
        if before.get(file) != Some(why) {
            warn!(file = %file, error = %why, "key file refused; that key is not accepted");
        }
    }
}

/// The valid key entries of `dir` by key id (the file name), and the
/// refused files with the reason. Names starting with `.` are skipped:
/// a mounted Secret keeps its versions in `..data` and `..<timestamp>`
/// directories, and the visible names are symlinks through `..data`.
/// A missing directory holds no keys (and says so).
fn read_dir(dir: &str) -> (BTreeMap<String, KeyConfig>, BTreeMap<String, String>) {
    let mut keys = BTreeMap::new();
    let mut refused = BTreeMap::new();
    if dir.is_empty() {
        return (keys, refused);
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            refused.insert(
                dir.to_owned(),
                format!("cannot read the keys directory: {e}"),
            );
            return (keys, refused);
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = Path::new(dir).join(&name);
        if !path.is_file() {
            continue;
        }
        match read_key_file(&path, &name) {
            Ok(key) => {
                keys.insert(name, key);
            }
            Err(why) => {
                refused.insert(path.display().to_string(), why);
            }
        }
    }
    (keys, refused)
}

fn read_key_file(path: &Path, id: &str) -> Result<KeyConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let key: KeyConfig = toml::from_str(&text).map_err(|e| format!("not a key entry: {e}"))?;
    key.check(&format!("auth.keys_dir/{id}"), id)
        .map_err(|e| e.to_string())?;
    Ok(key)
}

/// The scheduler's side: it asks for a token as each in-process run
/// starts, and gets one while calls need a credential (the mode may change
/// on reload; without authentication runs pay nothing).
#[derive(Debug, Clone)]
pub struct RunTokenIssuer(pub SharedAuthenticator);

impl RunCredentials for RunTokenIssuer {
    fn issue(&self, tenant: &Arc<str>, agent: AgentId) -> Option<RunCredential> {
        let auth = self.0.load();
        if !auth.required() {
            return None;
        }
        auth.run_tokens().issue_for(tenant, agent)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{keys, AuthMode, Role};
    use super::*;

    fn entry(key: &str, tenant: &str) -> String {
        format!(
            "sha256 = \"{}\"\ntenant = \"{tenant}\"\nroles = [\"frontend\"]\n",
            keys::digest_hex(&keys::digest(key))
        )
    }

    fn header(key: &str) -> String {
        format!("Bearer {key}")
    }

    #[test]
    fn keys_come_and_go_with_the_files_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = keys::generate("k1").unwrap();
        let k2 = keys::generate("k2").unwrap();
        std::fs::write(dir.path().join("k1"), entry(&k1, "a")).unwrap();
        let config = AuthConfig {
            mode: AuthMode::Required,
            keys_dir: dir.path().display().to_string(),
            ..AuthConfig::default()
        };
        config.validate().unwrap();
        let ring = Keyring::new(&config);
        let auth = ring.shared();
        let tenant = |key: &str| {
            auth.load()
                .authenticate(Some(header(key).as_bytes()))
                .map(|p| p.tenant.to_string())
        };
        assert_eq!(tenant(&k1).unwrap(), "a");
        assert!(tenant(&k2).is_err());
        assert!(!ring.refresh(), "nothing changed");

        std::fs::write(dir.path().join("k2"), entry(&k2, "b")).unwrap();
        std::fs::remove_file(dir.path().join("k1")).unwrap();
        // Hidden names (a Secret's ..data) and broken files are skipped.
        std::fs::write(dir.path().join("..data"), "junk").unwrap();
        std::fs::write(dir.path().join("k3"), "sha256 = 1").unwrap();
        assert!(ring.refresh());
        assert!(tenant(&k1).is_err(), "a removed key stops working");
        assert_eq!(tenant(&k2).unwrap(), "b");
        assert_eq!(auth.load().key_count(), 1);
    }

    #[test]
    fn a_config_entry_wins_over_a_file_of_the_same_id() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = keys::generate("k1").unwrap();
        std::fs::write(dir.path().join("k1"), entry(&k1, "from-file")).unwrap();
        let config = AuthConfig {
            mode: AuthMode::Required,
            keys_dir: dir.path().display().to_string(),
            keys: BTreeMap::from([(
                "k1".to_owned(),
                KeyConfig {
                    sha256: keys::digest_hex(&keys::digest(&k1)),
                    tenant: "from-config".into(),
                    roles: vec![Role::Viewer],
                    agent_types: None,
                },
            )]),
            ..AuthConfig::default()
        };
        let ring = Keyring::new(&config);
        let p = ring
            .shared()
            .load()
            .authenticate(Some(header(&k1).as_bytes()))
            .unwrap();
        assert_eq!(&*p.tenant, "from-config");
    }

    #[test]
    fn reconfigure_applies_a_new_mode_and_keys() {
        let ring = Keyring::new(&AuthConfig::default());
        let auth = ring.shared();
        assert!(auth.load().authenticate(None).is_ok(), "mode none");
        let k1 = keys::generate("k1").unwrap();
        ring.reconfigure(&AuthConfig {
            mode: AuthMode::Required,
            keys: BTreeMap::from([("k1".to_owned(), toml::from_str(&entry(&k1, "a")).unwrap())]),
            ..AuthConfig::default()
        });
        assert!(auth.load().authenticate(None).is_err());
        assert!(auth
            .load()
            .authenticate(Some(header(&k1).as_bytes()))
            .is_ok());
    }
}
