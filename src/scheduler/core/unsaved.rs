//! The core's record of changes not yet handed to the store's writer (its
//! own file, so that `Core`'s fields name no file that implements `Core`).

use std::sync::Arc;

use foldhash::HashSet;

use crate::scheduler::{events::Event, types::AgentId};

/// Changes not yet handed to the store's writer.
#[derive(Debug, Default)]
pub(super) struct Unsaved {
    pub(super) agents: HashSet<AgentId>,
    pub(super) removed: Vec<AgentId>,
    pub(super) events: Vec<Arc<Event>>,
    /// Ticket of the newest change: counts changes since the core was
    /// built, so "durable up to ticket t" covers every change numbered ≤ t.
    pub(super) ticket: u64,
}
