//! Where time comes from when a caller does not pass it in.
//!
//! The gate and the router take `Instant`s as arguments, so a simulator drives them with
//! virtual time. Only hooks that cannot carry a time (an interceptor called by a client) read
//! a [`Clock`].

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A source of the current instant.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock (`Instant::now`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests, simulators).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Instant) -> ManualClock {
        ManualClock {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        // An instant beyond the platform's range is not reachable: stay at the last one.
        if let Some(next) = now.checked_add(by) {
            *now = next;
        }
    }

    /// Sets the clock to `to` (which may be earlier: the gate copes with time going backwards
    /// by treating it as no time passed).
    pub fn set(&self, to: Instant) {
        *self.now.lock() = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

impl<T: Clock + ?Sized> Clock for std::sync::Arc<T> {
    fn now(&self) -> Instant {
        (**self).now()
    }
}

impl<T: Clock + ?Sized> Clock for &T {
    fn now(&self) -> Instant {
        (**self).now()
    }
}
