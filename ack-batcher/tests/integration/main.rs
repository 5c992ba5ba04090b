//! Integration tests of ack-batcher, on virtual time.

mod faults;
mod lifecycle;
mod properties;
mod results;
mod support;
mod triggers;
