//! Counters and histograms the core keeps for metrics, updated under the
//! lock it already holds (plain integers: no atomics, no extra lock) and
//! read by the metrics endpoint when it is scraped.

use std::{
    hash::{BuildHasher, Hash, Hasher},
    sync::Arc,
    time::Duration,
};

use hashbrown::HashTable;

use super::{queue::BucketKey, types::AgentStatus};

/// Upper bounds (seconds) of the queue-wait histogram.
pub const QUEUE_WAIT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// Upper bounds (seconds) of the run-duration histogram.
pub const RUN_DURATION_BOUNDS: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
    21600.0,
];

/// A fixed-bucket histogram (Prometheus layout: counts per upper bound,
/// plus the sum and the total count).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative count per bound; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: Duration) {
        let secs = value.as_secs_f64();
        let slot = self.bounds.partition_point(|b| *b < secs);
        self.counts[slot] += 1;
        self.sum += secs;
        self.count += 1;
    }

    /// Sum of all observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// `(upper bound, observations in (previous bound, bound])` pairs,
    /// +Inf last: per bucket, not cumulative (the encoder accumulates).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }
}

/// Terminal statuses in the order of [`BucketStats::finished`].
pub const FINISHED_STATUSES: [AgentStatus; 3] = [
    AgentStatus::Done,
    AgentStatus::Failed,
    AgentStatus::Cancelled,
];

/// One bucket's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStats {
    /// Live agents by state, now.
    pub queued: u32,
    /// Running (RUNNING) agents, now.
    pub running: u32,
    /// Agents waiting for an approval, now.
    pub awaiting_approval: u32,
    /// Agents admitted since start.
    pub spawned: u64,
    /// Agents ended since start, by [`FINISHED_STATUSES`].
    pub finished: [u64; 3],
    /// Time from admission to first start.
    pub queue_wait: Histogram,
    /// Time from first start to the end.
    pub run_duration: Histogram,
}

impl Default for BucketStats {
    fn default() -> Self {
        Self {
            queued: 0,
            running: 0,
            awaiting_approval: 0,
            spawned: 0,
            finished: [0; 3],
            queue_wait: Histogram::new(QUEUE_WAIT_BOUNDS),
            run_duration: Histogram::new(RUN_DURATION_BOUNDS),
        }
    }
}

impl BucketStats {
    /// Live agents (queued, running or awaiting approval).
    pub fn live(&self) -> u32 {
        self.queued + self.running + self.awaiting_approval
    }

    fn gauge(&mut self, status: AgentStatus) -> Option<&mut u32> {
        match status {
            AgentStatus::Queued => Some(&mut self.queued),
            AgentStatus::Running => Some(&mut self.running),
            AgentStatus::AwaitingApproval => Some(&mut self.awaiting_approval),
            AgentStatus::Done | AgentStatus::Failed | AgentStatus::Cancelled => None,
        }
    }
}

/// Every tenant's numbers per bucket. Entries stay once seen, so counters
/// never go back (Prometheus counters must only grow).
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// (tenant, bucket, numbers), found by one hash of the two names: a
    /// Spawn changes its bucket's numbers five times, and a table keyed by
    /// the pair needs no key cloned but the first time (a map of maps
    /// looked up by `&str` took four probes per change).
    buckets: HashTable<(Arc<str>, BucketKey, BucketStats)>,
    hasher: foldhash::fast::RandomState,
}

fn hash_pair(state: &foldhash::fast::RandomState, tenant: &str, bucket: &str) -> u64 {
    let mut h = state.build_hasher();
    tenant.hash(&mut h);
    bucket.hash(&mut h);
    h.finish()
}

impl Stats {
    fn bucket(&mut self, tenant: &Arc<str>, bucket: &BucketKey) -> &mut BucketStats {
        let hasher = &self.hasher;
        let entry = self.buckets.entry(
            hash_pair(hasher, tenant, bucket),
            |(t, b, _)| **t == **tenant && **b == **bucket,
            |(t, b, _)| hash_pair(hasher, t, b),
        );
        &mut entry
            .or_insert_with(|| (tenant.clone(), bucket.clone(), BucketStats::default()))
            .into_mut()
            .2
    }

