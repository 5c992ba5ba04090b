//! The `pulsar-wire` client against a real two-broker cluster (`scripts/brokers/pulsar-cluster
//! start`: Pulsar 4.0.x, brokers A and B on one ZooKeeper and one bookie, 2 transaction
//! coordinators, public/default in 8 bundles), issue 13's acceptance: nothing lost,
//! duplicates only among unacknowledged messages, no user code to recover anything.
//!
//! Runs when `PULSAR_CLUSTER_A_URL`, `PULSAR_CLUSTER_B_URL`, `PULSAR_CLUSTER_ADMIN_A` and
//! `PULSAR_CLUSTER_ADMIN_B` are set (the script prints them); otherwise every test returns at
//! once. The client only ever knows broker A's URL: topics on B are reached through A's
//! lookup redirects. Which broker owns a topic is read from the admin lookup
//! (`GET /lookup/v2/topic/...`), and a bundle is moved with
//! `PUT /admin/v2/namespaces/public/default/{bundle}/unload?destinationBroker=...`.

use integration_tests::real_pulsar::var;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_tools::pulsar_admin::PulsarAdmin;
use integration_tests::outage::{self, Fault, Report, Stream};
use integration_tests::peer_stream::{self, PeerCounts};
use pulsar_wire::{
    BatchingOptions, Client, ClientBuilder, ConnectOptions, Consumer, InitialPosition,
    OutgoingMessage, Producer, SubType,
};

/// How long a test waits for something that should happen soon.
const PATIENCE: Duration = Duration::from_secs(30);

/// One of the two brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Broker {
    A,
    B,
}

impl Broker {
    fn name(self) -> &'static str {
        match self {
            Self::A => "A",
            Self::B => "B",
        }
    }
}

/// The cluster: a client through A only, the admin API of A (it follows redirects to the
/// owner), and the brokers' URLs to tell owners apart.
struct Cluster {
    client: Client,
    admin: PulsarAdmin,
    /// `pulsar://` URLs of A and B, as the lookup names them.
    urls: [String; 2],
    /// `host:port` of B's and A's admin, the broker ids `destinationBroker` takes.
    ids: [String; 2],
    scenario: &'static str,
    started: Instant,
}

/// The cluster, or `None` (the test is skipped) unless all four variables are set.
async fn cluster(scenario: &'static str) -> Option<Cluster> {
    let (Some(a_url), Some(b_url), Some(admin_a), Some(admin_b)) = (
        var("PULSAR_CLUSTER_A_URL"),
        var("PULSAR_CLUSTER_B_URL"),
        var("PULSAR_CLUSTER_ADMIN_A"),
        var("PULSAR_CLUSTER_ADMIN_B"),
    ) else {
        eprintln!(
            "PULSAR_CLUSTER_A_URL, PULSAR_CLUSTER_B_URL, PULSAR_CLUSTER_ADMIN_A and \
             PULSAR_CLUSTER_ADMIN_B are not all set; skipping"
        );
        return None;
    };
    let id = |url: &str| {
        url.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned()
    };
    let admin = PulsarAdmin::new(&admin_a).expect("PULSAR_CLUSTER_ADMIN_A is http://host:port");
    let options = ConnectOptions::new(&a_url)
        .expect("PULSAR_CLUSTER_A_URL is a pulsar:// URL")
        .operation_timeout(Duration::from_secs(30));
    let client = ClientBuilder::from(options)
        .build()
        .await
        .expect("the client connects to broker A");
    Some(Cluster {
        client,
        admin,
        urls: [
            a_url.trim_end_matches('/').to_owned(),
            b_url.trim_end_matches('/').to_owned(),
        ],
        ids: [id(&admin_a), id(&admin_b)],
        scenario,
        started: Instant::now(),
    })
}

fn millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

impl Cluster {
    /// A fresh topic name.
    fn topic(&self, tag: &str) -> String {
        format!(
            "persistent://public/default/cl-{}-{tag}-{}-{}",
            self.scenario,
            std::process::id(),
            millis()
        )
    }

