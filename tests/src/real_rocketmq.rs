//! The real RocketMQ proxy of `scripts/brokers/rocketmq` for a test: its endpoint, names no
//! other run uses, and waiting for a condition.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::real_pulsar::var;

/// `ROCKETMQ_ENDPOINT` (the 5.3.3 proxy), when set and not empty; the tests skip without it.
pub fn endpoint() -> Option<String> {
    var("ROCKETMQ_ENDPOINT")
}

/// `name` made unique to this process and moment, for groups and message prefixes.
pub fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

/// Waits (polling every 100 ms) until `done` holds; panics naming `what` after `limit`.
pub async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the proxy at [`endpoint`] runs in cluster mode (`ROCKETMQ_PROXY_MODE=cluster`, as
/// the broker scripts print it; local mode when unset).
pub fn proxy_in_cluster_mode() -> bool {
    var("ROCKETMQ_PROXY_MODE").as_deref() == Some("cluster")
}

/// The RocketMQ version behind [`endpoint`] (`ROCKETMQ_VERSION`, as the broker scripts print
/// it; `5.3.3` when unset).
pub fn broker_version() -> String {
    var("ROCKETMQ_VERSION").unwrap_or_else(|| "5.3.3".to_owned())
}

/// Receives from `consumer` and acknowledges what comes until `empty` receives have come back
/// empty (or failed); returns how many messages it took. It takes what earlier runs left, and
/// it makes the group's first pop of each subscribed topic happen before a test sends: on
/// RocketMQ 5.x a group's first pop of a queue may start at its end
/// (`initPopOffsetByCheckMsgInMem`), which skips messages sent before it.
pub async fn take_leftovers(consumer: &rocketmq_grpc::SimpleConsumer, empty: usize) -> usize {
    let (mut empties, mut taken) = (0, 0);
    while empties < empty {
        let early = consumer
            .receive(32, Duration::from_secs(20))
            .await
            .unwrap_or_default();
        if early.is_empty() {
            empties += 1;
        }
        taken += early.len();
        for message in &early {
            let _ = consumer.ack(message).await;
        }
    }
    taken
}
