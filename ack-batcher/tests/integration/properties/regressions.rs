//! What writing the property test found, each reduced to a minimal test that pins the
//! documented behaviour.

use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{Batcher, Error, RetryPolicy};

use super::case::{CallPlan, ItemFault};
use super::item_id;
use super::log::{SharedLog, Transport};

/// A transport that answers every call at once with `items` (cycled), and its log.
fn answering_transport(items: Vec<ItemFault>) -> (SharedLog, Transport) {
    let log = SharedLog::default();
    let transport = Transport {
        log: Arc::clone(&log),
        plans: vec![CallPlan {
            delay_ms: 0,
            whole: None,
            items,
            truncate: None,
            extra: false,
        }],
    };
    (log, transport)
}

/// `Stats::terminal_failures` counts the items whose last failure the transport marked not
/// retryable; an item whose retryable failure ran out of attempts is failed, not terminal.
#[test]
fn terminal_failures_leave_out_items_that_ran_out_of_attempts() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let (_log, transport) = answering_transport(vec![ItemFault::Retryable]);
    let stats = runtime.block_on(async {
        let batcher = Batcher::builder()
            .retry(RetryPolicy::never())
            .build(transport)
            .expect("valid settings");
        // The transport fails the item retryably; with one attempt that is final.
        let outcome = batcher.submit_immediate(0, item_id(1, 0)).await;
        assert!(
            matches!(outcome, Err(Error::Failed { attempts: 1, .. })),
            "{outcome:?}"
        );
        batcher.close(Duration::from_secs(1)).await;
        batcher.stats()
    });
    assert_eq!(stats.items_failed, 1);
    assert_eq!(stats.terminal_failures, 0, "{stats:?}");
}
