//! How subagentd reaches PostgreSQL: the URL, the password file, and TLS
//! with libpq's `sslmode` meanings over rustls (the crypto provider the
//! binary already uses), so managed databases that require TLS work.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default, as libpq) | if the server offers it | not checked |
//! | `require` | always | not checked; with a CA file, as `verify-ca` (libpq does the same) |
//! | `verify-ca` | always | signed by a trusted CA |
//! | `verify-full` | always | signed by a trusted CA and issued for the host connected to |
//!
//! The CA is `sslrootcert` in the URL, else `[store] tls_ca_file`, else the
//! web PKI roots (also what `sslrootcert=system` names; as in libpq, it
//! then means verify-full). A client certificate
//! for PostgreSQL's `cert` authentication is `sslcert`/`sslkey`, else
//! `[store] tls_cert_file`/`tls_key_file`. A parameter in the URL wins
//! over the `[store]` key. tokio-postgres reads none of these parameters
//! but `sslmode=disable|prefer|require`, so they are taken out of the URL
//! here and the rest is handed to it unchanged.

use std::{fmt, path::PathBuf, str::FromStr, sync::Arc};

use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WebPkiServerVerifier,
    },
    crypto::CryptoProvider,
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::StoreConfig;

/// The connector every PostgreSQL connection of the store and the lease
/// uses (one type whatever the mode; `disable` never calls it).
pub type Tls = MakeRustlsConnect;

/// `sslmode`, with libpq's meanings (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, its certificate not checked.
    #[default]
    Prefer,
    /// TLS always, the certificate not checked (unless a CA is given).
    Require,
    /// TLS always, the certificate signed by a trusted CA.
    VerifyCa,
    /// As `VerifyCa`, and issued for the host name connected to.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode \"allow\" is not supported: use \"disable\" or \"prefer\"".into(),
                )
            }
            other => {
                return Err(format!(
                "sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        })
    }
}

/// A file and where it was named, for messages ("sslrootcert in the URL",
/// "store.tls_ca_file").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The file.
    pub path: PathBuf,
    /// Where it was named.
    pub by: &'static str,
}

/// How to reach the database besides its URL: `[store]`'s password file
/// and TLS files. The URL's own parameters win over the TLS files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Holds the password (one trailing newline trimmed); overrides a
    /// password in the URL.
    pub password_file: Option<PathBuf>,
    /// `[store] tls_ca_file`.
    pub ca_file: Option<PathBuf>,
    /// `[store] tls_cert_file`.
    pub cert_file: Option<PathBuf>,
    /// `[store] tls_key_file`.
    pub key_file: Option<PathBuf>,
}

impl ConnectOptions {
    /// The options `[store]` sets.
    pub fn of(store: &StoreConfig) -> Self {
        Self {
            password_file: store.password_file.clone(),
            ca_file: store.tls_ca_file.clone(),
            cert_file: store.tls_cert_file.clone(),
            key_file: store.tls_key_file.clone(),
        }
    }
}

/// The TLS settings of one connection, the URL's and `[store]`'s merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `sslmode` (default `prefer`).
    pub mode: SslMode,
    /// The CA file, if one was named.
    pub ca: Option<Named>,
    /// The client certificate and its key, if named.
    pub client: Option<(Named, Named)>,
}

