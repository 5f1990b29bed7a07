//! Scheduler core without gRPC: the cost of admission + release with many
//! agents queued, and of watch fan-out.
//!
//! `cargo bench --bench scheduler`. See BENCHMARKS.md for results.

use std::{collections::BTreeMap, hint::black_box, time::SystemTime};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use subagentd::{
    config::{AgentTypeConfig, Limits, RunnerKind, RunsConfig, WatchConfig},
    scheduler::{AgentFilter, AgentId, Core, SpawnSpec},
};

const LEADS: usize = 64;

fn core(buckets: usize) -> Core {
    let limits = Limits {
        max_background_agents: u32::MAX,
        // One running agent per bucket: every spawn into a bucket with a
        // running agent queues, every finish starts the bucket's next agent.
        default_concurrency: 1,
        // Per-parent limits are evaluated on every admission (every agent
        // has a lead) but never bind before the bucket does, so the queue
        // length stays constant.
        max_concurrent_per_parent: buckets as u32 + 1,
        ..Limits::default()
    };
    Core::new(
        limits,
        RunsConfig::default(),
        &WatchConfig::default(),
        BTreeMap::from([(
            "simulated".to_owned(),
            AgentTypeConfig {
                runner: RunnerKind::Simulated,
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

/// One admission (a spawn that queues behind the bucket's running agent)
/// plus one release (the running agent finishes, the bucket's oldest queued
/// agent starts). The queue length stays constant.
fn admission_and_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_release");
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
                        .map(|_| core.subscribe(&AgentFilter::default(), 0, false).live)
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
                        while let Ok(ev) = rx.try_recv() {
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

criterion_group!(benches, admission_and_release, watch_fanout);
criterion_main!(benches);
