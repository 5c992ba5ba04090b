//! Integration tests of the Pulsar adapter against the embedded broker emulator.

mod acks;
mod bad_input;
mod chunks;
mod compression;
mod dead_letter;
mod delayed;
mod faults;
mod growth;
mod key_shared;
mod link_state;
mod outages;
mod pending;
mod pipelining;
mod priority;
mod reader;
mod receiving;
mod redelivery;
mod restarts;
mod schemas;
mod scripted;
mod shared;
mod support;
mod txn;
mod unmodelled;
