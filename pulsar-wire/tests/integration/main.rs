//! Integration tests of the Pulsar adapter against the embedded broker emulator.

mod acks;
mod bad_input;
mod compression;
mod faults;
mod priority;
mod scripted;
mod support;
mod txn;
mod unmodelled;
