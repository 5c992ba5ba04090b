//! Integration tests of the RocketMQ adapter against the embedded proxy emulator.

mod ack_delay;
mod bad_input;
mod batching;
mod dead_letters;
mod delay;
mod faults;
mod priority_lite;
mod producer;
mod recovery;
mod renewal;
mod results;
mod simple;
mod support;
mod transactions;
