//! The property test: a fault-injecting transport under random operations, on virtual time.
//!
//! Every case builds a paused current-thread runtime, a batcher with random (small) settings
//! and a transport that fails items (retryably or terminally), fails whole batches, answers
//! with too few or too many replies and sleeps inside `flush`. It then runs a random sequence
//! of submits (some with deadlines, some immediate, some from tasks of their own), `flush(key)`,
//! `flush_all` (awaited or left running) and sleeps, and finally `close` with a random timeout,
//! which is sometimes shorter than the transport's delays so that items are abandoned. One case
//! in five drops the batcher instead, which closes it in the background within `drop_timeout`.
//!
//! Everything that happens is written to one event log: the test's own submits, the
//! observer's `before_flush` / `after_flush` / `on_abandoned`, and the transport's calls and
//! returns. [`check_log`](checker::check_log) then checks the log against the items' outcomes:
//!
//! - every accepted item resolves exactly once, to the outcome its last reply implies;
//! - no batch is empty, exceeds `max_items` or mixes keys;
//! - first attempts of a key's non-immediate items keep their submission order within a batch,
//!   and across the key's batches (in transport call order) when `max_in_flight_per_key` is 1,
//!   the only case the batcher promises it for;
//! - the transport's calls, their answers and the observer's views agree one to one, and
//!   retries are decided by the retry policy and wait for its backoff.
//!
//! The run itself checks, after every operation, that the batcher's `pending` gauge equals the
//! number of unresolved tickets (and stays within `max_pending`), that an awaited flush
//! returns only once its key's items were answered, and after `close` that every ticket is
//! already resolved (polled once, no waiting), that `stats().pending` is 0, that the close
//! report and the counters add up, and that a closed batcher hands items back.
//!
//! Cases run in about 2 ms each. The tests in [`checker`] show that the checker catches what
//! it should, and those in [`regressions`] pin down what writing it found.

use std::fmt;

use ack_batcher::Retryable;
use proptest::prelude::*;

use case::case;
use runner::run;

// Defined before the submodules, which use it.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod case;
mod checker;
mod ending;
mod log;
mod regressions;
mod runner;

/// Keys are `0..KEYS`.
const KEYS: u8 = 3;

/// An item id: the number of the submit operation with the key in the low byte.
fn item_id(seq: u64, key: u8) -> u64 {
    (seq << 8) | u64::from(key)
}

fn key_of(id: u64) -> u8 {
    (id & 0xff) as u8
}

/// What a successful item resolves to: its own id and the attempt the transport saw.
type Out = (u64, u32);

/// A transport failure; `call` is the index of the flush call that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fault {
    retryable: bool,
    call: usize,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable {
            "retryable"
        } else {
            "terminal"
        };
        write!(f, "{kind} fault in call {}", self.call)
    }
}

impl std::error::Error for Fault {}

impl Retryable for Fault {
    fn is_retryable(&self) -> bool {
        self.retryable
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    })]

    /// Every item resolves exactly once, batches respect `max_items` and keys, items keep
    /// their order, and close resolves everything, under random faults and operations.
    #[test]
    fn batcher_holds_its_guarantees_under_faults(case in case()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        if let Err(problem) = runtime.block_on(run(case)) {
            return Err(TestCaseError::fail(problem));
        }
    }
}
