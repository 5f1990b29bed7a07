//! The numbers behind the report: percentiles and per-request costs of one
//! timed phase, ratios to the same round's baseline, and medians over the
//! rounds.

use crate::{cli::Scenario, load::LoadResult, servers::CommitCounts};

use super::model::{Row, RunReport, StoreStats, WatchStats};

const MIB: f64 = 1024.0 * 1024.0;

/// The raw numbers of one timed phase, for [`Row::new`].
#[derive(Debug)]
pub struct Measurement<'a> {
    /// The driver's result.
    pub result: &'a LoadResult,
    /// Server CPU during the timed phase, seconds.
    pub server_cpu_s: f64,
    /// Client CPU during the timed phase, seconds.
    pub client_cpu_s: f64,
    /// Server VmHWM, bytes.
    pub server_peak_rss_bytes: u64,
    /// Store counters over the timed phase (store scenarios only).
    pub commits: Option<CommitCounts>,
}

impl Row {
    /// A row from one timed phase; ratios are filled by [`RunReport::finish`].
    pub fn new(
        scenario: Scenario,
        concurrency: usize,
        m: Measurement<'_>,
        watch: Option<WatchStats>,
    ) -> Self {
        let h = &m.result.histogram;
        let ms = |micros: u64| micros as f64 / 1000.0;
        let per_1k = |cpu_s: f64| cpu_s * 1000.0 / (m.result.requests().max(1) as f64);
        Self {
            round: 1,
            scenario,
            concurrency,
            requests: m.result.requests(),
            elapsed_s: m.result.elapsed.as_secs_f64(),
            requests_per_s: m.result.requests_per_second(),
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
            errors: m.result.errors(),
            rps_vs_baseline: None,
            p99_vs_baseline: None,
            server_cpu_s_per_1k: per_1k(m.server_cpu_s),
            client_cpu_s_per_1k: per_1k(m.client_cpu_s),
            server_peak_rss_mib: m.server_peak_rss_bytes as f64 / MIB,
            watch,
            rps_vs_memory: None,
            p99_vs_memory: None,
            store: m.commits.map(|c| {
                let per_commit = |n: f64| n / (c.commits.max(1) as f64);
                StoreStats {
                    commits: c.commits,
                    changes: c.changes,
                    commits_per_s: c.commits as f64 / m.result.elapsed.as_secs_f64().max(1e-9),
                    changes_per_commit: per_commit(c.changes as f64),
                    requests_per_commit: per_commit(m.result.requests() as f64),
                }
            }),
        }
    }
}

impl RunReport {
    /// Fills the ratios to the baseline (and, for the store rows, to
    /// bg-spawn) of every row.
    pub(super) fn fill_ratios(&mut self) {
        let baselines: Vec<(usize, usize, f64, f64)> = self
            .rows
            .iter()
            .filter(|r| r.scenario == Scenario::Baseline)
            .map(|r| (r.round, r.concurrency, r.requests_per_s, r.p99_ms))
            .collect();
        let memory: Vec<(usize, usize, f64, f64)> = self
            .rows
            .iter()
            .filter(|r| r.scenario == Scenario::BgSpawn)
            .map(|r| (r.round, r.concurrency, r.requests_per_s, r.p99_ms))
            .collect();
        let same = |row: &Row, of: &[(usize, usize, f64, f64)]| {
            of.iter()
                .find(|b| b.0 == row.round && b.1 == row.concurrency)
                .map(|b| (b.2, b.3))
        };
        for row in &mut self.rows {
            if let Some((rps, p99)) = same(row, &baselines) {
                row.rps_vs_baseline = ratio(row.requests_per_s, rps);
                row.p99_vs_baseline = ratio(row.p99_ms, p99);
            }
            if row.scenario.has_store() {
                if let Some((rps, p99)) = same(row, &memory) {
                    row.rps_vs_memory = ratio(row.requests_per_s, rps);
                    row.p99_vs_memory = ratio(row.p99_ms, p99);
                }
            }
        }
    }

    /// `f(a, b)` for every round that measured both `a` and `b` at
    /// `concurrency`.
    pub(super) fn per_round(
        &self,
        a: Scenario,
        b: Scenario,
        concurrency: usize,
        f: impl Fn(&Row, &Row) -> f64,
    ) -> Vec<f64> {
        (1..=self.settings.rounds)
            .filter_map(|round| {
                let ra = self.row(round, a, concurrency)?;
                let rb = self.row(round, b, concurrency)?;
                Some(f(ra, rb))
            })
            .collect()
    }

    /// `f(row)` for every round that measured `scenario` at `concurrency`.
    pub(super) fn per_round_of(
        &self,
        scenario: Scenario,
        concurrency: usize,
        f: impl Fn(&Row) -> f64,
    ) -> Vec<f64> {
        (1..=self.settings.rounds)
            .filter_map(|round| self.row(round, scenario, concurrency).map(&f))
            .collect()
    }
}

/// The median and range of one number over the rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Spread {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
    rounds: usize,
}

impl Spread {
    /// None when no round measured it.
    pub(super) fn of(mut values: Vec<f64>) -> Option<Self> {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => values[n / 2],
            _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        Some(Self {
            median,
            min: values[0],
            max: values[n - 1],
            rounds: n,
        })
    }

    pub(super) fn describe(&self, unit: &str) -> String {
        let fmt = |v: f64| {
            if v >= 1000.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        if self.rounds == 1 {
            format!("{}{unit}", fmt(self.median))
        } else {
            format!(
                "median {}{unit} over {} rounds (range {}–{})",
                fmt(self.median),
                self.rounds,
                fmt(self.min),
                fmt(self.max)
            )
        }
    }
}

fn ratio(value: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| value / base)
}
