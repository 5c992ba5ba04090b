//! `pulsar-wire` over TLS with token authentication against a real broker
//! (`scripts/brokers/pulsar start-secure`: 4.0.x standalone with only a TLS port, token
//! authentication and authorization, and a token refresh check every second).
//!
//! Runs when `PULSAR_SECURE_SERVICE_URL`, `PULSAR_SECURE_CA` and `PULSAR_SECURE_TOKEN_FILE`
//! are set (the script prints them, with `PULSAR_SECURE_ADMIN_URL` for the backlog check and
//! `PULSAR_SECURE_SECRET_KEY` for the token refresh test); otherwise every test returns at
//! once.

use integration_tests::real_pulsar::var;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use broker_tools::pulsar_admin::PulsarAdmin;
use pulsar_wire::ServerError;
use pulsar_wire::{
    BatchingOptions, ClientBuilder, ConnectOptions, Consumer, Error, InitialPosition,
    OutgoingMessage, Producer, SubType, TokenProvider, async_trait,
};

/// How long a test waits for something that should happen soon.
const PATIENCE: Duration = Duration::from_secs(30);
/// How fast a refused token must be reported.
const AT_ONCE: Duration = Duration::from_secs(3);
/// The role of the script's superuser token.
const ROLE: &str = "it-admin";

/// The secure broker's addresses and credentials.
struct Secure {
    service_url: String,
    admin_url: Option<String>,
    ca: String,
    token_file: String,
    secret_key: Option<String>,
}

/// `None` (the test is skipped) unless the service URL, the CA and the token are all set.
fn secure() -> Option<Secure> {
    let (Some(service_url), Some(ca), Some(token_file)) = (
        var("PULSAR_SECURE_SERVICE_URL"),
        var("PULSAR_SECURE_CA"),
        var("PULSAR_SECURE_TOKEN_FILE"),
    ) else {
        eprintln!(
            "PULSAR_SECURE_SERVICE_URL, PULSAR_SECURE_CA and PULSAR_SECURE_TOKEN_FILE are not all set; skipping"
        );
        return None;
    };
    Some(Secure {
        service_url,
        admin_url: var("PULSAR_SECURE_ADMIN_URL"),
        ca,
        token_file,
        secret_key: var("PULSAR_SECURE_SECRET_KEY"),
    })
}

impl Secure {
    /// TLS with the broker's CA, no credentials yet.
    fn options(&self) -> ConnectOptions {
        ConnectOptions::new(&self.service_url)
            .expect("PULSAR_SECURE_SERVICE_URL is a pulsar+ssl:// URL")
            .tls_ca_file(&self.ca)
            .operation_timeout(PATIENCE)
    }

    fn admin(&self) -> Option<PulsarAdmin> {
        let url = self.admin_url.as_deref()?;
        let token = std::fs::read_to_string(&self.token_file).expect("the token file");
        Some(
            PulsarAdmin::secure(url, &self.ca, &token)
                .expect("PULSAR_SECURE_ADMIN_URL is https://"),
        )
    }

    fn address(&self) -> String {
        self.service_url
            .trim_start_matches("pulsar+ssl://")
            .trim_end_matches('/')
            .to_owned()
    }
}

fn unique_topic(name: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "persistent://public/default/secure-{name}-{}-{millis}",
        std::process::id()
    )
}

