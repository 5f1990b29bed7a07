//! The PostgreSQL store: the engine (one transaction per batch, fenced by
//! the lease epoch), the leader lease, and how both reach the database
//! (URL, password file, TLS).

pub mod engine;
pub mod lease;
pub mod tls;

pub use self::engine::*;
