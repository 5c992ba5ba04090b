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

/// How long a pop of a consumer that stopped may still take a message at the broker: after a
/// consumer's last receive (even one the proxy answered, empty), the next message of the topic
/// can go to a pop still suspended at the broker, and nobody sees it until its invisible time
/// ends (seen on 5.3.3: with two gated push consumers started right after a simple consumer
/// settled the group, 2 of 50 urgent messages came 40 s late in 5 of 5 runs; none with this
/// wait in between). A test that needs the next messages on time waits this long after such a
/// consumer closed.
pub const STALE_POP: Duration = Duration::from_secs(22);

/// Like [`take_leftovers`], then closes the consumer and waits out its stale pops
/// ([`STALE_POP`]), so that the next messages of its topics go to the consumers that come next.
pub async fn settle_group(consumer: rocketmq_grpc::SimpleConsumer) -> usize {
    let taken = take_leftovers(&consumer, 1).await;
    consumer.close(Duration::from_secs(5)).await;
    tokio::time::sleep(STALE_POP).await;
    taken
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
        // At once: an ack waits in its batch (up to 5 s), so one after the other they would
        // take seconds per receive.
        futures_util::future::join_all(early.iter().map(|message| consumer.ack(message))).await;
    }
    taken
}
