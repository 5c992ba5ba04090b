//! Link states against the emulator: a proxy that stops serving makes the clients'
//! `state()` go `Reconnecting` (the attempt counting up), serving again brings `Connected`
//! back, and `close` ends in `Closed`. The push, lite push and simple consumers and the
//! producer each report the state of their own session.
//!
//! Virtual time (tokio's clock paused): the heartbeats, telemetry reopenings and waits pass
//! at once.

use std::sync::Arc;
use std::time::Duration;

use rocketmq_grpc::{LinkState, OutgoingMessage, Producer, PushConsumer, SimpleConsumer};
use tokio::sync::watch;

use crate::support::{self, GROUP, Handler};

/// Waits (virtual time, 120 s at most) until the state matches.
async fn reach(state: &mut watch::Receiver<LinkState>, what: &str, wanted: fn(&LinkState) -> bool) {
    let reached = tokio::time::timeout(Duration::from_secs(120), state.wait_for(wanted))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(
        reached,
        "the link became {what} (it is {:?})",
        *state.borrow()
    );
}

fn reconnecting(state: &LinkState) -> bool {
    matches!(state, LinkState::Reconnecting { .. })
}

#[tokio::test(start_paused = true)]
async fn an_outage_is_reconnecting_then_connected_and_close_is_closed() {
    let mut emulator = support::emulator(&["orders"]).await;
    let simple = SimpleConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .await_duration(Duration::from_secs(5))
        .build()
        .await
        .expect("the simple consumer starts");
    let push = PushConsumer::builder(support::config(&emulator), GROUP)
        .subscribe("orders", "*")
        .handler(Arc::new(Handler::default()))
        .build()
        .await
        .expect("the push consumer starts");
    let producer = Producer::builder(support::config(&emulator))
        .topic("orders")
        .start()
        .await
        .expect("the producer starts");
    let mut states = [simple.state(), push.state(), producer.state()];
    for state in &states {
        assert!(state.borrow().is_connected(), "{:?}", *state.borrow());
    }

    emulator.stop_serving().await.expect("down");
    for state in &mut states {
        reach(state, "reconnecting", reconnecting).await;
    }
    // While the proxy stays down, the failed calls count up.
    reach(
        &mut states[0],
        "reconnecting, a later attempt",
        |s| matches!(s, LinkState::Reconnecting { attempt, .. } if *attempt >= 3),
    )
    .await;
    let now = states[0].borrow().clone();
    let LinkState::Reconnecting { cause, .. } = now else {
        unreachable!()
    };
    assert!(cause.is_retryable(), "{cause:?}");
    // A call made meanwhile fails with what the state says.
    let error = simple
        .receive(1, Duration::from_secs(30))
        .await
        .expect_err("the proxy is down");
    assert!(error.is_retryable(), "{error:?}");

    emulator.resume_serving().await.expect("up again");
    for state in &mut states {
        reach(state, "connected", LinkState::is_connected).await;
    }
    producer
        .send(OutgoingMessage::new("orders", "after"))
        .await
        .expect("sent after the outage");
    assert!(producer.state().borrow().is_connected());

    simple.close(Duration::from_secs(1)).await;
    push.close(Duration::from_secs(1)).await;
    producer.close(Duration::from_secs(1)).await;
    for state in &mut states {
        reach(state, "closed", |s| matches!(s, LinkState::Closed)).await;
        assert!(state.borrow().is_final());
    }
    // A closed link stays closed.
    assert!(matches!(*simple.state().borrow(), LinkState::Closed));
}

/// The lite push consumer reports its push consumer's session.
#[tokio::test(start_paused = true)]
async fn a_lite_push_consumer_reports_its_link_and_closes() {
    let emulator = rocketmq_grpc_emulator::Emulator::builder()
        .topic("lite-parent", rocketmq_grpc_emulator::TopicKind::Lite, 4)
        .lite_group("lite-group", "lite-parent")
        .seed(7)
        .start()
        .await
        .expect("the emulator starts");
    let consumer = rocketmq_grpc::LitePushConsumer::builder(
        support::config(&emulator),
        "lite-group",
        "lite-parent",
    )
    .handler(Arc::new(Handler::default()))
    .build()
    .await
    .expect("the lite consumer starts");
    let mut state = consumer.state();
    assert!(state.borrow().is_connected());
    consumer.close(Duration::from_secs(1)).await;
    reach(&mut state, "closed", |s| matches!(s, LinkState::Closed)).await;
}
