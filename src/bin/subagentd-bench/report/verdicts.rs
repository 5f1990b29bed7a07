//! The targets that these measurements can decide (pass, fail or
//! not measured), and what fails the exit status. Verdicts never change the
//! exit status (no timing assertions in CI); only errors and server failures
//! do.

use crate::cli::Scenario;

use super::{
    model::{MemoryReport, Row, RunReport, Verdict, VerdictStatus},
    statistics::Spread,
};

/// Target: bg-spawn requests/s ≥ this × baseline at concurrency 64.
const BG_SPAWN_THROUGHPUT_TARGET: f64 = 0.8;
/// Target: bg-spawn p99 ≤ this × baseline p99 at concurrency 16.
const BG_SPAWN_P99_TARGET: f64 = 1.5;
/// Target: events/s delivered to all watchers together.
const WATCH_EVENTS_TARGET: f64 = 1_000_000.0;
/// Target: bg-spawn-watched requests/s ≥ this × bg-spawn.
const WATCHED_THROUGHPUT_TARGET: f64 = 0.9;
/// Target: bg-spawn-embedded requests/s ≥ this × bg-spawn (memory) at
/// concurrency 64.
const EMBEDDED_THROUGHPUT_TARGET: f64 = 0.6;
/// Target: bg-spawn-postgres requests/s ≥ this × bg-spawn at concurrency 64.
const POSTGRES_THROUGHPUT_TARGET: f64 = 0.25;
/// Target: bg-spawn-embedded p99 at concurrency 16, ms.
const EMBEDDED_P99_TARGET_MS: f64 = 10.0;
/// Target: bytes per retained finished agent beyond its prompt and result.
const BYTES_PER_AGENT_TARGET: f64 = 1024.0;
/// Target: idle RSS, MiB.
const IDLE_RSS_TARGET_MIB: f64 = 20.0;

impl Verdict {
    fn decide(target: &str, measured: Option<(bool, String)>, missing: &str) -> Self {
        let (status, detail) = match measured {
            Some((true, detail)) => (VerdictStatus::Met, detail),
            Some((false, detail)) => (VerdictStatus::NotMet, detail),
            None => (VerdictStatus::NotMeasured, format!("needs {missing}")),
        };
        Self {
            target: target.to_owned(),
            status,
            detail,
        }
    }
}

impl RunReport {
    /// Fills the ratios to the baseline and decides the verdicts.
    pub fn finish(&mut self) {
        self.fill_ratios();
        self.verdicts = self.verdicts();
    }

