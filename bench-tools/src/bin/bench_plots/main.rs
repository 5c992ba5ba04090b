//! `bench_plots`: draws BENCHMARKS.md's figures from the benchmark data and keeps its
//! end-to-end table up to date.
//!
//! It reads the CSV files of `--data` (by default `scripts/benchmarks/data`: `e2e.csv`,
//! `ack_rpcs.csv`, `txn_stall.csv`, `priority_latency.csv`, transcribed from the archived runs
//! as that folder's README says), writes one SVG per figure into `--out` (by default
//! `scripts/benchmarks`) and rewrites the table between `<!-- bench-e2e: results start -->` and
//! `<!-- bench-e2e: results end -->` in `--markdown` (by default `BENCHMARKS.md`) from
//! `e2e.csv`. `--e2e FILE` first replaces `e2e.csv` with bench-e2e's results CSV (checked
//! before anything is written). `--check` writes nothing and fails when a file is not what the
//! data renders.
//!
//! From the repository's root:
//!
//! ```text
//! cargo run -p bench-tools --bin bench_plots -- --data scripts/benchmarks/data --out scripts/benchmarks
//! cargo run -p bench-tools --bin bench_plots -- --data scripts/benchmarks/data --out scripts/benchmarks --e2e results.csv
//! ```
//!
//! Only `plotters`' SVG backend is used: text is written as SVG `<text>` elements that the
//! viewer sets in its own sans-serif font, so no font library is needed to build or run.
//! The tests (`cargo test -p bench-tools --bin bench_plots`) include one that fails when a
//! committed SVG or the BENCHMARKS.md table is stale.

mod bar_chart;
mod csv_table;
mod figures;
mod markers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use csv_table::{CsvError, Table};

