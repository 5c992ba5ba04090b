//! What the tests, the examples and the benchmarks share around the brokers.
//!
//! - [`pulsar_admin`]: the Pulsar admin REST calls the real-broker suites and examples need
//!   (topic creation, partitions, per-topic `maxUnackedMessagesOnConsumer`, topic stats, bundle
//!   unloads), over HTTP or HTTPS.
//! - [`txn_steady`]: a steady stream with aborted transactions on one Shared subscription, with
//!   one or more consumers, the shape behind `tests/tests/pulsar_real.rs` and the
//!   `pulsar_txn_steady` example.
//! - [`work_queue`]: a plain Shared work queue whose handlers hold each message for a while, and
//!   whether a held message is handed to another consumer (the `pulsar_work_queue` example).
//! - [`cpu`]: this process's and its children's CPU time, for load examples and tests that
//!   bound a client's work.
//!
//! It is not published: it exists so that examples need not depend on the test crate.

pub mod cpu;
pub mod pulsar_admin;
pub mod txn_steady;
pub mod work_queue;