    /// The broker that owns `topic` (the lookup assigns its bundle if nobody owns it).
    async fn owner(&self, topic: &str) -> Broker {
        let name = topic.strip_prefix("persistent://").unwrap_or(topic);
        let path = format!("/lookup/v2/topic/persistent/{name}");
        let deadline = Instant::now() + PATIENCE;
        loop {
            let last = match self.admin.request("GET", &path, None).await {
                Ok(response) if response.is_success() => {
                    let json: serde_json::Value =
                        serde_json::from_str(&response.body).expect("lookup JSON");
                    let url = json
                        .get("brokerUrl")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .trim_end_matches('/')
                        .to_owned();
                    if url == self.urls[0] {
                        return Broker::A;
                    }
                    if url == self.urls[1] {
                        return Broker::B;
                    }
                    format!("an unknown broker: {}", response.body)
                }
                Ok(response) => format!("{} {}", response.status, response.body),
                Err(error) => error.0,
            };
            assert!(
                Instant::now() < deadline,
                "{}: no owner for {topic}: {last}",
                self.scenario
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The bundle range of `topic`'s namespace that holds it (`0x..._0x...`).
    async fn bundle(&self, topic: &str) -> String {
        let name = topic.strip_prefix("persistent://").unwrap_or(topic);
        let path = format!("/lookup/v2/topic/persistent/{name}/bundle");
        let response = self
            .admin
            .request("GET", &path, None)
            .await
            .expect("bundle lookup");
        assert!(response.is_success(), "GET {path}: {response:?}");
        response.body.trim().trim_matches('"').to_owned()
    }

    /// Unloads `topic`'s bundle so that it goes to `to`, and waits until the lookup names
    /// `to`. Returns how long it took. The unload is asked again every 10 s while the bundle
    /// stays where it was: in one CI run of 2026-12-02 (bded698) the broker took the request
    /// (success) and left the bundle on A for the whole 30 s. The deadline ([`PATIENCE`],
    /// 30 s) was not changed for it; how long moves take is printed (`moves`), no duration is
    /// recorded in the history.
    async fn move_bundle(&self, topic: &str, to: Broker) -> Duration {
        let started = Instant::now();
        let bundle = self.bundle(topic).await;
        let namespace = topic
            .strip_prefix("persistent://")
            .unwrap_or(topic)
            .rsplit_once('/')
            .map_or("public/default", |(namespace, _)| namespace);
        let path = format!(
            "/admin/v2/namespaces/{namespace}/{bundle}/unload?destinationBroker={}",
            self.ids[to as usize]
        );
        let unload = || async {
            let response = self
                .admin
                .request("PUT", &path, None)
                .await
                .expect("bundle unload");
            assert!(response.is_success(), "PUT {path}: {response:?}");
        };
        unload().await;
        let mut asked = Instant::now();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let owner = self.owner(topic).await;
            if owner == to {
                return started.elapsed();
            }
            if asked.elapsed() >= Duration::from_secs(10) {
                unload().await;
                asked = Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "{}: bundle {bundle} of {topic} still on {owner:?} after unloading it to {to:?}",
                self.scenario
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A fresh non-partitioned topic owned by `want`: fresh topics until one lands there
    /// (their bundles are spread over both brokers on first lookup), else the last one's
    /// bundle moved there.
    async fn topic_on(&self, want: Broker, tag: &str) -> String {
        let mut last = String::new();
        for attempt in 0..12 {
            let topic = self.topic(&format!("{tag}{attempt}"));
            self.admin
                .create_topic(&topic)
                .await
                .expect("topic created");
            let owner = self.owner(&topic).await;
            if owner == want {
                println!(
                    "{}: {topic} is on {} (attempt {attempt})",
                    self.scenario,
                    want.name()
                );
                return topic;
            }
            last = topic;
        }
        let took = self.move_bundle(&last, want).await;
        println!(
            "{}: {last} moved to {} in {took:?}",
            self.scenario,
            want.name()
        );
        last
    }

    async fn shared(&self, topic: &str, sub: &str) -> Consumer {
        Consumer::builder(&self.client, topic, sub)
            .options(
                integration_tests::real_pulsar::consumer_options()
                    .sub_type(SubType::Shared)
                    .initial_position(InitialPosition::Earliest),
            )
            .build()
            .await
            .expect("subscribed")
    }

    /// A producer on `topic` batching 10 messages or 10 ms.
    async fn batching_producer(&self, topic: &str) -> Producer {
        Producer::builder(&self.client, topic)
            .batching(
                BatchingOptions::default()
                    .max_messages(10)
                    .max_delay(Duration::from_millis(10)),
            )
            .build()
            .await
            .expect("producer created")
    }

    /// Waits until `sub` on `topic` has no backlog and nothing unacked.
    async fn assert_drained(&self, topic: &str, sub: &str) {
        self.admin
            .wait_for_stats(topic, PATIENCE, |stats| {
                stats.subscription(sub).is_some_and(|s| s.is_drained())
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {topic} not drained: {e}", self.scenario));
    }

    /// [`outage::run`] at 100 msg/s for `seconds` on `topic`.
    async fn outage_run(
        &self,
        topic: &str,
        seconds: u64,
        faults: Vec<(Duration, Fault)>,
    ) -> Report {
        let stream = Stream {
            rate: 100,
            produce_for: Duration::from_secs(seconds),
            patience: Duration::from_secs(60),
        };
        let report = outage::run(&self.client, &self.admin, topic, &stream, faults).await;
        println!("{}: {report:?}", self.scenario);
        report
    }

    /// [`Cluster::outage_run`], with the official Python client streaming beside it on the
    /// same topic (through A only, 100 msg/s, its own subscription and payloads) through the
    /// same faults.
    async fn outage_run_beside_python(
        &self,
        topic: &str,
        seconds: u64,
        faults: Vec<(Duration, Fault)>,
    ) -> (Report, PeerCounts) {
        let python =
            peer_stream::python_stream(&self.urls[0], topic, 100, seconds, Duration::from_secs(60));
        let (report, python) = tokio::join!(self.outage_run(topic, seconds, faults), python);
        let python = python.unwrap_or_else(|e| panic!("{}: {e}", self.scenario));
        println!("{}: the Python client beside it: {python:?}", self.scenario);
        (report, python)
    }

    async fn done(self) {
        self.client.close().await;
        println!("{}: passed in {:?}", self.scenario, self.started.elapsed());
    }
}

/// Receives until `count` distinct payloads arrived (acking each), within [`PATIENCE`];
/// returns the distinct payloads and how many copies came.
async fn receive_distinct(consumer: &Consumer, count: usize) -> (HashSet<String>, usize) {
    let mut seen = HashSet::new();
    let mut copies = 0;
    let deadline = Instant::now() + PATIENCE;
    while seen.len() < count && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), consumer.receive()).await {
            Err(_) => {}
            Ok(Ok(message)) => {
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                if !seen.insert(payload) {
                    copies += 1;
                }
                consumer.ack(&message).await.expect("acked");
            }
            Ok(Err(error)) => panic!("receive failed: {error}"),
        }
    }
    consumer.flush_acks().await;
    (seen, copies)
}

/// Ours lost no more, failed no more sends or receives, and delivered no more copies than the
/// Python client in the same run (with 10 copies' slack: which messages a broker redelivers
/// depends on when the fault lands in each client's ack grouping).
fn assert_at_least_as_good(ours: &Report, python: &PeerCounts) {
    assert!(
        python.finished,
        "the Python client did not finish: {python:?}"
    );
    assert!(ours.lost <= python.lost, "{ours:?} against {python:?}");
    assert!(
        ours.send_failures <= python.send_errors && ours.receive_failures <= python.receive_errors,
        "{ours:?} against {python:?}"
    );
    assert!(
        ours.copies <= python.copies + 10,
        "{ours:?} against {python:?}"
    );
}

fn payloads(prefix: &str, count: usize) -> HashSet<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

/// A topic owned by B, reached through A only: 200 messages produced and consumed, all of
/// them, none twice, nothing left on the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_owned_by_b_is_produced_and_consumed_through_a() {
    let Some(cluster) = cluster("on-b").await else {
        return;
    };
    let topic = cluster.topic_on(Broker::B, "t").await;
    let consumer = cluster.shared(&topic, "sub").await;
    let producer = cluster.batching_producer(&topic).await;
    send_all(&producer, "b", 200).await;
    let (seen, copies) = receive_distinct(&consumer, 200).await;
    assert_eq!(seen, payloads("b", 200), "{} of 200", seen.len());
    assert_eq!(copies, 0);
    cluster.assert_drained(&topic, "sub").await;
    assert_eq!(cluster.owner(&topic).await, Broker::B);
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("consumer closed");
    cluster.done().await;
}

/// Sends `prefix0` .. `prefix{count - 1}`, all at once, and waits for every receipt.
async fn send_all(producer: &Producer, prefix: &str, count: usize) {
    let sends: Vec<_> = (0..count)
        .map(|i| {
            let producer = producer.clone();
            let payload = format!("{prefix}{i}");
            tokio::spawn(async move { producer.send(OutgoingMessage::new(payload)).await })
        })
        .collect();
    for send in sends {
        send.await.expect("joined").expect("sent");
    }
}

/// An 8-partition topic whose partitions are spread over both brokers (moved there when the
/// first lookups put them all on one): a producer and a Shared consumer through A, 800
/// messages, every one received once, nothing left on any partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_topic_over_both_brokers() {
    let Some(cluster) = cluster("partitioned").await else {
        return;
    };
    let topic = cluster.topic("p");
    cluster
        .admin
        .create_partitioned_topic(&topic, 8)
        .await
        .expect("partitioned topic created");
    let partitions: Vec<String> = (0..8)
        .map(|i| pulsar_wire::partition_topic(&topic, i))
        .collect();
    let mut owners = BTreeMap::new();
    for partition in &partitions {
        owners.insert(partition.clone(), cluster.owner(partition).await);
    }
    let on =
        |owners: &BTreeMap<String, Broker>, b: Broker| owners.values().filter(|&&o| o == b).count();
    println!(
        "partitioned: {} partitions on A, {} on B",
        on(&owners, Broker::A),
        on(&owners, Broker::B)
    );
    for lonely in [Broker::A, Broker::B] {
        if on(&owners, lonely) == 0 {
            let other = if lonely == Broker::A {
                Broker::B
            } else {
                Broker::A
            };
            cluster.move_bundle(&partitions[0], lonely).await;
            for partition in &partitions {
                owners.insert(partition.clone(), cluster.owner(partition).await);
            }
            println!(
                "partitioned: after moving a bundle from {other:?}: {} on A, {} on B",
                on(&owners, Broker::A),
                on(&owners, Broker::B)
            );
        }
    }
    assert!(
        on(&owners, Broker::A) > 0 && on(&owners, Broker::B) > 0,
        "{owners:?}"
    );
    let consumer = cluster.shared(&topic, "sub").await;
    let producer = cluster.batching_producer(&topic).await;
    send_all(&producer, "p", 800).await;
    let (seen, copies) = receive_distinct(&consumer, 800).await;
    assert_eq!(seen, payloads("p", 800), "{} of 800", seen.len());
    assert_eq!(copies, 0);
    for partition in &partitions {
        cluster.assert_drained(partition, "sub").await;
    }
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("consumer closed");
    cluster.done().await;
}

/// A topic's bundle moved from A to B, then back to A, while a stream runs on it at 100
/// msg/s: every payload arrives, no send or receive fails, nothing left unacknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_its_bundle_moving_between_the_brokers() {
    let Some(cluster) = cluster("bundle-move").await else {
        return;
    };
    let cluster = Arc::new(cluster);
    let topic = cluster.topic_on(Broker::A, "t").await;
    let moves = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let faults = [(3, Broker::B), (7, Broker::A)]
        .into_iter()
        .map(|(at, to)| {
            let cluster = Arc::clone(&cluster);
            let topic = topic.clone();
            let moves = Arc::clone(&moves);
            let fault: Fault = Box::new(move || {
                Box::pin(async move {
                    let took = cluster.move_bundle(&topic, to).await;
                    moves.lock().push((to, took));
                })
            });
            (Duration::from_secs(at), fault)
        })
        .collect();
    let (report, python) = cluster.outage_run_beside_python(&topic, 10, faults).await;
    println!("bundle-move: moves {:?}", moves.lock());
    let missed = report.shortfalls();
    assert!(missed.is_empty(), "{missed:?}: {report:?}");
    assert_at_least_as_good(&report, &python);
    assert_eq!(report.sent, 1_000, "{report:?}");
    assert_eq!(moves.lock().len(), 2);
    // At least once each, not twice (one per move) as before c6673b4 (2026-12-02): a move
    // that lands while the producer or consumer is still registering after the previous one
    // can end that registration before it counts, so two moves may count as one reconnect.
    // Seen in 1 of 8 runs (the count is not recorded; below 2 for one of the two). Bound: 1,
    // the least that shows the client followed a move at all; that both moves happened is
    // checked above.
    assert!(report.producer_reconnects >= 1, "{report:?}");
    assert!(report.consumer_reconnects >= 1, "{report:?}");
    let Ok(cluster) = Arc::try_unwrap(cluster) else {
        panic!("the faults are done");
    };
    cluster.done().await;
}

/// One transaction produces on a topic owned by A and acknowledges a message of a topic
/// owned by B, and commits: the produced message is visible only after the commit, the
/// acknowledged one is gone. Four such transactions, so both coordinators take some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_over_both_brokers_commits() {
    let Some(cluster) = cluster("txn").await else {
        return;
    };
    let on_a = cluster.topic_on(Broker::A, "out").await;
    let on_b = cluster.topic_on(Broker::B, "in").await;
    let rounds = 4;
    let input = Producer::builder(&cluster.client, &on_b)
        .no_batching()
        .build()
        .await
        .expect("input producer");
    for i in 0..rounds {
        input
            .send(OutgoingMessage::new(format!("in{i}")))
            .await
            .expect("input sent");
    }
    let source = cluster.shared(&on_b, "sub").await;
    let sink = cluster.shared(&on_a, "check").await;
    let output = Producer::builder(&cluster.client, &on_a)
        .no_batching()
        .transactional(true)
        .build()
        .await
        .expect("output producer");
    let coordinator = cluster
        .client
        .transaction_coordinator()
        .await
        .expect("the transaction coordinators");
    println!("txn: {} coordinators", coordinator.coordinators());
    let mut coordinators = HashSet::new();
    for i in 0..rounds {
        let message = tokio::time::timeout(PATIENCE, source.receive())
            .await
            .expect("an input message in time")
            .expect("received");
        let txn = coordinator
            .new_transaction(Duration::from_secs(60))
            .await
            .expect("a transaction");
        coordinators.insert(txn.id().most_bits);
        output
            .send_in(&txn, OutgoingMessage::new(format!("out{i}")))
            .await
            .expect("sent in the transaction");
        source
            .ack_in(&txn, &message)
            .await
            .expect("acked in the transaction");
        // Not visible before the commit.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), sink.receive())
                .await
                .is_err(),
            "out{i} visible before the commit"
        );
        txn.commit().await.expect("committed");
        let out = tokio::time::timeout(PATIENCE, sink.receive())
            .await
            .expect("the output in time after the commit")
            .expect("received");
        assert_eq!(out.payload(), format!("out{i}").as_bytes());
        sink.ack(&out).await.expect("output acked");
    }
    sink.flush_acks().await;
    println!("txn: coordinators used {coordinators:?}");
    assert_eq!(coordinators.len(), 2, "{coordinators:?}");
    cluster.assert_drained(&on_b, "sub").await;
    cluster.assert_drained(&on_a, "check").await;
    // The acknowledged input is not delivered again.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), source.receive())
            .await
            .is_err(),
        "an acknowledged input came again"
    );
    cluster.done().await;
}

