//! The admission queue: queued agents grouped into sub-queues by the exact
//! set of limits that hold them, with per-limit indexes of sub-queue heads.
//!
//! Inside one sub-queue every agent is held by the same bucket and the same
//! parent, so FIFO there is exact. When a limit frees a slot only the
//! sub-queues passing through that limit can have become startable; their
//! heads are ordered by admission sequence, so the earliest eligible agent is
//! found by walking that limit's head index and skipping whole sub-queues
//! whose *other* limit is full. Nothing here scans individual queued agents:
//! push, remove and pop are O(log n).
//!
//! Agents of a worker type that have no worker yet are also held by worker
//! capacity for their type: a third limit with its own head index. Queued
//! foreground agents (which bypass bucket and parent limits) can only be
//! waiting for a worker, so they are indexed by type alone.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use super::types::{AgentId, ParentKey};

/// Key of a concurrency bucket: a model ("provider/model") or a provider.
pub type BucketKey = Arc<str>;

/// Whose worker capacity an agent needs: (tenant, agent type). A worker
/// serves only its own tenant's runs, so capacity is per tenant.
pub type WorkerKey = (Arc<str>, Arc<str>);

/// The full tuple of limits that hold a queued agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubKey {
    /// Its bucket.
    pub bucket: BucketKey,
    /// Its parent for the per-parent limit.
    pub parent: ParentKey,
    /// Its tenant and agent type, when it needs a worker's capacity to
    /// start.
    pub worker_type: Option<WorkerKey>,
    /// Foreground: not held by its bucket or parent limit.
    pub foreground: bool,
}

impl SubKey {
    /// A background agent held by its bucket and parent only.
    pub fn new(bucket: BucketKey, parent: ParentKey) -> Self {
        Self {
            bucket,
            parent,
            worker_type: None,
            foreground: false,
        }
    }
}

/// Limits whose room grew since the last drain.
#[derive(Debug, Default)]
pub struct Dirty {
    buckets: Vec<BucketKey>,
    parents: Vec<ParentKey>,
    types: Vec<WorkerKey>,
    all: bool,
}

impl Dirty {
    /// A bucket freed a slot (or its limit rose).
    pub fn bucket(&mut self, b: &BucketKey) {
        if !self.buckets.contains(b) {
            self.buckets.push(b.clone());
        }
    }

    /// A parent freed a slot.
    pub fn parent(&mut self, p: &ParentKey) {
        if *p != ParentKey::None && !self.parents.contains(p) {
            self.parents.push(p.clone());
        }
    }

    /// Worker capacity for a tenant's agent type grew (a worker connected
    /// or freed a slot).
    pub fn worker_type(&mut self, t: &WorkerKey) {
        if !self.types.contains(t) {
            self.types.push(t.clone());
        }
    }

    /// Every limit may have room (after a limit change).
    pub fn everything(&mut self) {
        self.all = true;
    }

    /// Nothing freed.
    pub fn is_empty(&self) -> bool {
        !self.all && self.buckets.is_empty() && self.parents.is_empty() && self.types.is_empty()
    }
}

/// Queued agents, see the module docs.
#[derive(Debug, Default)]
pub struct AdmissionQueue {
    subqueues: HashMap<SubKey, BTreeMap<u64, AgentId>>,
    by_bucket: HashMap<BucketKey, BTreeMap<u64, SubKey>>,
    by_parent: HashMap<ParentKey, BTreeMap<u64, SubKey>>,
    by_type: HashMap<WorkerKey, BTreeMap<u64, SubKey>>,
    len: usize,
}

impl AdmissionQueue {
    /// Number of queued agents.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues an agent under its admission sequence number. A resumed agent
    /// keeps its old number, so it goes ahead of newer agents.
    pub fn push(&mut self, seq: u64, id: AgentId, key: SubKey) {
        // Look up before inserting so the common case (the sub-queue
        // exists) clones no key.
        let sub = match self.subqueues.get_mut(&key) {
            Some(sub) => sub,
            None => self.subqueues.entry(key.clone()).or_default(),
        };
        let old_head = sub.keys().next().copied();
        sub.insert(seq, id);
        self.len += 1;
        if old_head.is_none_or(|h| seq < h) {
            self.move_head(&key, old_head, Some(seq));
        }
    }

    /// Removes a queued agent; returns whether it was there.
    pub fn remove(&mut self, seq: u64, key: &SubKey) -> bool {
        let Some(sub) = self.subqueues.get_mut(key) else {
            return false;
        };
        let old_head = sub.keys().next().copied();
        if sub.remove(&seq).is_none() {
            return false;
        }
        self.len -= 1;
        let new_head = sub.keys().next().copied();
        if new_head.is_none() {
            self.subqueues.remove(key);
        }
        if old_head != new_head {
            self.move_head(key, old_head, new_head);
        }
        true
    }

    fn move_head(&mut self, key: &SubKey, old: Option<u64>, new: Option<u64>) {
        fn update<K: std::hash::Hash + Eq + Clone>(
            index: &mut HashMap<K, BTreeMap<u64, SubKey>>,
            k: &K,
            key: &SubKey,
            old: Option<u64>,
            new: Option<u64>,
        ) {
            let heads = match index.get_mut(k) {
                Some(heads) => heads,
                None => index.entry(k.clone()).or_default(),
            };
            if let Some(old) = old {
                heads.remove(&old);
            }
            if let Some(new) = new {
                heads.insert(new, key.clone());
            }
            if heads.is_empty() {
                index.remove(k);
            }
        }
        if !key.foreground {
            update(&mut self.by_bucket, &key.bucket, key, old, new);
            if key.parent != ParentKey::None {
                update(&mut self.by_parent, &key.parent, key, old, new);
            }
        }
        if let Some(t) = &key.worker_type {
            update(&mut self.by_type, t, key, old, new);
        }
    }