    fn verdicts(&self) -> Vec<Verdict> {
        use Scenario::{
            Baseline, BgSpawn, BgSpawnEmbedded, BgSpawnLeadWatched, BgSpawnPostgres, BgSpawnWatched,
        };
        let rps = |s: &Row, base: &Row| s.requests_per_s / base.requests_per_s;
        let p99 = |s: &Row, base: &Row| s.p99_ms / base.p99_ms;
        let watched_events: Vec<(f64, usize)> = (1..=self.settings.rounds)
            .filter_map(|round| self.row(round, BgSpawnWatched, 64)?.watch.as_ref())
            .map(|w| (w.events_per_s, w.watchers))
            .collect();
        vec![
            Verdict::decide(
                "background Spawn throughput ≥ 0.8 × baseline at concurrency 64",
                Spread::of(self.per_round(BgSpawn, Baseline, 64, rps))
                    .map(|r| (r.median >= BG_SPAWN_THROUGHPUT_TARGET, r.describe("×"))),
                "baseline and bg-spawn at concurrency 64",
            ),
            Verdict::decide(
                "background Spawn p99 ≤ 1.5 × baseline p99 at concurrency 16",
                Spread::of(self.per_round(BgSpawn, Baseline, 16, p99))
                    .map(|r| (r.median <= BG_SPAWN_P99_TARGET, r.describe("×"))),
                "baseline and bg-spawn at concurrency 16",
            ),
            Verdict::decide(
                "with 100 watchers: ≥ 1M events/s delivered in total (concurrency 64)",
                Spread::of(watched_events.iter().map(|e| e.0).collect()).map(|r| {
                    let mut detail = r.describe(" events/s");
                    if watched_events.iter().any(|e| e.1 != 100) {
                        detail.push_str(" (the target is stated for 100 watchers)");
                    }
                    (r.median >= WATCH_EVENTS_TARGET, detail)
                }),
                "bg-spawn-watched at concurrency 64",
            ),
            Verdict::decide(
                "with 100 watchers: Spawn throughput ≥ 0.9 × without watchers (concurrency 64)",
                Spread::of(self.per_round(BgSpawnWatched, BgSpawn, 64, rps))
                    .map(|r| (r.median >= WATCHED_THROUGHPUT_TARGET, r.describe("×"))),
                "bg-spawn and bg-spawn-watched at concurrency 64",
            ),
            Verdict::decide(
                "with one watcher per lead (200 leads): Spawn throughput ≥ 0.9 × without watchers (concurrency 64)",
                Spread::of(self.per_round(BgSpawnLeadWatched, BgSpawn, 64, rps))
                    .map(|r| (r.median >= WATCHED_THROUGHPUT_TARGET, r.describe("×"))),
                "bg-spawn and bg-spawn-lead-watched at concurrency 64",
            ),
            Verdict::decide(
                "embedded store: Spawn throughput ≥ 0.6 × memory (bg-spawn) at concurrency 64",
                Spread::of(self.per_round(BgSpawnEmbedded, BgSpawn, 64, rps))
                    .map(|r| (r.median >= EMBEDDED_THROUGHPUT_TARGET, r.describe("×"))),
                "bg-spawn and bg-spawn-embedded at concurrency 64",
            ),
            Verdict::decide(
                "PostgreSQL store: Spawn throughput ≥ 0.25 × memory (bg-spawn) at concurrency 64",
                Spread::of(self.per_round(BgSpawnPostgres, BgSpawn, 64, rps))
                    .map(|r| (r.median >= POSTGRES_THROUGHPUT_TARGET, r.describe("×"))),
                "bg-spawn and bg-spawn-postgres (--postgres-url) at concurrency 64",
            ),
            Verdict::decide(
                "embedded store: Spawn p99 ≤ 10 ms at concurrency 16",
                Spread::of(self.per_round_of(BgSpawnEmbedded, 16, |r| r.p99_ms))
                    .map(|r| (r.median <= EMBEDDED_P99_TARGET_MS, r.describe(" ms"))),
                "bg-spawn-embedded at concurrency 16",
            ),
        ]
    }

    /// True if anything must fail the exit status: an error answer, a
    /// failed watcher stream, or a failure.
    pub fn saw_errors(&self) -> bool {
        !self.failures.is_empty()
            || self.rows.iter().any(|r| {
                !r.errors.is_empty()
                    || r.watch
                        .as_ref()
                        .is_some_and(|w| !w.stream_errors.is_empty())
            })
    }
}

impl MemoryReport {
    /// Decides the verdicts.
    pub fn finish(&mut self) {
        let mut verdicts: Vec<Verdict> = self
            .rows
            .iter()
            .map(|r| {
                let beyond_text = r.bytes_per_agent - r.text_bytes_per_agent as f64;
                Verdict::decide(
                    &format!(
                        "≤ 1 KiB per retained finished agent beyond prompt and result ({} agents)",
                        r.agents
                    ),
                    Some((
                        beyond_text <= BYTES_PER_AGENT_TARGET,
                        format!(
                            "{:.0} B/agent − {} B text = {beyond_text:.0} B",
                            r.bytes_per_agent, r.text_bytes_per_agent
                        ),
                    )),
                    "",
                )
            })
            .collect();
        let idle = self.rows.iter().map(|r| r.idle_rss_mib).reduce(f64::max);
        verdicts.push(Verdict::decide(
            "idle RSS ≤ 20 MB (read as MiB)",
            idle.map(|mib| {
                (
                    mib <= IDLE_RSS_TARGET_MIB,
                    format!("largest idle RSS {mib:.1} MiB"),
                )
            }),
            "one memory row",
        ));
        self.verdicts = verdicts;
    }