/// Restarts one broker of the cluster with `scripts/brokers/pulsar-cluster restart-broker`
/// (TERM: it hands its bundles over as it stops); returns how long it took.
async fn restart_broker(broker: Broker) -> Duration {
    restart_broker_with(broker, &[]).await
}

/// [`restart_broker`] with more arguments of the script (`--kill`, `--down SECONDS`).
async fn restart_broker_with(broker: Broker, more: &[&str]) -> Duration {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/brokers/pulsar-cluster"
    );
    let started = Instant::now();
    let mut args = vec!["restart-broker".to_owned(), broker.name().to_owned()];
    args.extend(more.iter().map(|a| (*a).to_owned()));
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(script).args(&args).status()
    })
    .await
    .expect("joined")
    .expect("the restart script runs");
    assert!(status.success(), "the restart failed: {status}");
    started.elapsed()
}

/// Broker B stopped (TERM) and started again while a stream runs at 100 msg/s on a topic it
/// owns, the client connected through A: the topic goes to A, producer and consumer follow
/// it by themselves, every payload arrives, no send or receive fails, nothing is left
/// unacknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_its_broker_restarted() {
    let Some(cluster) = cluster("restart-b").await else {
        return;
    };
    let topic = cluster.topic_on(Broker::B, "t").await;
    let down = Arc::new(parking_lot::Mutex::new(Duration::ZERO));
    let fault: Fault = Box::new({
        let down = Arc::clone(&down);
        move || {
            Box::pin(async move {
                *down.lock() = restart_broker(Broker::B).await;
            })
        }
    });
    let (report, python) = cluster
        .outage_run_beside_python(&topic, 30, vec![(Duration::from_secs(5), fault)])
        .await;
    let down = *down.lock();
    let owner = cluster.owner(&topic).await;
    println!("restart-b: the restart took {down:?}; the topic is now on {owner:?}");
    let missed = report.shortfalls();
    assert!(missed.is_empty(), "{missed:?}: {report:?}");
    assert_at_least_as_good(&report, &python);
    assert_eq!(report.sent, 3_000, "{report:?}");
    assert!(report.producer_reconnects >= 1, "{report:?}");
    assert!(report.consumer_reconnects >= 1, "{report:?}");
    cluster.done().await;
}

