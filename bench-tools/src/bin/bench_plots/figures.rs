//! One function per figure: each takes its CSV table (see `scripts/benchmarks/data/README.md`)
//! and returns the SVG text. The end-to-end figure's data also gives the Markdown table that
//! goes between BENCHMARKS.md's markers ([`e2e_table`]).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::bar_chart::{self, Bar, Chart, ColorBy, DrawResult, FONT, Scale, draw_err};
use crate::csv_table::{CsvError, Row, Table};

/// Why a figure or table could not be made from its data.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FigureError {
    /// The data is malformed (the error names the file and the line).
    #[error(transparent)]
    Csv(#[from] CsvError),
    /// Drawing failed.
    #[error("{0}")]
    Draw(String),
}

/// A figure: the SVG file it is written to, the CSV it is drawn from, and how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Figure {
    /// The output's file name, in the output folder.
    pub(crate) svg: &'static str,
    /// The input's file name, in the data folder.
    pub(crate) csv: &'static str,
    /// Draws the figure from the parsed input.
    pub(crate) render: fn(&Table) -> Result<String, FigureError>,
}

/// Every figure, in the order BENCHMARKS.md shows them.
pub(crate) const FIGURES: [Figure; 4] = [
    Figure {
        svg: "e2e.svg",
        csv: "e2e.csv",
        render: e2e,
    },
    Figure {
        svg: "ack_rpcs.svg",
        csv: "ack_rpcs.csv",
        render: ack_rpcs,
    },
    Figure {
        svg: "txn_stall.svg",
        csv: "txn_stall.csv",
        render: txn_stall,
    },
    Figure {
        svg: "priority_latency.svg",
        csv: "priority_latency.csv",
        render: priority_latency,
    },
];

/// The columns of bench-e2e's results CSV, in its order.
pub(crate) const E2E_COLUMNS: [&str; 11] = [
    "settings",
    "path",
    "client",
    "in_flight",
    "runs",
    "msgs_per_s",
    "mb_per_s",
    "cpu_s_per_million",
    "p50_ms",
    "p99_ms",
    "rss_mib",
];

/// Renders an SVG of `size` pixels, with a white background, a title line and, when given, a
/// footnote line, and `draw` filling the space between.
fn svg(
    size: (u32, u32),
    title: &str,
    footnote: Option<&str>,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> DrawResult,
) -> Result<String, FigureError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| FigureError::Draw(draw_err(e)))?;
        let body = root
            .titled(title, (FONT, 22))
            .map_err(|e| FigureError::Draw(draw_err(e)))?;
        let body = match footnote {
            Some(note) => {
                let (_, height) = body.dim_in_pixel();
                let (body, foot) = body.split_vertically(height.saturating_sub(24));
                let style = TextStyle::from((FONT, 14).into_font())
                    .pos(Pos::new(HPos::Left, VPos::Center))
                    .color(&RGBColor(80, 80, 80));
                foot.draw_text(note, &style, (12, 10))
                    .map_err(|e| FigureError::Draw(draw_err(e)))?;
                body
            }
            None => body,
        };
        draw(&body).map_err(FigureError::Draw)?;
        root.present().map_err(|e| FigureError::Draw(draw_err(e)))?;
    }
    Ok(out)
}

/// The distinct values of column `col`, in order of first appearance.
fn distinct(table: &Table, col: usize) -> Result<Vec<String>, FigureError> {
    let mut seen: Vec<String> = Vec::new();
    for row in &table.rows {
        let value = table.required_text(row, col)?;
        if !seen.iter().any(|s| s == value) {
            seen.push(value.to_owned());
        }
    }
    Ok(seen)
}

/// Fails when the table has no record.
fn non_empty(table: &Table) -> Result<(), FigureError> {
    if table.rows.is_empty() {
        return Err(FigureError::Csv(CsvError {
            file: table.file.clone(),
            line: 0,
            message: "no records after the header".to_owned(),
        }));
    }
    Ok(())
}

