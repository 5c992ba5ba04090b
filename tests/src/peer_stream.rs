//! The official Python client streaming beside ours through the same faults
//! (`scripts/python-peers/restart_stream.py`): its own batching producer and Shared consumer
//! on the same topic (its own subscription and payload prefix), counted the way
//! [`crate::outage::Report`] counts ours.

use std::collections::HashSet;
use std::time::Duration;

/// What the Python client counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCounts {
    /// Payloads sent with a receipt.
    pub sent: u64,
    /// Payloads sent with a receipt that never arrived.
    pub lost: u64,
    /// Deliveries of a payload already received.
    pub copies: u64,
    /// Sends that failed.
    pub send_errors: u64,
    /// Receives that failed.
    pub receive_errors: u64,
    /// Whether it printed `done` (it ends by itself once everything arrived or its patience ran
    /// out).
    pub finished: bool,
}

impl PeerCounts {
    /// Counts the lines `restart_stream.py` printed.
    pub fn parse(output: &str) -> Self {
        let mut sent = HashSet::new();
        let mut seen = HashSet::new();
        let mut counts = Self::default();
        for line in output.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("sent"), Some(_), Some(payload)) => {
                    sent.insert(payload.to_owned());
                }
                (Some("recv"), Some(_), Some(payload)) => {
                    counts.copies += u64::from(!seen.insert(payload.to_owned()));
                }
                (Some("send-error"), ..) => counts.send_errors += 1,
                (Some("recv-error"), ..) => counts.receive_errors += 1,
                (Some("done"), ..) => counts.finished = true,
                _ => {}
            }
        }
        counts.sent = sent.len() as u64;
        counts.lost = sent.difference(&seen).count() as u64;
        counts
    }
}

/// Streams with the Python client on `topic` through `service_url` at `rate` msg/s for
/// `seconds` (payloads `py0`, `py1`, …), waiting at most `patience` for the last ones; runs
/// it to the end on a blocking thread and counts what it printed.
///
/// # Errors
/// When the peer cannot be run or exits with a failure (its output is in the message).
pub async fn python_stream(
    service_url: &str,
    topic: &str,
    rate: u32,
    seconds: u64,
    patience: Duration,
) -> Result<PeerCounts, String> {
    let run = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/python-peers/run");
    let args = [
        "restart_stream".to_owned(),
        service_url.to_owned(),
        topic.to_owned(),
        rate.to_string(),
        seconds.to_string(),
        patience.as_secs().to_string(),
        "py".to_owned(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(run)
            .args(&args)
            .stderr(std::process::Stdio::inherit())
            .output()
    })
    .await
    .map_err(|e| format!("the Python peer's thread failed: {e}"))?
    .map_err(|e| format!("cannot run {run}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "restart_stream.py failed ({}): {stdout}",
            output.status
        ));
    }
    Ok(PeerCounts::parse(&stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lost_copies_and_errors_by_payload() {
        let output = "ready\nsent 1 py0\nsent 2 py1\nsend-error 3 py2 Timeout\nrecv 4 py0\n\
                      recv 5 py0\nrecv-error 6 x\ndone\n";
        assert_eq!(
            PeerCounts::parse(output),
            PeerCounts {
                sent: 2,
                lost: 1,
                copies: 1,
                send_errors: 1,
                receive_errors: 1,
                finished: true,
            }
        );
    }
}
