//! Scenario (c): ack-path saturation.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ack_batcher::{BatchInfo, Batcher, FlushReason, ItemOptions, ItemReply, ItemView, Next};
use ack_batcher::{Observer, RetryPolicy};
use rocketmq_grpc::pb;
use rocketmq_grpc::{AckEntry, AckFlusher, AckKey, ClientConfig, Endpoint, Session, wire};

use crate::emulator::EmulatorProcess;
use crate::options::Options;
use crate::support::{BoxError, own_cpu_seconds, process_cpu_seconds, runtime, yes_no};

/// Counts final outcomes, like the consumer's own observer.
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    pub(crate) ok: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Observer<AckKey, AckEntry, (), rocketmq_grpc::Error> for Resolved {
    fn after_flush(
        &self,
        _key: &AckKey,
        _batch: &BatchInfo,
        items: &[ItemView<'_, AckEntry, (), rocketmq_grpc::Error>],
    ) {
        let mut ok = 0;
        let mut failed = 0;
        for view in items.iter().filter(|view| view.next == Next::Resolved) {
            if matches!(view.reply, ItemReply::Ok(())) {
                ok += 1;
            } else {
                failed += 1;
            }
        }
        self.ok.fetch_add(ok, Ordering::Relaxed);
        self.failed.fetch_add(failed, Ordering::Relaxed);
    }
}

/// A received message as the consumer keeps it for its ack.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) message_id: String,
    pub(crate) receipt_handle: String,
}

pub(crate) async fn receive_all(
    session: &Session,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    count: usize,
) -> Result<Vec<Held>, BoxError> {
    let mut client = wire::client(session, endpoint)?;
    let mut held = Vec::with_capacity(count);
    let mut empty = 0;
    while held.len() < count {
        let request = pb::ReceiveMessageRequest {
            group: Some(wire::resource(session, group)),
            message_queue: Some(pb::MessageQueue {
                topic: Some(wire::resource(session, topic)),
                id: 0,
                permission: pb::Permission::ReadWrite as i32,
                broker: None,
                accept_message_types: vec![pb::MessageType::Normal as i32],
            }),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 1024,
            invisible_duration: Duration::from_secs(3600).try_into().ok(),
            auto_renew: false,
            long_polling_timeout: Duration::from_secs(5).try_into().ok(),
            attempt_id: None,
        };
        let mut stream = client
            .receive_message(wire::request(session, request, Duration::from_secs(10)))
            .await?
            .into_inner();
        let before = held.len();
        while let Some(frame) = stream.message().await? {
            if let Some(pb::receive_message_response::Content::Message(message)) = frame.content
                && let Some(system) = message.system_properties
            {
                held.push(Held {
                    message_id: system.message_id,
                    receipt_handle: system.receipt_handle.unwrap_or_default(),
                });
            }
        }
        if held.len() == before {
            empty += 1;
            if empty >= 3 {
                return Err(
                    format!("only {} of {count} messages could be received", held.len()).into(),
                );
            }
        }
    }
    Ok(held)
}