/// Places each row's value at `[group][series]`, with `group` and `series` the indexes of the
/// row's fields in `groups` and `series`; a second row for the same cell is an error.
fn grid(
    table: &Table,
    (group_col, groups): (usize, &[String]),
    (series_col, series): (usize, &[String]),
    mut value: impl FnMut(&Row) -> Result<Option<Bar>, FigureError>,
) -> Result<Vec<Vec<Option<Bar>>>, FigureError> {
    let mut cells = vec![vec![None; series.len()]; groups.len()];
    let mut filled = vec![vec![false; series.len()]; groups.len()];
    for row in &table.rows {
        let g = index_of(groups, table.text(row, group_col));
        let s = index_of(series, table.text(row, series_col));
        if std::mem::replace(&mut filled[g][s], true) {
            return Err(FigureError::Csv(table.row_error(
                row,
                format!("a second record for `{}` / `{}`", groups[g], series[s]),
            )));
        }
        cells[g][s] = value(row)?;
    }
    Ok(cells)
}

/// The position of `name` in `names`, which [`distinct`] made from the same table.
fn index_of(names: &[String], name: &str) -> usize {
    names.iter().position(|n| n == name).unwrap_or(0)
}

/// Throughput and CPU per million messages, per settings table, path and client, from
/// bench-e2e's CSV: one column of two charts per (settings, path, in flight).
pub(crate) fn e2e(table: &Table) -> Result<String, FigureError> {
    non_empty(table)?;
    let settings = table.column("settings")?;
    let path = table.column("path")?;
    let client = table.column("client")?;
    let in_flight = table.column("in_flight")?;
    let rate = table.column("msgs_per_s")?;
    let cpu = table.column("cpu_s_per_million")?;
    distinct(table, settings)?;
    distinct(table, path)?;
    distinct(table, client)?;
    // One panel per settings table, path and in-flight setting (a produce path is measured
    // at several).
    let panel_of = |row: &Row| {
        let named = format!("{}: {}", table.text(row, settings), table.text(row, path));
        match table.text(row, in_flight) {
            "" => named,
            n => format!("{named}, {n} in flight"),
        }
    };
    let mut paths: Vec<String> = Vec::new();
    for row in &table.rows {
        let panel = panel_of(row);
        if !paths.contains(&panel) {
            paths.push(panel);
        }
    }
    let mut panels = Vec::new();
    // Client names wrap under narrow panels; every panel keeps room for the longest.
    let label_lines = 2;
    for p in &paths {
        let rows: Vec<&Row> = table.rows.iter().filter(|r| &panel_of(r) == p).collect();
        let mut clients: Vec<String> = Vec::new();
        for row in &rows {
            let name = table.text(row, client);
            if clients.iter().any(|c| c == name) {
                return Err(FigureError::Csv(
                    table.row_error(row, format!("a second record for `{p}` / `{name}`")),
                ));
            }
            clients.push(name.to_owned());
        }
        let mut rates = Vec::new();
        let mut cpus = Vec::new();
        for row in &rows {
            rates.push(vec![table.number(row, rate)?.map(Bar::new)]);
            cpus.push(vec![table.number(row, cpu)?.map(Bar::new)]);
        }
        let chart = |y_desc: &str, values| Chart {
            title: p.clone(),
            y_desc: y_desc.to_owned(),
            groups: clients.clone(),
            series: vec![y_desc.to_owned()],
            values,
            scale: Scale::Linear,
            color_by: ColorBy::Group,
            legend: false,
            label_lines,
        };
        panels.push((
            chart("messages per second", rates),
            chart("client CPU s per million messages", cpus),
        ));
    }
    let columns = panels.len().max(2);
    let width = 340 * columns as u32;
    svg(
        (width, 680),
        "Clients end to end: throughput (top, higher is better) and CPU per million messages (bottom, lower is better)",
        Some(
            "n/m: not measured. Source: scripts/benchmarks/data/e2e.csv (bench-e2e's results; see its README).",
        ),
        |area| {
            let cells = area.split_evenly((2, columns));
            for (i, (throughput, cpu)) in panels.iter().enumerate() {
                bar_chart::draw(&cells[i], throughput)?;
                bar_chart::draw(&cells[columns + i], cpu)?;
            }
            Ok(())
        },
    )
}

