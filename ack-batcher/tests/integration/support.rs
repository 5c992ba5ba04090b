//! A scripted transport that records every flush call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ack_batcher::{Flush, FlushResult, ItemReply, Retryable};
use parking_lot::Mutex;
use tokio::time::Instant;

/// A transport failure, retryable or not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("test failure ({})", if *retryable { "retryable" } else { "terminal" })]
pub(crate) struct Failure {
    pub(crate) retryable: bool,
}

impl Retryable for Failure {
    fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// One recorded flush call.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) key: String,
    pub(crate) items: Vec<u32>,
    pub(crate) at: Instant,
}

type Answer = dyn Fn(&str, &[u32], u32) -> FlushResult<u32, Failure> + Send + Sync;

/// What the transport does; shared with the test so it can inspect calls.
pub(crate) struct Script {
    pub(crate) calls: Mutex<Vec<Call>>,
    /// How long each flush takes.
    pub(crate) delay: Mutex<Duration>,
    /// Called with the key, the items and how many times this batch's first item was seen
    /// before (0 on its first attempt).
    answer: Box<Answer>,
    seen: Mutex<HashMap<u32, u32>>,
}

impl Script {
    pub(crate) fn new(
        answer: impl Fn(&str, &[u32], u32) -> FlushResult<u32, Failure> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            delay: Mutex::new(Duration::ZERO),
            answer: Box::new(answer),
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// Succeeds every item with its id times ten.
    pub(crate) fn ok() -> Arc<Self> {
        Self::new(|_, items, _| Ok(items.iter().map(|i| ItemReply::Ok(i * 10)).collect()))
    }

    pub(crate) fn with_delay(self: Arc<Self>, delay: Duration) -> Arc<Self> {
        *self.delay.lock() = delay;
        self
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    pub(crate) fn sizes(&self) -> Vec<usize> {
        self.calls.lock().iter().map(|c| c.items.len()).collect()
    }
}

/// The [`Flush`] implementation around a shared [`Script`].
pub(crate) struct Transport(pub(crate) Arc<Script>);

impl Flush<String, u32> for Transport {
    type Output = u32;
    type Error = Failure;

    async fn flush(&self, key: &String, items: &[u32]) -> FlushResult<u32, Failure> {
        let script = &self.0;
        script.calls.lock().push(Call {
            key: key.clone(),
            items: items.to_vec(),
            at: Instant::now(),
        });
        let attempt = {
            let mut seen = script.seen.lock();
            let count = seen.entry(items[0]).or_insert(0);
            *count += 1;
            *count - 1
        };
        let delay = *script.delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        (script.answer)(key, items, attempt)
    }
}

pub(crate) fn key(name: &str) -> String {
    name.to_owned()
}
