//! Approvals: a run pauses for a tool call's approval, and a decision
//! sends it back to the queue (or straight to running).

use std::{sync::Arc, time::SystemTime};

use tokio::sync::oneshot;
use uuid::Uuid;

use super::Core;
use crate::config::RunnerKind;
use crate::scheduler::{error::Error, queue::Dirty, trace::SpanEventKind, types::*};

impl Core {
    /// The run asks for approval of a tool call: RUNNING → AWAITING_APPROVAL,
    /// freeing its bucket and parent slots (the global slot and a worker's
    /// capacity stay). Returns the new approval and where its decision will
    /// arrive (once the agent runs again), or None if the agent is not
    /// running.
    pub fn request_approval(
        &mut self,
        id: AgentId,
        tool_name: &str,
        detail: &str,
    ) -> Option<(Approval, oneshot::Receiver<ApprovalOutcome>)> {
        let (tx, rx) = oneshot::channel();
        let approval = self.pause_for_approval(id, tool_name, detail, Some(tx))?;
        Some((approval, rx))
    }

    pub(super) fn pause_for_approval(
        &mut self,
        id: AgentId,
        tool_name: &str,
        detail: &str,
        decision_to: Option<oneshot::Sender<ApprovalOutcome>>,
    ) -> Option<Approval> {
        let rec = self.agents.get_mut(&id)?;
        if rec.view.status != AgentStatus::Running {
            return None;
        }
        let run = rec.run.as_mut()?;
        run.progress.touch();
        run.approval = decision_to;
        run.decision = None;
        let approval = Approval {
            id: Uuid::new_v4(),
            tool_name: tool_name.into(),
            detail: if detail.is_empty() {
                self.empty.clone()
            } else {
                detail.into()
            },
        };
        rec.view.approval = Some(Arc::new(approval.clone()));
        if let Some(span) = rec.span.as_mut() {
            let tool = approval.tool_name.clone();
            span.push(SystemTime::now(), SpanEventKind::ApprovalRequested { tool });
        }
        let mut dirty = Dirty::default();
        self.transition(id, AgentStatus::AwaitingApproval, &mut dirty)
            .ok()?;
        self.drain(dirty);
        Some(approval)
    }

    /// Decides an agent's pending approval: the agent goes back to its
    /// bucket's queue (or runs at once, see [`Core::resume`]) and its run
    /// receives `outcome` when it is RUNNING again.
    pub fn decide_approval(
        &mut self,
        scope: &Scope,
        id: AgentId,
        approval_id: Uuid,
        outcome: ApprovalOutcome,
    ) -> Result<AgentView, Error> {
        let rec = self
            .agents
            .get_mut(&id)
            .filter(|r| scope.admits(&r.view.tenant))
            .ok_or_else(|| Error::NotFound {
                field: "id",
                id: id.to_string(),
            })?;
        let pending = match (&rec.view.approval, rec.view.status) {
            (Some(approval), AgentStatus::AwaitingApproval) => approval.id,
            (_, status) => return Err(Error::NotAwaitingApproval { id, status }),
        };
        if pending != approval_id {
            return Err(Error::ApprovalMismatch {
                id,
                given: approval_id,
                pending,
            });
        }
        if rec.runner == RunnerKind::Worker && rec.run.is_none() {
            // Restored for its worker to re-attach: the decision would have
            // nowhere to go, and the run would start over.
            return Err(Error::AwaitingReattach { id });
        }
        if let Some(run) = rec.run.as_mut() {
            run.decision = Some((approval_id, outcome));
        }
        self.resume(id);
        Ok(self.view(id).expect("known agent"))
    }
}