/// AckMessage RPCs per 10,000 acknowledged messages and consumer CPU per message, immediate
/// against batched acks (and the Java client where measured), per scenario.
pub(crate) fn ack_rpcs(table: &Table) -> Result<String, FigureError> {
    non_empty(table)?;
    let scenario = table.column("scenario")?;
    let client = table.column("client")?;
    let acked = table.column("messages_acked")?;
    let rpcs = table.column("ack_rpcs")?;
    let cpu = table.column("cpu_us_per_msg")?;
    let groups = distinct(table, scenario)?;
    let series = distinct(table, client)?;
    let per_10k = grid(table, (scenario, &groups), (client, &series), |row| {
        let acked_n = table.required_number(row, acked)?;
        if acked_n <= 0.0 {
            return Err(FigureError::Csv(table.field_error(
                row,
                acked,
                "must be above 0".to_owned(),
            )));
        }
        Ok(table
            .number(row, rpcs)?
            .map(|n| Bar::new(n / acked_n * 10_000.0)))
    })?;
    let cpu_us = grid(table, (scenario, &groups), (client, &series), |row| {
        Ok(table.number(row, cpu)?.map(Bar::new))
    })?;
    let chart = |title: &str, y_desc: &str, values| Chart {
        title: title.to_owned(),
        y_desc: y_desc.to_owned(),
        groups: groups.clone(),
        series: series.clone(),
        values,
        scale: Scale::Log,
        color_by: ColorBy::Series,
        legend: true,
        label_lines: 1,
    };
    let left = chart(
        "AckMessage RPCs per 10,000 acked messages",
        "RPCs per 10,000 messages (log)",
        per_10k,
    );
    let right = chart(
        "Consumer CPU per consumed message",
        "CPU µs per message (log)",
        cpu_us,
    );
    svg(
        (1200, 500),
        "RocketMQ acks: batched (up to 1,024 entries or 5 s) against one AckMessage per message",
        Some("Lower is better. n/m: not measured. Source: scripts/benchmarks/data/ack_rpcs.csv."),
        |area| {
            let (a, b) = area.split_horizontally(600);
            bar_chart::draw(&a, &left)?;
            bar_chart::draw(&b, &right)
        },
    )
}

/// The median of `values` (not empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The runs of one ack loop and client in `txn_stall.csv`.
#[derive(Debug, Clone, Default)]
struct Runs {
    /// Blocked seconds, one per run.
    blocked: Vec<f64>,
    /// Refused commits, one per run that has the number.
    refused: Vec<f64>,
    /// Whether a run did not drain.
    not_drained: bool,
    /// The runs' names, to refuse a run given twice.
    names: Vec<String>,
}

/// Blocked time and refused commits in the steady transactional stream with aborts, per ack
/// loop and client: the median of the runs, a whisker from the least to the most.
pub(crate) fn txn_stall(table: &Table) -> Result<String, FigureError> {
    non_empty(table)?;
    let lp = table.column("loop")?;
    let run = table.column("run")?;
    let client = table.column("client")?;
    let drained = table.column("drained")?;
    let blocked = table.column("blocked_s")?;
    let refused = table.column("commits_refused")?;
    let groups = distinct(table, lp)?;
    let series = distinct(table, client)?;
    // Per (loop, client): the runs' values and whether one did not drain.
    let mut runs = vec![vec![Runs::default(); series.len()]; groups.len()];
    for row in &table.rows {
        let g = index_of(&groups, table.text(row, lp));
        let s = index_of(&series, table.text(row, client));
        let cell = &mut runs[g][s];
        let run_name = table.required_text(row, run)?.to_owned();
        if cell.names.contains(&run_name) {
            return Err(FigureError::Csv(table.row_error(
                row,
                format!(
                    "a second record for run {run_name} of `{}` / `{}`",
                    groups[g], series[s]
                ),
            )));
        }
        cell.names.push(run_name);
        cell.blocked.push(table.required_number(row, blocked)?);
        if let Some(n) = table.number(row, refused)? {
            cell.refused.push(n);
        }
        match table.required_text(row, drained)? {
            "yes" => {}
            "no" => cell.not_drained = true,
            other => {
                return Err(FigureError::Csv(table.field_error(
                    row,
                    drained,
                    format!("is `{other}`, not yes or no"),
                )));
            }
        }
    }
    let summarise = |pick: fn(&Runs) -> &Vec<f64>| {
        runs.iter()
            .map(|row| {
                row.iter()
                    .map(|cell| {
                        let values = pick(cell);
                        if values.is_empty() {
                            return None;
                        }
                        let mut sorted = values.clone();
                        let mid = median(&mut sorted);
                        let range =
                            (values.len() > 1).then(|| (sorted[0], sorted[sorted.len() - 1]));
                        Some(Bar {
                            value: mid,
                            range,
                            mark: if cell.not_drained { "*" } else { "" },
                        })
                    })
                    .collect()
            })
            .collect::<Vec<Vec<Option<Bar>>>>()
    };
    let chart = |title: &str, y_desc: &str, values| Chart {
        title: title.to_owned(),
        y_desc: y_desc.to_owned(),
        groups: groups.clone(),
        series: series.clone(),
        values,
        scale: Scale::Linear,
        color_by: ColorBy::Series,
        legend: true,
        label_lines: 1,
    };
    let top = chart(
        "Time the broker held the consumer blocked (maxUnackedMessagesOnConsumer=50)",
        "blocked s per 60 s run",
        summarise(|c| &c.blocked),
    );
    let bottom = chart(
        "Commits the broker refused",
        "refused commits per run",
        summarise(|c| &c.refused),
    );
    svg(
        (1200, 780),
        "Pulsar 4.0.8, 140 msg/s with every third transaction aborted: does the Shared consumer stall?",
        Some(
            "Bars: median of the runs; whiskers: least to most. *: a run did not drain within 60 s after the producer stopped. Source: scripts/benchmarks/data/txn_stall.csv.",
        ),
        |area| {
            let (_, height) = area.dim_in_pixel();
            let (a, b) = area.split_vertically(height / 2);
            bar_chart::draw(&a, &top)?;
            bar_chart::draw(&b, &bottom)
        },
    )
}

