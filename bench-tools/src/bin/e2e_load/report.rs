//! One row per measurement (`runs.csv`), medians per (path, client, in flight) (`results.csv`)
//! and the markdown table.

use std::fmt::Write as _;
use std::path::Path;

use crate::stats::median;

/// One measured run of one client on one path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Run {
    /// The settings table: `tuned` or `defaults`.
    pub(crate) settings: &'static str,
    /// The path's name.
    pub(crate) path: &'static str,
    /// The client's label.
    pub(crate) client: String,
    /// Messages in flight (produce paths), or 0.
    pub(crate) in_flight: usize,
    /// 1-based run number.
    pub(crate) run: usize,
    /// Messages produced or consumed.
    pub(crate) messages: u64,
    /// Payload bytes per message.
    pub(crate) size: usize,
    /// Seconds of the measured window.
    pub(crate) seconds: f64,
    /// Client CPU seconds within the window (from `/proc/PID/stat`).
    pub(crate) cpu_s: f64,
    /// Client CPU seconds of the whole process, start-up included (from `getrusage`).
    pub(crate) process_cpu_s: f64,
    /// Median latency in ms.
    pub(crate) p50_ms: Option<f64>,
    /// 99th percentile latency in ms.
    pub(crate) p99_ms: Option<f64>,
    /// The client's resident memory at the window's end, MiB.
    pub(crate) rss_mib: Option<f64>,
    /// The broker processes' CPU seconds within the window (with their pid files given).
    pub(crate) broker_cpu_s: Option<f64>,
}

impl Run {
    /// The broker processes' CPU within the window, in cores busy (CPU seconds per second).
    pub(crate) fn broker_cores(&self) -> Option<f64> {
        self.broker_cpu_s.map(|cpu| cpu / self.seconds.max(1e-9))
    }

    pub(crate) fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds.max(1e-9)
    }

    /// Payload megabytes (10^6 bytes) per second.
    pub(crate) fn mb_per_s(&self) -> f64 {
        self.msgs_per_s() * self.size as f64 / 1e6
    }

    pub(crate) fn cpu_s_per_million(&self) -> f64 {
        self.cpu_s * 1e6 / self.messages.max(1) as f64
    }

    pub(crate) fn process_cpu_s_per_million(&self) -> f64 {
        self.process_cpu_s * 1e6 / self.messages.max(1) as f64
    }
}

/// The medians of one (path, client, in flight).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    pub(crate) settings: &'static str,
    pub(crate) path: &'static str,
    pub(crate) client: String,
    pub(crate) in_flight: usize,
    pub(crate) runs: usize,
    pub(crate) msgs_per_s: f64,
    pub(crate) mb_per_s: f64,
    pub(crate) cpu_s_per_million: f64,
    pub(crate) process_cpu_s_per_million: f64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) rss_mib: Option<f64>,
    /// The broker processes' CPU within the window, cores busy.
    pub(crate) broker_cores: Option<f64>,
}

/// Medians per (settings, path, client, in flight), in the order the groups first appear.
pub(crate) fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(&'static str, &'static str, &str, usize)> = Vec::new();
    for run in runs {
        let key = (run.settings, run.path, run.client.as_str(), run.in_flight);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(settings, path, client, in_flight)| {
            let group: Vec<&Run> = runs
                .iter()
                .filter(|r| {
                    r.settings == settings
                        && r.path == path
                        && r.client == client
                        && r.in_flight == in_flight
                })
                .collect();
            let of = |f: &dyn Fn(&Run) -> f64| {
                median(&group.iter().map(|r| f(r)).collect::<Vec<_>>()).unwrap_or(f64::NAN)
            };
            let of_opt = |f: &dyn Fn(&Run) -> Option<f64>| {
                median(&group.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            Summary {
                settings,
                path,
                client: client.to_owned(),
                in_flight,
                runs: group.len(),
                msgs_per_s: of(&Run::msgs_per_s),
                mb_per_s: of(&Run::mb_per_s),
                cpu_s_per_million: of(&Run::cpu_s_per_million),
                process_cpu_s_per_million: of(&Run::process_cpu_s_per_million),
                p50_ms: of_opt(&|r| r.p50_ms),
                p99_ms: of_opt(&|r| r.p99_ms),
                rss_mib: of_opt(&|r| r.rss_mib),
                broker_cores: of_opt(&Run::broker_cores),
            }
        })
        .collect()
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |v| format!("{v:.decimals$}"))
}

fn in_flight(n: usize) -> String {
    if n == 0 { String::new() } else { n.to_string() }
}

