//! The scheduler: admission, the run lifecycle, and the events they produce.
//!
//! [`Core`] is synchronous and owns all state; [`Scheduler`] is the cheap,
//! cloneable handle the API uses (`handle/`). It locks the core for one
//! method call at a time (never across an `.await`), then starts the runs
//! the core admitted. The scheduler owns the ports it calls: the run seam
//! (`run`), the durability seam (`durability`), the span sink (`trace`)
//! and run credentials (`types::RunCredentials`); adapters implement them.
//!
//! This root only declares modules and re-exports (explicitly, so that a
//! path through it names the file that defines the item).

pub mod conversation;
pub mod core;
pub mod durability;
pub mod durable;
pub mod error;
pub mod events;
pub mod handle;
pub mod inbox;
pub mod queue;
pub mod run;
pub mod state;
pub mod stats;
pub mod trace;
pub mod trace_id;
pub mod types;
pub mod workers;

pub use self::core::{
    recovery::{Inconsistent, RecoveryReport},
    Core, Page, RunProgress, RunStart, SteerDelivery,
};
pub use self::error::{Error, FieldViolation};
pub use self::events::{Event, EventKind, Live, Progress, Received, SubscriberId, Subscription};
pub use self::handle::{
    calls::AwaitMode,
    watch::{Watch, WatchLive},
    Scheduler,
};
pub use self::run::{crashed, RemoteReports, RunReporter, CODE_RUNNER_CRASHED};
pub use self::types::{
    AgentError, AgentFilter, AgentId, AgentStatus, AgentView, Approval, ApprovalOutcome, Attempt,
    Attempts, Continuation, InboxOf, InboxRead, Labels, ModelRef, ParentKey, RunCredential,
    RunCredentials, Scope, SpawnSpec, TurnVerdict, Usage, WatchQuery, Workspace, CODE_CANCELLED,
    CODE_CIRCUIT_BREAKER, CODE_DEADLINE_EXCEEDED, CODE_RUN_FAILED, CODE_SERVER_RESTARTED,
    CODE_STALE, CODE_TURN_LIMIT, CODE_WORKER_LOST, DEFAULT_TENANT, MAX_INBOX_AGENTS,
};
pub use self::workers::{
    Assignment, HeldRun, ReportNumber, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo,
};
