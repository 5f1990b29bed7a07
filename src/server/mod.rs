//! Wiring: the gRPC server (AgentService, WorkerService, health,
//! reflection) composed from the layers below it, the `[http]` listener
//! (`/mcp`), its background tasks,
//! recovery, the election on PostgreSQL, reload and shutdown.
//!
//! This root only declares modules and re-exports.

mod background;
pub mod baseline;
mod follower;
mod handle;
mod health;
mod http;
mod recovery;
mod router;
mod serve;
mod start;

pub use self::handle::ServerHandle;
pub use self::health::SERVICE_NAME;
pub use self::http::{LEAD_HEADER, SHARED_LEAD};
pub use self::serve::serve;
pub use self::start::start;
