//! A small client of the Pulsar admin REST API (`PULSAR_ADMIN_URL`), for the real-broker
//! suite: create a topic, set its `maxUnackedMessagesOnConsumer` and wait until the broker
//! reports it, and read the topic stats that the suite asserts on (per consumer
//! `unackedMessages` and `blockedConsumerOnUnackedMsgs`, per subscription `msgBacklog`).
//!
//! The transport is [`reqwest`] (HTTP/1.1, rustls on `ring`). A broker with TLS and token
//! authentication (`scripts/brokers/pulsar start-secure`) is reached over HTTPS with its CA
//! as the only root and a bearer token ([`PulsarAdmin::secure`]).

use std::collections::BTreeMap;
use std::error::Error as _;
use std::fmt;
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use reqwest::{Client, Method, Url};
use serde_json::Value;

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How many redirects one request follows.
const MAX_REDIRECTS: usize = 5;

/// The admin API of one broker.
#[derive(Clone)]
pub struct PulsarAdmin {
    /// `scheme://host:port/`.
    base: Url,
    /// HTTP/1.1, no proxy, no redirects of its own (see [`PulsarAdmin::request`]); over TLS
    /// it trusts only the broker's CA.
    client: Client,
    /// Whether the client has the broker's CA (only then may a redirect go to `https://`).
    tls: bool,
    /// Sent as `Authorization: Bearer <token>`.
    token: Option<String>,
}

impl fmt::Debug for PulsarAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PulsarAdmin")
            .field("base", &self.base.as_str())
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `scheme://host:port` (an optional trailing slash) → the URL `scheme://host:port/`.
fn admin_base(admin_url: &str, scheme: &str) -> Result<Url, AdminError> {
    let address = admin_url
        .strip_prefix(scheme)
        .ok_or_else(|| AdminError(format!("{admin_url:?} is not an {scheme} URL")))?
        .trim_end_matches('/');
    if address.is_empty() || address.contains('/') || !address.contains(':') {
        return Err(AdminError(format!(
            "{admin_url:?} is not {scheme}host:port"
        )));
    }
    Url::parse(&format!("{scheme}{address}/"))
        .map_err(|e| AdminError(format!("{admin_url:?} is not {scheme}host:port: {e}")))
}

/// The HTTP client: `roots` are the only certificates it trusts (none: plain HTTP only).
/// Redirects are followed by [`PulsarAdmin::request`] itself, which keeps the method, the
/// body and the token on the way to another broker (reqwest drops the token there); no
/// connection is kept between requests, as a broker that restarts would leave a dead one in
/// the pool.
fn http_client(roots: Vec<reqwest::Certificate>) -> Result<Client, AdminError> {
    let builder = Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(0)
        .tls_built_in_root_certs(false);
    roots
        .into_iter()
        .fold(builder, reqwest::ClientBuilder::add_root_certificate)
        .build()
        .map_err(|e| AdminError(format!("the HTTP client: {}", chain(&e))))
}

/// An error and its causes, `: `-separated (reqwest's own message names only the step).
fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// What a request failed with.
#[derive(Debug, Clone)]
pub struct AdminError(pub String);

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AdminError {}

/// The REST path of a persistent topic: `persistent://t/ns/x` (or `t/ns/x`) becomes
/// `/admin/v2/persistent/t/ns/x`.
pub fn topic_path(topic: &str) -> String {
    let name = topic.strip_prefix("persistent://").unwrap_or(topic);
    format!("/admin/v2/persistent/{name}")
}

impl PulsarAdmin {
    /// The admin API at `admin_url` (`http://host:port`).
    ///
    /// # Errors
    /// When the URL is not `http://host:port`.
    pub fn new(admin_url: &str) -> Result<Self, AdminError> {
        Ok(Self {
            base: admin_base(admin_url, "http://")?,
            client: http_client(Vec::new())?,
            tls: false,
            token: None,
        })
    }

