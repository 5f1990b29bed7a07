//! The human-readable reports: plain-text tables (first column left-aligned,
//! the others right-aligned), then the verdicts and the failures.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::cli::Scenario;

use super::{
    model::{Failure, MemoryReport, Row, RunReport, StoreStats, Verdict, VerdictStatus},
    statistics::Spread,
};

/// The human-readable `run` report.
pub fn render_run(report: &RunReport) -> String {
    let s = &report.settings;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsubagentd-bench run — {} build, {}\n{} s timed + {} s warm-up per row, {} connections; \
         ratios are to the baseline at the same concurrency (and round)",
        report.build, report.machine, s.duration_s, s.warmup_s, s.connections
    );
    let rounds = s.rounds > 1;
    let mut headers = vec![
        "scenario",
        "conc",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "req/s ×base",
        "p99 ×base",
        "srv CPU s/1k",
        "cli CPU s/1k",
        "srv peak RSS MiB",
    ];
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.scenario.to_string(),
                r.concurrency.to_string(),
                format!("{:.0}", r.requests_per_s),
                format!("{:.3}", r.p50_ms),
                format!("{:.3}", r.p99_ms),
                format!("{:.3}", r.p999_ms),
                errors_cell(&r.errors),
                r.rps_vs_baseline
                    .map_or("-".to_owned(), |x| format!("{x:.2}")),
                r.p99_vs_baseline
                    .map_or("-".to_owned(), |x| format!("{x:.2}")),
                format!("{:.4}", r.server_cpu_s_per_1k),
                format!("{:.4}", r.client_cpu_s_per_1k),
                format!("{:.1}", r.server_peak_rss_mib),
            ];
            if rounds {
                cells.insert(0, r.round.to_string());
            }
            cells
        })
        .collect();
    if rounds {
        headers.insert(0, "round");
    }
    out.push('\n');
    out.push_str(&render_table(&headers, &rows));

    if rounds {
        render_medians(&mut out, report);
    }

    let watch_rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .filter_map(|r| r.watch.as_ref().map(|w| (r, w)))
        .map(|(r, w)| {
            vec![
                r.scenario.to_string(),
                r.concurrency.to_string(),
                w.watchers.to_string(),
                format!("{:.0}", w.events_per_s),
                format!("{:.1}", w.max_lag_ms),
                errors_cell(&w.stream_errors),
            ]
        })
        .collect();
    if !watch_rows.is_empty() {
        let _ = writeln!(
            out,
            "\nwatchers ({} connections; lag = receive time − newest agent timestamp)",
            s.watcher_connections
        );
        out.push_str(&render_table(
            &[
                "scenario",
                "conc",
                "watchers",
                "events/s (all)",
                "max lag ms",
                "stream errors",
            ],
            &watch_rows,
        ));
    }
    render_store(&mut out, report);
    render_verdicts(&mut out, &report.verdicts);
    render_failures(&mut out, &report.failures);
    out
}

/// The store scenarios: ratios to bg-spawn (no store) and what the writer
/// did, per round, then the medians.
fn render_store(out: &mut String, report: &RunReport) {
    let store_rows: Vec<(&Row, &StoreStats)> = report
        .rows
        .iter()
        .filter_map(|r| r.store.as_ref().map(|s| (r, s)))
        .collect();
    if store_rows.is_empty() {
        return;
    }
    let ratio_cell = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}"));
    let rounds = report.settings.rounds > 1;
    let mut headers = vec![
        "scenario",
        "conc",
        "req/s",
        "p99 ms",
        "req/s ×bg-spawn",
        "p99 ×bg-spawn",
        "commits/s",
        "changes/commit",
        "req/commit",
    ];
    if rounds {
        headers.insert(0, "round");
    }
    let rows: Vec<Vec<String>> = store_rows
        .iter()
        .map(|(r, st)| {
            let mut cells = vec![
                r.scenario.to_string(),
                r.concurrency.to_string(),
                format!("{:.0}", r.requests_per_s),
                format!("{:.3}", r.p99_ms),
                ratio_cell(r.rps_vs_memory),
                ratio_cell(r.p99_vs_memory),
                format!("{:.0}", st.commits_per_s),
                format!("{:.1}", st.changes_per_commit),
                format!("{:.1}", st.requests_per_commit),
            ];
            if rounds {
                cells.insert(0, r.round.to_string());
            }
            cells
        })
        .collect();
    let _ = writeln!(
        out,
        "\nstores (ratios to bg-spawn, which keeps nothing, at the same concurrency and round; \
         commits from subagentd_store_*_total over the timed phase)"
    );
    out.push_str(&render_table(&headers, &rows));
    if !rounds {
        return;
    }
    let mut keys: Vec<(Scenario, usize)> = store_rows
        .iter()
        .map(|(r, _)| (r.scenario, r.concurrency))
        .collect();
    keys.sort();
    keys.dedup();
    let spread = |key: (Scenario, usize), digits: usize, f: &dyn Fn(&Row) -> Option<f64>| {
        Spread::of(
            store_rows
                .iter()
                .filter(|(r, _)| (r.scenario, r.concurrency) == key)
                .filter_map(|(r, _)| f(r))
                .collect(),
        )
        .map_or("-".to_owned(), |s| {
            format!(
                "{:.digits$} ({:.digits$}–{:.digits$})",
                s.median, s.min, s.max
            )
        })
    };
    let stat = |f: fn(&StoreStats) -> f64| move |r: &Row| r.store.as_ref().map(f);
    let medians: Vec<Vec<String>> = keys
        .into_iter()
        .map(|key| {
            vec![
                key.0.to_string(),
                key.1.to_string(),
                spread(key, 2, &|r| Some(r.requests_per_s / 1000.0)),
                spread(key, 2, &|r| Some(r.p50_ms)),
                spread(key, 2, &|r| Some(r.p99_ms)),
                spread(key, 2, &|r| r.rps_vs_memory),
                spread(key, 0, &stat(|s| s.commits_per_s)),
                spread(key, 1, &stat(|s| s.changes_per_commit)),
                spread(key, 1, &stat(|s| s.requests_per_commit)),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "\nstores, median over {} rounds (range)",
        report.settings.rounds
    );
    out.push_str(&render_table(
        &[
            "scenario",
            "conc",
            "k req/s",
            "p50 ms",
            "p99 ms",
            "req/s ×bg-spawn",
            "commits/s",
            "changes/commit",
            "req/commit",
        ],
        &medians,
    ));
}

/// The human-readable `memory` report.
pub fn render_memory(report: &MemoryReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsubagentd-bench memory — {} build, {}\nbackground spawns of prompt `hi` (result `hi`), \
         concurrency {} over {} connections, retention 1h",
        report.build, report.machine, report.concurrency, report.connections
    );
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            vec![
                r.agents.to_string(),
                r.done.to_string(),
                errors_cell(&r.errors),
                format!("{:.0}", r.spawns_per_s),
                format!("{:.1}", r.await_s),
                format!("{:.1}", r.idle_rss_mib),
                format!("{:.1}", r.rss_after_mib),
                format!("{:.1}", r.peak_rss_mib),
                format!("{:.0}", r.bytes_per_agent),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&render_table(
        &[
            "agents",
            "done",
            "errors",
            "spawns/s",
            "await s",
            "idle RSS MiB",
            "RSS after MiB",
            "peak RSS MiB",
            "bytes/agent",
        ],
        &rows,
    ));
    render_verdicts(&mut out, &report.verdicts);
    render_failures(&mut out, &report.failures);
    out
}

