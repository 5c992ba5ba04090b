//! A keyed time/size batcher with per-item results.
//!
//! Message-queue clients acknowledge one message per request although their protocols take
//! many entries per request. `ack-batcher` groups items by key, flushes a key's batch on size,
//! on time, before the earliest item deadline, on demand or on close, and still hands every
//! item its own result. It knows nothing of any protocol: a transport implements [`Flush`].
//!
//! What it guarantees:
//! - **Per-item results.** [`Batcher::submit`] resolves to that item's own outcome; the
//!   transport answers per item ([`ItemReply`]) or fails the whole batch, which reaches every
//!   item. [`Matched`] maps a response carrying ids back onto the items.
//! - **Retries without head-of-line blocking.** Retryable failures ([`Retryable`]) and missing
//!   replies are retried after an exponential backoff with jitter ([`RetryPolicy`]; by
//!   default 100 ms doubling up to 10 s, each wait cut by up to half at random), bounded by
//!   attempts and the item's deadline; the retries of one key that fall due together go out
//!   as one batch.
//!   Fresh items and other keys never wait for them.
//! - **A broken transport breaks nothing else.** A panic in [`Flush::flush`] fails that
//!   batch's items ([`Error::Panicked`]); an optional flush timeout turns a hang into missing
//!   replies; [`Batcher::close`] returns within its timeout whatever the transport does.
//! - **Nothing lost.** Every accepted item resolves exactly once. [`Batcher::close`] stops
//!   intake, flushes, waits within a timeout and reports ([`CloseReport`]); dropping the
//!   batcher closes it in the background.
//! - **Bounded memory.** At most `max_pending` items, waiting or rejecting as configured
//!   ([`Backpressure`]); at most `max_in_flight_per_key` batches in flight per key; idle keys
//!   are released.
//! - **Observable.** [`Observer`] sees every item of every batch with its reply;
//!   [`Batcher::stats`] counts batches per [`FlushReason`], sizes, retries and failures.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use ack_batcher::{Batcher, Flush, FlushResult, ItemReply, Retryable};
//!
//! #[derive(Debug, Clone, thiserror::Error)]
//! #[error("server unavailable")]
//! struct Unavailable;
//! impl Retryable for Unavailable {
//!     fn is_retryable(&self) -> bool { true }
//! }
//!
//! /// Acks message ids per topic; odd ids are "unknown" to this toy server.
//! struct AckSink;
//! impl Flush<&'static str, u64> for AckSink {
//!     type Output = ();
//!     type Error = Unavailable;
//!     async fn flush(&self, _topic: &&'static str, ids: &[u64]) -> FlushResult<(), Unavailable> {
//!         Ok(ids.iter().map(|id| if id % 2 == 0 { ItemReply::Ok(()) } else { ItemReply::Missing }).collect())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let batcher = Batcher::builder()
//!     .max_items(100)
//!     .max_delay(Duration::from_millis(20))
//!     .build(AckSink)?;
//!
//! let (a, b) = tokio::join!(batcher.submit("orders", 2), batcher.submit("orders", 3));
//! assert!(a.is_ok());
//! assert!(matches!(b, Err(ack_batcher::Error::Missing { attempts: 3 })));
//!
//! let report = batcher.close(Duration::from_secs(5)).await;
//! assert_eq!(report.abandoned, 0);
//! # Ok(()) }
//! ```
//!
//! The crate's modules form no cycle (`scripts/check-module-cycles` checks it).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: every feature-gated item shows its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::return_self_not_must_use)]

mod backoff;
mod batcher;
mod budget;
mod config;
mod error;
mod flush;
mod match_ids;
mod observe;
mod shared;
mod state;
mod ticket;

pub use backoff::{Backoff, jittered};
pub use batcher::{Batcher, ItemOptions};
pub use budget::{RetryAccount, RetryBudget};
pub use config::{Backpressure, Builder, RetryPolicy};
pub use error::{Error, Retryable};
pub use flush::{Flush, FlushReason, FlushResult, ItemReply};
pub use match_ids::Matched;
pub use observe::{BatchInfo, BatchSizeHistogram, CloseReport, ItemView, Next, Observer, Stats};
pub use ticket::Ticket;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
