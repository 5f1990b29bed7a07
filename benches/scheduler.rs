//! Scheduler core without gRPC: the cost of admission + release with many
//! agents queued, and of watch fan-out.
//!
//! `cargo bench --bench scheduler`. See BENCHMARKS.md for results.

use std::{collections::BTreeMap, hint::black_box, time::SystemTime};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::{collections::HashMap, sync::Arc};

use subagentd::{
    config::{AgentTypeConfig, Limits, RunnerKind, RunsConfig, WatchConfig},
    scheduler::{
        queue::{AdmissionQueue, BucketKey, Dirty, SubKey},
        AgentFilter, AgentId, AgentStatus, Core, ParentKey, Received, SpawnSpec, WatchQuery,
    },
};

const LEADS: usize = 64;

fn core(buckets: usize) -> Core {
    core_with(Limits {
        max_background_agents: u32::MAX,
        // One running agent per bucket: every spawn into a bucket with a
        // running agent queues, every finish starts the bucket's next agent.
        default_concurrency: 1,
        // Per-parent limits are evaluated on every admission (every agent
        // has a lead) but never bind before the bucket does, so the queue
        // length stays constant.
        max_concurrent_per_parent: buckets as u32 + 1,
        ..Limits::default()
    })
}

fn core_with(limits: Limits) -> Core {
    Core::new(
        limits,
        RunsConfig::default(),
        &WatchConfig::default(),
        BTreeMap::from([(
            "simulated".to_owned(),
            AgentTypeConfig {
                runner: RunnerKind::Simulated,
                retry_on_worker_lost: 0,
                ..AgentTypeConfig::default()
            },
        )]),
    )
}

fn spec(bucket: usize, lead: usize) -> SpawnSpec {
    SpawnSpec {
        agent: "simulated".into(),
        model: format!("p/m{bucket}"),
        prompt: "hi".into(),
        lead_id: Some(format!("lead-{lead}")),
        background: true,
        ..SpawnSpec::default()
    }
}

/// A core with one running agent per bucket and `queued` agents waiting,
/// spread round-robin over the buckets. Returns the running agent of each
/// bucket.
fn filled(buckets: usize, queued: usize) -> (Core, Vec<std::collections::VecDeque<AgentId>>) {
    let mut c = core(buckets);
    let now = SystemTime::now();
    let mut per_bucket = vec![std::collections::VecDeque::new(); buckets];
    for i in 0..buckets + queued {
        let b = i % buckets;
        let (view, _) = c.spawn(spec(b, i % LEADS), now).expect("admitted");
        per_bucket[b].push_back(view.id);
    }
    drop(c.take_starts());
    (c, per_bucket)
}

/// The admission queue alone, as the peers' queue code is measured: one
/// acquire that has to queue (its bucket is full) and one release that
/// starts the bucket's oldest eligible agent, with bucket and per-parent
/// room checked against live counters. The queue length stays constant.
fn queue_admission_and_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue_admission_release");
    group.throughput(Throughput::Elements(1));
    for &buckets in &[1usize, 1000] {
        for &queued in &[0usize, 1_000, 100_000] {
            let bucket_keys: Vec<BucketKey> =
                (0..buckets).map(|b| Arc::from(format!("p/m{b}"))).collect();
            let parents: Vec<ParentKey> = (0..LEADS)
                .map(|l| ParentKey::Lead(Arc::from("t"), Arc::from(format!("lead-{l}"))))
                .collect();
            // Every bucket runs one agent (limit 1); parents have room.
            let mut bucket_running: HashMap<BucketKey, u32> =
                bucket_keys.iter().map(|b| (b.clone(), 1)).collect();
            let parent_running: HashMap<ParentKey, u32> =
                parents.iter().map(|p| (p.clone(), 0)).collect();
            let mut q = AdmissionQueue::default();
            let mut seq = 0u64;
            for i in 0..queued {
                seq += 1;
                let key = SubKey::new(bucket_keys[i % buckets].clone(), parents[i % LEADS].clone());
                q.push(seq, AgentId::from_u128(seq as u128), key);
            }
            let mut i = 0usize;
            group.bench_function(
                BenchmarkId::new(format!("buckets_{buckets}"), format!("queued_{queued}")),
                |b| {
                    b.iter(|| {
                        let bucket = &bucket_keys[i % buckets];
                        let parent = &parents[i % LEADS];
                        i += 1;
                        // Acquire: the bucket is full, so the agent queues.
                        seq += 1;
                        assert!(bucket_running[bucket] >= 1, "every bucket is full");
                        let key = SubKey::new(bucket.clone(), parent.clone());
                        q.push(seq, AgentId::from_u128(seq as u128), key);
                        // Release: the bucket's running agent ends; its oldest
                        // eligible queued agent takes the slot.
                        *bucket_running.get_mut(bucket).expect("bucket") -= 1;
                        let mut dirty = Dirty::default();
                        dirty.bucket(bucket);
                        let (s, id, key) = q
                            .next_eligible(
                                &dirty,
                                |b| bucket_running[b] < 1,
                                |p| parent_running[p] < u32::MAX,
                                |_| true,
                            )
                            .expect("an eligible agent");
                        q.remove(s, &key);
                        *bucket_running.get_mut(&key.bucket).expect("bucket") += 1;
                        black_box(id);
                    })
                },
            );
        }
    }
    group.finish();
}