/// Per scenario and concurrency: the median of each round's ratio to its
/// own baseline.
fn render_medians(out: &mut String, report: &RunReport) {
    let mut keys: Vec<(Scenario, usize)> = report
        .rows
        .iter()
        .map(|r| (r.scenario, r.concurrency))
        .collect();
    keys.sort();
    keys.dedup();
    let spread = |scenario: Scenario, concurrency: usize, f: fn(&Row) -> Option<f64>| {
        Spread::of(
            report
                .rows
                .iter()
                .filter(|r| r.scenario == scenario && r.concurrency == concurrency)
                .filter_map(f)
                .collect(),
        )
        .map_or("-".to_owned(), |s| {
            format!("{:.2} ({:.2}–{:.2})", s.median, s.min, s.max)
        })
    };
    let rows: Vec<Vec<String>> = keys
        .into_iter()
        .map(|(scenario, concurrency)| {
            vec![
                scenario.to_string(),
                concurrency.to_string(),
                spread(scenario, concurrency, |r| Some(r.requests_per_s / 1000.0)),
                spread(scenario, concurrency, |r| r.rps_vs_baseline),
                spread(scenario, concurrency, |r| r.p99_vs_baseline),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "\nmedian over {} rounds (range), ratios to the same round's baseline",
        report.settings.rounds
    );
    out.push_str(&render_table(
        &["scenario", "conc", "k req/s", "req/s ×base", "p99 ×base"],
        &rows,
    ));
}

fn render_verdicts(out: &mut String, verdicts: &[Verdict]) {
    if verdicts.is_empty() {
        return;
    }
    out.push_str("\ntargets (never change the exit status):\n");
    for v in verdicts {
        let status = match v.status {
            VerdictStatus::Met => "met",
            VerdictStatus::NotMet => "NOT MET",
            VerdictStatus::NotMeasured => "not measured",
        };
        let _ = writeln!(out, "  [{status:^12}] {}: {}", v.target, v.detail);
    }
}

fn render_failures(out: &mut String, failures: &[Failure]) {
    if failures.is_empty() {
        return;
    }
    out.push_str("\nfailures:\n");
    for f in failures {
        let scope = f.scenario.map_or("-".to_owned(), |s| s.to_string());
        let _ = writeln!(out, "  [{scope}] {}", f.message.replace('\n', "\n    "));
    }
}

fn errors_cell(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "-".to_owned();
    }
    errors
        .iter()
        .map(|(name, n)| format!("{name}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A plain-text table: first column left-aligned, the others right-aligned.
fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([headers[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..headers.len()).map(width).collect();
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i == 0 {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            } else {
                text.push_str("  ");
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    let rules: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    out.push_str(&line(rules.iter().map(String::as_str).collect()));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let table = render_table(
            &["name", "n"],
            &[
                vec!["a".into(), "1".into()],
                vec!["long".into(), "100".into()],
            ],
        );
        assert_eq!(table, "name    n\n----  ---\na       1\nlong  100\n");
    }
}
