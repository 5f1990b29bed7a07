//! The core's listing indexes: admission order and live-by-status (each
//! also per tenant), and the lead index; kept beside the records so a
//! listing reads only its own agents.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, BinaryHeap},
    sync::Arc,
};

use foldhash::HashMap;

use crate::scheduler::types::*;

/// Agents in admission order, over every tenant and per tenant, so a
/// tenant's listing reads only its own agents (an admin's, every one).
/// The per-tenant half is a tree of integers per tenant: one tree keyed by
/// (tenant, sequence) compared strings at every level on each change (a
/// Spawn makes six), which cost more than the hash lookup of the tenant.
#[derive(Debug, Default)]
pub(super) struct SeqIndex {
    pub(super) all: BTreeMap<u64, AgentId>,
    pub(super) by_tenant: HashMap<Arc<str>, BTreeMap<u64, AgentId>>,
}

impl SeqIndex {
    pub(super) fn insert(&mut self, tenant: &Arc<str>, seq: u64, id: AgentId) {
        self.all.insert(seq, id);
        match self.by_tenant.get_mut(&**tenant) {
            Some(own) => {
                own.insert(seq, id);
            }
            None => {
                self.by_tenant
                    .insert(tenant.clone(), BTreeMap::from([(seq, id)]));
            }
        }
    }

    pub(super) fn remove(&mut self, tenant: &Arc<str>, seq: u64) {
        self.all.remove(&seq);
        // An emptied tenant's tree stays (its node too): a live-by-status
        // index empties and refills at every Spawn of a quiet tenant. One
        // entry per tenant seen, as the metrics keep.
        if let Some(own) = self.by_tenant.get_mut(&**tenant) {
            own.remove(&seq);
        }
    }

    pub(super) fn contains(&self, seq: u64) -> bool {
        self.all.contains_key(&seq)
    }

    /// Every agent held, oldest first.
    pub(super) fn ids(&self) -> impl Iterator<Item = &AgentId> {
        self.all.values()
    }

    /// The agents from admission sequence `from` on, oldest first: of
    /// `tenant`, or of every tenant when None.
    pub(super) fn range<'a>(
        &'a self,
        tenant: Option<&Arc<str>>,
        from: u64,
    ) -> Box<dyn Iterator<Item = (u64, &'a AgentId)> + 'a> {
        match tenant {
            Some(t) => match self.by_tenant.get(&**t) {
                Some(own) => Box::new(own.range(from..).map(|(&seq, id)| (seq, id))),
                None => Box::new(std::iter::empty()),
            },
            None => Box::new(self.all.range(from..).map(|(&seq, id)| (seq, id))),
        }
    }

    /// (tenant, sequence) of every entry of the per-tenant half and (None,
    /// sequence) of the other, for [`Core::counters`].
    pub(super) fn entries(&self) -> impl Iterator<Item = (Option<String>, u64)> + '_ {
        let own = self
            .by_tenant
            .iter()
            .flat_map(|(t, seqs)| seqs.keys().map(move |seq| (Some(t.to_string()), *seq)));
        self.all.keys().map(|seq| (None, *seq)).chain(own)
    }
}

/// Retained agents by lead id and tenant, in admission order, for `lead_id`
/// listings and snapshots, scoped to a tenant or (an admin's, or any call
/// with authentication off) over every tenant. Keyed by hashes of the lead
/// and the tenant, not the strings: a string key made every insert compare
/// strings behind two pointers at each level of a tree of every retained
/// agent (27 % of `Core::spawn` under a lead-watched load), and an integer
/// key is also smaller. A range may therefore hold agents of another lead
/// or tenant whose hash collides; callers filter on the agent itself (as
/// every listing does). The seed is random per process, so a collision
/// cannot be chosen by a caller.
#[derive(Debug, Default)]
pub(super) struct LeadIndex {
    pub(super) hasher: foldhash::fast::RandomState,
    /// (lead hash, tenant hash, admission sequence).
    pub(super) entries: BTreeMap<(u64, u64, u64), AgentId>,
}

impl LeadIndex {
    pub(super) fn hash(&self, s: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, s)
    }

    pub(super) fn key(&self, tenant: &str, lead: &str, seq: u64) -> (u64, u64, u64) {
        (self.hash(lead), self.hash(tenant), seq)
    }

    pub(super) fn insert(&mut self, tenant: &str, lead: &str, seq: u64, id: AgentId) {
        let key = self.key(tenant, lead, seq);
        self.entries.insert(key, id);
    }

    pub(super) fn remove(&mut self, tenant: &str, lead: &str, seq: u64) {
        let key = self.key(tenant, lead, seq);
        self.entries.remove(&key);
    }

    /// The agents under `lead` from admission sequence `from` on, oldest
    /// first: of `tenant`, or of every tenant when None (one ordered run
    /// per tenant, merged: O(tenants under the lead × log n) to start, then
    /// O(log tenants) per agent). Agents of a colliding lead or tenant may
    /// be among them.
    pub(super) fn range<'a>(
        &'a self,
        tenant: Option<&str>,
        lead: &str,
        from: u64,
    ) -> Box<dyn Iterator<Item = (u64, &'a AgentId)> + 'a> {
        let lead = self.hash(lead);
        let run = move |tenant: u64| {
            self.entries
                .range((lead, tenant, from)..=(lead, tenant, u64::MAX))
                .map(|(&(_, _, seq), id)| (seq, id))
        };
        if let Some(tenant) = tenant {
            return Box::new(run(self.hash(tenant)));
        }
        let mut runs = Vec::new();
        let mut next_tenant = Some(0);
        while let Some(at) = next_tenant {
            let Some((&(l, tenant, _), _)) = self.entries.range((lead, at, 0)..).next() else {
                break;
            };
            if l != lead {
                break;
            }
            runs.push(run(tenant));
            next_tenant = tenant.checked_add(1);
        }
        if runs.len() == 1 {
            return Box::new(runs.pop().expect("one run"));
        }
        Box::new(MergedBySeq::new(runs))
    }
}

