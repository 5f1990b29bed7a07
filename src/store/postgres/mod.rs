//! The PostgreSQL store: the engine (one transaction per batch, fenced by
//! the lease epoch), the leader lease, and how both reach the database
//! (URL, password file, TLS).

pub mod connection;
pub mod engine;
pub mod lease;
mod schema;
#[cfg(test)]
mod tests;
pub mod tls;

pub use self::connection::{connect, ConnectOptions, DEFAULT_CONNECT_TIMEOUT};
pub use self::engine::PostgresStore;
