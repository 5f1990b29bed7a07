//! Counters and invariant checks the model-based test and the benches
//! compare against the records.

use super::{Core, Counters};
use crate::scheduler::{state::Held, types::*};

impl Core {
    /// The core's counters, for comparison with [`Core::recount`].
    pub fn counters(&self) -> Counters {
        Counters {
            live_background: self.live_background,
            tenants: self
                .tenant_live
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            buckets: self
                .bucket_running
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            parents: self
                .parent_running
                .iter()
                .map(|(k, v)| (format!("{k:?}"), *v))
                .collect(),
            trees: self.tree_live.iter().map(|(k, v)| (*k, *v)).collect(),
            queued: self.queue.len(),
            live_by_status: self.by_status.entries(),
            retained: self.order.entries().collect(),
        }
    }

    /// The counters recomputed from the agents' states.
    pub fn recount(&self) -> Counters {
        let mut c = Counters::default();
        for rec in self.agents.values() {
            let held = Held::of(rec.view.status, rec.view.background);
            if held.global {
                c.live_background += 1;
                *c.tenants.entry(rec.view.tenant.to_string()).or_default() += 1;
            }
            if held.bucket {
                *c.buckets.entry(rec.view.bucket.to_string()).or_default() += 1;
            }
            if held.parent {
                *c.parents
                    .entry(format!("{:?}", rec.parent_key()))
                    .or_default() += 1;
            }
            if held.tree {
                *c.trees.entry(rec.view.root_id).or_default() += 1;
            }
            if rec.view.status == AgentStatus::Queued {
                c.queued += 1;
            }
            let tenant = rec.view.tenant.to_string();
            if !rec.view.status.is_terminal() {
                let status = rec.view.status.name();
                c.live_by_status.insert((status, None, rec.seq));
                c.live_by_status
                    .insert((status, Some(tenant.clone()), rec.seq));
            }
            c.retained.insert((None, rec.seq));
            c.retained.insert((Some(tenant), rec.seq));
        }
        c
    }

    /// Whether a queued agent could start now (its limits all have room).
    /// After every public method this is false for every queued agent.
    pub fn startable_queued(&self) -> Vec<AgentId> {
        self.agents
            .values()
            .filter(|r| r.view.status == AgentStatus::Queued && self.can_start(r))
            .map(|r| r.view.id)
            .collect()
    }

    /// Running agents per bucket and their limits, for invariant checks.
    pub fn bucket_usage(&self) -> Vec<(String, u32, u32)> {
        self.bucket_running
            .iter()
            .map(|(k, v)| (k.to_string(), *v, self.bucket_limit(k)))
            .collect()
    }

    /// Admission sequence of an agent.
    pub fn seq_of(&self, id: AgentId) -> Option<u64> {
        self.agents.get(&id).map(|r| r.seq)
    }
}
