//! Markdown tables of a scenario's reports.

use std::fmt::Write;

use crate::metrics::Report;
use crate::scenarios::Scenario;

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{:.1}", v * 100.0))
}

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
}

/// The scenario's heading, description and two tables: per strategy and level, then per
/// strategy.
pub(crate) fn render(scenario: &Scenario, reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "#### {}\n\n{}\n", scenario.name, scenario.about);
    out.push_str(
        "| strategy | level | delivered | left | p50 ms | p99 ms | max bypass | inversion | \
         longest gap ms | share % |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        for (l, lv) in r.levels.iter().enumerate() {
            let name = if l == 0 { r.strategy.as_str() } else { "" };
            let _ = writeln!(
                out,
                "| {name} | {l} | {} | {} | {} | {} | {} | {} | {} | {} |",
                lv.delivered,
                lv.left,
                lv.p50,
                lv.p99,
                lv.max_bypass,
                ratio(lv.inversion),
                lv.longest_gap,
                pct(lv.share),
            );
        }
    }
    out.push_str(
        "\n| strategy | last delivery ms | idle service slots | max buffered | pauses |\n\
         |---|---:|---:|---:|---:|\n",
    );
    for r in reports {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.strategy, r.last_delivery, r.idle_slots, r.max_buffered, r.pauses
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::LevelReport;
    use crate::scenarios::{TEST, cold_start};

    #[test]
    fn one_row_per_strategy_and_level() {
        let level = LevelReport {
            delivered: 3,
            left: 0,
            p50: 1,
            p99: 2,
            max_bypass: 0,
            inversion: Some(0.25),
            longest_gap: 4,
            share: None,
        };
        let report = Report {
            strategy: "x".into(),
            levels: vec![
                level.clone(),
                LevelReport {
                    inversion: None,
                    ..level
                },
            ],
            last_delivery: 9,
            idle_slots: 0,
            max_buffered: 5,
            pauses: 1,
        };
        let text = render(&cold_start(TEST), &[report]);
        assert!(
            text.contains("| x | 0 | 3 | 0 | 1 | 2 | 0 | 0.250 | 4 | – |"),
            "{text}"
        );
        assert!(
            text.contains("|  | 1 | 3 | 0 | 1 | 2 | 0 | – | 4 | – |"),
            "{text}"
        );
        assert!(text.contains("| x | 9 | 0 | 5 | 1 |"), "{text}");
    }
}
