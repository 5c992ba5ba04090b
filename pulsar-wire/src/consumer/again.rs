//! [`Again`]: messages the consumer hands to the application a second time itself, instead of
//! asking the broker to redeliver them (which, on a Shared subscription, would send the rest
//! of their batch to another consumer too).

use std::collections::VecDeque;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Message;

/// The messages to hand over again, in the order they were given back; unbounded, since it
/// only ever holds messages the application already had.
#[derive(Debug, Default)]
pub(crate) struct Again {
    queue: Mutex<VecDeque<Message>>,
    ready: Notify,
}

impl Again {
    /// Queues `message` with its redelivery count one higher, and wakes a waiting receive.
    pub(crate) fn push(&self, message: Message) {
        self.queue.lock().push_back(message.delivered_again());
        self.ready.notify_one();
    }

    /// Queues a copy the broker sent again (its redelivery count is the broker's), and wakes
    /// a waiting receive.
    pub(crate) fn push_copy(&self, mut message: Message) {
        message.handed_again = true;
        self.queue.lock().push_back(message);
        self.ready.notify_one();
    }

    /// The next message to hand over again, if any.
    pub(crate) fn pop(&self) -> Option<Message> {
        self.queue.lock().pop_front()
    }

    /// Waits until a message is queued (at once if one was queued since the last wait).
    pub(crate) async fn ready(&self) {
        self.ready.notified().await;
    }
}