    /// A new agent of `tenant` entered `bucket` (it starts QUEUED).
    pub fn spawned(&mut self, tenant: &Arc<str>, bucket: &BucketKey) {
        let b = self.bucket(tenant, bucket);
        b.spawned += 1;
        b.queued += 1;
    }

    /// An agent of `bucket` read back from a store, in `status` (counted in
    /// the gauges, not as spawned or finished: that happened before).
    pub fn restored(&mut self, tenant: &Arc<str>, bucket: &BucketKey, status: AgentStatus) {
        if let Some(n) = self.bucket(tenant, bucket).gauge(status) {
            *n += 1;
        }
    }

    /// An agent of `bucket` moved from `from` to `to`.
    pub fn moved(
        &mut self,
        tenant: &Arc<str>,
        bucket: &BucketKey,
        from: AgentStatus,
        to: AgentStatus,
    ) {
        let b = self.bucket(tenant, bucket);
        if let Some(n) = b.gauge(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = b.gauge(to) {
            *n += 1;
        }
        if let Some(i) = FINISHED_STATUSES.iter().position(|s| *s == to) {
            b.finished[i] += 1;
        }
    }

    /// A live agent in `status` moved from bucket `from` to `to` (reload).
    pub fn rebucketed(
        &mut self,
        tenant: &Arc<str>,
        from: &BucketKey,
        to: &BucketKey,
        status: AgentStatus,
    ) {
        if let Some(n) = self.bucket(tenant, from).gauge(status) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.bucket(tenant, to).gauge(status) {
            *n += 1;
        }
    }

    /// An agent of `bucket` started for the first time after `wait`.
    pub fn first_start(&mut self, tenant: &Arc<str>, bucket: &BucketKey, wait: Duration) {
        self.bucket(tenant, bucket).queue_wait.observe(wait);
    }

    /// A started agent of `bucket` ended after running for `ran`.
    pub fn ended(&mut self, tenant: &Arc<str>, bucket: &BucketKey, ran: Duration) {
        self.bucket(tenant, bucket).run_duration.observe(ran);
    }

    /// Every (tenant, bucket) seen, in no particular order.
    pub fn buckets(&self) -> impl Iterator<Item = (&Arc<str>, &BucketKey, &BucketStats)> {
        self.buckets.iter().map(|(t, b, s)| (t, b, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_count_per_bound_and_bounds_are_inclusive() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(1)); // on the bound: counted in `le=1`
        h.observe(Duration::from_secs(3));
        assert_eq!(h.buckets(), vec![(1.0, 2), (2.0, 0), (f64::INFINITY, 1)]);
        assert_eq!(h.count(), 3);
        assert!((h.sum() - 4.5).abs() < 1e-9);
    }

    #[test]
    fn gauges_follow_moves_and_counters_only_grow() {
        let mut s = Stats::default();
        let (t, u): (Arc<str>, Arc<str>) = ("team-a".into(), "team-b".into());
        let b: BucketKey = "acme/m".into();
        s.spawned(&t, &b);
        s.spawned(&t, &b);
        s.spawned(&u, &b);
        s.moved(&t, &b, AgentStatus::Queued, AgentStatus::Running);
        s.moved(&t, &b, AgentStatus::Running, AgentStatus::AwaitingApproval);
        s.moved(&t, &b, AgentStatus::Queued, AgentStatus::Cancelled);
        let of = |s: &Stats, tenant: &str, bucket: &str| {
            s.buckets()
                .find(|(t, b, _)| &***t == tenant && &***b == bucket)
                .map(|(_, _, st)| st.clone())
                .expect("seen")
        };
        let st = of(&s, "team-a", "acme/m");
        assert_eq!((st.queued, st.running, st.awaiting_approval), (0, 0, 1));
        assert_eq!(st.spawned, 2);
        assert_eq!(st.finished, [0, 0, 1]);
        let other_tenant = of(&s, "team-b", "acme/m");
        assert_eq!((other_tenant.queued, other_tenant.spawned), (1, 1));
        let other: BucketKey = "acme".into();
        s.rebucketed(&t, &b, &other, AgentStatus::AwaitingApproval);
        assert_eq!(of(&s, "team-a", "acme/m").live(), 0);
        assert_eq!(of(&s, "team-a", "acme").awaiting_approval, 1);
        assert_eq!(of(&s, "team-b", "acme/m").live(), 1);
    }
}
