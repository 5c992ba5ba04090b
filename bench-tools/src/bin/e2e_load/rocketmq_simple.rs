//! RocketMQ simple consume: a backlog of N messages on a fresh topic (written by our producer,
//! not measured), then a fresh group's simple consumer drains it with 4 concurrent receive
//! loops, each receiving up to 32 messages invisible for 30 s and acknowledging each one
//! without waiting (the Java client's `ackAsync`; ours spawns `ack`, batched per (endpoint,
//! topic)). The window opens at the `WARMUP`-th received message (the JIT's warm-up and the
//! first receives excluded) and closes at the N-th; the Java client's acks are one
//! `AckMessage` per message by construction, ours print how many requests carried them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rocketmq_grpc::{ClientConfig, SimpleConsumer};
use tokio::sync::Notify;

use crate::Driver;
use crate::stdin_closed;

/// Concurrent receive loops (both clients).
pub(crate) const RECEIVERS: usize = 4;
/// Messages per receive (the proxy's maximum).
const BATCH: u32 = 32;
/// Invisible duration of a receive.
const INVISIBLE: Duration = Duration::from_secs(30);

/// `child rocketmq-simple ENDPOINT TOPIC GROUP MESSAGES WARMUP`
pub(crate) async fn child(args: crate::args::Simple) -> Result<(), String> {
    let (endpoint, topic, group) = (&args.endpoint, &args.topic, &args.group);
    let (n, warmup) = (args.messages, args.warmup);
    if warmup >= n {
        return Err(format!("WARMUP ({warmup}) must be below MESSAGES ({n})"));
    }
    let config = ClientConfig::new(endpoint).map_err(|e| e.to_string())?;
    let consumer = Arc::new(
        SimpleConsumer::builder(config, group.as_str())
            .subscribe(topic.as_str(), "*")
            .build()
            .await
            .map_err(|e| e.to_string())?,
    );
    let received = Arc::new(AtomicUsize::new(0));
    let failed_acks = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(Notify::new());
    let window: Arc<parking_lot::Mutex<Option<Instant>>> = Arc::default();
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..RECEIVERS {
        let consumer = Arc::clone(&consumer);
        let received = Arc::clone(&received);
        let failed_acks = Arc::clone(&failed_acks);
        let done = Arc::clone(&done);
        let window = Arc::clone(&window);
        loops.spawn(async move {
            loop {
                let messages = match consumer.receive(BATCH, INVISIBLE).await {
                    Ok(messages) => messages,
                    // Closed: the window ended. A receive that fails at once must not spin
                    // (a loop that never yields is never aborted: it held two cores once).
                    Err(rocketmq_grpc::Error::Closed(_)) => return,
                    Err(e) => {
                        eprintln!("e2e_load: receive: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                for message in messages {
                    let count = received.fetch_add(1, Ordering::Relaxed) + 1;
                    if count == warmup {
                        *window.lock() = Some(Instant::now());
                        println!("start");
                    }
                    if count == n {
                        done.notify_one();
                    }
                    let consumer = Arc::clone(&consumer);
                    let failed_acks = Arc::clone(&failed_acks);
                    tokio::spawn(async move {
                        if consumer.ack(&message).await.is_err() {
                            failed_acks.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            }
        });
    }
    done.notified().await;
    let started = window.lock().ok_or("the window never opened")?;
    let seconds = started.elapsed().as_secs_f64();
    loops.abort_all();
    while loops.join_next().await.is_some() {}
    let report = consumer.close(Duration::from_secs(30)).await;
    let stats = consumer.stats();
    // Before the result line: the driver reads CPU at it, and this is bookkeeping only.
    println!(
        "note ack_requests={} acked={} failed_acks={} close={report:?}",
        stats.acks.total_batches(),
        stats.acked,
        failed_acks.load(Ordering::Relaxed)
    );
    println!("result messages={} seconds={seconds:.6}", n - warmup);
    stdin_closed().await;
    Ok(())
}

/// Run `run` of every client, each on its own topic and backlog, deleted after.
pub(crate) async fn measure(driver: &mut Driver, run: usize) -> Result<(), String> {
    let warmup = (driver.options.rocketmq_backlog / 5).to_string();
    crate::rocketmq_consume::measure_path(
        driver,
        run,
        "rocketmq-simple",
        "E2eRocketMqSimpleConsume",
        &[warmup],
    )
    .await
}
