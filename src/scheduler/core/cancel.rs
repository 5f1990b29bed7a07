//! Cancel: of one agent, of every agent under a lead, and the cascade to
//! the live descendants of an agent that ended.

use std::sync::Arc;

use super::Core;
use crate::scheduler::{error::Error, queue::Dirty, types::*};

/// Why the core moves agents to CANCELLED as a cascade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cascade {
    /// Explicit cancel: the whole subtree, detached agents included.
    Everything,
    /// The parent ended on its own: detached subtrees survive.
    SkipDetached,
}

impl Core {
    /// Cancels an agent and its live descendants (detached ones included,
    /// also when the agent itself already ended). Returns every agent moved
    /// to CANCELLED. An agent outside `scope` is NOT_FOUND, like an
    /// unknown id (its descendants share its tenant).
    pub fn cancel(
        &mut self,
        scope: &Scope,
        id: AgentId,
        reason: &str,
    ) -> Result<Vec<AgentView>, Error> {
        if self.record_in(scope, id).is_none() {
            return Err(Error::NotFound {
                field: "id",
                id: id.to_string(),
            });
        }
        // An agent that already ended is not listed, but live descendants
        // that outlived it (detached ones) are still part of its subtree.
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        self.cancel_one(id, cancel_message(reason), &mut dirty, &mut cancelled);
        self.cascade(id, Cascade::Everything, &mut dirty, &mut cancelled);
        self.drain(dirty);
        Ok(cancelled)
    }

    /// Cancels every live agent under `tenant`'s lead `lead`, with their
    /// descendants.
    pub fn cancel_lead(&mut self, tenant: &str, lead: &str, reason: &str) -> Vec<AgentView> {
        let mut ids: Vec<AgentId> = self
            .lead_live
            .get(&(Arc::from(tenant), Arc::from(lead)))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        // Cancel in admission order so events read naturally (parents first).
        ids.sort_by_key(|id| self.agents.get(id).map_or(0, |r| r.seq));
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        let message = cancel_message(reason);
        for id in ids {
            if self
                .agents
                .get(&id)
                .is_some_and(|r| !r.view.status.is_terminal())
            {
                self.cancel_one(id, message.clone(), &mut dirty, &mut cancelled);
                self.cascade(id, Cascade::Everything, &mut dirty, &mut cancelled);
            }
        }
        self.drain(dirty);
        cancelled
    }

    pub(super) fn cancel_one(
        &mut self,
        id: AgentId,
        message: String,
        dirty: &mut Dirty,
        cancelled: &mut Vec<AgentView>,
    ) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        if rec.view.status.is_terminal() {
            return;
        }
        rec.view.error = Some(AgentError::new(CODE_CANCELLED, message));
        if self.transition(id, AgentStatus::Cancelled, dirty).is_ok() {
            if let Some(v) = self.view(id) {
                cancelled.push(v);
            }
        }
    }

    /// Cancels the live descendants of `id`, which has just ended.
    pub(super) fn cascade(
        &mut self,
        id: AgentId,
        mode: Cascade,
        dirty: &mut Dirty,
        cancelled: &mut Vec<AgentView>,
    ) {
        let mut stack = vec![id];
        while let Some(parent) = stack.pop() {
            let Some(rec) = self.agents.get(&parent) else {
                continue;
            };
            let (children, status) = (rec.children.to_vec(), rec.view.status);
            for child in children {
                let Some(c) = self.agents.get(&child) else {
                    continue;
                };
                if mode == Cascade::SkipDetached && c.view.detached {
                    continue;
                }
                if !c.view.status.is_terminal() {
                    let message = format!(
                        "parent agent {parent} ended ({})",
                        format!("{status:?}").to_uppercase()
                    );
                    self.cancel_one(child, message, dirty, cancelled);
                }
                stack.push(child);
            }
        }
    }
}

fn cancel_message(reason: &str) -> String {
    if reason.is_empty() {
        "cancelled by request".to_owned()
    } else {
        reason.to_owned()
    }
}
