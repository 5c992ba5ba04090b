//! Running one consumer (ours or an official Java client) as a child process, with the line
//! protocol both follow: `ready`, then `consumed=N`, then, once standard input is closed,
//! `closed cpu_ms=CPU`.

use std::process::Stdio;
use std::time::Duration;

use broker_tools::cpu::children as children_cpu;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A consumer process between `ready` and shutdown.
pub(crate) struct Consumer {
    label: String,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    children_cpu_before: Duration,
}

/// What a consumer process reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuReport {
    /// CPU the consumer measured itself, from before connecting to after shutdown.
    pub(crate) own: Duration,
    /// CPU of the whole process (start-up included), from the operating system.
    pub(crate) process: Duration,
}

impl Consumer {
    /// Starts `program args…` and waits until it says `ready`.
    pub(crate) async fn start(label: &str, program: &str, args: &[String]) -> Result<Self, String> {
        let children_cpu_before = children_cpu();
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{label}: cannot start {program}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut consumer = Self {
            label: label.to_owned(),
            child,
            lines: BufReader::new(stdout).lines(),
            children_cpu_before,
        };
        consumer.expect("ready", Duration::from_secs(180)).await?;
        Ok(consumer)
    }

    /// Waits for a line starting with `prefix`; returns the rest of it.
    async fn expect(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let label = &self.label;
        let wait = async {
            loop {
                match self.lines.next_line().await {
                    Ok(Some(line)) => {
                        if let Some(rest) = line.strip_prefix(prefix) {
                            return Ok(rest.to_owned());
                        }
                        println!("  [{label}] {line}");
                    }
                    Ok(None) => return Err(format!("{label} exited before `{prefix}`")),
                    Err(e) => return Err(format!("{label}: {e}")),
                }
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| format!("{label}: no `{prefix}` within {limit:?}"))?
    }

    /// Waits until it consumed everything, shuts it down and returns its CPU.
    pub(crate) async fn finish(mut self, limit: Duration) -> Result<CpuReport, String> {
        self.expect("consumed=", limit).await?;
        drop(self.child.stdin.take());
        let own = self
            .expect("closed cpu_ms=", Duration::from_secs(60))
            .await?;
        let own = own
            .trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{}: bad cpu line: {e}", self.label))?;
        let status = self.child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{} exited with {status}", self.label));
        }
        Ok(CpuReport {
            own,
            process: children_cpu().saturating_sub(self.children_cpu_before),
        })
    }
}
