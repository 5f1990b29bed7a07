//! The run lifecycle as an explicit state machine, and the slots each state
//! holds.
//!
//! ```text
//!            spawn (room)            run reports approval
//!   ┌──────────────────────► RUNNING ───────────────────► AWAITING_APPROVAL
//!   │ spawn (no room)          ▲  │ done/fail/cancel/deadline    │   │
//!   └──► QUEUED ── slot free ──┘  ▼                              │   │ resume
//!          │ cancel          DONE | FAILED | CANCELLED ◄─────────┘   │ (re-queued
//!          └───────────────────────────▲                              ▼  at its seq)
//!                                      └───────────────────────── QUEUED
//! ```
//!
//! Slots are a function of the state, not something call sites remember:
//! every move goes through [`Held::of`] before and after, and the core
//! releases exactly the difference. A terminal state holds nothing, so a
//! second terminal move (which [`check_move`] refuses anyway) could not
//! release anything twice.

use super::types::AgentStatus;

/// The slots an agent occupies in a given state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// A unit of `max_background_agents`.
    pub global: bool,
    /// A running slot of its bucket.
    pub bucket: bool,
    /// A running slot of its parent (agent or lead).
    pub parent: bool,
    /// A live member of its tree (`max_live_descendants_per_root`).
    pub tree: bool,
}

impl Held {
    /// Slots held by an agent in `status`; foreground agents never hold
    /// global, bucket or parent slots.
    pub fn of(status: AgentStatus, background: bool) -> Self {
        use AgentStatus::*;
        let live = !status.is_terminal();
        Self {
            global: background && live,
            bucket: background && status == Running,
            parent: background && status == Running,
            tree: live,
        }
    }
}

/// A move the state machine does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("agent cannot move from {from:?} to {to:?}")]
pub struct InvalidMove {
    /// Current state.
    pub from: AgentStatus,
    /// Requested state.
    pub to: AgentStatus,
}

/// Checks a move against the lifecycle diagram above.
pub fn check_move(from: AgentStatus, to: AgentStatus) -> Result<(), InvalidMove> {
    use AgentStatus::*;
    let ok = match from {
        // QUEUED → DONE: a worker's run that ends on its own while its
        // approved agent waits for a slot (the worker still held the run).
        Queued => matches!(to, Running | Done | Failed | Cancelled),
        // RUNNING → QUEUED: a retry after the run's worker was lost.
        Running => matches!(to, Queued | AwaitingApproval | Done | Failed | Cancelled),
        AwaitingApproval => matches!(to, Queued | Running | Done | Failed | Cancelled),
        Done | Failed | Cancelled => false,
    };
    if ok {
        Ok(())
    } else {
        Err(InvalidMove { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AgentStatus::*;

    const ALL: [AgentStatus; 6] = [Queued, Running, AwaitingApproval, Done, Failed, Cancelled];

    #[test]
    fn terminal_states_hold_nothing_and_allow_no_move() {
        for s in [Done, Failed, Cancelled] {
            assert_eq!(Held::of(s, true), Held::default());
            for to in ALL {
                assert!(check_move(s, to).is_err());
            }
        }
    }

    #[test]
    fn awaiting_approval_keeps_only_the_global_slot() {
        assert_eq!(
            Held::of(AwaitingApproval, true),
            Held {
                global: true,
                bucket: false,
                parent: false,
                tree: true
            }
        );
    }

    #[test]
    fn foreground_agents_hold_only_their_tree_slot() {
        for s in [Queued, Running, AwaitingApproval] {
            assert_eq!(
                Held::of(s, false),
                Held {
                    tree: true,
                    ..Held::default()
                }
            );
        }
    }

    #[test]
    fn a_queued_agent_cannot_pause_for_approval() {
        assert!(check_move(Queued, AwaitingApproval).is_err());
        assert!(check_move(Queued, Running).is_ok());
    }
}
