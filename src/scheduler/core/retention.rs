//! Retention and shutdown: forgetting finished agents after
//! `finished_retention`, and the two steps of stopping (stop admitting,
//! then cancel everything live).

use std::{sync::Arc, time::SystemTime};

use super::Core;
use crate::scheduler::{queue::Dirty, types::*};

impl Core {
    /// Stops admitting and starting agents (the drain before shutdown):
    /// Spawn is refused with [`Error::ShuttingDown`], queued agents stay
    /// queued, running ones go on.
    ///
    /// [`Error::ShuttingDown`]: crate::scheduler::error::Error::ShuttingDown
    pub fn stop_admitting(&mut self) {
        self.closed = true;
    }

    /// Agents RUNNING now (not waiting for a slot or an approval).
    pub fn running_count(&self) -> u32 {
        self.stats.buckets().map(|(_, _, b)| b.running).sum()
    }

    /// Stops admitting and cancels every live agent with `reason`, oldest
    /// first, in one step: nothing queued is started by the slots this
    /// frees. Returns how many agents were cancelled.
    pub fn shut_down(&mut self, reason: &str) -> usize {
        self.closed = true;
        let live: Vec<AgentId> = self
            .order
            .ids()
            .filter(|id| !self.agents[*id].view.status.is_terminal())
            .copied()
            .collect();
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        for id in live {
            self.cancel_one(id, reason.to_owned(), &mut dirty, &mut cancelled);
        }
        cancelled.len()
    }

    /// Shutdown over a durable store: stops admitting and stops every
    /// in-process run without recording anything (the store keeps them
    /// RUNNING, so the next start treats them as interrupted); queued
    /// agents stay queued and worker runs stay held for re-attach. Call
    /// after the store's writer has stopped. Returns how many runs it
    /// stopped.
    pub fn detach_runs(&mut self) -> usize {
        self.closed = true;
        let mut stopped = 0;
        for rec in self.agents.values_mut() {
            if rec.runner == crate::config::RunnerKind::Worker {
                continue;
            }
            if let Some(run) = rec.run.take() {
                // The run task ends without a report.
                run.cancel.cancel();
                stopped += 1;
            }
        }
        stopped
    }

    /// Forgets agents that finished more than `finished_retention` before
    /// `now`. Returns how many were forgotten.
    pub fn sweep(&mut self, now: SystemTime) -> usize {
        let retention = self.runs.finished_retention;
        let mut n = 0;
        while let Some(&(at, id)) = self.finished.front() {
            if at + retention > now {
                break;
            }
            self.finished.pop_front();
            if let Some(rec) = self.agents.remove(&id) {
                self.order.remove(&rec.view.tenant, rec.seq);
                if let Some(lead) = &rec.view.lead_id {
                    self.by_lead.remove(&rec.view.tenant, lead, rec.seq);
                }
                self.by_root.remove(&(rec.view.root_id, rec.seq));
                if let Some(k) = rec.idempotency_key() {
                    self.idempotency.remove(&(
                        rec.view.tenant.clone(),
                        rec.parent_key(),
                        k.clone(),
                    ));
                }
                self.forgotten(id);
                n += 1;
            }
        }
        self.conversations.sweep(now);
        if n > 0 {
            // Names no agent uses any more (a model nobody spawns now).
            self.names.retain(|name| Arc::strong_count(name) > 1);
        }
        n
    }
}
