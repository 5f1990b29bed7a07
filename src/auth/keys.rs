//! API keys: `sa_<key_id>_<secret>`, the secret 32 random bytes in
//! base64url without padding. The server keeps only the SHA-256 digest of
//! the whole key, so a leaked config names keys but grants nothing.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

pub use crate::config::auth::{is_key_id, MAX_KEY_ID_BYTES};

/// Prefix of every key (a JWT never starts with it).
pub const PREFIX: &str = "sa_";
/// Random bytes in a key's secret.
pub const SECRET_BYTES: usize = 32;
/// Length of the secret's base64url text (no padding).
const SECRET_CHARS: usize = 43;
/// A SHA-256 digest.
pub type KeyDigest = [u8; 32];

/// A key split into its id and secret, not yet checked against any entry.
#[derive(Debug, PartialEq, Eq)]
pub struct ParsedKey<'a> {
    /// The key id (letters and digits).
    pub key_id: &'a str,
    /// The whole key, for its digest.
    pub whole: &'a str,
}

/// Splits a key; None when it does not have the shape of one (the caller
/// answers `malformed`).
pub fn parse(key: &str) -> Option<ParsedKey<'_>> {
    let rest = key.strip_prefix(PREFIX)?;
    // The key id has no '_', so the first one ends it; the secret's
    // alphabet (base64url) may contain '_' itself.
    let (key_id, secret) = rest.split_once('_')?;
    if !is_key_id(key_id) || secret.len() != SECRET_CHARS {
        return None;
    }
    let decoded = URL_SAFE_NO_PAD.decode(secret).ok()?;
    (decoded.len() == SECRET_BYTES).then_some(ParsedKey { key_id, whole: key })
}

/// SHA-256 of the whole key.
pub fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Compares digests in constant time.
pub fn digests_equal(a: &KeyDigest, b: &KeyDigest) -> bool {
    a.ct_eq(b).into()
}

/// Lower-case hex of a digest, as config files hold it.
pub fn digest_hex(d: &KeyDigest) -> String {
    hex::encode(d)
}

/// Parses the hex digest of a config entry.
pub fn parse_digest_hex(s: &str) -> Option<KeyDigest> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut out).ok()?;
    Some(out)
}

/// A fresh key with id `key_id` (already validated), from the OS's
/// random source.
pub fn generate(key_id: &str) -> anyhow::Result<String> {
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
    Ok(format!(
        "{PREFIX}{key_id}_{}",
        URL_SAFE_NO_PAD.encode(secret)
    ))
}

/// A fresh key id: 16 random letters and digits.
pub fn generate_key_id() -> anyhow::Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
    // 256 is not a multiple of 36; the bias (at most 1/256 per character)
    // does not matter for an identifier that is not secret.
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_parses_and_its_digest_round_trips() {
        let id = generate_key_id().unwrap();
        assert!(is_key_id(&id));
        let key = generate(&id).unwrap();
        let parsed = parse(&key).expect("a generated key parses");
        assert_eq!(parsed.key_id, id);
        let d = digest(&key);
        assert_eq!(parse_digest_hex(&digest_hex(&d)), Some(d));
        assert!(digests_equal(&d, &digest(&key)));
        assert!(!digests_equal(&d, &digest("sa_other")));
        assert_ne!(generate(&id).unwrap(), key, "secrets are random");
    }

    #[test]
    fn malformed_keys_are_refused() {
        let good = generate("abc").unwrap();
        let secret = good.strip_prefix("sa_abc_").unwrap();
        for bad in [
            String::new(),
            "sa_".into(),
            "sa_abc".into(),
            format!("xx_abc_{secret}"),
            format!("sa__{secret}"),
            format!("sa_a-b_{secret}"),
            format!("sa_abc_{}", &secret[1..]),
            format!("sa_abc_{secret}A"),
            format!("sa_abc_{}!", &secret[1..]),
            format!("sa_{}_{secret}", "a".repeat(65)),
        ] {
            assert_eq!(parse(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn secrets_may_contain_underscores() {
        // 32 bytes of 0xff encode to '_' characters in base64url.
        let key = format!("sa_k1_{}", URL_SAFE_NO_PAD.encode([0xffu8; 32]));
        assert!(key.matches('_').count() > 2);
        assert_eq!(parse(&key).map(|p| p.key_id), Some("k1"));
    }

    #[test]
    fn digest_hex_is_checked() {
        assert_eq!(parse_digest_hex("00"), None);
        assert_eq!(parse_digest_hex(&"zz".repeat(32)), None);
        assert_eq!(parse_digest_hex(&"Ab".repeat(32)), Some([0xab; 32]));
    }
}
