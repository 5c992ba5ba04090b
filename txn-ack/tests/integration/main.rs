//! Integration tests of txn-ack against the broker model (feature `model`).
//!
//! - [`golden`]: the wire words of the reference's worked examples and across word boundaries.
//! - [`stall`]: the Go v0.21.0 stall (apache/pulsar-client-go#1534) reproduced with a legacy
//!   builder, and gone with this crate's.
//! - [`conflicts`]: the pending-ack conflict rules, and that this crate's builder never hits
//!   them.
//! - [`rules`]: the model's accounting rules one by one (§5, §6, §7 of the reference).
//! - [`properties`]: random correct clients keep the count exact; random garbage never panics.
//! - [`shared`]: several consumers of one subscription: whose accounting each step changes, and
//!   ordinary acks through any consumer drain to zero.
//! - [`bad_input`]: clear errors for bad sizes, indexes and words; idempotent ordinary acks.
//! - [`no_alloc`]: building acks and updating the trackers for batches of up to 64 messages
//!   does not allocate (counted by this binary's global allocator).
//!
//! [`legacy`] holds the broken client builders; they exist only here, to prove the checks can
//! fail.

mod bad_input;
mod conflicts;
mod golden;
mod legacy;
mod no_alloc;
mod properties;
mod rules;
mod shared;
mod stall;
mod support;

#[global_allocator]
static ALLOCATOR: no_alloc::CountingAllocator = no_alloc::CountingAllocator;