/// Acks `held` with raw `AckMessage` calls of `per_call` entries, `in_flight` at a time.
/// Returns (entries answered OK, seconds).
pub(crate) async fn raw_acks(
    session: &Arc<Session>,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    held: Arc<Vec<Held>>,
    per_call: usize,
    in_flight: usize,
) -> Result<(u64, f64), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (session, next, ok, held) = (
            Arc::clone(session),
            Arc::clone(&next),
            Arc::clone(&ok),
            Arc::clone(&held),
        );
        let mut client = wire::client(&session, endpoint)?;
        let (topic, group) = (
            wire::resource(&session, topic),
            wire::resource(&session, group),
        );
        tasks.spawn(async move {
            loop {
                let from = next.fetch_add(per_call, Ordering::Relaxed);
                if from >= held.len() {
                    return Ok::<(), BoxError>(());
                }
                let chunk = &held[from..(from + per_call).min(held.len())];
                let request = pb::AckMessageRequest {
                    group: Some(group.clone()),
                    topic: Some(topic.clone()),
                    entries: chunk
                        .iter()
                        .map(|h| pb::AckMessageEntry {
                            message_id: h.message_id.clone(),
                            receipt_handle: h.receipt_handle.clone(),
                            lite_topic: None,
                        })
                        .collect(),
                };
                let response = client
                    .ack_message(wire::request(&session, request, Duration::from_secs(10)))
                    .await?
                    .into_inner();
                let n = response
                    .entries
                    .iter()
                    .filter(|e| {
                        e.status
                            .as_ref()
                            .is_some_and(|s| s.code == pb::Code::Ok as i32)
                    })
                    .count();
                ok.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok((ok.load(Ordering::Relaxed), start.elapsed().as_secs_f64()))
}

/// Acks `held` through the consumer's ack path: the batcher with the `AckFlusher`, set up as
/// `AckSettings::default()` sets it up, each ack built and enqueued as the consumer does.
/// Returns (acks confirmed, seconds).
pub(crate) async fn batcher_acks(
    session: &Arc<Session>,
    endpoint: &Endpoint,
    topic: &str,
    group: &str,
    held: Vec<Held>,
    submitters: usize,
) -> Result<(u64, f64, ack_batcher::Stats), BoxError> {
    let resolved = Arc::new(Resolved::default());
    let batcher = Arc::new(
        Batcher::builder()
            .max_items(1024)
            .max_delay(Duration::from_secs(5))
            .deadline_margin(Duration::from_secs(1))
            .max_pending(65_536)
            .retry(
                RetryPolicy::default()
                    .backoff(Duration::from_secs(1))
                    .max_attempts(10_000),
            )
            .observer(resolved.clone())
            .build(AckFlusher::new(Arc::clone(session), group))?,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3000);
    let per_task = held.len().div_ceil(submitters.max(1));
    let mut shares: Vec<Vec<Held>> = Vec::new();
    let mut held = held;
    while !held.is_empty() {
        let rest = held.split_off(per_task.min(held.len()));
        shares.push(held);
        held = rest;
    }
    let endpoint = endpoint.clone();
    let topic = topic.to_owned();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for share in shares {
        let (batcher, endpoint, topic) = (Arc::clone(&batcher), endpoint.clone(), topic.clone());
        tasks.spawn(async move {
            for message in &share {
                // As `PushConsumer` does per consumed message: a key and an entry, cloned from
                // the received message, and the ticket dropped (the observer sees the result).
                let key = AckKey {
                    endpoint: endpoint.clone(),
                    topic: topic.clone(),
                };
                let entry = AckEntry {
                    message_id: message.message_id.clone(),
                    receipt_handle: message.receipt_handle.clone(),
                    lite_topic: None,
                };
                if batcher
                    .enqueue(key, entry, ItemOptions::new().deadline(deadline))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // The last partial batch goes on close, as at a consumer's shutdown.
    let report = batcher.close(Duration::from_secs(60)).await;
    let seconds = start.elapsed().as_secs_f64();
    if report.abandoned > 0 || resolved.failed.load(Ordering::Relaxed) > 0 {
        eprintln!(
            "   batcher: {} abandoned, {} failed",
            report.abandoned,
            resolved.failed.load(Ordering::Relaxed)
        );
    }
    Ok((
        resolved.ok.load(Ordering::Relaxed),
        seconds,
        batcher.stats(),
    ))
}

pub(crate) fn scenario_c(options: &Options) -> Result<String, BoxError> {
    let m = options.c_messages;
    let single = options.c_single;
    let total = 2 * m + single;
    eprintln!("== c: preloading {total} messages into one topic");
    let prefix = "c";
    let topic = "c0";
    let group = "load";
    let mut emulator = EmulatorProcess::start(
        &options.emulator,
        &[
            "--topics".into(),
            "1".into(),
            "--prefix".into(),
            prefix.into(),
            "--queues".into(),
            "1".into(),
            "--group".into(),
            group.into(),
            "--receive-batch-max".into(),
            "1024".into(),
            "--preload".into(),
            total.to_string(),
            "--body-size".into(),
            "16".into(),
        ],
    )?;
    let endpoint = Endpoint::parse(&emulator.endpoint)?;
    let session = Session::new(
        ClientConfig::new(&emulator.endpoint)?.request_timeout(Duration::from_secs(10)),
    )?;
    let rt = runtime()?;
    let received_at = Instant::now();
    let mut held = rt.block_on(receive_all(&session, &endpoint, topic, group, total))?;
    eprintln!(
        "   received {} messages in {:.1} s",
        held.len(),
        received_at.elapsed().as_secs_f64()
    );
    let single_held: Vec<Held> = held.split_off(2 * m);
    let batched_held: Vec<Held> = held.split_off(m);
    let raw_held = Arc::new(held);
    let pid = emulator.pid();

    let phase = |label: &str| {
        eprintln!("   {label}");
        (own_cpu_seconds(), process_cpu_seconds(pid))
    };
    let before = phase("raw 1,024-entry AckMessage calls");
    let (raw_ok, raw_s) = rt.block_on(raw_acks(
        &session,
        &endpoint,
        topic,
        group,
        raw_held,
        1024,
        options.c_in_flight,
    ))?;
    let raw_cpu = (
        own_cpu_seconds() - before.0,
        process_cpu_seconds(pid) - before.1,
    );
    let stats_raw = emulator.stats()?;

    let before = phase("the consumer's ack path (batcher + AckFlusher)");
    let (batched_ok, batched_s, batcher_stats) = rt.block_on(batcher_acks(
        &session,
        &endpoint,
        topic,
        group,
        batched_held,
        options.c_submitters,
    ))?;
    let batched_cpu = (
        own_cpu_seconds() - before.0,
        process_cpu_seconds(pid) - before.1,
    );
    let stats_batched = emulator.stats()?;

    let mut single_row = None;
    if single > 0 {
        let before = phase("raw 1-entry AckMessage calls");
        let (ok, s) = rt.block_on(raw_acks(
            &session,
            &endpoint,
            topic,
            group,
            Arc::new(single_held),
            1,
            options.c_in_flight,
        ))?;
        single_row = Some((
            ok,
            s,
            own_cpu_seconds() - before.0,
            process_cpu_seconds(pid) - before.1,
        ));
    }
    let final_stats = emulator.finish()?;
    drop(rt);

    let raw_rate = raw_ok as f64 / raw_s;
    let batched_rate = batched_ok as f64 / batched_s;
    let ratio = batched_rate / raw_rate;
    let rpcs_batched = stats_batched.u64("ack_rpcs") - stats_raw.u64("ack_rpcs");
    let full_batched = stats_batched.u64("ack_requests_1024") - stats_raw.u64("ack_requests_1024");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#### (c) ack-path saturation: one topic, {m} received messages per path\n"
    );
    let _ = writeln!(
        out,
        "| path | acks confirmed | seconds | acks/s | AckMessage calls | client CPU s | emulator CPU s | of ceiling | target | met? |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    );
    let _ = writeln!(
        out,
        "| raw 1,024-entry `AckMessage`, {} in flight (ceiling) | {raw_ok} | {raw_s:.2} | {raw_rate:.0} | {} | {:.2} | {:.2} | 100 % | | |",
        options.c_in_flight,
        stats_raw.u64("ack_rpcs"),
        raw_cpu.0,
        raw_cpu.1,
    );
    let _ = writeln!(
        out,
        "| consumer ack path: `Batcher` + `AckFlusher`, {} submitting tasks | {batched_ok} | {batched_s:.2} | {batched_rate:.0} | {rpcs_batched} ({full_batched} of 1,024) | {:.2} | {:.2} | {:.1} % | ≥ 70 % | {} |",
        options.c_submitters,
        batched_cpu.0,
        batched_cpu.1,
        ratio * 100.0,
        yes_no(ratio >= 0.70 && batched_ok == m as u64),
    );
    if let Some((ok, s, client, emu)) = single_row {
        let _ = writeln!(
            out,
            "| raw 1-entry `AckMessage`, {} in flight (for reference) | {ok} | {s:.2} | {:.0} | {} | {client:.2} | {emu:.2} | {:.1} % | | |",
            options.c_in_flight,
            ok as f64 / s,
            final_stats.u64("ack_rpcs") - stats_batched.u64("ack_rpcs"),
            ok as f64 / s / raw_rate * 100.0,
        );
    }
    let _ = writeln!(
        out,
        "\nBatcher flushes: {}; expired receipt handles: {}.\n",
        FlushReason::ALL
            .iter()
            .filter(|r| batcher_stats.batches(**r) > 0)
            .map(|r| format!("{} {r}", batcher_stats.batches(*r)))
            .collect::<Vec<_>>()
            .join(", "),
        final_stats.u64("expired_handles"),
    );
    Ok(out)
}
