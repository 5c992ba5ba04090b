//! A handler slower than the invisibility: the consumer renews the message's invisibility
//! while the handler runs (`PushConsumerBuilder::renewal`), so the message is neither
//! delivered again nor its ack refused; without renewal it comes twice.
//!
//! The emulator's "proxy" renews auto-renewed receives only for 20 s here, as the real 5.3.3
//! proxy configured with 20 s in effect does (an ack 30 s after the receipt is refused as
//! expired there, and the message delivered again). Virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rocketmq_grpc::PushConsumer;
use rocketmq_grpc_emulator::{Emulator, TopicKind};

use crate::support::{self, GROUP, Handler};

/// One topic of one queue whose messages stay invisible for 20 s after a receive, renewed by
/// nobody but the client.
async fn emulator() -> Emulator {
    Emulator::builder()
        .topic("orders", TopicKind::Normal, 1)
        .group(GROUP, false)
        .auto_renew(Duration::from_secs(20), Duration::from_secs(20))
        .seed(11)
        .start()
        .await
        .expect("the emulator starts")
}

/// Runs a 50 s handler on one message under `renewal` and returns how often it was handled
/// and the consumer's renewals and acks, 3 minutes later.
async fn slow_handler(renewal: Duration) -> (u64, u64, u64) {
    let emulator = emulator().await;
    let handled = Arc::new(AtomicU64::new(0));
    let consumer = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .renewal(renewal)
        .handler(Handler {
            handled: Arc::clone(&handled),
            pause: Duration::from_secs(50),
        })
        .build()
        .await
        .unwrap();
    support::publish(&emulator, "orders", 1);
    tokio::time::sleep(Duration::from_secs(180)).await;
    let stats = consumer.stats();
    consumer.close(Duration::from_secs(60)).await;
    (handled.load(Ordering::Relaxed), stats.renewed, stats.acked)
}

#[tokio::test(start_paused = true)]
async fn a_handler_slower_than_the_invisibility_gets_no_duplicate_with_renewal() {
    let (handled, renewed, acked) = slow_handler(Duration::from_secs(60)).await;
    assert_eq!(handled, 1, "handled once");
    // At 16 s (a fifth of 20 s before the end) to 76 s; the handler ends at 50 s.
    assert_eq!(renewed, 1);
    assert_eq!(acked, 1, "acked with the renewed handle");
}

#[tokio::test(start_paused = true)]
async fn renewals_go_on_while_the_handler_runs() {
    // 10 s renewals: the first at 16 s, then 3 s before each end (a fifth of 10 s is less),
    // every 7 s: at 16, 23, 30, 37 and 44 s; the handler ends at 50 s.
    let (handled, renewed, acked) = slow_handler(Duration::from_secs(10)).await;
    assert_eq!((handled, acked), (1, 1));
    assert_eq!(renewed, 5);
}

#[tokio::test(start_paused = true)]
async fn without_renewal_a_slow_handler_gets_its_message_twice() {
    let (handled, renewed, _) = slow_handler(Duration::ZERO).await;
    assert_eq!(renewed, 0);
    assert!(handled >= 2, "handled {handled} times");
}
