//! Integration tests of the RocketMQ adapter against the embedded proxy emulator.

mod ack_delay;
mod bad_input;
mod batching;
mod bodies;
mod concurrency;
mod dead_letters;
mod delay;
mod failover;
mod faults;
mod filters;
mod link_state;
mod lost_arrivals;
mod metrics;
mod priority_gate;
mod priority_lite;
mod priority_topics;
mod producer;
mod recovery;
mod renewal;
mod results;
mod simple;
mod support;
#[cfg(feature = "tls")]
mod tls;
mod transactions;
mod unassigned;
