//! Batch-size-preserving Pulsar ack sets, ack tracking and transactional acks.
//!
//! A Pulsar entry often holds a batch of messages. Acknowledging them correctly takes four
//! things that clients keep getting wrong:
//! - the **ack set** ([`AckSet`]), Java `BitSet` words where a set bit is a message still
//!   outstanding;
//! - **ordinary acks** ([`AckTracker`]) that accumulate per entry and, when a batch completes,
//!   acknowledge the whole entry *keeping its batch size*;
//! - **transactional acks** ([`txn_ack`], [`TxnAckTracker`]) that carry an *independent* set per
//!   ack and *always* the batch size. A 4.0.x broker decrements a consumer's unacked count by
//!   `batch_size` (or 1 when it is absent) minus the set's cardinality; a client that drops the
//!   batch size leaks `batch_size - 1` per batch until Shared consumers stall, and one that
//!   reuses an accumulated set gets `TransactionConflict`;
//! - **deliveries** ([`Deliveries`]): a 4.0.x broker counts a Shared consumer's unacked
//!   messages per delivery, gives nothing back on abort, and replays an aborted batch to any
//!   consumer of the subscription, with the messages of it an application still holds.
//!   [`Deliveries`] says which messages of a batch the application holds (so that a client
//!   holds back the transactional acks whose abort would replay them), recognises the
//!   duplicates it still gets and measures the drift of the broker's count.
//!
//! Everything here is pure: no I/O, no protocol types. An adapter turns an [`AckId`] into a
//! `MessageIdData`.
//!
//! ```
//! use txn_ack::{AckKind, MessagePosition, TxnAckTracker, TxnId};
//!
//! let txn = TxnId { most_bits: 0, least_bits: 42 };
//! let mut acks = TxnAckTracker::default();
//! // A batch of 3 in entry 7:12, acknowledged inside one transaction.
//! for index in 0..3 {
//!     let at = MessagePosition::in_batch(7, 12, -1, index, 3)?;
//!     let ack = acks.ack(txn, AckKind::Individual, &at)?;
//!     assert_eq!(ack.id.batch_size(), Some(3)); // always there, the last index included
//!     assert_eq!(ack.id.ack_set().map(|s| s.outstanding_count()), Some(2)); // independent
//! }
//! // The same message again would be a TransactionConflict on the broker: refused here.
//! let again = MessagePosition::in_batch(7, 12, -1, 1, 3)?;
//! assert!(acks.ack(txn, AckKind::Individual, &again).is_err());
//! # Ok::<(), txn_ack::Error>(())
//! ```
//!
//! # Feature flags
//! - `model` (off by default): the `model` module, a pure, deterministic model of a 4.0.x
//!   broker's side of a Shared subscription, with one consumer or several (whose acks,
//!   redelivery requests and replays interact as on the broker): dispatch with pending acks
//!   and batch sizes, the unacked count with blocking at the limit and unblocking at half of it, ordinary
//!   and transactional acks as the broker reads them from the wire, and the pending-ack
//!   conflict rules with commit and abort. It is this crate's test oracle and the accounting
//!   core of a broker emulator. It adds no dependencies.
//!
//! The crate's modules form no cycle (`scripts/check-module-cycles` checks it).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod ack_set;
mod deliveries;
mod error;
mod ids;
mod position;
mod recent;
mod tracker;
mod txn;

#[cfg(feature = "model")]
pub mod model;

pub use ack_set::AckSet;
pub use deliveries::{Deliveries, Delivery, DuplicateOf};
pub use error::{Error, MAX_BATCH_SIZE};
pub use ids::{EntryId, TxnId};
pub use position::{AckId, AckKind, MessagePosition};
pub use recent::Recall;
pub use tracker::{Ack, AckTracker, PartialBatches};
pub use txn::{TxnAck, TxnAckTracker, txn_ack};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
