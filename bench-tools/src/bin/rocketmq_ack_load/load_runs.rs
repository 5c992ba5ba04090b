//! Scenarios (a) and (b): an emulator, a consumer and a producer process per ack mode, and
//! their tables.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::emulator::EmulatorProcess;
use crate::options::Options;
use crate::support::{BoxError, Kv, yes_no};

/// One mode of (a) or (b).
#[derive(Debug)]
pub(crate) struct ModeResult {
    pub(crate) producer: Kv,
    pub(crate) consumer: Kv,
    pub(crate) emulator: Kv,
}

pub(crate) fn run_mode(
    options: &Options,
    prefix: &str,
    topics: u32,
    queues: u32,
    batched: bool,
    follow_deadlines: Option<u64>,
) -> Result<ModeResult, BoxError> {
    let mode = match (batched, follow_deadlines) {
        (true, Some(_)) => "follow-deadlines batched",
        (true, None) => "batched",
        (false, _) => "immediate",
    };
    eprintln!("== {prefix}: {topics} topic(s) x {queues} queue(s), {mode} acks");
    let group = "load";
    let emulator = EmulatorProcess::start(
        &options.emulator,
        &[
            "--topics".into(),
            topics.to_string(),
            "--prefix".into(),
            prefix.into(),
            "--queues".into(),
            queues.to_string(),
            "--group".into(),
            group.into(),
        ],
    )?;
    let exe = std::env::current_exe()?;
    let mut consumer_args: Vec<String> = vec![
        "--role".into(),
        "consume".into(),
        "--endpoint".into(),
        emulator.endpoint.clone(),
        "--prefix".into(),
        prefix.into(),
        "--topics".into(),
        topics.to_string(),
        "--queues".into(),
        queues.to_string(),
        "--group".into(),
        group.into(),
    ];
    if batched {
        consumer_args.push("--batched".into());
    }
    if let Some(secs) = follow_deadlines {
        consumer_args.extend(["--follow-deadlines".into(), secs.to_string()]);
    }
    let mut consumer = Command::new(&exe)
        .args(&consumer_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut consumer_in = consumer.stdin.take().ok_or("no consumer stdin")?;
    let mut consumer_out = BufReader::new(consumer.stdout.take().ok_or("no consumer stdout")?);
    let mut line = String::new();
    loop {
        line.clear();
        if consumer_out.read_line(&mut line)? == 0 {
            return Err("the consumer exited before it was ready".into());
        }
        if line.trim() == "ready" {
            break;
        }
    }
    eprintln!(
        "   consumer subscribed; producing for {} s",
        options.duration
    );
    let producer_out = Command::new(&exe)
        .args([
            "--role".into(),
            "produce".into(),
            "--endpoint".into(),
            emulator.endpoint.clone(),
            "--prefix".into(),
            prefix.into(),
            "--topics".into(),
            topics.to_string(),
            "--rate".into(),
            options.rate.to_string(),
            "--duration".into(),
            options.duration.to_string(),
            "--body".into(),
            options.body.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let producer = Kv::read_block(&mut producer_out.stdout.as_slice())?;
    eprintln!(
        "   produced {} messages at {} msg/s ({} failed{})",
        producer.u64("sent"),
        producer.str("rate"),
        producer.u64("failed"),
        match producer.str("first_error") {
            "" => String::new(),
            error => format!(": {error}"),
        }
    );
    writeln!(consumer_in, "expect {}", producer.u64("sent"))?;
    consumer_in.flush()?;
    let consumer_kv = Kv::read_block(&mut consumer_out)?;
    drop(consumer_in);
    let _ = consumer.wait();
    let emulator = emulator.finish()?;
    eprintln!(
        "   consumed {} at {} msg/s; client CPU {} s; {} ack RPCs; p99 {} ms",
        consumer_kv.u64("consumed"),
        consumer_kv.str("throughput"),
        consumer_kv.str("cpu_s"),
        emulator.u64("ack_rpcs"),
        consumer_kv.str("lat_p99_ms")
    );
    Ok(ModeResult {
        producer,
        consumer: consumer_kv,
        emulator,
    })
}

pub(crate) fn none_if_empty(text: &str) -> String {
    if text.is_empty() {
        "none".into()
    } else {
        text.replace('|', "/")
    }
}

pub(crate) fn pct_change(before: f64, after: f64) -> String {
    if before == 0.0 {
        return "n/a".into();
    }
    format!("{:+.1} %", (after - before) / before * 100.0)
}

/// The markdown table of one scenario, immediate against batched.
pub(crate) fn flow_table(
    title: &str,
    one_topic: bool,
    options: &Options,
    immediate: &ModeResult,
    batched: &ModeResult,
) -> String {
    let (i, b) = (immediate, batched);
    let mut out = String::new();
    let _ = writeln!(out, "#### {title}\n");
    let _ = writeln!(
        out,
        "| metric | immediate | batched | change | target | met? |\n| --- | ---: | ---: | ---: | --- | --- |"
    );
    let mut row = |metric: &str, a: String, b: String, change: String, target: &str, met: &str| {
        let _ = writeln!(
            out,
            "| {metric} | {a} | {b} | {change} | {target} | {met} |"
        );
    };
    row(
        "messages produced (achieved rate, msg/s)",
        format!("{} ({})", i.producer.u64("sent"), i.producer.str("rate")),
        format!("{} ({})", b.producer.u64("sent"), b.producer.str("rate")),
        String::new(),
        &format!("{} msg/s for {} s", options.rate, options.duration),
        "",
    );
    row(
        "messages consumed",
        i.consumer.u64("consumed").to_string(),
        b.consumer.u64("consumed").to_string(),
        String::new(),
        "all produced",
        yes_no(
            i.consumer.u64("consumed") >= i.producer.u64("sent")
                && b.consumer.u64("consumed") >= b.producer.u64("sent"),
        ),
    );
    let (ti, tb) = (i.consumer.f64("throughput"), b.consumer.f64("throughput"));
    row(
        "consume throughput (msg/s)",
        format!("{ti:.0}"),
        format!("{tb:.0}"),
        pct_change(ti, tb),
        "unchanged (batched ≥ 98 % of immediate)",
        yes_no(tb >= 0.98 * ti),
    );
    let (ri, rb) = (
        i.emulator.u64("ack_rpcs") as f64,
        b.emulator.u64("ack_rpcs") as f64,
    );
    // Compared per acknowledged message, so that a baseline that did not acknowledge everything
    // (or retried a lot) is neither flattered nor penalised; equal to the plain ratio of RPCs
    // when both modes acknowledged every message.
    let per_ack = |rpcs: f64, kv: &Kv| rpcs / (kv.u64("acked").max(1) as f64);
    let (pi, pb) = (per_ack(ri, &i.emulator), per_ack(rb, &b.emulator));
    let reduction = if pi > 0.0 { 1.0 - pb / pi } else { 0.0 };
    let full = b.emulator.u64("ack_requests_1024");
    let (target, met) = if one_topic {
        (
            "≥ 99.9 % fewer, requests of exactly 1,024 entries seen",
            reduction >= 0.999 && full > 0,
        )
    } else {
        ("≥ 97 % fewer", reduction >= 0.97)
    };
    row(
        "ack RPCs",
        format!("{ri:.0}"),
        format!("{rb:.0}"),
        pct_change(ri, rb),
        "",
        "",
    );
    row(
        "ack RPCs per acknowledged message",
        format!("{pi:.4}"),
        format!("{pb:.4}"),
        format!("{:.2} % fewer", reduction * 100.0),
        target,
        yes_no(met),
    );
    row(
        "mean entries per ack RPC",
        i.emulator.str("mean_entries_per_ack_rpc").into(),
        b.emulator.str("mean_entries_per_ack_rpc").into(),
        String::new(),
        "",
        "",
    );
    row(
        "ack RPCs of exactly 1,024 entries",
        i.emulator.u64("ack_requests_1024").to_string(),
        full.to_string(),
        String::new(),
        "",
        "",
    );
    row(
        "batched flushes by reason (client)",
        i.consumer.str("flush_reasons").into(),
        b.consumer.str("flush_reasons").into(),
        String::new(),
        "",
        "",
    );
    let (ci, cb) = (i.consumer.f64("cpu_s"), b.consumer.f64("cpu_s"));
    let per_msg = |kv: &Kv| kv.f64("cpu_s") / (kv.u64("consumed").max(1) as f64);
    let per_10k_acks = |kv: &Kv| kv.f64("cpu_s") / (kv.u64("confirmed").max(1) as f64) * 1e4;
    row(
        "client (consumer process) CPU s",
        format!("{ci:.2}"),
        format!("{cb:.2}"),
        pct_change(ci, cb),
        "",
        "",
    );
    row(
        "client CPU s per 10,000 acks",
        format!("{:.3}", per_10k_acks(&i.consumer)),
        format!("{:.3}", per_10k_acks(&b.consumer)),
        pct_change(per_10k_acks(&i.consumer), per_10k_acks(&b.consumer)),
        "",
        "",
    );
    let (mi, mb) = (per_msg(&i.consumer), per_msg(&b.consumer));
    row(
        "client CPU µs per consumed message",
        format!("{:.1}", mi * 1e6),
        format!("{:.1}", mb * 1e6),
        pct_change(mi, mb),
        "≥ 30 % lower",
        yes_no(mb <= 0.7 * mi),
    );
    row(
        "producer process CPU s (not client CPU above)",
        i.producer.str("cpu_s").into(),
        b.producer.str("cpu_s").into(),
        pct_change(i.producer.f64("cpu_s"), b.producer.f64("cpu_s")),
        "",
        "",
    );
    row(
        "emulator process CPU s",
        i.emulator.str("cpu_s").into(),
        b.emulator.str("cpu_s").into(),
        pct_change(i.emulator.f64("cpu_s"), b.emulator.f64("cpu_s")),
        "",
        "",
    );
    row(
        "ack confirmation p50 (ms)",
        i.consumer.str("lat_p50_ms").into(),
        b.consumer.str("lat_p50_ms").into(),
        String::new(),
        "",
        "",
    );
    let p99 = b.consumer.f64("lat_p99_ms");
    row(
        "ack confirmation p99 (ms)",
        i.consumer.str("lat_p99_ms").into(),
        b.consumer.str("lat_p99_ms").into(),
        String::new(),
        "batched ≤ 5,000 + 100",
        yes_no(p99 <= 5_100.0 && b.consumer.u64("latency_samples") > 0),
    );
    row(
        "ack confirmation max (ms)",
        i.consumer.str("lat_max_ms").into(),
        b.consumer.str("lat_max_ms").into(),
        String::new(),
        "",
        "",
    );
    let (ei, eb) = (
        i.emulator.u64("expired_handles"),
        b.emulator.u64("expired_handles"),
    );
    row(
        "expired receipt handles",
        ei.to_string(),
        eb.to_string(),
        String::new(),
        "0",
        yes_no(ei == 0 && eb == 0),
    );
    row(
        "redelivered / unacknowledged after shutdown",
        format!(
            "{} / {}",
            i.emulator.u64("redelivered"),
            i.consumer.u64("unacknowledged")
        ),
        format!(
            "{} / {}",
            b.emulator.u64("redelivered"),
            b.consumer.u64("unacknowledged")
        ),
        String::new(),
        "",
        "",
    );
    row(
        "delivered (emulator) / received (consumer)",
        format!(
            "{} / {}",
            i.emulator.u64("messages_delivered"),
            i.consumer.u64("received")
        ),
        format!(
            "{} / {}",
            b.emulator.u64("messages_delivered"),
            b.consumer.u64("received")
        ),
        String::new(),
        "",
        "",
    );
    row(
        "ack errors seen by the observer (retried or final)",
        none_if_empty(i.consumer.str("ack_errors")),
        none_if_empty(b.consumer.str("ack_errors")),
        String::new(),
        "",
        "",
    );
    row(
        "acknowledged (emulator)",
        i.emulator.u64("acked").to_string(),
        b.emulator.u64("acked").to_string(),
        String::new(),
        "",
        "",
    );
    out.push('\n');
    out
}

/// The markdown table of `AckSettings::default()` against `follow_deadlines(max_delay)` in
/// one scenario: entries per request against the redelivery exposure.
pub(crate) fn deadline_table(
    title: &str,
    max_delay: u64,
    batched: &ModeResult,
    follow: &ModeResult,
) -> String {
    let (b, f) = (batched, follow);
    let mut out = String::new();
    let _ = writeln!(out, "#### {title}: `follow_deadlines({max_delay} s)`\n");
    let _ = writeln!(
        out,
        "| metric | default (5 s) | follow_deadlines ({max_delay} s) | change |\n| --- | ---: | ---: | ---: |"
    );
    let mut row = |metric: &str, a: String, b: String, change: String| {
        let _ = writeln!(out, "| {metric} | {a} | {b} | {change} |");
    };
    row(
        "messages produced / consumed",
        format!(
            "{} / {}",
            b.producer.u64("sent"),
            b.consumer.u64("consumed")
        ),
        format!(
            "{} / {}",
            f.producer.u64("sent"),
            f.consumer.u64("consumed")
        ),
        String::new(),
    );
    let (rb, rf) = (
        b.emulator.u64("ack_rpcs") as f64,
        f.emulator.u64("ack_rpcs") as f64,
    );
    row(
        "ack RPCs",
        format!("{rb:.0}"),
        format!("{rf:.0}"),
        pct_change(rb, rf),
    );
    let per_ack = |rpcs: f64, kv: &Kv| rpcs / (kv.u64("acked").max(1) as f64);
    let (pb, pf) = (per_ack(rb, &b.emulator), per_ack(rf, &f.emulator));
    row(
        "ack RPCs per acknowledged message",
        format!("{pb:.4}"),
        format!("{pf:.4}"),
        pct_change(pb, pf),
    );
    let (eb, ef) = (
        b.emulator.f64("mean_entries_per_ack_rpc"),
        f.emulator.f64("mean_entries_per_ack_rpc"),
    );
    row(
        "mean entries per AckMessage request",
        b.emulator.str("mean_entries_per_ack_rpc").into(),
        f.emulator.str("mean_entries_per_ack_rpc").into(),
        pct_change(eb, ef),
    );
    row(
        "flushes by reason (client)",
        b.consumer.str("flush_reasons").into(),
        f.consumer.str("flush_reasons").into(),
        String::new(),
    );
    for (metric, key) in [
        ("ack delay mean, handled to confirmed (ms)", "lat_mean_ms"),
        ("ack delay p50 (ms)", "lat_p50_ms"),
        ("ack delay p99 (ms)", "lat_p99_ms"),
        ("ack delay max (ms)", "lat_max_ms"),
        (
            "redelivery exposure: handled, ack not sent, mean (every 100 ms)",
            "unsent_mean",
        ),
        ("redelivery exposure: max", "unsent_max"),
    ] {
        row(
            metric,
            b.consumer.str(key).into(),
            f.consumer.str(key).into(),
            pct_change(b.consumer.f64(key), f.consumer.f64(key)),
        );
    }
    let per_msg = |kv: &Kv| kv.f64("cpu_s") / (kv.u64("consumed").max(1) as f64) * 1e6;
    row(
        "client CPU µs per consumed message",
        format!("{:.1}", per_msg(&b.consumer)),
        format!("{:.1}", per_msg(&f.consumer)),
        pct_change(per_msg(&b.consumer), per_msg(&f.consumer)),
    );
    row(
        "expired receipt handles / redelivered",
        format!(
            "{} / {}",
            b.emulator.u64("expired_handles"),
            b.emulator.u64("redelivered")
        ),
        format!(
            "{} / {}",
            f.emulator.u64("expired_handles"),
            f.emulator.u64("redelivered")
        ),
        String::new(),
    );
    row(
        "acknowledged (emulator) / unacknowledged after shutdown",
        format!(
            "{} / {}",
            b.emulator.u64("acked"),
            b.consumer.u64("unacknowledged")
        ),
        format!(
            "{} / {}",
            f.emulator.u64("acked"),
            f.consumer.u64("unacknowledged")
        ),
        String::new(),
    );
    out.push('\n');
    out
}