/// `runs.csv`: every measurement.
pub(crate) fn runs_csv(runs: &[Run]) -> String {
    let mut out = String::from(
        "settings,path,client,in_flight,run,messages,bytes_per_message,seconds,msgs_per_s,\
         mb_per_s,cpu_s,cpu_s_per_million,process_cpu_s,process_cpu_s_per_million,p50_ms,p99_ms,\
         rss_mib,broker_cpu_s,broker_cores\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{:.3},{:.0},{:.2},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{}",
            r.settings,
            r.path,
            r.client,
            in_flight(r.in_flight),
            r.run,
            r.messages,
            r.size,
            r.seconds,
            r.msgs_per_s(),
            r.mb_per_s(),
            r.cpu_s,
            r.cpu_s_per_million(),
            r.process_cpu_s,
            r.process_cpu_s_per_million(),
            opt(r.p50_ms, 3),
            opt(r.p99_ms, 3),
            opt(r.rss_mib, 0),
            opt(r.broker_cpu_s, 3),
            opt(r.broker_cores(), 3),
        );
    }
    out
}

/// `results.csv`: the medians.
pub(crate) fn results_csv(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "settings,path,client,in_flight,runs,msgs_per_s,mb_per_s,cpu_s_per_million,\
         process_cpu_s_per_million,p50_ms,p99_ms,rss_mib,broker_cores\n",
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.0},{:.2},{:.3},{:.3},{},{},{},{}",
            s.settings,
            s.path,
            s.client,
            in_flight(s.in_flight),
            s.runs,
            s.msgs_per_s,
            s.mb_per_s,
            s.cpu_s_per_million,
            s.process_cpu_s_per_million,
            opt(s.p50_ms, 3),
            opt(s.p99_ms, 3),
            opt(s.rss_mib, 0),
            opt(s.broker_cores, 3),
        );
    }
    out
}

/// The markdown table of the medians.
pub(crate) fn markdown(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| settings | path | client | in flight | runs | msg/s | MB/s | CPU s per M msgs | \
         CPU s per M (whole process) | p50 ms | p99 ms | RSS MiB | broker cores |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} |",
            s.settings,
            s.path,
            s.client,
            in_flight(s.in_flight),
            s.runs,
            s.msgs_per_s,
            s.mb_per_s,
            s.cpu_s_per_million,
            s.process_cpu_s_per_million,
            opt(s.p50_ms, 1),
            opt(s.p99_ms, 1),
            opt(s.rss_mib, 0),
            opt(s.broker_cores, 2),
        );
    }
    out
}

/// Writes both CSV files into `dir`.
pub(crate) fn write(dir: &Path, runs: &[Run]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in [
        ("runs.csv", runs_csv(runs)),
        ("results.csv", results_csv(&summarize(runs))),
    ] {
        let file = dir.join(name);
        std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(client: &str, n: usize, seconds: f64, p99: Option<f64>) -> Run {
        Run {
            settings: "tuned",
            path: "pulsar-produce",
            client: client.into(),
            in_flight: 1000,
            run: n,
            messages: 1_000_000,
            size: 1000,
            seconds,
            cpu_s: seconds / 2.0,
            process_cpu_s: seconds,
            p50_ms: Some(1.0),
            p99_ms: p99,
            rss_mib: Some(20.0),
            broker_cpu_s: (client == "ours").then_some(seconds * 1.5),
        }
    }

    #[test]
    fn medians_per_client_in_first_seen_order() {
        let runs = [
            run("ours", 1, 10.0, Some(5.0)),
            run("java", 1, 20.0, None),
            run("ours", 2, 5.0, Some(7.0)),
            run("ours", 3, 4.0, Some(6.0)),
        ];
        let summaries = summarize(&runs);
        assert_eq!(summaries.len(), 2);
        let ours = &summaries[0];
        assert_eq!((ours.client.as_str(), ours.runs), ("ours", 3));
        assert_eq!(ours.msgs_per_s, 200_000.0);
        assert_eq!(ours.mb_per_s, 200.0);
        assert_eq!(ours.cpu_s_per_million, 2.5);
        assert_eq!(ours.p99_ms, Some(6.0));
        assert_eq!(summaries[1].p99_ms, None);
        let csv = results_csv(&summaries);
        assert!(csv.contains(
            "\ntuned,pulsar-produce,ours,1000,3,200000,200.00,2.500,5.000,1.000,6.000,20,1.500\n"
        ));
        assert!(csv.ends_with(",java,1000,1,50000,50.00,10.000,20.000,1.000,,20,\n"));
        assert_eq!(runs_csv(&runs).lines().count(), 5);
        assert!(
            markdown(&summaries)
                .contains("| tuned | pulsar-produce | ours | 1000 | 3 | 200000 | 200.0 |")
        );
    }
}
