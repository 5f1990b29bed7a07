//! How the store and the lease reach PostgreSQL: the connection config
//! from the URL, the password file and TLS (`tls`), and the errors of the
//! client and the pool as [`StoreError`]s naming the (redacted) URL.

use std::{str::FromStr, time::Duration};

pub use super::tls::ConnectOptions;
use super::tls::{split_url, Tls};
use crate::{config::redact_url, store::StoreError};

/// How long connecting to the server may take when the URL does not say
/// (`connect_timeout`): a server that is down fails the start, or the
/// commit that needed a new connection, instead of hanging for minutes.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client configuration of `url` and its TLS connector: the URL's
/// TLS parameters and `options`' files ([`super::postgres_tls`]), the
/// password from `options.password_file` (its one trailing newline
/// trimmed) if set, and the defaults subagentd adds:
/// [`DEFAULT_CONNECT_TIMEOUT`] and the application name `subagentd`,
/// unless the URL sets them.
pub(super) fn config_of(
    url: &str,
    options: &ConnectOptions,
) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let invalid = |e: &dyn std::fmt::Display| {
        StoreError::Engine(format!(
            "{} is not a valid PostgreSQL connection URL: {e}",
            redacted(url),
        ))
    };
    let (rest, tls) = split_url(url, options).map_err(|e| invalid(&e))?;
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| invalid(&chain(&e)))?;
    // Every sslmode was taken out above; one left over would be silently
    // replaced by ours (a TLS requirement lost): refuse instead.
    if config.get_ssl_mode() != tokio_postgres::config::SslMode::Prefer {
        return Err(invalid(&"an sslmode that could not be read"));
    }
    config.ssl_mode(tls.client_mode());
    let connector = tls.connector().map_err(|e| {
        StoreError::Engine(format!(
            "postgres store {}: sslmode={}: {e}",
            redacted(url),
            tls.mode
        ))
    })?;
    if let Some(path) = &options.password_file {
        let bytes = std::fs::read(path).map_err(|e| {
            StoreError::Engine(format!(
                "cannot read the password file {}: {e}",
                path.display()
            ))
        })?;
        let password = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        config.password(password);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("subagentd");
    }
    Ok((config, connector))
}

/// A client of the database at `url` (as the store connects: TLS and
/// password per `options`), its connection driven by a task of the
/// caller's runtime. For tools and tests that need a plain connection.
pub async fn connect(
    url: &str,
    options: &ConnectOptions,
) -> Result<tokio_postgres::Client, StoreError> {
    let where_ = redacted(url);
    let (config, tls) = config_of(url, options)?;
    let (client, connection) = config.connect(tls).await.or_engine(&where_)?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` fit for a message (see [`redact_url`]: never its password).
pub(super) fn redacted(url: &str) -> String {
    redact_url(url)
}

pub(super) fn engine(where_: &str, e: impl std::error::Error) -> StoreError {
    StoreError::Engine(format!("postgres store {where_}: {}", chain(&e)))
}

/// `.or_engine(where_)`: any error of the client or the pool as
/// [`StoreError::Engine`], naming the (redacted) URL.
pub(super) trait OrEngine<T> {
    fn or_engine(self, where_: &str) -> Result<T, StoreError>;
}

impl<T, E: std::error::Error> OrEngine<T> for Result<T, E> {
    fn or_engine(self, where_: &str) -> Result<T, StoreError> {
        self.map_err(|e| engine(where_, e))
    }
}

pub(super) fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("postgres store: {}", chain(&e)))
}

/// `e` and its sources: tokio-postgres says only "db error" or "invalid
/// configuration" itself and keeps what the server or the parser said in
/// the source.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // The pool's error repeats its cause in its own message.
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}