/// The high-priority messages' p99 latency per scenario, without priority, with the published
/// replica's design and with our gate.
pub(crate) fn priority_latency(table: &Table) -> Result<String, FigureError> {
    non_empty(table)?;
    let scenario = table.column("scenario")?;
    let consumer = table.column("consumer")?;
    let p99 = table.column("high_p99_ms")?;
    let groups = distinct(table, scenario)?;
    let series = distinct(table, consumer)?;
    let values = grid(table, (scenario, &groups), (consumer, &series), |row| {
        Ok(table.number(row, p99)?.map(Bar::new))
    })?;
    let chart = Chart {
        title: "Urgent messages: p99 latency of the high level".to_owned(),
        y_desc: "high-priority p99 ms (log)".to_owned(),
        groups,
        series,
        values,
        scale: Scale::Log,
        color_by: ColorBy::Series,
        legend: true,
        label_lines: 1,
    };
    svg(
        (1200, 520),
        "Priority: urgent messages behind a low-priority backlog, with and without the gate",
        Some(
            "Lower is better. n/m: not measured (the replica exists only in the simulator). Source: scripts/benchmarks/data/priority_latency.csv.",
        ),
        |area| bar_chart::draw(area, &chart),
    )
}

/// A CSV cell for the Markdown table: "not measured" when empty, digit groups for integers.
fn cell(text: &str) -> String {
    if text.is_empty() {
        return "not measured".to_owned();
    }
    if text.len() >= 4 && text.bytes().all(|b| b.is_ascii_digit()) {
        let mut out = String::new();
        for (i, c) in text.chars().enumerate() {
            if i > 0 && (text.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        return out;
    }
    text.replace('|', "\\|")
}

/// The Markdown tables of bench-e2e's results, one per settings table in the order they
/// first appear (every other column, numbers checked).
pub(crate) fn e2e_table(table: &Table) -> Result<String, FigureError> {
    non_empty(table)?;
    let cols = E2E_COLUMNS
        .iter()
        .map(|c| table.column(c))
        .collect::<Result<Vec<_>, _>>()?;
    let (settings, shown) = (cols[0], &cols[1..]);
    let mut out = String::new();
    for group in distinct(table, settings)? {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "Settings: **{group}**\n\n\
             | path | client | in flight | runs | msg/s | MB/s | CPU s per million msgs | p50 ms | p99 ms | RSS MiB |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        ));
        for row in table
            .rows
            .iter()
            .filter(|r| table.text(r, settings) == group)
        {
            let mut cells = Vec::new();
            for (i, &col) in shown.iter().enumerate() {
                if i < 2 {
                    cells.push(cell(table.required_text(row, col)?));
                } else {
                    table.number(row, col)?;
                    cells.push(cell(table.text(row, col)));
                }
            }
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the SVG has a `<text>` element of exactly `label` (the SVG backend writes the
    /// text on a line of its own).
    fn has_text(svg: &str, label: &str) -> bool {
        svg.contains(&format!("\n{label}\n</text>"))
    }

    fn parse(text: &str) -> Table {
        Table::parse("test.csv", text).unwrap()
    }

    #[test]
    fn the_ack_figure_names_its_scenarios_clients_and_values() {
        let svg = ack_rpcs(&parse(
            "scenario,client,messages_acked,ack_rpcs,cpu_us_per_msg,source\n\
             one topic,ours: immediate,480000,480000,54.2,x\n\
             one topic,ours: batched,480000,469,24.1,x\n\
             real broker,Java 5.0.8,10000,10000,,x\n",
        ))
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for label in [
            "AckMessage RPCs per 10,000 acked messages",
            "one topic",
            "real broker",
            "ours: batched",
            "Java 5.0.8",
            "9.77",
            "10k",
            "54.2",
            "n/m",
        ] {
            assert!(has_text(&svg, label), "no {label:?} in the SVG");
        }
    }

    #[test]
    fn the_txn_figure_takes_medians_and_marks_runs_that_did_not_drain() {
        let svg = txn_stall(&parse(
            "loop,run,client,drained,blocked_s,commits_refused\n\
             old,1,ours,yes,0,0\n\
             old,1,Java,yes,29,632\n\
             old,2,Java,no,109.2,210\n\
             old,3,Java,no,91.2,593\n",
        ))
        .unwrap();
        assert!(has_text(&svg, "91.2*"), "median 91.2 with its mark");
        assert!(has_text(&svg, "593*"), "median of refused commits");
        assert!(has_text(&svg, "0"));
    }

    #[test]
    fn the_priority_and_e2e_figures_render() {
        let svg = priority_latency(&parse(
            "scenario,consumer,high_p50_ms,high_p99_ms\nbacklog,no priority,9949,9998\nbacklog,ours,49,98\n",
        ))
        .unwrap();
        assert!(has_text(&svg, "no priority") && has_text(&svg, "98") && has_text(&svg, "9,998"));
        let e2e_csv = parse(
            "settings,path,client,in_flight,runs,msgs_per_s,mb_per_s,cpu_s_per_million,p50_ms,p99_ms,rss_mib\n\
             tuned,Pulsar produce,ours,10000,,186000,,4.20,44,,23\n\
             tuned,RocketMQ produce,Java,256,,4200,,225,,,\n\
             defaults,Pulsar produce,ours,1000,3,150000,,1.9,2.5,13,24\n",
        );
        let svg = e2e(&e2e_csv).unwrap();
        for label in [
            "tuned: Pulsar produce, 10000 in flight",
            "tuned: RocketMQ produce, 256 in flight",
            "defaults: Pulsar produce, 1000 in flight",
            "messages per second",
            "client CPU s per million messages",
            "186k",
            "4.2",
            "225",
        ] {
            assert!(has_text(&svg, label), "no {label:?} in the SVG");
        }
        let md = e2e_table(&e2e_csv).unwrap();
        assert!(md.contains("| Pulsar produce | ours | 10,000 | not measured | 186,000 | not measured | 4.20 | 44 | not measured | 23 |"), "{md}");
        let (tuned, defaults) = md.split_once("Settings: **defaults**").expect("two tables");
        assert!(
            tuned.starts_with("Settings: **tuned**") && tuned.contains("| Java |"),
            "{md}"
        );
        assert!(
            defaults.contains("| 150,000 |") && !defaults.contains("| Java |"),
            "{md}"
        );
    }

    #[test]
    fn bad_records_are_errors_at_their_line() {
        let dup = parse("scenario,consumer,high_p50_ms,high_p99_ms\na,b,1,2\na,b,1,3\n");
        let err = priority_latency(&dup).unwrap_err().to_string();
        assert_eq!(err, "test.csv:3: a second record for `a` / `b`");
        let bad = parse("loop,run,client,drained,blocked_s,commits_refused\nx,1,ours,maybe,0,0\n");
        assert_eq!(
            txn_stall(&bad).unwrap_err().to_string(),
            "test.csv:2: column `drained` is `maybe`, not yes or no"
        );
        let missing = parse("path,client\na,b\n");
        assert!(
            e2e(&missing)
                .unwrap_err()
                .to_string()
                .starts_with("test.csv:1: no column `settings`")
        );
        let empty = parse("scenario,client,messages_acked,ack_rpcs,cpu_us_per_msg\n");
        assert!(
            ack_rpcs(&empty)
                .unwrap_err()
                .to_string()
                .contains("no records")
        );
        let zero = parse("scenario,client,messages_acked,ack_rpcs,cpu_us_per_msg\na,b,0,1,1\n");
        assert!(
            ack_rpcs(&zero)
                .unwrap_err()
                .to_string()
                .starts_with("test.csv:2: column `messages_acked`")
        );
    }
}
