//! Role `produce`: a paced `Producer` over gRPC, in its own process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rocketmq_grpc::{ClientConfig, OutgoingMessage, Producer};

use crate::support::{BoxError, Kv, own_cpu_seconds, runtime, topic_names};

#[derive(Debug)]
pub(crate) struct ProduceArgs {
    pub(crate) endpoint: String,
    pub(crate) prefix: String,
    pub(crate) topics: u32,
    pub(crate) rate: u64,
    pub(crate) duration: Duration,
    pub(crate) body: usize,
}

pub(crate) fn produce_role(args: ProduceArgs) -> Result<(), BoxError> {
    let rt = runtime()?;
    rt.block_on(produce(args))
}

pub(crate) async fn produce(args: ProduceArgs) -> Result<(), BoxError> {
    let topics: Arc<Vec<String>> = Arc::new(topic_names(&args.prefix, args.topics));
    let producer = Arc::new(Producer::builder(ClientConfig::new(&args.endpoint)?).build()?);
    // Learn every route before the clock starts (one message per topic is not sent here).
    let warm = Arc::new(tokio::sync::Semaphore::new(32));
    let mut warmups = tokio::task::JoinSet::new();
    for topic in topics.iter() {
        let producer = Arc::clone(&producer);
        let permit = Arc::clone(&warm).acquire_owned().await?;
        let topic = topic.clone();
        warmups.spawn(async move {
            let _permit = permit;
            // An empty-body message is refused before it is sent, after the route is known.
            let _ = producer.send(OutgoingMessage::new(topic, Vec::new())).await;
        });
    }
    while warmups.join_next().await.is_some() {}

    let total = args.rate * args.duration.as_secs();
    // One body shared by every message (a `Bytes` clone is not a copy).
    let body = bytes::Bytes::from(vec![b'm'; args.body]);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(512));
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let cpu_start = own_cpu_seconds();
    let start = Instant::now();
    let mut started = 0u64;
    while started < total {
        let due = ((start.elapsed().as_secs_f64() * args.rate as f64) as u64).min(total);
        while started < due {
            let permit = Arc::clone(&in_flight).acquire_owned().await?;
            let producer = Arc::clone(&producer);
            let message = OutgoingMessage::new(
                topics[(started % topics.len() as u64) as usize].clone(),
                body.clone(),
            );
            let (sent, failed, first_error) = (
                Arc::clone(&sent),
                Arc::clone(&failed),
                Arc::clone(&first_error),
            );
            tokio::spawn(async move {
                let _permit = permit;
                match producer.send(message).await {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        first_error
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get_or_insert_with(|| error.to_string());
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            });
            started += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _all = in_flight.acquire_many(512).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut kv = Kv::default();
    let sent = sent.load(Ordering::Relaxed);
    kv.put("sent", sent);
    kv.put("failed", failed.load(Ordering::Relaxed));
    kv.put("elapsed_s", format!("{elapsed:.3}"));
    kv.put("rate", format!("{:.1}", sent as f64 / elapsed));
    kv.put("cpu_s", format!("{:.3}", own_cpu_seconds() - cpu_start));
    if let Some(error) = first_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        kv.put("first_error", error.replace('\n', " "));
    }
    kv.print();
    Ok(())
}
