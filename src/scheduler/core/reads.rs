//! Reads: an agent's view, filtered listings and the indexes they use,
//! Await waiters, and WatchAgents subscriptions and events.

use std::sync::Arc;

use tokio::sync::Notify;

use super::{Core, Page, Record};
use crate::scheduler::{
    conversation::{TranscriptItem, TranscriptOf, TranscriptPage},
    error::Error,
    events::{EventKind, SubscriberId, Subscription},
    types::*,
};

impl Core {
    /// Agents RUNNING in this process now (as [`Core::running_count`],
    /// worker runs left out): those a shutdown over a durable store waits
    /// for, since worker runs go on and re-attach to the next leader.
    /// Reads the running agents only.
    pub fn in_process_running_count(&self) -> u32 {
        let n = self
            .by_status
            .running
            .ids()
            .filter(|id| self.agents[*id].runner != crate::config::RunnerKind::Worker)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    pub(super) fn view_of(&self, rec: &Record) -> AgentView {
        let mut v = rec.view.clone();
        if v.status == AgentStatus::Queued {
            v.queue_reason = Some(self.queue_reason(rec).into());
        }
        if let Some(run) = &rec.run {
            if !run.output.is_empty() {
                v.result = run.output.as_str().into();
            }
        }
        v
    }

    fn queue_reason(&self, rec: &Record) -> String {
        if !rec.view.background {
            // Foreground agents bypass bucket and parent: only a worker can
            // be missing.
            return self
                .worker_reason(rec)
                .unwrap_or_else(|| "waiting for a slot".to_owned());
        }
        let bucket = &rec.view.bucket;
        let limit = self.bucket_limit(bucket);
        let running = self.bucket_running.get(bucket).copied().unwrap_or(0);
        if limit != 0 && running >= limit {
            return format!("bucket \"{bucket}\" {running}/{limit} running");
        }
        let limit = self.limits.max_concurrent_per_parent;
        let running = self
            .parent_running
            .get(&rec.parent_key())
            .copied()
            .unwrap_or(0);
        // A root without a lead has no per-parent limit.
        if rec.parent_key() != ParentKey::None && limit != 0 && running >= limit {
            return format!("parent limit {running}/{limit}");
        }
        self.worker_reason(rec)
            .unwrap_or_else(|| "waiting for a slot".to_owned())
    }

    /// Why a worker type's agent cannot get a worker, if it cannot.
    fn worker_reason(&self, rec: &Record) -> Option<String> {
        let key = rec.needs_worker()?;
        let cap = self.workers.capacity_of(&key);
        let agent_type = &key.1;
        if cap.workers == 0 {
            Some(format!(
                "no worker connected for agent type \"{agent_type}\""
            ))
        } else if !self.workers.has_room(&key) {
            Some(format!(
                "all {} workers for agent type \"{agent_type}\" are busy ({}/{} runs)",
                cap.workers, cap.held, cap.capacity
            ))
        } else {
            None
        }
    }

    /// One agent as the API shows it.
    pub fn view(&self, id: AgentId) -> Option<AgentView> {
        self.agents.get(&id).map(|r| self.view_of(r))
    }

    /// The view of `id` if it is in `scope`: what a caller may see. None
    /// for another tenant's agent exactly as for an unknown id.
    pub fn view_in(&self, scope: &Scope, id: AgentId) -> Option<AgentView> {
        self.record_in(scope, id).map(|r| self.view_of(r))
    }

    pub(super) fn record_in(&self, scope: &Scope, id: AgentId) -> Option<&Record> {
        self.agents
            .get(&id)
            .filter(|r| scope.admits(&r.view.tenant))
            .map(|r| &**r)
    }

    /// Agents matching `filter`, oldest first, starting after admission
    /// sequence `after`, at most `limit`.
    pub fn list(&self, filter: &AgentFilter, after: u64, limit: usize) -> Page {
        let mut agents = Vec::new();
        let mut last = None;
        for (seq, rec) in self.candidates(filter, after) {
            if agents.len() == limit {
                return Page {
                    agents,
                    next_after: last,
                };
            }
            agents.push(self.view_of(rec));
            last = Some(seq);
        }
        Page {
            agents,
            next_after: None,
        }
    }

    /// The records matching `filter` after admission sequence `after`,
    /// oldest first. Filters with an index (ids, parent's child list,
    /// tree, lead, live statuses) read only their own agents, so a listing
    /// or a snapshot does not scan every retained agent under the lock;
    /// only a filter on finished states alone (or none) scans, testing
    /// each record before a view is built.
    fn candidates<'a>(
        &'a self,
        filter: &'a AgentFilter,
        after: u64,
    ) -> impl Iterator<Item = (u64, &'a Record)> + 'a {
        let record = move |(seq, id): (u64, &AgentId)| self.agents.get(id).map(|r| (seq, &**r));
        let after_seq = after.saturating_add(1);
        let candidates: Box<dyn Iterator<Item = (u64, &Record)>> = if !filter.ids.is_empty() {
            let mut recs: Vec<(u64, &Record)> = filter
                .ids
                .iter()
                .filter_map(|id| self.agents.get(id))
                .map(|rec| (rec.seq, &**rec))
                .filter(|(seq, _)| *seq > after)
                .collect();
            recs.sort_unstable_by_key(|(seq, _)| *seq);
            recs.dedup_by_key(|(seq, _)| *seq);
            Box::new(recs.into_iter())
        } else if let Some(c) = filter
            .conversation_id
            .and_then(|c| self.conversations.get(c))
        {
            // A conversation's own turns, in turn order: admission order too.
            let own: Vec<(u64, &Record)> = c
                .turns
                .iter()
                .filter(|t| !t.copied)
                .filter_map(|t| self.agents.get(&t.agent_id))
                .map(|rec| (rec.seq, &**rec))
                .filter(|(seq, _)| *seq > after)
                .collect();
            Box::new(own.into_iter())
        } else if let Some(parent) = filter.parent_id.and_then(|p| self.agents.get(&p)) {
            Box::new(
                parent
                    .children
                    .iter()
                    .filter_map(|c| self.agents.get(c))
                    .map(|rec| (rec.seq, &**rec))
                    .filter(move |(seq, _)| *seq > after),
            )
        } else if let Some(root) = filter.root_id {
            Box::new(
                self.by_root
                    .range((root, after_seq)..=(root, u64::MAX))
                    .map(|(&(_, seq), id)| (seq, id))
                    .filter_map(record),
            )
        } else if let Some(lead) = &filter.lead_id {
            Box::new(
                self.by_lead
                    .range(filter.tenant.as_deref(), lead, after_seq)
                    .filter_map(record),
            )
        } else if let Some(live) =
            self.by_status
                .ranges(&filter.statuses, after_seq, filter.tenant.as_ref())
        {
            Box::new(live.filter_map(record))
        } else {
            Box::new(
                self.order
                    .range(filter.tenant.as_ref(), after_seq)
                    .filter_map(record),
            )
        };
        candidates.filter(move |(_, rec)| filter.matches(&rec.view))
    }

    /// A page of the transcript `target` names, visible in `scope`: at most
    /// `limit` entries from position `after` on (the elision notice, when
    /// entries were elided, is position 0).
    pub fn transcript(
        &self,
        scope: &Scope,
        target: TranscriptOf,
        after: usize,
        limit: usize,
        now: std::time::SystemTime,
    ) -> Result<TranscriptPage, Error> {
        let Some((conversation_id, elided, entries)) =
            self.conversations.transcript(target, |t| scope.admits(t))
        else {
            let (field, id) = match target {
                TranscriptOf::Agent(id) => ("agent_id", id),
                TranscriptOf::Conversation(id) => ("conversation_id", id),
            };
            // Another tenant's is answered like an unknown id.
            let visible = self.record_in(scope, id).is_some() || !self.agents.contains_key(&id);
            return Err(if visible {
                self.expired_or_unknown(field, id, self.agents.contains_key(&id), now)
            } else {
                Error::NotFound {
                    field,
                    id: id.to_string(),
                }
            });
        };
        let notice = elided.any().then_some(TranscriptItem::Elided(elided));
        let all: Vec<TranscriptItem> = notice
            .into_iter()
            .chain(
                entries
                    .into_iter()
                    .map(|(agent_id, turn, entry)| TranscriptItem::Entry {
                        agent_id,
                        turn,
                        entry,
                    }),
            )
            .collect();
        let end = after.saturating_add(limit).min(all.len());
        let next_after = (end < all.len()).then_some(end);
        let items = all.into_iter().skip(after).take(limit).collect();
        Ok(TranscriptPage {
            conversation_id,
            items,
            next_after,
        })
    }

    /// Registers `waiter` to be notified when `id` settles. Returns false if
    /// it is settled already.
    pub fn add_waiter(&mut self, id: AgentId, waiter: &Arc<Notify>) -> bool {
        match self.agents.get(&id) {
            Some(rec) if !rec.view.status.is_settled() => {
                let list = self.waiters.entry(id).or_default();
                if !list.iter().any(|w| Arc::ptr_eq(w, waiter)) {
                    list.push(waiter.clone());
                }
                true
            }
            _ => false,
        }
    }

    /// Forgets a waiter (its Await returned or its caller went away).
    pub fn remove_waiter(&mut self, id: AgentId, waiter: &Arc<Notify>) {
        if let Some(list) = self.waiters.get_mut(&id) {
            list.retain(|w| !Arc::ptr_eq(w, waiter));
            if list.is_empty() {
                self.waiters.remove(&id);
            }
        }
    }

    /// Registered Await waiters over all agents (tests check that callers
    /// who went away left none behind).
    pub fn waiter_count(&self) -> usize {
        self.waiters.values().map(Vec::len).sum()
    }

    /// Counts one more WatchAgents stream of `tenant`, or refuses it at
    /// `[limits] max_watchers_per_tenant`.
    pub fn admit_watcher(&mut self, tenant: &Arc<str>) -> Result<(), Error> {
        let limit = self.limits.max_watchers_per_tenant;
        let open = self.tenant_watchers.get(tenant).copied().unwrap_or(0);
        if limit != 0 && open >= limit {
            return Err(Error::WatchLimit {
                tenant: tenant.clone(),
                limit,
                open,
            });
        }
        *self.tenant_watchers.entry(tenant.clone()).or_default() += 1;
        Ok(())
    }

    /// A stream [`Core::admit_watcher`] counted ended.
    pub fn watcher_left(&mut self, tenant: &str) {
        if let Some(n) = self.tenant_watchers.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.tenant_watchers.remove(tenant);
            }
        }
    }

    /// Subscribes to events, see [`EventLog::subscribe`].
    ///
    /// [`EventLog::subscribe`]: crate::scheduler::events::EventLog::subscribe
    pub fn subscribe(&mut self, query: &WatchQuery) -> Subscription {
        let WatchQuery {
            filter,
            after_sequence,
            include_snapshot,
            include_progress,
        } = query;
        let (after_sequence, include_snapshot) = (*after_sequence, *include_snapshot);
        let needs_snapshot = include_snapshot
            || (after_sequence > 0 && !self.events.can_replay_after(after_sequence));
        // Built only when sent, and filtered on the record before a view is
        // made, since this runs under the scheduler lock.
        let snapshot: Option<Vec<AgentView>> = needs_snapshot.then(|| {
            self.candidates(filter, 0)
                .map(|(_, rec)| self.view_of(rec))
                .collect()
        });
        let numbered = snapshot.as_ref().is_some_and(|s| !s.is_empty());
        let subscription =
            self.events
                .subscribe(filter, after_sequence, snapshot, *include_progress);
        if numbered {
            // The snapshot drew sequence numbers: they must be durable before
            // the subscriber sees them, or a restart could issue them again.
            self.position_changed();
        }
        subscription
    }

    /// Ends a routed subscription (see [`EventLog::unsubscribe`]).
    ///
    /// [`EventLog::unsubscribe`]: crate::scheduler::events::EventLog::unsubscribe
    pub fn unsubscribe(&mut self, id: SubscriberId) {
        self.events.unsubscribe(id);
    }

    pub(super) fn publish(&mut self, id: AgentId, kind: EventKind) {
        let view = self.view(id).expect("known agent");
        let event = self.events.publish(kind, view);
        self.published(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::core::indexes::LeadIndex;

    fn id(n: u128) -> AgentId {
        uuid::Uuid::from_u128(n)
    }

    #[test]
    fn a_lead_range_holds_its_own_agents_oldest_first_from_a_sequence_on() {
        let mut index = LeadIndex::default();
        // The same lead id in three tenants, and a second lead in one.
        index.insert("a", "lead", 1, id(1));
        index.insert("b", "lead", 2, id(2));
        index.insert("a", "other", 3, id(3));
        index.insert("a", "lead", 4, id(4));
        index.insert("c", "lead", 5, id(5));
        index.insert("b", "lead", 6, id(6));
        index.insert("a", "lead", 7, id(7));
        let of = |index: &LeadIndex, tenant, lead, from| {
            index
                .range(tenant, lead, from)
                .map(|(seq, id)| (seq, *id))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            of(&index, Some("a"), "lead", 0),
            [(1, id(1)), (4, id(4)), (7, id(7))]
        );
        assert_eq!(of(&index, Some("a"), "lead", 4), [(4, id(4)), (7, id(7))]);
        assert_eq!(of(&index, Some("b"), "lead", 0), [(2, id(2)), (6, id(6))]);
        // Every tenant's, merged in admission order.
        let seqs = |entries: Vec<(u64, AgentId)>| entries.iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(seqs(of(&index, None, "lead", 0)), [1, 2, 4, 5, 6, 7]);
        assert_eq!(seqs(of(&index, None, "lead", 5)), [5, 6, 7]);
        assert_eq!(of(&index, None, "other", 0), [(3, id(3))]);
        index.remove("a", "lead", 4);
        assert_eq!(of(&index, Some("a"), "lead", 0), [(1, id(1)), (7, id(7))]);
        assert!(of(&index, Some("b"), "other", 0).is_empty());
        assert!(of(&index, None, "missing", 0).is_empty());
    }
}
