//! The emulator child process (`rocketmq_emulator`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::support::{BoxError, Kv};

pub(crate) struct EmulatorProcess {
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) stdout: BufReader<ChildStdout>,
    pub(crate) endpoint: String,
}

impl EmulatorProcess {
    pub(crate) fn start(path: &PathBuf, args: &[String]) -> Result<Self, BoxError> {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", path.display()))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no emulator stdout")?);
        let mut line = String::new();
        loop {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                return Err("the emulator exited before printing its endpoint".into());
            }
            if let Some(endpoint) = line.trim().strip_prefix("endpoint=") {
                let endpoint = endpoint.to_owned();
                return Ok(Self {
                    child,
                    stdin,
                    stdout,
                    endpoint,
                });
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn stats(&mut self) -> Result<Kv, BoxError> {
        let stdin = self.stdin.as_mut().ok_or("emulator stdin closed")?;
        stdin.write_all(b"stats\n")?;
        stdin.flush()?;
        Ok(Kv::read_block(&mut self.stdout)?)
    }

    /// Closes stdin (the emulator stops) and returns its final statistics.
    pub(crate) fn finish(mut self) -> Result<Kv, BoxError> {
        drop(self.stdin.take());
        let kv = Kv::read_block(&mut self.stdout)?;
        let _ = self.child.wait();
        Ok(kv)
    }
}
