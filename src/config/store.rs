//! `[store]`: where durable state lives.

use std::{fmt, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Which engine keeps durable state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// One redb file in `[store] path`: a restart or crash loses nothing
    /// acknowledged. The default.
    #[default]
    Embedded,
    /// A PostgreSQL database at `[store] url`.
    Postgres,
    /// Nothing is written: everything is lost when the process exits. For
    /// tests and benchmarks.
    Memory,
}

/// Default `[store] path`, relative to the working directory.
pub const DEFAULT_STORE_PATH: &str = "./subagentd-data";
/// Default `[store] pool_size`.
pub const DEFAULT_STORE_POOL_SIZE: u32 = 4;

/// `[store]` section.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `embedded` (default), `postgres` or `memory`.
    pub backend: StoreBackend,
    /// The embedded store's data directory. Default `./subagentd-data`.
    pub path: PathBuf,
    /// PostgreSQL connection URL, `postgres://user@host:port/db`. Put the
    /// password in `password_file` or in the environment
    /// (`SUBAGENTD_STORE__URL`), never in a config file others can read.
    pub url: String,
    /// File holding the PostgreSQL password (a trailing newline is trimmed);
    /// it overrides a password in `url`.
    pub password_file: Option<PathBuf>,
    /// PostgreSQL connections. Default 4, minimum 1.
    pub pool_size: u32,
    /// PEM file of the CA(s) that sign the PostgreSQL server's certificate,
    /// for `sslmode=verify-ca` / `verify-full` (an `sslrootcert` in `url`
    /// wins). Unset: the system's web PKI roots.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for PostgreSQL's `cert` authentication, with
    /// `tls_key_file` (`sslcert` in `url` wins).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (`sslkey` in `url` wins).
    pub tls_key_file: Option<PathBuf>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::default(),
            path: PathBuf::from(DEFAULT_STORE_PATH),
            url: String::new(),
            password_file: None,
            pool_size: DEFAULT_STORE_POOL_SIZE,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

// By hand, so a password in the URL never reaches a log line.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("backend", &self.backend)
            .field("path", &self.path)
            .field("url", &redact_url(&self.url))
            .field("password_file", &self.password_file)
            .field("pool_size", &self.pool_size)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// `url` fit for a log line, `--dump-config` or an error: a password in
/// the user info shows as `***` (also one holding a `/`), and so does a
/// `password` parameter, in the query or in a `key=value` connection
/// string; everything else (host, database, `sslmode`, …) stays readable.
pub fn redact_url(url: &str) -> String {
    fn param(p: &str) -> String {
        match p.split_once('=') {
            Some((k, _)) if k.trim().eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => p.to_owned(),
        }
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.split(' ').map(param).collect::<Vec<_>>().join(" ");
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, q)) => {
            let q: Vec<String> = q.split('&').map(param).collect();
            (rest, format!("?{}", q.join("&")))
        }
        None => (rest, String::new()),
    };
    let shown = match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => format!("{scheme}://{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    };
    format!("{shown}{query}")
}

impl StoreConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.backend {
            StoreBackend::Embedded if self.path.as_os_str().is_empty() => {
                Err(invalid("store.path", "must not be empty"))
            }
            StoreBackend::Postgres
                if !(self.url.starts_with("postgres://")
                    || self.url.starts_with("postgresql://")) =>
            {
                Err(invalid(
                    "store.url",
                    format!(
                        "must be a postgres:// URL when `store.backend` is \"postgres\" (got {:?})",
                        redact_url(&self.url)
                    ),
                ))
            }
            _ if self.pool_size < 1 => Err(invalid(
                "store.pool_size",
                format!("must be ≥ 1 (got {})", self.pool_size),
            )),
            // Half a client certificate, unless the URL has the other half
            // (`sslcert`/`sslkey`, which win over these keys).
            _ if self.tls_cert_file.is_some() != self.tls_key_file.is_some()
                && !(self.url.contains("sslcert") || self.url.contains("sslkey")) =>
            {
                Err(invalid(
                    if self.tls_cert_file.is_some() {
                        "store.tls_key_file"
                    } else {
                        "store.tls_cert_file"
                    },
                    "must be set together with the other: a client certificate needs its key",
                ))
            }
            _ => Ok(()),
        }
    }
}