/// What can go wrong; every variant names the file it is about.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A CSV file is unreadable or malformed.
    #[error(transparent)]
    Csv(#[from] CsvError),
    /// A figure or the table could not be made from the data.
    #[error(transparent)]
    Figure(#[from] figures::FigureError),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The Markdown file's markers are missing or out of order.
    #[error("{file}: {message}")]
    Markers {
        /// The Markdown file.
        file: String,
        /// What is wrong with its markers.
        message: String,
    },
    /// `--check` found files that differ from what the data renders.
    #[error("out of date (regenerate with `{command}`): {files}")]
    Stale {
        /// The files that differ.
        files: String,
        /// The command that regenerates them.
        command: String,
    },
    /// The options do not go together.
    #[error("{0}")]
    Usage(String),
}

/// Draws BENCHMARKS.md's figures from the benchmark data and rewrites its end-to-end table.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(name = "bench_plots", args_override_self = true)]
struct Options {
    /// The folder of the CSV files.
    #[arg(long, value_name = "DIR", default_value = "scripts/benchmarks/data")]
    data: PathBuf,
    /// The folder the SVG files go to.
    #[arg(long, value_name = "DIR", default_value = "scripts/benchmarks")]
    out: PathBuf,
    /// The Markdown file whose marked table is rewritten.
    #[arg(long, value_name = "FILE", default_value = "BENCHMARKS.md")]
    markdown: PathBuf,
    /// bench-e2e's results, to replace `e2e.csv` with first.
    #[arg(long, value_name = "RESULTS.csv", conflicts_with = "check")]
    e2e: Option<PathBuf>,
    /// Only compare; write nothing, fail when a file is not what the data renders.
    #[arg(long)]
    check: bool,
}

impl Options {
    /// The command that regenerates what these options check.
    fn command(&self) -> String {
        format!(
            "cargo run -p bench-tools --bin bench_plots -- --data {} --out {}",
            self.data.display(),
            self.out.display()
        )
    }
}

/// Reads a text file.
fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Writes a text file.
fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Everything the data renders: each output file and its text.
fn render(data: &Path, out: &Path, markdown: &Path) -> Result<Vec<(PathBuf, String)>, Error> {
    let mut outputs = Vec::new();
    for figure in figures::FIGURES {
        let table = Table::read(&data.join(figure.csv))?;
        outputs.push((out.join(figure.svg), (figure.render)(&table)?));
    }
    let table = figures::e2e_table(&Table::read(&data.join("e2e.csv"))?)?;
    let text = read(markdown)?;
    let updated = markers::replace(&text, &table).map_err(|message| Error::Markers {
        file: markdown.display().to_string(),
        message,
    })?;
    outputs.push((markdown.to_path_buf(), updated));
    Ok(outputs)
}

/// Does what `options` say: replace the e2e data, then write (or check) every output.
fn run(options: &Options) -> Result<(), Error> {
    if let Some(results) = &options.e2e {
        // Check the whole file before it replaces the committed data.
        let text = read(results)?;
        let table = Table::parse(&results.display().to_string(), &text)?;
        figures::e2e(&table)?;
        figures::e2e_table(&table)?;
        let target = options.data.join("e2e.csv");
        if options.check {
            return Err(Error::Usage(
                "--e2e and --check do not go together".to_owned(),
            ));
        }
        write(&target, &text)?;
        println!("{} <- {}", target.display(), results.display());
    }
    let outputs = render(&options.data, &options.out, &options.markdown)?;
    let mut stale = Vec::new();
    for (path, text) in &outputs {
        let current = std::fs::read_to_string(path).ok();
        if current.as_deref() == Some(text.as_str()) {
            println!("{} (unchanged)", path.display());
        } else if options.check {
            stale.push(path.display().to_string());
        } else {
            write(path, text)?;
            println!("{} (written)", path.display());
        }
    }
    if !stale.is_empty() {
        return Err(Error::Stale {
            files: stale.join(", "),
            command: options.command(),
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    let options = Options::parse();
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_plots: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's root: the bench-tools crate's parent.
    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the bench-tools crate is inside the workspace")
            .to_path_buf()
    }

    #[test]
    fn the_committed_plots_and_table_match_the_committed_data() {
        let root = root();
        let out = root.join("scripts/benchmarks");
        let outputs = render(&out.join("data"), &out, &root.join("BENCHMARKS.md")).unwrap();
        assert_eq!(outputs.len(), figures::FIGURES.len() + 1);
        let stale: Vec<String> = outputs
            .iter()
            .filter(|(path, text)| {
                std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str())
            })
            .map(|(path, _)| path.display().to_string())
            .collect();
        assert!(
            stale.is_empty(),
            "stale: {stale:?}; regenerate from the repository's root with \
             `cargo run -p bench-tools --bin bench_plots -- --data scripts/benchmarks/data --out scripts/benchmarks`"
        );
    }

    #[test]
    fn options() {
        let args = |a: &[&str]| Options::try_parse_from(["bench_plots"].iter().chain(a));
        let o = args(&["--data", "d", "--out", "o", "--markdown", "M.md", "--check"]).unwrap();
        assert_eq!(o.data, PathBuf::from("d"));
        assert_eq!(o.out, PathBuf::from("o"));
        assert_eq!(o.markdown, PathBuf::from("M.md"));
        assert!(o.check);
        // The defaults, and the command lines of BENCHMARKS.md and scripts/benchmarks/data.
        let o = args(&[]).unwrap();
        assert_eq!(o.data, PathBuf::from("scripts/benchmarks/data"));
        assert_eq!(o.out, PathBuf::from("scripts/benchmarks"));
        assert_eq!(o.markdown, PathBuf::from("BENCHMARKS.md"));
        assert_eq!((o.e2e, o.check), (None, false));
        let documented = [
            "--data",
            "scripts/benchmarks/data",
            "--out",
            "scripts/benchmarks",
        ];
        assert!(args(&documented).is_ok());
        let with_e2e = [&documented[..], &["--e2e", "target/bench-e2e/results.csv"]].concat();
        let o = args(&with_e2e).unwrap();
        assert_eq!(o.e2e, Some(PathBuf::from("target/bench-e2e/results.csv")));
        // As before, a flag given twice takes its last value.
        assert_eq!(
            args(&["--out", "a", "--out", "b"]).unwrap().out,
            PathBuf::from("b")
        );
        assert!(args(&["--help"]).is_err());
        assert!(args(&["--data"]).is_err());
        assert!(args(&["--bogus"]).is_err());
        assert!(args(&["--e2e", "r.csv", "--check"]).is_err());
    }

    #[test]
    fn a_run_writes_then_finds_everything_unchanged_and_e2e_replaces_the_data() {
        let dir = std::env::temp_dir().join(format!("bench_plots_test_{}", std::process::id()));
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        for figure in figures::FIGURES {
            let from = root().join("scripts/benchmarks/data").join(figure.csv);
            std::fs::copy(from, data.join(figure.csv)).unwrap();
        }
        let md = dir.join("B.md");
        write(
            &md,
            &format!("intro\n{}\n{}\nafter\n", markers::START, markers::END),
        )
        .unwrap();
        let options = Options {
            data: data.clone(),
            out: dir.clone(),
            markdown: md.clone(),
            e2e: None,
            check: false,
        };
        run(&options).unwrap();
        run(&Options {
            check: true,
            ..options.clone()
        })
        .unwrap();
        assert!(
            read(&md)
                .unwrap()
                .contains("| pulsar-produce | ours (pulsar-wire) |")
        );

        let results = dir.join("results.csv");
        write(
            &results,
            "settings,path,client,in_flight,runs,msgs_per_s,mb_per_s,cpu_s_per_million,p50_ms,p99_ms,rss_mib\n\
             tuned,pulsar-produce,ours,10000,5,190000,190,4.1,40,90,30\n",
        )
        .unwrap();
        run(&Options {
            e2e: Some(results.clone()),
            ..options.clone()
        })
        .unwrap();
        assert_eq!(
            read(&data.join("e2e.csv")).unwrap(),
            read(&results).unwrap()
        );
        let table = read(&md).unwrap();
        assert!(
            table.contains(
                "| pulsar-produce | ours | 10,000 | 5 | 190,000 | 190 | 4.1 | 40 | 90 | 30 |"
            ),
            "{table}"
        );
        assert!(!table.contains("| Pulsar produce |"));

        // A bad results file changes nothing and names its line.
        write(&results, "settings,path,client,in_flight,runs,msgs_per_s,mb_per_s,cpu_s_per_million,p50_ms,p99_ms,rss_mib\ntuned,x,y,1,1,fast,1,1,1,1,1\n").unwrap();
        let err = run(&Options {
            e2e: Some(results.clone()),
            ..options.clone()
        })
        .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("results.csv:2: column `msgs_per_s` `fast` is not a number"),
            "{err}"
        );
        assert!(
            read(&data.join("e2e.csv"))
                .unwrap()
                .contains("pulsar-produce")
        );

        // A stale figure fails --check.
        write(&dir.join("ack_rpcs.svg"), "old").unwrap();
        let err = run(&Options {
            check: true,
            ..options
        })
        .unwrap_err();
        assert!(err.to_string().contains("ack_rpcs.svg"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
