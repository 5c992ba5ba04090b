//! [`Ticket`]: the future of one accepted item's outcome.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::Error;

/// The outcome of one accepted item, delivered exactly once.
///
/// Dropping a ticket does **not** withdraw the item: it stays in its batch, is flushed and
/// retried as usual, and its outcome is then discarded (observers and stats still see it).
/// A ticket never stays pending forever: if the batcher is torn down without delivering an
/// outcome, the ticket resolves to [`Error::Abandoned`].
#[derive(Debug)]
#[must_use = "a ticket carries the item's outcome; dropping it does not withdraw the item"]
pub struct Ticket<O, E> {
    rx: oneshot::Receiver<Result<O, Error<E>>>,
}

pub(crate) type Outcome<O, E> = Result<O, Error<E>>;

/// The batcher's end of a [`Ticket`].
pub(crate) type Reply<O, E> = oneshot::Sender<Outcome<O, E>>;

impl<O, E> Ticket<O, E> {
    pub(crate) fn new() -> (Reply<O, E>, Self) {
        let (tx, rx) = oneshot::channel();
        (tx, Self { rx })
    }
}

impl<O, E> Future for Ticket<O, E> {
    type Output = Result<O, Error<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|delivered| delivered.unwrap_or(Err(Error::Abandoned)))
    }
}