/// The URL's parameters that are ours to read.
const PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Takes the TLS parameters out of `url` (a `postgres://` URL or a libpq
/// `key=value` string) and merges them with `options`' files. Returns the
/// URL left for tokio-postgres and the settings.
pub fn split_url(url: &str, options: &ConnectOptions) -> Result<(String, TlsSettings), String> {
    let mut found: [Option<String>; 4] = Default::default();
    let mut take = |key: &str, value: String| match PARAMS.iter().position(|p| *p == key) {
        Some(i) => {
            found[i] = Some(value);
            true
        }
        None => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    let value = percent_encoding::percent_decode_str(value)
                        .decode_utf8()
                        .map_err(|e| format!("parameter {key} is not UTF-8: {e}"))?;
                    if !take(key, value.into_owned()) {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // libpq's key=value form: the pairs not taken, each as written.
        let mut kept = Vec::new();
        for (key, value, text) in conninfo_pairs(url)? {
            if !take(key, value) {
                kept.push(text);
            }
        }
        kept.join(" ")
    };
    let [mode, rootcert, cert, key] = found;
    let mode = match mode {
        Some(mode) => Some(mode.parse::<SslMode>()?),
        None => None,
    };
    // libpq's `sslrootcert=system`: the system's (here the web PKI) roots,
    // and then nothing weaker than verify-full.
    let (rootcert, mode) = match (rootcert.as_deref(), mode) {
        (Some("system"), None | Some(SslMode::VerifyFull)) => (None, SslMode::VerifyFull),
        (Some("system"), Some(weaker)) => {
            return Err(format!(
                "sslrootcert=system needs sslmode=verify-full (libpq's rule), not {weaker}"
            ))
        }
        (_, mode) => (rootcert, mode.unwrap_or_default()),
    };
    let named = |url: Option<String>, by_url, file: &Option<PathBuf>, by_key| match url {
        Some(path) => Some(Named {
            path: path.into(),
            by: by_url,
        }),
        None => file.clone().map(|path| Named { path, by: by_key }),
    };
    let ca = named(
        rootcert,
        "sslrootcert in the URL",
        &options.ca_file,
        "store.tls_ca_file",
    );
    let cert = named(
        cert,
        "sslcert in the URL",
        &options.cert_file,
        "store.tls_cert_file",
    );
    let key = named(
        key,
        "sslkey in the URL",
        &options.key_file,
        "store.tls_key_file",
    );
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(cert), None) => {
            return Err(format!(
                "a client certificate ({}) needs its key: set sslkey or store.tls_key_file",
                cert.by
            ))
        }
        (None, Some(key)) => {
            return Err(format!(
                "a client key ({}) needs its certificate: set sslcert or store.tls_cert_file",
                key.by
            ))
        }
    };
    Ok((rest, TlsSettings { mode, ca, client }))
}

/// The `key=value` pairs of a libpq connection string, as libpq reads
/// them (whitespace around `=`, single-quoted values, backslash escapes):
/// each key, its value, and the pair's text as written.
fn conninfo_pairs(s: &str) -> Result<Vec<(&str, String, &str)>, String> {
    let bytes = s.as_bytes();
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if i == bytes.len() {
            return Ok(pairs);
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[start..i];
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            return Err(format!(
                "missing \"=\" after {key:?} in the connection string"
            ));
        }
        i = skip_space(i + 1);
        let quoted = bytes.get(i) == Some(&b'\'');
        if quoted {
            i += 1;
        }
        let mut value = Vec::new();
        loop {
            match bytes.get(i) {
                None if quoted => return Err(format!("unterminated quoted value of {key:?}")),
                None => break,
                Some(b'\'') if quoted => {
                    i += 1;
                    break;
                }
                Some(c) if !quoted && c.is_ascii_whitespace() => break,
                Some(b'\\') if i + 1 < bytes.len() => {
                    value.push(bytes[i + 1]);
                    i += 2;
                }
                Some(&c) => {
                    value.push(c);
                    i += 1;
                }
            }
        }
        // Only ASCII bytes were removed (quotes, backslashes): still UTF-8.
        let value = String::from_utf8(value).map_err(|e| e.to_string())?;
        pairs.push((key, value, &s[start..i]));
    }
}

impl TlsSettings {
    /// The CA file when the mode never uses it (`disable`, `prefer`): a
    /// configuration that looks verified and is not, worth a warning.
    pub fn unused_ca(&self) -> Option<&Named> {
        self.ca
            .as_ref()
            .filter(|_| matches!(self.mode, SslMode::Disable | SslMode::Prefer))
    }