/// Ordered runs of (sequence, id), merged into one ordered by sequence.
struct MergedBySeq<'a, I> {
    pub(super) runs: Vec<I>,
    pub(super) heads: BinaryHeap<Reverse<(u64, usize, &'a AgentId)>>,
}

impl<'a, I: Iterator<Item = (u64, &'a AgentId)>> MergedBySeq<'a, I> {
    fn new(mut runs: Vec<I>) -> Self {
        let heads = runs
            .iter_mut()
            .enumerate()
            .filter_map(|(i, run)| run.next().map(|(seq, id)| Reverse((seq, i, id))))
            .collect();
        Self { runs, heads }
    }
}

impl<'a, I: Iterator<Item = (u64, &'a AgentId)>> Iterator for MergedBySeq<'a, I> {
    type Item = (u64, &'a AgentId);

    fn next(&mut self) -> Option<Self::Item> {
        let Reverse((seq, i, id)) = self.heads.pop()?;
        if let Some((next_seq, next_id)) = self.runs[i].next() {
            self.heads.push(Reverse((next_seq, i, next_id)));
        }
        Some((seq, id))
    }
}

/// Live agents by state (QUEUED, RUNNING, AWAITING_APPROVAL), each in
/// admission order, over every tenant and per tenant. Terminal states are
/// not indexed: retained finished agents far outnumber live ones and
/// would cost an entry each.
#[derive(Debug, Default)]
pub(super) struct LiveByStatus {
    pub(super) queued: SeqIndex,
    pub(super) running: SeqIndex,
    pub(super) awaiting_approval: SeqIndex,
}

impl LiveByStatus {
    pub(super) fn of(&self, status: AgentStatus) -> Option<&SeqIndex> {
        match status {
            AgentStatus::Queued => Some(&self.queued),
            AgentStatus::Running => Some(&self.running),
            AgentStatus::AwaitingApproval => Some(&self.awaiting_approval),
            AgentStatus::Done | AgentStatus::Failed | AgentStatus::Cancelled => None,
        }
    }

    pub(super) fn of_mut(&mut self, status: AgentStatus) -> Option<&mut SeqIndex> {
        match status {
            AgentStatus::Queued => Some(&mut self.queued),
            AgentStatus::Running => Some(&mut self.running),
            AgentStatus::AwaitingApproval => Some(&mut self.awaiting_approval),
            AgentStatus::Done | AgentStatus::Failed | AgentStatus::Cancelled => None,
        }
    }

    /// Moves agent `id` of `tenant` (admission sequence `seq`) from `from`
    /// (None: new) to `to`.
    pub(super) fn moved(
        &mut self,
        tenant: &Arc<str>,
        seq: u64,
        id: AgentId,
        from: Option<AgentStatus>,
        to: AgentStatus,
    ) {
        if let Some(index) = from.and_then(|f| self.of_mut(f)) {
            index.remove(tenant, seq);
        }
        if let Some(index) = self.of_mut(to) {
            index.insert(tenant, seq, id);
        }
    }

    /// The agents in any of `statuses` from admission sequence `from` on,
    /// oldest first, of `tenant` (None: every tenant), when every one of
    /// them is a live state (None when the index cannot answer: no
    /// statuses, or a terminal one among them).
    pub(super) fn ranges<'a>(
        &'a self,
        statuses: &[AgentStatus],
        from: u64,
        tenant: Option<&Arc<str>>,
    ) -> Option<impl Iterator<Item = (u64, &'a AgentId)> + 'a> {
        if statuses.is_empty() {
            return None;
        }
        let mut indexes: Vec<&SeqIndex> = Vec::with_capacity(3);
        for status in statuses {
            let index = self.of(*status)?;
            if !indexes.iter().any(|i| std::ptr::eq(*i, index)) {
                indexes.push(index);
            }
        }
        let mut heads: Vec<_> = indexes
            .into_iter()
            .map(|i| i.range(tenant, from).peekable())
            .collect();
        // A merge of at most three ordered ranges by sequence.
        Some(std::iter::from_fn(move || {
            let next = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(i, h)| h.peek().map(|(seq, _)| (*seq, i)))
                .min()?;
            heads[next.1].next()
        }))
    }

    /// Every (state, tenant or None, sequence) held, for [`Core::counters`].
    pub(super) fn entries(&self) -> BTreeSet<(&'static str, Option<String>, u64)> {
        [
            (AgentStatus::Queued, &self.queued),
            (AgentStatus::Running, &self.running),
            (AgentStatus::AwaitingApproval, &self.awaiting_approval),
        ]
        .into_iter()
        .flat_map(|(status, index)| {
            index
                .entries()
                .map(move |(tenant, seq)| (status.name(), tenant, seq))
        })
        .collect()
    }
}

/// Whose inbox an inbox Await waits on, as the core keys its waiters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum InboxKey {
    /// (tenant, lead).
    Lead(Arc<str>, Arc<str>),
    Parent(AgentId),
}