    /// The admin API at `admin_url` (`https://host:port`), trusting only the CA certificates
    /// in the PEM file `ca_file` and authenticating with `token`.
    ///
    /// # Errors
    /// When the URL is not `https://host:port` or the CA file cannot be read or holds no
    /// certificate.
    pub fn secure(admin_url: &str, ca_file: &str, token: &str) -> Result<Self, AdminError> {
        let base = admin_base(admin_url, "https://")?;
        let pem = std::fs::read(ca_file).map_err(|e| AdminError(format!("{ca_file}: {e}")))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| AdminError(format!("{ca_file}: {}", chain(&e))))?;
        if roots.is_empty() {
            return Err(AdminError(format!("{ca_file}: no PEM certificate")));
        }
        Ok(Self {
            base,
            client: http_client(roots)?,
            tls: true,
            token: Some(token.trim().to_owned()),
        })
    }

    /// One request to `path` (with its query, if any); any status is an answer, except a
    /// redirect (301, 302, 307, 308 with a `Location`), which is followed (up to 5 times)
    /// with the same method, body and token: in a cluster a broker that does not own a topic
    /// redirects its admin requests to the owner.
    ///
    /// # Errors
    /// When the broker cannot be reached, does not answer in time, or answers garbage.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response, AdminError> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|e| AdminError(format!("{method:?} {path}: {e}")))?;
        let mut url = self
            .base
            .join(path)
            .map_err(|e| AdminError(format!("{method} {path}: not a path: {e}")))?;
        for _ in 0..=MAX_REDIRECTS {
            let (response, location) = self.request_once(&method, &url, body).await?;
            let Some(location) =
                location.filter(|_| [301, 302, 307, 308].contains(&response.status))
            else {
                return Ok(response);
            };
            let next = url.join(&location).map_err(|e| {
                AdminError(format!("{method} {url}: redirected to {location:?}: {e}"))
            })?;
            match next.scheme() {
                "http" => {}
                "https" if self.tls => {}
                "https" => {
                    return Err(AdminError(format!(
                        "{method} {url}: redirected to {location:?} without a CA"
                    )));
                }
                _ => {
                    return Err(AdminError(format!(
                        "{method} {url}: redirected to {location:?}"
                    )));
                }
            }
            url = next;
        }
        Err(AdminError(format!(
            "{method} {url}: more than {MAX_REDIRECTS} redirects"
        )))
    }

    /// One request to `url`; the answer and its `Location` header.
    async fn request_once(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&str>,
    ) -> Result<(Response, Option<String>), AdminError> {
        let mut request = self
            .client
            .request(method.clone(), url.clone())
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, "application/json")
            .body(body.unwrap_or_default().to_owned());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let failed = |e: reqwest::Error| {
            // The URL leads the message already.
            let e = e.without_url();
            if e.is_timeout() {
                AdminError(format!(
                    "{method} {url}: no answer within {REQUEST_TIMEOUT:?}"
                ))
            } else {
                AdminError(format!("{method} {url}: {}", chain(&e)))
            }
        };
        let response = request.send().await.map_err(failed)?;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(LOCATION)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        let body = response.text().await.map_err(failed)?;
        Ok((Response { status, body }, location))
    }

    /// A request that must succeed (2xx).
    async fn expect_success(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response, AdminError> {
        let response = self.request(method, path, body).await?;
        if response.is_success() {
            Ok(response)
        } else {
            Err(self.refused(method, path, &response))
        }
    }

    /// The error of an answer that is not the one expected: the request, its URL, the status
    /// and the body (the status's name when the body is empty, as with a 401).
    fn refused(&self, method: &str, path: &str, response: &Response) -> AdminError {
        let body = response.body.trim();
        let body = if body.is_empty() {
            reqwest::StatusCode::from_u16(response.status)
                .ok()
                .and_then(|status| status.canonical_reason())
                .unwrap_or_default()
        } else {
            body
        };
        AdminError(format!(
            "{method} {}{path}: {} {body}",
            self.base.as_str().trim_end_matches('/'),
            response.status,
        ))
    }

    /// Creates a partitioned topic with `partitions` partitions
    /// (`PUT .../partitions`).
    ///
    /// # Errors
    /// When the broker refuses (409 when the topic exists).
    pub async fn create_partitioned_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<(), AdminError> {
        let path = format!("{}/partitions", topic_path(topic));
        self.expect_success("PUT", &path, Some(&partitions.to_string()))
            .await
            .map(drop)
    }

    /// Raises a partitioned topic's partition count (`POST .../partitions`, as
    /// `pulsar-admin topics update-partitioned-topic`); the broker creates the topic's
    /// subscriptions on the new partitions.
    ///
    /// # Errors
    /// When the broker refuses (for example a count that is not larger).
    pub async fn update_partitions(&self, topic: &str, partitions: u32) -> Result<(), AdminError> {
        let path = format!("{}/partitions", topic_path(topic));
        self.expect_success("POST", &path, Some(&partitions.to_string()))
            .await
            .map(drop)
    }

    /// Unloads a topic (`PUT .../unload`, as `pulsar-admin topics unload`): the broker closes
    /// its producers and consumers (`CLOSE_PRODUCER`, `CLOSE_CONSUMER`) and loads it again on
    /// the next lookup.
    ///
    /// # Errors
    /// When the broker refuses.
    pub async fn unload(&self, topic: &str) -> Result<(), AdminError> {
        let path = format!("{}/unload", topic_path(topic));
        self.expect_success("PUT", &path, None).await.map(drop)
    }

    /// Creates a non-partitioned topic (one that exists already is fine).
    ///
    /// # Errors
    /// When the broker refuses.
    pub async fn create_topic(&self, topic: &str) -> Result<(), AdminError> {
        let path = topic_path(topic);
        let response = self.request("PUT", &path, None).await?;
        if response.is_success() || response.status == 409 {
            Ok(())
        } else {
            Err(self.refused("PUT", &path, &response))
        }
    }

    /// The topic's own `maxUnackedMessagesOnConsumer` policy, if it has one.
    ///
    /// # Errors
    /// When the broker refuses.
    pub async fn max_unacked_on_consumer(&self, topic: &str) -> Result<Option<u32>, AdminError> {
        let path = format!("{}/maxUnackedMessagesOnConsumer", topic_path(topic));
        let response = self.expect_success("GET", &path, None).await?;
        Ok(response.body.trim().parse().ok())
    }

    /// Sets the topic's `maxUnackedMessagesOnConsumer` and waits (up to `limit`) until the
    /// broker reports it: topic policies travel through a system topic, so the first writes
    /// after the namespace's policies service starts may be refused and a write is read back
    /// only after a moment.
    ///
    /// # Errors
    /// When the broker does not report the value in time.
    pub async fn set_max_unacked_on_consumer(
        &self,
        topic: &str,
        max: u32,
        limit: Duration,
    ) -> Result<(), AdminError> {
        let path = format!("{}/maxUnackedMessagesOnConsumer", topic_path(topic));
        let deadline = Instant::now() + limit;
        let mut written = false;
        let mut last = String::new();
        loop {
            if !written {
                match self
                    .expect_success("POST", &path, Some(&max.to_string()))
                    .await
                {
                    Ok(_) => written = true,
                    Err(error) => last = error.0,
                }
            }
            if written {
                match self.max_unacked_on_consumer(topic).await {
                    Ok(Some(value)) if value == max => return Ok(()),
                    Ok(value) => last = format!("the broker reports {value:?}"),
                    Err(error) => last = error.0,
                }
            }
            if Instant::now() >= deadline {
                return Err(AdminError(format!(
                    "maxUnackedMessagesOnConsumer={max} on {topic} not reported within {limit:?}: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Turns the topic's message deduplication on or off (`POST .../deduplicationEnabled`) and
    /// waits (up to `limit`) until the broker reports it, as
    /// [`PulsarAdmin::set_max_unacked_on_consumer`] does. With it on, the broker drops a
    /// message whose sequence id is not above the last one it stored from that producer.
    ///
    /// # Errors
    /// When the broker does not report the value in time.
    pub async fn set_deduplication(
        &self,
        topic: &str,
        enabled: bool,
        limit: Duration,
    ) -> Result<(), AdminError> {
        let path = format!("{}/deduplicationEnabled", topic_path(topic));
        let deadline = Instant::now() + limit;
        let mut written = false;
        let mut last = String::new();
        loop {
            if !written {
                match self
                    .expect_success("POST", &path, Some(&enabled.to_string()))
                    .await
                {
                    Ok(_) => written = true,
                    Err(error) => last = error.0,
                }
            }
            if written {
                match self.expect_success("GET", &path, None).await {
                    Ok(response) if response.body.trim() == enabled.to_string() => return Ok(()),
                    Ok(response) => {
                        last = format!("the broker reports {:?}", response.body.trim());
                    }
                    Err(error) => last = error.0,
                }
            }
            if Instant::now() >= deadline {
                return Err(AdminError(format!(
                    "deduplicationEnabled={enabled} on {topic} not reported within {limit:?}: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The topic's stats (`GET …/stats?getPreciseBacklog=true`).
    ///
    /// # Errors
    /// When the broker refuses or the JSON is not what the stats look like.
    pub async fn topic_stats(&self, topic: &str) -> Result<TopicStats, AdminError> {
        let path = format!("{}/stats?getPreciseBacklog=true", topic_path(topic));
        let response = self.expect_success("GET", &path, None).await?;
        let json: Value = serde_json::from_str(&response.body)
            .map_err(|e| AdminError(format!("GET {path}: {e}: {}", response.body)))?;
        TopicStats::from_json(json).map_err(|e| AdminError(format!("GET {path}: {e}")))
    }

    /// Polls the topic's stats until `done` holds for them, for up to `limit`; returns them.
    ///
    /// # Errors
    /// The last stats (or the last error) when `done` did not hold in time.
    pub async fn wait_for_stats(
        &self,
        topic: &str,
        limit: Duration,
        mut done: impl FnMut(&TopicStats) -> bool,
    ) -> Result<TopicStats, AdminError> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.topic_stats(topic).await {
                Ok(stats) if done(&stats) => return Ok(stats),
                Ok(stats) => format!("{stats:#?}"),
                Err(error) => error.0,
            };
            if Instant::now() >= deadline {
                return Err(AdminError(format!(
                    "{topic}: the stats did not get there within {limit:?}; last: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The parts of `TopicStatsImpl` the suite reads.
#[derive(Debug, Clone)]
pub struct TopicStats {
    /// `msgInCounter`.
    pub msg_in_counter: i64,
    /// `subscriptions`, by name.
    pub subscriptions: BTreeMap<String, SubscriptionStats>,
    /// The whole answer.
    pub json: Value,
}

/// The parts of `SubscriptionStatsImpl` the suite reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// `type` (`Shared`, `Exclusive`, …).
    pub sub_type: String,
    /// `msgBacklog`: entries (not messages) not yet acknowledged.
    pub msg_backlog: i64,
    /// `unackedMessages`.
    pub unacked_messages: i64,
    /// `blockedSubscriptionOnUnackedMsgs`.
    pub blocked_subscription_on_unacked_msgs: bool,
    /// `consumers`.
    pub consumers: Vec<ConsumerStats>,
}

/// The parts of `ConsumerStatsImpl` the suite reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// `consumerName`.
    pub consumer_name: String,
    /// `unackedMessages`.
    pub unacked_messages: i64,
    /// `blockedConsumerOnUnackedMsgs`.
    pub blocked_consumer_on_unacked_msgs: bool,
    /// `availablePermits`.
    pub available_permits: i64,
    /// `msgOutCounter`.
    pub msg_out_counter: i64,
}

fn int(json: &Value, field: &str) -> Result<i64, String> {
    json.get(field)
        .and_then(Value::as_i64)
        .ok_or_else(|| format!("no integer {field:?}"))
}

fn flag(json: &Value, field: &str) -> Result<bool, String> {
    json.get(field)
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("no boolean {field:?}"))
}

impl TopicStats {
    /// Reads the stats out of the broker's JSON.
    ///
    /// # Errors
    /// When a field the suite needs is missing or has another type.
    pub fn from_json(json: Value) -> Result<Self, String> {
        let mut subscriptions = BTreeMap::new();
        if let Some(map) = json.get("subscriptions").and_then(Value::as_object) {
            for (name, sub) in map {
                let consumers = sub
                    .get("consumers")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|c| {
                        Ok(ConsumerStats {
                            consumer_name: c
                                .get("consumerName")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            unacked_messages: int(c, "unackedMessages")?,
                            blocked_consumer_on_unacked_msgs: flag(
                                c,
                                "blockedConsumerOnUnackedMsgs",
                            )?,
                            available_permits: int(c, "availablePermits")?,
                            msg_out_counter: int(c, "msgOutCounter")?,
                        })
                    })
                    .collect::<Result<_, String>>()
                    .map_err(|e| format!("subscription {name}, a consumer: {e}"))?;
                let stats = SubscriptionStats {
                    sub_type: sub
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    msg_backlog: int(sub, "msgBacklog")
                        .map_err(|e| format!("subscription {name}: {e}"))?,
                    unacked_messages: int(sub, "unackedMessages")
                        .map_err(|e| format!("subscription {name}: {e}"))?,
                    blocked_subscription_on_unacked_msgs: flag(
                        sub,
                        "blockedSubscriptionOnUnackedMsgs",
                    )
                    .map_err(|e| format!("subscription {name}: {e}"))?,
                    consumers,
                };
                subscriptions.insert(name.clone(), stats);
            }
        }
        Ok(Self {
            msg_in_counter: json
                .get("msgInCounter")
                .and_then(Value::as_i64)
                .unwrap_or_default(),
            subscriptions,
            json,
        })
    }

    /// One subscription's stats.
    pub fn subscription(&self, name: &str) -> Option<&SubscriptionStats> {
        self.subscriptions.get(name)
    }
}

impl SubscriptionStats {
    /// Every consumer has no unacknowledged messages and is not blocked, the subscription
    /// is not blocked, and its backlog is empty.
    pub fn is_drained(&self) -> bool {
        self.msg_backlog == 0
            && self.unacked_messages == 0
            && !self.blocked_subscription_on_unacked_msgs
            && self
                .consumers
                .iter()
                .all(|c| c.unacked_messages == 0 && !c.blocked_consumer_on_unacked_msgs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths() {
        assert!(PulsarAdmin::new("http://127.0.0.1:8080").is_ok());
        assert!(PulsarAdmin::new("http://127.0.0.1:8080/").is_ok());
        assert!(PulsarAdmin::new("https://127.0.0.1:8080").is_err());
        assert!(PulsarAdmin::secure("http://127.0.0.1:8443", "/nowhere", "t").is_err());
        let missing = PulsarAdmin::secure("https://127.0.0.1:8443", "/nowhere/ca.pem", "t");
        assert!(missing.unwrap_err().0.contains("/nowhere/ca.pem"));
        assert!(PulsarAdmin::new("http://127.0.0.1:8080/admin").is_err());
        assert_eq!(
            topic_path("persistent://public/default/t"),
            "/admin/v2/persistent/public/default/t"
        );
        assert_eq!(
            topic_path("public/default/t"),
            "/admin/v2/persistent/public/default/t"
        );
    }

    #[tokio::test]
    async fn a_failed_request_names_its_url() {
        // Nothing listens on port 1.
        let admin = PulsarAdmin::new("http://127.0.0.1:1").unwrap();
        let error = admin
            .unload("persistent://public/default/t")
            .await
            .unwrap_err();
        assert!(
            error.0.starts_with(
                "PUT http://127.0.0.1:1/admin/v2/persistent/public/default/t/unload: "
            ),
            "{error}"
        );
        let error = admin.request("NOT A METHOD", "/", None).await.unwrap_err();
        assert!(error.0.contains("NOT A METHOD"), "{error}");
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let file = std::env::temp_dir().join(format!("no-ca-{}.pem", std::process::id()));
        std::fs::write(&file, "not a certificate\n").unwrap();
        let path = file.to_str().unwrap();
        let error = PulsarAdmin::secure("https://127.0.0.1:8443", path, "t").unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert!(error.0.contains(path), "{error}");
    }

    #[test]
    fn stats_are_read_from_the_broker_json() {
        // Trimmed from a 4.0.x broker's answer.
        let json = serde_json::json!({
            "msgInCounter": 40,
            "publishers": [],
            "subscriptions": {
                "sub": {
                    "msgBacklog": 2, "msgBacklogNoDelayed": 2, "unackedMessages": 21,
                    "blockedSubscriptionOnUnackedMsgs": false, "type": "Shared",
                    "consumers": [{
                        "consumerName": "c1", "unackedMessages": 21,
                        "blockedConsumerOnUnackedMsgs": true, "availablePermits": 979,
                        "msgOutCounter": 21
                    }]
                },
                "idle": {
                    "msgBacklog": 0, "unackedMessages": 0,
                    "blockedSubscriptionOnUnackedMsgs": false, "type": "Exclusive",
                    "consumers": []
                }
            }
        });
        let stats = TopicStats::from_json(json).unwrap();
        assert_eq!(stats.msg_in_counter, 40);
        let sub = stats.subscription("sub").unwrap();
        assert_eq!((sub.msg_backlog, sub.unacked_messages), (2, 21));
        assert_eq!(sub.sub_type, "Shared");
        assert!(sub.consumers[0].blocked_consumer_on_unacked_msgs);
        assert_eq!(sub.consumers[0].available_permits, 979);
        assert!(!sub.is_drained());
        assert!(stats.subscription("idle").unwrap().is_drained());

        let broken = serde_json::json!({"subscriptions": {"s": {"msgBacklog": "x"}}});
        assert!(TopicStats::from_json(broken).is_err());
    }
}
