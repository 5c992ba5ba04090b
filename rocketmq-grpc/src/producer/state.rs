//! The state shared by the producer and its background tasks.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use ack_batcher::RetryAccount;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::checker::CheckerSlot;
use super::policy::SendRetryPolicy;
use super::routes::Routes;
use crate::Session;

/// What the producer's handle and its tasks share.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) session: Arc<Session>,
    pub(super) routes: Routes,
    pub(super) next: AtomicUsize,
    pub(super) max_body: Mutex<usize>,
    pub(super) retry_window: Mutex<Duration>,
    /// Attempts fixed by the application (kept when the proxy announces its policy).
    pub(super) max_attempts: Mutex<Option<u32>>,
    /// The policy in force: the default, then what the proxy announced.
    pub(super) policy: Mutex<SendRetryPolicy>,
    /// Topics announced in the settings.
    pub(super) topics: Mutex<BTreeSet<String>>,
    pub(super) topics_changed: Notify,
    /// Woken on every settings answer.
    pub(super) settled: Notify,
    pub(super) settings_answers: AtomicU64,
    pub(super) started: AtomicBool,
    pub(super) stop: CancellationToken,
    /// Send retries keep to a retry budget (ack-batcher's rule: a share of recent first
    /// attempts plus a floor), so that an outage cannot multiply the requests.
    pub(super) budget: Mutex<Arc<RetryAccount>>,
    /// Retries over the budget wait for their next back-off or for this: woken when a send
    /// succeeds while some wait (the proxy answers again, so they go at once).
    pub(super) answered: Notify,
    pub(super) deferred: AtomicUsize,
    /// Retries the budget deferred, for [`Producer::retries_deferred`].
    pub(super) retries_deferred: AtomicU64,
    /// `SendMessage` requests made, retries included, for [`Producer::send_attempts`].
    pub(super) attempts: AtomicU64,
    /// Decides transactions left open, when the proxy asks.
    pub(super) checker: CheckerSlot,
    /// Whether [`Producer::close`](super::Producer::close) was called, and the sends in
    /// flight.
    pub(super) closing: Mutex<Closing>,
    /// Woken when the last send in flight ends.
    pub(super) idle: Notify,
    /// Cancelled when `close` abandons the sends still in flight.
    pub(super) abandon: CancellationToken,
}

impl Inner {
    /// [`Error::Closed`] once the producer was closed.
    pub(super) fn check_open(&self) -> Result<(), crate::Error> {
        if self.closing.lock().closed {
            return Err(crate::Error::Closed("the producer"));
        }
        Ok(())
    }
}

/// The producer's sends in flight and whether it is closed.
#[derive(Debug, Default)]
pub(super) struct Closing {
    /// `close` was called: no send starts any more.
    pub(super) closed: bool,
    /// Sends (and batches) started and not yet ended.
    pub(super) in_flight: usize,
    /// `close` gave up waiting: every send still in flight ends with `Error::Closed`.
    pub(super) abandoned: bool,
}