/// The whole core path: one spawn that queues behind the bucket's running
/// agent (record, id, QUEUED event) plus one finish (DONE event, slots
/// released, the bucket's oldest queued agent started with its run
/// hand-off and STARTED event). The queue length stays constant.
fn admission_and_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("core_spawn_finish");
    group.throughput(Throughput::Elements(1));
    for &buckets in &[1usize, 1000] {
        for &queued in &[0usize, 1_000, 100_000] {
            let (mut core, mut per_bucket) = filled(buckets, queued);
            let mut i = 0usize;
            let now = SystemTime::now();
            group.bench_function(
                BenchmarkId::new(format!("buckets_{buckets}"), format!("queued_{queued}")),
                |b| {
                    b.iter(|| {
                        let bucket = i % buckets;
                        i += 1;
                        let (view, _) = core.spawn(spec(bucket, i % LEADS), now).expect("admitted");
                        per_bucket[bucket].push_back(view.id);
                        let running = per_bucket[bucket].pop_front().expect("a running agent");
                        black_box(core.finish(running, Ok(String::new())));
                        black_box(core.take_starts());
                    })
                },
            );
            // Finished agents are retained like in the server; sweeping them
            // is a separate, batched cost.
        }
    }
    group.finish();
}

/// Publishing one event to 1 and 100 subscribers, each draining its
/// receiver.
fn watch_fanout(c: &mut Criterion) {
    let mut group = c.benchmark_group("watch_fanout");
    for &subscribers in &[1usize, 100] {
        group.throughput(Throughput::Elements(subscribers as u64));
        group.bench_function(BenchmarkId::from_parameter(subscribers), |b| {
            b.iter_batched_ref(
                || {
                    let mut core = core(1);
                    let subs: Vec<_> = (0..subscribers)
                        .map(|_| core.subscribe(&WatchQuery::default()).live)
                        .collect();
                    (core, subs)
                },
                |(core, subs)| {
                    // A foreground spawn publishes STARTED; finishing it
                    // publishes DONE: two events per iteration.
                    let mut s = spec(0, 0);
                    s.background = false;
                    let (view, _) = core.spawn(s, SystemTime::now()).expect("admitted");
                    core.finish(view.id, Ok(String::new()));
                    for rx in subs.iter_mut() {
                        while let Received::Event(ev) = rx.try_recv() {
                            black_box(ev);
                        }
                    }
                    drop(core.take_starts());
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// A core retaining `finished` finished agents, then 100 running ones
/// under lead `lead-watched` (the finished ones are spread over 64 other
/// leads), as a dashboard server looks after a busy day.
fn retaining(finished: usize) -> Core {
    let mut core = core_with(Limits {
        max_background_agents: u32::MAX,
        default_concurrency: 0,
        max_concurrent_per_parent: 0,
        ..Limits::default()
    });
    let now = SystemTime::now();
    for i in 0..finished {
        let (view, _) = core.spawn(spec(0, i % LEADS), now).expect("admitted");
        core.finish(view.id, Ok(String::new()));
        drop(core.take_starts());
    }
    for _ in 0..100 {
        let mut s = spec(0, 0);
        s.lead_id = Some("lead-watched".into());
        core.spawn(s, now).expect("admitted");
    }
    drop(core.take_starts());
    core
}

/// What a dashboard polls: `Status{statuses=[RUNNING], page_size=100}`, and
/// the WatchAgents snapshot of one lead's agents, with 1M retained
/// finished agents and 100 running.
fn status_listing(c: &mut Criterion) {
    let mut group = c.benchmark_group("status_listing");
    group.sample_size(20);
    let mut core = retaining(1_000_000);
    let running = AgentFilter {
        statuses: vec![AgentStatus::Running],
        ..AgentFilter::default()
    };
    group.bench_function("running_page_100_of_1m_retained", |b| {
        b.iter(|| {
            let page = core.list(&running, 0, 100);
            assert_eq!(page.agents.len(), 100);
            black_box(page)
        })
    });
    let lead = WatchQuery {
        filter: AgentFilter {
            lead_id: Some("lead-watched".into()),
            ..AgentFilter::default()
        },
        include_snapshot: true,
        ..WatchQuery::default()
    };
    group.bench_function("lead_snapshot_100_of_1m_retained", |b| {
        b.iter(|| {
            let sub = core.subscribe(&lead);
            assert_eq!(sub.initial.len(), 100);
            black_box(sub)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    queue_admission_and_release,
    admission_and_release,
    watch_fanout,
    status_listing
);
criterion_main!(benches);