    /// The earliest queued agent that passes through a dirty limit and
    /// whose limits all have room, as `(seq, id, key)`.
    ///
    /// `bucket_room` / `parent_room` answer whether a limit can take one
    /// more running agent.
    pub fn next_eligible<'a>(
        &'a self,
        dirty: &Dirty,
        bucket_room: impl Fn(&BucketKey) -> bool,
        parent_room: impl Fn(&ParentKey) -> bool,
        type_room: impl Fn(&WorkerKey) -> bool,
    ) -> Option<(u64, AgentId, SubKey)> {
        let mut best: Option<(u64, &SubKey)> = None;
        let mut consider = |candidate: Option<(&u64, &'a SubKey)>| {
            if let Some((&seq, key)) = candidate {
                if best.is_none_or(|(s, _)| seq < s) {
                    best = Some((seq, key));
                }
            }
        };
        let worker_ok = |k: &SubKey| k.worker_type.as_ref().is_none_or(&type_room);
        let first_in_bucket = |b: &BucketKey, heads: &'a BTreeMap<u64, SubKey>| {
            if bucket_room(b) {
                heads
                    .iter()
                    .find(|(_, k)| parent_room(&k.parent) && worker_ok(k))
            } else {
                None
            }
        };
        let first_of_type = |t: &WorkerKey, heads: &'a BTreeMap<u64, SubKey>| {
            if type_room(t) {
                heads.iter().find(|(_, k)| {
                    k.foreground || (bucket_room(&k.bucket) && parent_room(&k.parent))
                })
            } else {
                None
            }
        };
        if dirty.all {
            for (b, heads) in &self.by_bucket {
                consider(first_in_bucket(b, heads));
            }
            for (t, heads) in &self.by_type {
                consider(first_of_type(t, heads));
            }
        } else {
            for b in &dirty.buckets {
                if let Some(heads) = self.by_bucket.get(b) {
                    consider(first_in_bucket(b, heads));
                }
            }
            for p in &dirty.parents {
                if !parent_room(p) {
                    continue;
                }
                if let Some(heads) = self.by_parent.get(p) {
                    consider(
                        heads
                            .iter()
                            .find(|(_, k)| bucket_room(&k.bucket) && worker_ok(k)),
                    );
                }
            }
            for t in &dirty.types {
                if let Some(heads) = self.by_type.get(t) {
                    consider(first_of_type(t, heads));
                }
            }
        }
        let (seq, key) = best?;
        let id = *self.subqueues.get(key)?.get(&seq)?;
        Some((seq, id, key.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn key(b: &str, p: u128) -> SubKey {
        SubKey::new(
            b.into(),
            if p == 0 {
                ParentKey::None
            } else {
                ParentKey::Agent(Uuid::from_u128(p))
            },
        )
    }

    #[test]
    fn fifo_within_a_bucket_and_earliest_across_dirty_limits() {
        let mut q = AdmissionQueue::default();
        q.push(1, Uuid::from_u128(1), key("a", 0));
        q.push(2, Uuid::from_u128(2), key("b", 0));
        q.push(3, Uuid::from_u128(3), key("a", 0));
        let mut dirty = Dirty::default();
        dirty.bucket(&"a".into());
        dirty.bucket(&"b".into());
        let (seq, _, k) = q
            .next_eligible(&dirty, |_| true, |_| true, |_| true)
            .unwrap();
        assert_eq!(seq, 1);
        assert!(q.remove(seq, &k));
        let (seq, _, _) = q
            .next_eligible(&dirty, |_| true, |_| true, |_| true)
            .unwrap();
        assert_eq!(seq, 2);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn a_full_parent_is_skipped_without_blocking_others_in_the_bucket() {
        let mut q = AdmissionQueue::default();
        q.push(1, Uuid::from_u128(1), key("a", 7));
        q.push(2, Uuid::from_u128(2), key("a", 8));
        let mut dirty = Dirty::default();
        dirty.bucket(&"a".into());
        let full = ParentKey::Agent(Uuid::from_u128(7));
        let (seq, _, _) = q
            .next_eligible(&dirty, |_| true, |p| *p != full, |_| true)
            .unwrap();
        assert_eq!(seq, 2);
    }

    #[test]
    fn a_resumed_agent_goes_ahead_of_newer_ones() {
        let mut q = AdmissionQueue::default();
        q.push(5, Uuid::from_u128(5), key("a", 0));
        q.push(2, Uuid::from_u128(2), key("a", 0));
        let mut dirty = Dirty::default();
        dirty.everything();
        assert_eq!(
            q.next_eligible(&dirty, |_| true, |_| true, |_| true)
                .unwrap()
                .0,
            2
        );
        assert!(q.remove(2, &key("a", 0)));
        assert!(!q.remove(2, &key("a", 0)));
        assert_eq!(
            q.next_eligible(&dirty, |_| true, |_| true, |_| true)
                .unwrap()
                .0,
            5
        );
    }
}