/// The topic that decides where coordinator `tc` runs.
fn coordinator_topic(tc: u64) -> String {
    format!(
        "{}-partition-{tc}",
        pulsar_wire::TRANSACTION_COORDINATOR_ASSIGN
    )
}

/// Each coordinator's partition of the assignment topic moved to the other broker (an admin
/// unload, as load shedding or a bundle split would) while 4 transactions are open on it: the
/// 4 commit, and new transactions open at once after the move (issue 27: the client kept the
/// old connection and every END_TXN, NEW_TXN and add-to-transaction was refused with
/// `TransactionCoordinatorNotFound`: 0 of 4 committed, 0 of 4 opened; the Java client: 4 of 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_outlive_their_coordinator_moving() {
    let Some(cluster) = cluster("tc-moves").await else {
        return;
    };
    let topic = cluster.topic("txn-out");
    let producer = Producer::builder(&cluster.client, &topic)
        .no_batching()
        .transactional(true)
        .build()
        .await
        .expect("producer");
    let reader = cluster.shared(&topic, "check").await;
    let coordinator = cluster
        .client
        .transaction_coordinator()
        .await
        .expect("the coordinators")
        .clone();
    assert_eq!(coordinator.coordinators(), 2);
    let mut committed = 0;
    for tc in 0..2u64 {
        // Four open transactions on coordinator `tc`, each with a message in it.
        let mut open = Vec::new();
        while open.len() < 4 {
            let txn = coordinator
                .new_transaction(Duration::from_secs(120))
                .await
                .expect("a transaction");
            if txn.id().most_bits == tc {
                producer
                    .send_in(&txn, OutgoingMessage::new(format!("tc{tc}-{}", open.len())))
                    .await
                    .expect("sent in the transaction");
                open.push(txn);
            } else {
                txn.abort().await.expect("the other coordinator's aborted");
            }
        }
        let assign = coordinator_topic(tc);
        let from = cluster.owner(&assign).await;
        let to = if from == Broker::A {
            Broker::B
        } else {
            Broker::A
        };
        let took = cluster.move_bundle(&assign, to).await;
        println!("tc-moves: coordinator {tc} moved {from:?} -> {to:?} in {took:?}");
        for txn in &open {
            let started = Instant::now();
            txn.commit()
                .await
                .unwrap_or_else(|e| panic!("coordinator {tc}: {} not committed: {e}", txn.id()));
            println!(
                "tc-moves: {} committed in {:?}",
                txn.id(),
                started.elapsed()
            );
            committed += 1;
        }
        // New transactions on the moved coordinator open at once.
        let mut opened = 0;
        while opened < 2 {
            let started = Instant::now();
            let txn = coordinator
                .new_transaction(Duration::from_secs(60))
                .await
                .expect("a new transaction after the move");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                started.elapsed()
            );
            if txn.id().most_bits == tc {
                opened += 1;
            }
            txn.abort().await.expect("aborted");
        }
    }
    assert_eq!(committed, 8);
    let (seen, _) = receive_distinct(&reader, 8).await;
    assert_eq!(seen.len(), 8, "{seen:?}");
    cluster.done().await;
}

