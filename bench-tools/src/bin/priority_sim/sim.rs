//! The run loop: one scenario under one strategy, tick by tick in virtual time.
//!
//! Each tick: the topic grows if due; producers publish (through the strategy's router and
//! the producer's batches); the broker dispatches what the permits allow; the consumer gets
//! the arrivals and a timer tick; the application takes up to `service` messages and,
//! if the scenario says so, acknowledges each. Permits returned during a tick are used by the
//! broker in the next one (1 ms round trip).

use std::time::{Duration, Instant};

use crate::metrics::{Recorder, Report};
use crate::model::{Producer, Topic};
use crate::rng::SplitMix64;
use crate::scenarios::Scenario;
use crate::strategies::{Consumer, Routing, Setup, Spec};

/// Runs `scenario` under `strategy`.
pub(crate) fn run(scenario: &Scenario, strategy: &Spec) -> Result<Report, String> {
    let start = Instant::now();
    let at = |tick: u64| start + Duration::from_millis(tick);
    let setup = Setup {
        levels: scenario.levels,
        partitions: scenario.partitions,
        queue: scenario.queue,
        batching: scenario.batching,
        start,
    };
    let mut rng = SplitMix64::new(scenario.seed);
    let mut topic = Topic::new(scenario.partitions);
    let mut routing = Routing::new(&strategy.kind, &setup, &mut rng)?;
    let mut consumer: Option<Consumer> = None;
    let mut producer = Producer::new(scenario.batching);
    let mut recorder = Recorder::new(scenario.levels);
    let mut levels: Vec<u8> = Vec::new();
    let mut live = scenario.partitions;
    let last_publication = scenario.last_publication();
    let mut batch: Vec<u8> = Vec::new();
    let mut tick = 0;
    loop {
        let now = at(tick);
        if let Some(g) = scenario.growth {
            if tick == g.at {
                topic.grow(g.to);
                live = g.to;
            }
            if tick == g.at + g.consumer_lag
                && let Some(consumer) = consumer.as_mut()
            {
                consumer.set_partitions(g.to, scenario.queue, &mut topic, now);
            }
        }

        batch.clear();
        for b in scenario.bursts.iter().filter(|b| b.at == tick) {
            batch.extend(std::iter::repeat_n(b.level, b.count as usize));
        }
        let mut counts: Vec<(u8, u64)> = scenario
            .streams
            .iter()
            .filter(|s| (s.from..s.until).contains(&tick))
            .map(|s| (s.level, rng.count(s.per_tick)))
            .collect();
        // Streams interleave message by message.
        while counts.iter().any(|&(_, n)| n > 0) {
            for (level, n) in counts.iter_mut().filter(|(_, n)| *n > 0) {
                batch.push(*level);
                *n -= 1;
            }
        }
        for &level in &batch {
            let id = recorder.publish(level, tick);
            levels.push(level);
            let p = routing.route(level, live, tick, now);
            producer.send(&mut topic, p, id, tick);
        }
        producer.flush_aged(&mut topic, tick);

        if consumer.is_none() && tick >= scenario.consumer_start {
            // The consumer sees the partitions the topic has when it starts.
            let setup = Setup {
                partitions: topic.partitions(),
                ..setup
            };
            consumer = Some(Consumer::new(&strategy.kind, &setup, &mut topic, now)?);
        }
        let Some(consumer) = consumer.as_mut() else {
            tick += 1;
            continue;
        };

        for (p, entry) in topic.dispatch() {
            consumer.on_arrival(p, &entry, &levels, &mut topic, now);
        }
        consumer.tick(&mut topic, now);
        recorder.buffered(consumer.buffered());

        for slot in 0..scenario.service {
            match consumer.take(&levels, &mut topic, now) {
                Some((p, id)) => {
                    recorder.deliver(id, tick);
                    if scenario.acks {
                        consumer.on_ack(p, &mut topic, now);
                    }
                }
                None => {
                    recorder.idle(scenario.service - slot);
                    break;
                }
            }
        }

        let done = tick >= last_publication && recorder.pending() == 0;
        if done || tick + 1 >= scenario.max_ticks {
            break;
        }
        tick += 1;
    }
    Ok(recorder.finish(strategy.name, tick, topic.pauses))
}
