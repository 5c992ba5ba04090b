//! Bounded topics: a Pulsar namespace with retention 0, a backlog quota and a message TTL,
//! every topic force-deleted after its measurement; RocketMQ topics created and deleted
//! through `scripts/brokers/rocketmq`; a free-disk guard before every measurement.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use broker_tools::pulsar_admin::{PulsarAdmin, topic_path};
use tokio::process::Command;

/// The backlog quota of the bench namespace: 2 GiB, then producers fail.
pub(crate) const BACKLOG_QUOTA_BYTES: u64 = 2 << 30;

/// A name part unique to this moment and process.
pub(crate) fn stamp() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{}-{millis}", std::process::id())
}

async fn expect(
    admin: &PulsarAdmin,
    method: &str,
    path: &str,
    body: Option<&str>,
    also_fine: &[u16],
) -> Result<(), String> {
    let response = admin
        .request(method, path, body)
        .await
        .map_err(|e| e.to_string())?;
    if response.is_success() || also_fine.contains(&response.status) {
        Ok(())
    } else {
        Err(format!(
            "{method} {path}: {} {}",
            response.status,
            response.body.trim()
        ))
    }
}

/// Creates `namespace` if needed and bounds it: no retention beyond the backlog, a 2 GiB
/// backlog quota (`producer_exception`), a 1 h message TTL.
pub(crate) async fn prepare_namespace(admin: &PulsarAdmin, namespace: &str) -> Result<(), String> {
    let base = format!("/admin/v2/namespaces/{namespace}");
    expect(admin, "PUT", &base, None, &[409]).await?;
    expect(
        admin,
        "POST",
        &format!("{base}/retention"),
        Some(r#"{"retentionTimeInMinutes":0,"retentionSizeInMB":0}"#),
        &[],
    )
    .await?;
    expect(
        admin,
        "POST",
        &format!("{base}/backlogQuota?backlogQuotaType=destination_storage"),
        Some(&format!(
            r#"{{"limitSize":{BACKLOG_QUOTA_BYTES},"limitTime":-1,"policy":"producer_exception"}}"#
        )),
        &[],
    )
    .await?;
    expect(
        admin,
        "POST",
        &format!("{base}/messageTTL"),
        Some("3600"),
        &[],
    )
    .await
}

/// Creates a non-partitioned topic.
pub(crate) async fn create_topic(admin: &PulsarAdmin, topic: &str) -> Result<(), String> {
    expect(admin, "PUT", &topic_path(topic), None, &[409]).await
}

/// Creates `subscription` on `topic` at its end (before the backlog is written, so that
/// retention 0 keeps it).
pub(crate) async fn create_subscription(
    admin: &PulsarAdmin,
    topic: &str,
    subscription: &str,
) -> Result<(), String> {
    let path = format!("{}/subscription/{subscription}", topic_path(topic));
    expect(admin, "PUT", &path, None, &[409]).await
}

/// Deletes `topic` with its data, whoever is still attached.
pub(crate) async fn delete_topic(admin: &PulsarAdmin, topic: &str) -> Result<(), String> {
    let path = format!("{}?force=true", topic_path(topic));
    expect(admin, "DELETE", &path, None, &[404]).await
}

/// `scripts/brokers/rocketmq create-topic|delete-topic NAME`.
pub(crate) async fn rocketmq_topic(script: &str, action: &str, topic: &str) -> Result<(), String> {
    let output = Command::new(script)
        .args([action, topic])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{script} {action} {topic}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{script} {action} {topic}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Free bytes on the file system that holds `path` (`df -Pk`).
pub(crate) async fn free_bytes(path: &Path) -> Result<u64, String> {
    let output = Command::new("df")
        .arg("-Pk")
        .arg(path)
        .output()
        .await
        .map_err(|e| format!("df: {e}"))?;
    parse_df(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| format!("df -Pk {}: unreadable output", path.display()))
}

/// The `Available` column (KiB) of `df -Pk`'s second line, in bytes.
pub(crate) fn parse_df(text: &str) -> Option<u64> {
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_output() {
        let text = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                    /dev/vda         263174212  12000000  83886080      14% /\n";
        assert_eq!(parse_df(text), Some(83_886_080 * 1024));
        assert_eq!(parse_df("Filesystem\n"), None);
    }
}