    /// True if anything must fail the exit status.
    pub fn saw_errors(&self) -> bool {
        !self.failures.is_empty() || self.rows.iter().any(|r| !r.errors.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::report::{model::StoreStats, text::render_run};

    fn row(round: usize, scenario: Scenario, concurrency: usize, rps: f64, p99_ms: f64) -> Row {
        Row {
            round,
            scenario,
            concurrency,
            requests: (rps * 3.0) as u64,
            elapsed_s: 3.0,
            requests_per_s: rps,
            p50_ms: p99_ms / 2.0,
            p99_ms,
            p999_ms: p99_ms,
            max_ms: p99_ms,
            errors: BTreeMap::new(),
            rps_vs_baseline: None,
            p99_vs_baseline: None,
            rps_vs_memory: None,
            p99_vs_memory: None,
            server_cpu_s_per_1k: 0.02,
            client_cpu_s_per_1k: 0.02,
            server_peak_rss_mib: 30.0,
            watch: None,
            store: scenario.has_store().then_some(StoreStats {
                commits: 3000,
                changes: 60_000,
                commits_per_s: 1000.0,
                changes_per_commit: 20.0,
                requests_per_commit: 7.0,
            }),
        }
    }

    fn report(rounds: usize, rows: Vec<Row>) -> RunReport {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "subagentd-bench",
            "run",
            "--rounds",
            &rounds.to_string(),
        ])
        .unwrap();
        let crate::cli::Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        let mut report = RunReport::new(&args);
        report.rows = rows;
        report.finish();
        report
    }

    fn verdict<'a>(report: &'a RunReport, starts: &str) -> &'a Verdict {
        report
            .verdicts
            .iter()
            .find(|v| v.target.starts_with(starts))
            .unwrap_or_else(|| panic!("no verdict {starts}"))
    }

    #[test]
    fn store_rows_are_compared_with_bg_spawn_of_their_round() {
        use Scenario::{BgSpawn, BgSpawnEmbedded, BgSpawnPostgres};
        let report = report(
            2,
            vec![
                row(1, BgSpawn, 64, 40_000.0, 4.0),
                row(1, BgSpawnEmbedded, 64, 28_000.0, 8.0),
                row(1, BgSpawnPostgres, 64, 8_000.0, 20.0),
                row(1, BgSpawnEmbedded, 16, 20_000.0, 5.0),
                row(2, BgSpawn, 64, 20_000.0, 4.0),
                row(2, BgSpawnEmbedded, 64, 16_000.0, 8.0),
                row(2, BgSpawnPostgres, 64, 6_000.0, 20.0),
                row(2, BgSpawnEmbedded, 16, 20_000.0, 12.0),
            ],
        );
        let embedded = report.row(2, BgSpawnEmbedded, 64).unwrap();
        assert_eq!(embedded.rps_vs_memory, Some(0.8));
        assert_eq!(embedded.p99_vs_memory, Some(2.0));
        assert_eq!(report.row(1, BgSpawn, 64).unwrap().rps_vs_memory, None);
        // Medians: embedded (0.7, 0.8) → 0.75; postgres (0.2, 0.3) → 0.25;
        // embedded p99 at 16 (5, 12) → 8.5 ms.
        let v = verdict(&report, "embedded store: Spawn throughput");
        assert_eq!(v.status, VerdictStatus::Met, "{}", v.detail);
        assert!(v.detail.contains("median 0.75×"), "{}", v.detail);
        let v = verdict(&report, "PostgreSQL store");
        assert_eq!(v.status, VerdictStatus::Met, "{}", v.detail);
        let v = verdict(&report, "embedded store: Spawn p99");
        assert_eq!(v.status, VerdictStatus::Met, "{}", v.detail);
        assert!(v.detail.contains("8.50 ms"), "{}", v.detail);

        let text = render_run(&report);
        assert!(text.contains("changes/commit"), "{text}");
        assert!(text.contains("stores, median over 2 rounds"), "{text}");
    }

    #[test]
    fn store_verdicts_without_their_rows_are_not_measured() {
        let report = report(1, vec![row(1, Scenario::BgSpawnEmbedded, 64, 1.0, 30.0)]);
        for starts in [
            "embedded store: Spawn throughput",
            "PostgreSQL store",
            "embedded store: Spawn p99",
        ] {
            assert_eq!(
                verdict(&report, starts).status,
                VerdictStatus::NotMeasured,
                "{starts}"
            );
        }
        assert!(!render_run(&report).contains("stores, median"));
    }
}