#[tokio::test]
async fn messages_go_through_tls_with_a_token_and_the_backlog_drains() {
    let Some(secure) = secure() else { return };
    let started = Instant::now();
    let client = ClientBuilder::from(secure.options().auth_token_file(&secure.token_file))
        .build()
        .await
        .expect("connected over TLS with the token");
    let topic = unique_topic("roundtrip");
    // The lookup answers with the broker's brokerServiceUrlTls, the only URL it has.
    let connection = client.lookup(&topic).await.expect("looked up");
    assert!(connection.is_tls());
    assert_eq!(connection.address(), secure.address());

    let consumer = Consumer::builder(&client, &topic, "sub")
        .options(
            integration_tests::real_pulsar::consumer_options()
                .sub_type(SubType::Shared)
                .initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
        .expect("subscribed");
    let producer = Producer::builder(&client, &topic)
        .batching(
            BatchingOptions::default()
                .max_messages(10)
                .max_delay(Duration::from_millis(20)),
        )
        .build()
        .await
        .expect("producer created");
    const COUNT: usize = 200;
    let sends = (0..COUNT).map(|i| producer.send(OutgoingMessage::new(format!("secure-{i}"))));
    for sent in futures_util::future::join_all(sends).await {
        sent.expect("sent");
    }
    let mut received = BTreeMap::new();
    while received.len() < COUNT {
        let message = tokio::time::timeout(PATIENCE, consumer.receive())
            .await
            .unwrap_or_else(|_| panic!("only {} of {COUNT} received", received.len()))
            .expect("received");
        let payload = String::from_utf8(message.payload().to_vec()).expect("UTF-8");
        *received.entry(payload).or_insert(0) += 1;
        consumer.ack(&message).await.expect("acked");
    }
    for i in 0..COUNT {
        assert_eq!(received.get(&format!("secure-{i}")), Some(&1), "secure-{i}");
    }
    consumer.flush_acks().await;
    if let Some(admin) = secure.admin() {
        let stats = admin
            .wait_for_stats(&topic, PATIENCE, |stats| {
                stats.subscription("sub").is_some_and(|s| s.is_drained())
            })
            .await
            .expect("the backlog drains (read over HTTPS with the token)");
        assert_eq!(stats.msg_in_counter, COUNT as i64);
        println!(
            "{COUNT} messages over TLS, backlog {} after {:?}",
            stats.subscription("sub").map_or(-1, |s| s.msg_backlog),
            started.elapsed()
        );
    } else {
        println!("PULSAR_SECURE_ADMIN_URL is not set: {COUNT} messages counted, backlog not read");
    }
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("consumer closed");
    client.close().await;
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_at_once() {
    let Some(secure) = secure() else { return };
    let mut cases = vec![
        ("a token that is no JWT", Some("not-a-token".to_owned())),
        ("no token", None),
    ];
    if let Some(key) = &secure.secret_key {
        let real = std::fs::read(key).expect("the secret key");
        let other: Vec<u8> = real.iter().map(|b| b ^ 0x5a).collect();
        cases.push((
            "a token signed with another key",
            Some(hs256(&other, ROLE, None)),
        ));
        cases.push((
            "an expired token",
            Some(hs256(&real, ROLE, Some(now_secs().saturating_sub(60)))),
        ));
    }
    for (case, token) in cases {
        let token_sent = token.is_some();
        let options = match token {
            Some(token) => secure.options().auth_token(token),
            None => secure.options(),
        };
        let started = Instant::now();
        let error = ClientBuilder::from(options).build().await.expect_err(case);
        let elapsed = started.elapsed();
        println!("{case}: {error} (after {elapsed:?})");
        assert!(elapsed < AT_ONCE, "{case}: reported after {elapsed:?}");
        assert!(
            matches!(&error, Error::Authentication { broker, token_sent: sent, .. }
                if *broker == secure.address() && *sent == token_sent),
            "{case}: {error:?}"
        );
        assert_eq!(error.server_error(), Some(ServerError::AuthenticationError));
        let text = error.to_string();
        assert!(text.contains(&secure.address()), "{case}: {text}");
        let hint = if token_sent {
            "check the token"
        } else {
            "requires authentication"
        };
        assert!(text.contains(hint), "{case}: {text}");
    }
}

#[tokio::test]
async fn misconfigured_tls_is_explained() {
    let Some(secure) = secure() else { return };
    // The public roots do not vouch for the script's CA.
    let options = ConnectOptions::new(&secure.service_url)
        .expect("valid")
        .auth_token_file(&secure.token_file)
        .operation_timeout(PATIENCE);
    let error = ClientBuilder::from(options)
        .build()
        .await
        .expect_err("untrusted");
    println!("public roots only: {error}");
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
    assert!(error.to_string().contains("tls_ca_file"), "{error}");

    // Plain TCP to the TLS port: the broker closes without answering CONNECT.
    let started = Instant::now();
    let options = ConnectOptions::new(&format!("pulsar://{}", secure.address()))
        .expect("valid")
        .auth_token_file(&secure.token_file)
        .operation_timeout(PATIENCE);
    let error = ClientBuilder::from(options)
        .build()
        .await
        .expect_err("not TLS");
    println!("plain TCP to the TLS port: {error}");
    assert!(started.elapsed() < AT_ONCE, "{:?}", started.elapsed());
    assert!(error.to_string().contains("pulsar+ssl://"), "{error}");

    // "localhost" is in the certificate, as is 127.0.0.1.
    if secure.address().starts_with("127.0.0.1:") {
        let url = secure.service_url.replace("127.0.0.1", "localhost");
        let options = ConnectOptions::new(&url)
            .expect("valid")
            .tls_ca_file(&secure.ca)
            .auth_token_file(&secure.token_file);
        ClientBuilder::from(options)
            .build()
            .await
            .expect("localhost is a name of the certificate");
    }
}

/// Tokens for [`ROLE`] that expire `lifetime` after they are made, counted.
struct Expiring {
    key: Vec<u8>,
    lifetime: u64,
    made: AtomicU64,
    /// Always hand out the first token (which then expires): the broker must refuse it.
    stale: Option<String>,
}

#[async_trait]
impl TokenProvider for Expiring {
    async fn token(&self) -> Result<String, Error> {
        self.made.fetch_add(1, Ordering::Relaxed);
        if let Some(stale) = &self.stale {
            return Ok(stale.clone());
        }
        Ok(hs256(&self.key, ROLE, Some(now_secs() + self.lifetime)))
    }
}

#[tokio::test]
async fn expiring_tokens_are_renewed_when_the_broker_challenges() {
    let Some(secure) = secure() else { return };
    let Some(key) = &secure.secret_key else {
        eprintln!("PULSAR_SECURE_SECRET_KEY is not set; skipping");
        return;
    };
    let key = std::fs::read(key).expect("the secret key");
    let provider = Arc::new(Expiring {
        key: key.clone(),
        lifetime: 2,
        made: AtomicU64::new(0),
        stale: None,
    });
    let client = ClientBuilder::from(secure.options().auth_token_provider(Arc::clone(&provider)))
        .build()
        .await
        .expect("connected with a token that lives 2 s");
    let topic = unique_topic("refresh");
    let consumer = Consumer::builder(&client, &topic, "sub")
        .options(
            integration_tests::real_pulsar::consumer_options()
                .initial_position(InitialPosition::Earliest),
        )
        .build()
        .await
        .expect("subscribed");
    let producer = Producer::builder(&client, &topic)
        .no_batching()
        .build()
        .await
        .expect("producer created");
    // Work on for 8 s, well past several expiries, one message every 250 ms.
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(8) {
        producer
            .send(OutgoingMessage::new(format!("refresh-{sent}")))
            .await
            .unwrap_or_else(|e| panic!("send {sent} after {:?}: {e}", started.elapsed()));
        let message = tokio::time::timeout(PATIENCE, consumer.receive())
            .await
            .expect("in time")
            .expect("received");
        assert_eq!(
            message.payload().as_ref(),
            format!("refresh-{sent}").as_bytes()
        );
        consumer.ack(&message).await.expect("acked");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let connection = client.lookup(&topic).await.expect("the same connection");
    let challenges = connection.auth_challenges();
    let made = provider.made.load(Ordering::Relaxed);
    println!("{sent} messages in 8 s; {challenges} AUTH_CHALLENGEs answered; {made} tokens made");
    assert!(challenges >= 2, "{challenges} challenges");
    assert!(
        made > challenges,
        "{made} tokens for {challenges} challenges"
    );
    producer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("producer closed");
    consumer
        .close(pulsar_wire::DEFAULT_CLOSE_DEADLINE)
        .await
        .expect("consumer closed");

    // A provider that keeps answering with the expired token: the broker refuses it and
    // what is pending fails with the authentication error, not a timeout.
    let stale = hs256(&key, ROLE, Some(now_secs() + 2));
    let provider = Arc::new(Expiring {
        key,
        lifetime: 2,
        made: AtomicU64::new(0),
        stale: Some(stale),
    });
    let client = ClientBuilder::from(secure.options().auth_token_provider(provider))
        .build()
        .await
        .expect("connected while the token is valid");
    let connection = client.service_connection().await.expect("connected");
    let started = Instant::now();
    let error = loop {
        match connection.partitions(&topic).await {
            Ok(_) if started.elapsed() < PATIENCE => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(_) => panic!("the expired token was never refused"),
            Err(error) => break error,
        }
    };
    println!("stale token refused after {:?}: {error}", started.elapsed());
    assert!(
        matches!(
            error,
            Error::Authentication {
                token_sent: true,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A JWT signed with HMAC-SHA256, as `bin/pulsar tokens create --secret-key` makes them:
/// subject `sub`, expiring at `exp` (seconds since the epoch) when given.
fn hs256(key: &[u8], sub: &str, exp: Option<u64>) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256"}"#);
    let claims = match exp {
        Some(exp) => serde_json::json!({ "sub": sub, "exp": exp }),
        None => serde_json::json!({ "sub": sub }),
    };
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        signed.as_bytes(),
    );
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}