    /// tokio-postgres' own mode: whether to ask for TLS and whether to
    /// go on without it.
    pub fn client_mode(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Pg;
        match self.mode {
            SslMode::Disable => Pg::Disable,
            SslMode::Prefer => Pg::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Pg::Require,
        }
    }

    /// The connector: the trust anchors, the check the mode asks for and
    /// the client certificate. Reads the files now; an error names the
    /// file, where it was named and why.
    pub fn connector(&self) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS to PostgreSQL: {e}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, &self.ca) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Arc::new(Unverified(provider.clone()))
            }
            (SslMode::Require | SslMode::VerifyCa, ca) => {
                Arc::new(ChainOnly(web_pki(ca.as_ref(), provider.clone())?))
            }
            (SslMode::VerifyFull, ca) => web_pki(ca.as_ref(), provider.clone())?,
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(&cert.path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| file_error(cert, e))?;
                if chain.is_empty() {
                    return Err(file_error(cert, "holds no PEM certificate"));
                }
                let private =
                    PrivateKeyDer::from_pem_file(&key.path).map_err(|e| file_error(key, e))?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| file_error(key, e))?
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }
}

fn file_error(file: &Named, e: impl fmt::Display) -> String {
    format!("{} ({}): {e}", file.path.display(), file.by)
}

