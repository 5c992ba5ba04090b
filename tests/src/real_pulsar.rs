//! The real Pulsar broker of `scripts/brokers/pulsar` for a test: a client and the admin API
//! on a fresh topic, and the official clients' peers (`scripts/java-peers`,
//! `scripts/python-peers`) to run beside ours.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker_tools::pulsar_admin::PulsarAdmin;
use pulsar_wire::{Client, ClientBuilder, ConnectOptions, ConsumerOptions, PartialBatches};

/// A variable of the broker scripts, when set and not empty.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Consumer options for the broker of `scripts/brokers/pulsar`: the defaults, except that acks
/// of partly acknowledged batches carry the accumulated set
/// ([`PartialBatches::SendAckSet`]), the setting for a broker with
/// `acknowledgmentAtBatchIndexLevelEnabled=true`, as the script configures it (the default,
/// holding them until the batch is complete, is for brokers without it).
#[must_use]
pub fn consumer_options() -> ConsumerOptions {
    ConsumerOptions::default().partial_batches(PartialBatches::SendAckSet)
}

/// A client and the admin API of the real broker, with a fresh topic for one scenario.
#[derive(Debug)]
pub struct RealPulsar {
    /// A client connected to `PULSAR_SERVICE_URL`.
    pub client: Client,
    /// The admin API at `PULSAR_ADMIN_URL`.
    pub admin: PulsarAdmin,
    /// `PULSAR_SERVICE_URL`, for the peers.
    pub service_url: String,
    /// `persistent://public/default/it-<scenario>-<pid>-<millis>`, created.
    pub topic: String,
    /// When the setup began.
    pub started: Instant,
}

impl RealPulsar {
    /// The broker with a fresh topic (`partitions` > 0: a partitioned one); `None` (the test
    /// is skipped) unless `PULSAR_SERVICE_URL` and `PULSAR_ADMIN_URL` are both set.
    pub async fn new(scenario: &str, partitions: u32) -> Option<Self> {
        let (Some(service_url), Some(admin_url)) =
            (var("PULSAR_SERVICE_URL"), var("PULSAR_ADMIN_URL"))
        else {
            eprintln!("PULSAR_SERVICE_URL and PULSAR_ADMIN_URL are not both set; skipping");
            return None;
        };
        let started = Instant::now();
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let topic = format!(
            "persistent://public/default/it-{scenario}-{}-{millis}",
            std::process::id()
        );
        let admin = PulsarAdmin::new(&admin_url).expect("PULSAR_ADMIN_URL is http://host:port");
        if partitions > 0 {
            admin
                .create_partitioned_topic(&topic, partitions)
                .await
                .expect("partitioned topic created");
        } else {
            admin.create_topic(&topic).await.expect("topic created");
        }
        let options = ConnectOptions::new(&service_url)
            .expect("PULSAR_SERVICE_URL is a pulsar:// URL")
            .operation_timeout(Duration::from_secs(30));
        let client = ClientBuilder::from(options)
            .build()
            .await
            .expect("the client connects to the real broker");
        Some(Self {
            client,
            admin,
            service_url,
            topic,
            started,
        })
    }
}

/// Runs one of the official Java client peers (`scripts/java-peers/run`, which builds them
/// from Maven Central on first use) to completion and returns its standard output; panics if
/// it failed.
pub async fn java_peer(main: &str, args: &[&str]) -> String {
    peer("java-peers/run", main, args).await
}

/// Runs a Python-client peer (`scripts/python-peers/<script>.py`) and returns what it
/// printed; panics if it failed.
pub async fn python_peer(script: &str, args: &[&str]) -> String {
    peer("python-peers/run", script, args).await
}

async fn peer(runner: &str, main: &str, args: &[&str]) -> String {
    let run = format!("{}/../scripts/{runner}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::new(&run)
        .arg(main)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {run}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // What the peer said on its way out (a build's output can be long: its end).
    let tail: String = {
        let lines: Vec<&str> = stderr.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert!(
        output.status.success(),
        "{main} failed ({}): stdout {stdout}\nstderr (end):\n{tail}",
        output.status
    );
    stdout
}
