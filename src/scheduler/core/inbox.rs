//! Inboxes: a lead's root agents, or an agent's direct children, that are
//! live or settled and not yet collected — what an inbox Await reads,
//! collects and waits on.
//!
//! An inbox is read by scanning the lead's agents (the lead index) or the
//! parent's children, not kept as an index of its own: the scan costs an
//! inbox Await O(agents retained under the lead), and no Spawn or settle
//! pays anything for inboxes nobody reads.

use std::{sync::Arc, time::SystemTime};

use tokio::sync::Notify;

use super::{indexes::InboxKey, Core, Record};
use crate::scheduler::{error::Error, types::*};

impl Core {
    /// Marks the terminal agents of `views` collected at `now` (those not
    /// collected yet), in the records and in `views`; agents awaiting
    /// approval stay uncollected: their approval must be seen until it is
    /// decided.
    pub fn collect(&mut self, views: &mut [AgentView], now: SystemTime) {
        for view in views {
            if view.collected_at.is_some() {
                continue;
            }
            if !view.status.is_terminal() {
                continue;
            }
            let Some(rec) = self.agents.get_mut(&view.id) else {
                continue;
            };
            let fresh = rec.view.collected_at.is_none();
            let at = *rec.view.collected_at.get_or_insert(now);
            view.collected_at = Some(at);
            if fresh {
                self.changed(view.id);
            }
        }
    }

    /// Reads `tenant`'s (lead) or `scope`'s (parent) inbox `of` as it is
    /// now. An unknown parent is NOT_FOUND naming `parent_id`.
    pub fn read_inbox<'a>(
        &'a self,
        scope: &Scope,
        tenant: &str,
        of: &InboxOf,
    ) -> Result<InboxRead, Error> {
        let mut read = InboxRead::default();
        let mut settled: Vec<&Record> = Vec::new();
        let mut visit = |rec: &'a Record| {
            if !rec.view.status.is_settled() {
                read.live += 1;
            } else if rec.view.collected_at.is_none() {
                settled.push(rec);
            }
        };
        match of {
            InboxOf::Lead(lead) => {
                for (_, id) in self.by_lead.range(Some(tenant), lead, 0) {
                    let rec = &self.agents[id];
                    // The index is keyed by hashes: skip a colliding lead or
                    // tenant.
                    if rec.view.parent_id.is_none()
                        && *rec.view.tenant == *tenant
                        && rec.view.lead_id.as_deref() == Some(lead.as_str())
                    {
                        visit(rec);
                    }
                }
            }
            InboxOf::Parent(parent) => {
                let rec = self
                    .agents
                    .get(parent)
                    .filter(|r| scope.admits(&r.view.tenant))
                    .ok_or_else(|| Error::NotFound {
                        field: "parent_id",
                        id: parent.to_string(),
                    })?;
                for child in rec.children.iter() {
                    if let Some(rec) = self.agents.get(child) {
                        visit(rec);
                    }
                }
            }
        }
        // Approvals first: a person must see them, and they are never
        // collected, so at the end of a long inbox they could be cut off.
        settled.sort_by_key(|r| {
            (
                r.view.status != AgentStatus::AwaitingApproval,
                r.view.finished_at,
                r.seq,
            )
        });
        read.settled = settled
            .into_iter()
            .take(MAX_INBOX_AGENTS)
            .map(|r| self.view_of(r))
            .collect();
        Ok(read)
    }

    /// Registers `waiter` to be woken when an agent of inbox `of` settles.
    pub fn add_inbox_waiter(&mut self, tenant: &str, of: &InboxOf, waiter: &Arc<Notify>) {
        let list = self.inbox_waiters.entry(inbox_key(tenant, of)).or_default();
        if !list.iter().any(|w| Arc::ptr_eq(w, waiter)) {
            list.push(waiter.clone());
        }
    }

    /// Forgets an inbox waiter (its Await returned or its caller went away).
    pub fn remove_inbox_waiter(&mut self, tenant: &str, of: &InboxOf, waiter: &Arc<Notify>) {
        let key = inbox_key(tenant, of);
        if let Some(list) = self.inbox_waiters.get_mut(&key) {
            list.retain(|w| !Arc::ptr_eq(w, waiter));
            if list.is_empty() {
                self.inbox_waiters.remove(&key);
            }
        }
    }

    /// Registered inbox waiters (tests check that callers who went away
    /// left none behind).
    pub fn inbox_waiter_count(&self) -> usize {
        self.inbox_waiters.values().map(Vec::len).sum()
    }

    /// `id` settled: wakes the waiters on the inbox it belongs to.
    pub(super) fn wake_inbox(&self, id: AgentId) {
        if self.inbox_waiters.is_empty() {
            return;
        }
        let Some(rec) = self.agents.get(&id) else {
            return;
        };
        let key = match (&rec.view.parent_id, &rec.view.lead_id) {
            (Some(parent), _) => InboxKey::Parent(*parent),
            (None, Some(lead)) => InboxKey::Lead(rec.view.tenant.clone(), lead.clone()),
            (None, None) => return,
        };
        for w in self.inbox_waiters.get(&key).into_iter().flatten() {
            w.notify_one();
        }
    }
}

fn inbox_key(tenant: &str, of: &InboxOf) -> InboxKey {
    match of {
        InboxOf::Lead(lead) => InboxKey::Lead(tenant.into(), lead.as_str().into()),
        InboxOf::Parent(parent) => InboxKey::Parent(*parent),
    }
}