/// The standard check of a certificate chain and host name against the
/// CA file's certificates, or the web PKI roots without one.
fn web_pki(
    ca: Option<&Named>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(&ca.path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error(ca, e))?;
            for cert in certs {
                roots.add(cert).map_err(|e| file_error(ca, e))?;
            }
            if roots.is_empty() {
                return Err(file_error(ca, "holds no PEM certificate"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("TLS to PostgreSQL: {e}"))
}

/// `prefer` and `require` without a CA: encryption without authentication,
/// as libpq. The handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted CA (and be valid now);
/// the host name is not checked. The standard verifier checks the chain
/// before the name, so its name error alone means the chain is good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn split(url: &str) -> (String, TlsSettings) {
        split_url(url, &ConnectOptions::default()).unwrap()
    }

    #[test]
    fn the_default_is_prefer_and_a_url_without_tls_parameters_is_unchanged() {
        for url in [
            "postgres://sa@db:5432/sa",
            "postgres://sa@db/sa?connect_timeout=3&application_name=x",
            "host=db user=sa dbname=sa",
        ] {
            let (rest, tls) = split(url);
            assert_eq!(rest, url);
            assert_eq!(tls, TlsSettings::default());
            assert_eq!(tls.mode, SslMode::Prefer);
        }
    }

    #[test]
    fn tls_parameters_are_taken_out_of_both_forms_and_decoded() {
        let (rest, tls) = split(
            "postgres://sa@db/sa?connect_timeout=3&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem\
             &sslcert=/c.pem&sslkey=/k.pem&application_name=x",
        );
        assert_eq!(
            rest,
            "postgres://sa@db/sa?connect_timeout=3&application_name=x"
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        let ca = tls.ca.unwrap();
        assert!(ca.path == Path::new("/etc/ca.pem") && ca.by.contains("sslrootcert"));
        let (cert, key) = tls.client.unwrap();
        assert!(cert.path == Path::new("/c.pem") && key.path == Path::new("/k.pem"));

        let (rest, tls) = split("host=db sslmode=verify-ca  user=sa sslrootcert='/ca.pem'");
        assert_eq!(rest, "host=db user=sa");
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert!(tls.ca.unwrap().path == Path::new("/ca.pem"));

        // As libpq reads them: spaces around `=`, quotes and escapes; the
        // other pairs are handed on as written.
        let (rest, tls) = split(
            "host = db  sslmode = require password='a  b\\'c' sslrootcert = /a\\ b.pem dbname=x",
        );
        assert_eq!(rest, "host = db password='a  b\\'c' dbname=x");
        assert_eq!(tls.mode, SslMode::Require);
        assert!(tls.ca.unwrap().path == Path::new("/a b.pem"));
        let err = split_url("host=db sslmode", &ConnectOptions::default()).unwrap_err();
        assert!(err.contains("missing \"=\""), "{err}");
        let err = split_url("host='db", &ConnectOptions::default()).unwrap_err();
        assert!(err.contains("unterminated"), "{err}");

        let (rest, _) = split("postgres://sa@db/sa?sslmode=require");
        assert_eq!(rest, "postgres://sa@db/sa");
    }

    #[test]
    fn a_url_parameter_wins_over_the_store_key() {
        let options = ConnectOptions {
            ca_file: Some("/from-config.pem".into()),
            cert_file: Some("/cert.pem".into()),
            key_file: Some("/key.pem".into()),
            ..ConnectOptions::default()
        };
        let (_, tls) = split_url("postgres://db/x?sslrootcert=/from-url.pem", &options).unwrap();
        let ca = tls.ca.unwrap();
        assert!(ca.path == Path::new("/from-url.pem"), "{ca:?}");
        let (cert, _) = tls.client.unwrap();
        assert_eq!(cert.by, "store.tls_cert_file");
        let (_, tls) = split_url("postgres://db/x", &options).unwrap();
        assert_eq!(tls.ca.unwrap().by, "store.tls_ca_file");
    }

    #[test]
    fn bad_modes_and_half_a_client_certificate_are_refused_with_a_reason() {
        let err = |url: &str| split_url(url, &ConnectOptions::default()).unwrap_err();
        assert!(err("postgres://db/x?sslmode=verify").contains("is not one of"));
        assert!(err("postgres://db/x?sslmode=allow").contains("not supported"));
        assert!(err("postgres://db/x?sslcert=/c.pem").contains("needs its key"));
        assert!(err("host=db sslkey=/k.pem").contains("needs its certificate"));
        assert!(err("postgres://db/x?sslrootcert=system&sslmode=require").contains("verify-full"));
    }

    #[test]
    fn sslrootcert_system_means_the_web_pki_roots_and_verify_full() {
        for url in [
            "postgres://db/x?sslrootcert=system",
            "postgres://db/x?sslrootcert=system&sslmode=verify-full",
        ] {
            let (_, tls) = split(url);
            assert_eq!((tls.mode, tls.ca), (SslMode::VerifyFull, None));
        }
    }

    #[test]
    fn each_mode_maps_to_the_clients_own_and_builds_a_connector() {
        use tokio_postgres::config::SslMode as Pg;
        for (mode, pg) in [
            (SslMode::Disable, Pg::Disable),
            (SslMode::Prefer, Pg::Prefer),
            (SslMode::Require, Pg::Require),
            (SslMode::VerifyCa, Pg::Require),
            (SslMode::VerifyFull, Pg::Require),
        ] {
            let tls = TlsSettings {
                mode,
                ..TlsSettings::default()
            };
            assert_eq!(tls.client_mode(), pg);
            assert_eq!(mode.to_string().parse::<SslMode>(), Ok(mode));
            // Without a CA file the web PKI roots are the anchors.
            tls.connector().unwrap();
        }
        let with_ca = |mode| {
            let options = ConnectOptions {
                ca_file: Some("/ca.pem".into()),
                ..ConnectOptions::default()
            };
            split_url(&format!("postgres://db/x?sslmode={mode}"), &options)
                .unwrap()
                .1
        };
        assert!(with_ca("prefer").unused_ca().is_some());
        assert!(with_ca("disable").unused_ca().is_some());
        assert!(
            with_ca("require").unused_ca().is_none(),
            "require checks the chain"
        );
        assert!(with_ca("verify-full").unused_ca().is_none());
    }

    #[test]
    fn an_unreadable_or_empty_ca_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        for path in [dir.path().join("absent.pem"), empty] {
            let tls = TlsSettings {
                mode: SslMode::VerifyFull,
                ca: Some(Named {
                    path: path.clone(),
                    by: "store.tls_ca_file",
                }),
                client: None,
            };
            let Err(err) = tls.connector() else {
                panic!("{path:?} is no CA file");
            };
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains("store.tls_ca_file"), "{err}");
        }
    }
}
