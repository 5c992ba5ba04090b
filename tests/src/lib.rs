//! Cross-crate integration tests. The real-broker suites live in `tests/` and run only when
//! the broker scripts' address variables are set (`ROCKETMQ_ENDPOINT`; `PULSAR_SERVICE_URL`
//! and `PULSAR_ADMIN_URL`); without them each test returns at once, so `cargo test
//! --workspace` stays hermetic.
//!
//! The Pulsar admin REST client, the steady transactional stream and CPU time are in the
//! `broker-tools` crate beside this one, which the examples use too. [`outage`]: a
//! steady stream through broker faults (unloads, restarts), counted by payload; [`peer_stream`]:
//! the official Python client streaming beside it through the same faults; [`rocketmq_stream`]:
//! the same for RocketMQ, through proxy restarts and broker stops; [`real_pulsar`]: the real
//! broker's client, admin API and a fresh topic, and the official clients' peers.

pub mod conformance;
pub mod outage;
pub mod peer_stream;
pub mod real_pulsar;
pub mod real_rocketmq;
pub mod rocketmq_stream;
