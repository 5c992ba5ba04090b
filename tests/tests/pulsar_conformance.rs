//! The differential conformance harness (`integration_tests::conformance`): fixed seeds run
//! against the embedded emulator (always) and against a real broker (when
//! `PULSAR_SERVICE_URL` and `PULSAR_ADMIN_URL` are set, as `scripts/brokers/pulsar start`
//! prints them; otherwise that test returns at once). Every step's per consumer unacked count
//! and blocked flag and the subscription's backlog (entries) must equal those of
//! `txn_ack::model::SubscriptionModel` fed with what went over the wire: one consumer, or two
//! and three Shared consumers of one subscription (where a replay may go to any consumer; the
//! model follows the consumer it arrived at).

use integration_tests::real_pulsar::var;
use std::time::{Duration, Instant};

use broker_tools::pulsar_admin::PulsarAdmin;
use integration_tests::conformance::{Script, Target, run_script};
use pulsar_wire::{Client, ClientBuilder, ConnectOptions};
use pulsar_wire_emulator::{ConflictEffects, Emulator, EmulatorConfig};

/// The seeds (their class is `seed % 5`: mixed, steady transactional shape, two consumers,
/// two consumers with transactions, three consumers), six of each class.
const SEEDS: [u64; 30] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    27, 28, 29, 30,
];
/// Steps per script.
const STEPS: usize = 64;
/// `maxUnackedMessagesOnConsumer` of every topic: small, so that consumers block.
const LIMIT: u32 = 12;

fn unique() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{}-{millis}", std::process::id())
}

async fn run_all(target: Target<'_>, client: &Client, prefix: &str) {
    let started = Instant::now();
    let mut failures = Vec::new();
    // CONFORMANCE_SEEDS=3,17 runs only those seeds (to replay a failure).
    let only: Option<Vec<u64>> = var("CONFORMANCE_SEEDS")
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    for seed in SEEDS {
        if only.as_ref().is_some_and(|only| !only.contains(&seed)) {
            continue;
        }
        let script = Script::generate(seed, STEPS);
        let topic = format!("persistent://public/default/{prefix}-s{seed}");
        let at = Instant::now();
        match run_script(target, client, &topic, LIMIT, &script).await {
            Ok(report) => {
                println!(
                    "seed {seed} ({:?}): {} steps in {:?}: {} dispatches ({} while in \
                     pendingAcks), {} acks ({} conflicts), {} commits, {} aborts, {} blocks",
                    script.class,
                    report.steps,
                    at.elapsed(),
                    report.dispatches,
                    report.redispatches,
                    report.acks,
                    report.conflicts,
                    report.commits,
                    report.aborts,
                    report.blocks
                );
                if var("CONFORMANCE_LOG").is_some() {
                    println!("{}", report.log.join("\n"));
                }
            }
            Err(error) => {
                println!("{error}\n{script}");
                failures.push(error.to_string());
            }
        }
    }
    println!("{} seeds in {:?}", SEEDS.len(), started.elapsed());
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_conform_on_the_emulator() {
    let emulator = Emulator::start(
        EmulatorConfig::default()
            .batch_index_ack(true)
            .conflict_effects(ConflictEffects::AsBroker)
            .keep_alive(None),
    )
    .await
    .expect("the emulator starts");
    let options = ConnectOptions::new(emulator.endpoint())
        .expect("the endpoint")
        .operation_timeout(Duration::from_secs(10));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("connected");
    run_all(
        Target::Emulator(&emulator),
        &client,
        &format!("conf-{}", unique()),
    )
    .await;
    client.close().await;
    emulator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_conform_on_the_real_broker() {
    let (Some(service_url), Some(admin_url)) = (var("PULSAR_SERVICE_URL"), var("PULSAR_ADMIN_URL"))
    else {
        eprintln!("PULSAR_SERVICE_URL and PULSAR_ADMIN_URL are not both set; skipping");
        return;
    };
    let admin = PulsarAdmin::new(&admin_url).expect("PULSAR_ADMIN_URL is http://host:port");
    let options = ConnectOptions::new(&service_url)
        .expect("PULSAR_SERVICE_URL is a pulsar:// URL")
        .operation_timeout(Duration::from_secs(30));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("connected");
    run_all(Target::Real(&admin), &client, &format!("conf-{}", unique())).await;
    client.close().await;
}