/// The broker that owns a stream's topic killed with -9 (no hand-over) and started again 20 s
/// later, the client connected through the other: the producer and the consumer carry on
/// with no application call, and a producer created during the outage is created once the
/// topic has a live owner, within the operation timeout (issue 27: it failed twice in 0.5 s
/// with `Connection refused`, the lookup still naming the dead broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_its_broker_killed() {
    let Some(cluster) = cluster("kill-b").await else {
        return;
    };
    let cluster = Arc::new(cluster);
    let topic = cluster.topic_on(Broker::B, "t").await;
    let created = Arc::new(parking_lot::Mutex::new(None));
    let fault: Fault = Box::new({
        let (cluster, topic, created) = (Arc::clone(&cluster), topic.clone(), Arc::clone(&created));
        move || {
            Box::pin(async move {
                let restart =
                    tokio::spawn(restart_broker_with(Broker::B, &["--kill", "--down", "20"]));
                // The kill lands first (the script sends KILL at once).
                tokio::time::sleep(Duration::from_secs(1)).await;
                let started = Instant::now();
                let made = Producer::builder(&cluster.client, &topic).build().await;
                *created.lock() =
                    Some((made.map(drop).map_err(|e| e.to_string()), started.elapsed()));
                let down = restart.await.expect("joined");
                println!("kill-b: B killed and started again in {down:?}");
            })
        }
    });
    let report = cluster
        .outage_run(&topic, 40, vec![(Duration::from_secs(5), fault)])
        .await;
    let created = created
        .lock()
        .clone()
        .expect("the producer was created during the outage");
    println!("kill-b: a producer created during the outage: {created:?}");
    assert!(created.0.is_ok(), "{created:?}");
    assert!(created.1 < Duration::from_secs(30), "{created:?}");
    let missed = report.shortfalls();
    assert!(missed.is_empty(), "{missed:?}: {report:?}");
    assert!(report.producer_reconnects >= 1, "{report:?}");
    assert!(report.consumer_reconnects >= 1, "{report:?}");
    let Ok(cluster) = Arc::try_unwrap(cluster) else {
        panic!("the cluster is still shared");
    };
    cluster.done().await;
}

/// PIP-307 on a cluster running the extensible load manager
/// (`PULSAR_CLUSTER_LOAD_MANAGER=extensible scripts/brokers/pulsar-cluster start`; skipped
/// on the modular one, whose closes name no broker): a bundle moved from A to B closes the
/// producer and the consumer naming B (`assignedBrokerServiceUrl`), and both go there without
/// a lookup; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_moved_by_the_extensible_load_manager_is_followed_to_its_new_broker() {
    if var("PULSAR_CLUSTER_LOAD_MANAGER").as_deref() != Some("extensible") {
        eprintln!("PULSAR_CLUSTER_LOAD_MANAGER is not extensible; skipping");
        return;
    }
    let Some(cluster) = cluster("pip307").await else {
        return;
    };
    let topic = cluster.topic_on(Broker::A, "moved").await;
    let consumer = cluster.shared(&topic, "sub").await;
    let producer = cluster.batching_producer(&topic).await;
    send_all(&producer, "before", 50).await;
    let (got, _) = receive_distinct(&consumer, 50).await;
    assert_eq!(got, payloads("before", 50));
    let took = cluster.move_bundle(&topic, Broker::B).await;
    println!("pip307: {topic} moved to B in {took:?}");
    send_all(&producer, "after", 50).await;
    let (got, _) = receive_distinct(&consumer, 50).await;
    assert_eq!(got, payloads("after", 50));
    let stats = consumer.stats();
    assert!(
        stats.moved >= 1,
        "the close named no broker (moved {}, reconnects {})",
        stats.moved,
        stats.reconnects
    );
    cluster.assert_drained(&topic, "sub").await;
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("closed");
    cluster.done().await;
}
