//! The accept loop and the per-connection tasks: a reader that hands frames to the broker,
//! a writer that drains the connection's queue, keep-alive pings and transaction timeouts.
//! The accept loop can be stopped (the listener closed) and started again on the same
//! address, for [`Emulator::take_down`](super::Emulator::take_down) and
//! [`Emulator::bring_up`](super::Emulator::bring_up).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use prost::Message;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::codec::{Encoder, FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use txn_ack::TxnId;

use super::broker::{Broker, Out};
use pulsar_wire::Error;
use pulsar_wire::wire::{Frame, PulsarCodec, encode_frame};

/// What the emulator's tasks share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) broker: Mutex<Broker>,
    pub(super) shutdown: CancellationToken,
    pub(super) tasks: TaskTracker,
    /// The largest frame accepted.
    pub(super) max_frame_size: usize,
    pub(super) keep_alive: Option<Duration>,
    /// The running accept loop; `None` while the broker is down. The async lock also keeps
    /// two restarts from interleaving.
    pub(super) accepting: tokio::sync::Mutex<Option<AcceptLoop>>,
}

/// An accept loop and the token that stops it.
#[derive(Debug)]
pub(super) struct AcceptLoop {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl AcceptLoop {
    /// Starts accepting on `listener`; connections are registered in `epoch`.
    pub(super) fn spawn(listener: TcpListener, shared: &Arc<Shared>, epoch: u64) -> Self {
        let stop = shared.shutdown.child_token();
        let task = shared
            .tasks
            .spawn(accept_loop(listener, shared.clone(), stop.clone(), epoch));
        Self { stop, task }
    }

    /// Stops accepting and waits until the listener is closed.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// A frame to write, with a wrong checksum if `corrupt`.
#[derive(Debug)]
struct Outbound {
    frame: Box<Frame>,
    corrupt: bool,
}

/// Encodes frames as [`PulsarCodec`] does, and can spoil a payload frame's CRC32C.
#[derive(Debug, Default)]
struct ServerEncoder;

impl Encoder<Outbound> for ServerEncoder {
    type Error = Error;

    fn encode(&mut self, item: Outbound, dst: &mut BytesMut) -> Result<(), Error> {
        let start = dst.len();
        encode_frame(&item.frame, dst);
        if item.corrupt && item.frame.payload.is_some() {
            // [u32 total][u32 command size][command][u16 magic][u32 CRC32C]...
            let at = start + 8 + item.frame.command.encoded_len() + 2;
            if let Some(crc) = dst.get_mut(at..at + 4) {
                for byte in crc {
                    *byte ^= 0xff;
                }
            }
        }
        Ok(())
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    epoch: u64,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    shared.tasks.spawn(connection(shared.clone(), stream, peer, epoch));
                }
                Err(error) => {
                    tracing::warn!(%error, "the emulator failed to accept a connection");
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn connection(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr, epoch: u64) {
    let (tx, rx) = mpsc::unbounded_channel();
    let token = shared.shutdown.child_token();
    // A connection accepted just before the broker went down is closed at once.
    let conn = shared
        .broker
        .lock()
        .register(tx, token.clone(), peer, epoch);
    let (read, write) = stream.into_split();
    let mut reader = FramedRead::new(read, PulsarCodec::new(shared.max_frame_size));
    let writer = FramedWrite::new(write, ServerEncoder);
    let writer = shared.tasks.spawn(write_loop(writer, rx, token.clone()));
    let mut keep_alive = shared.keep_alive.map(|period| {
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    let mut last_received = Instant::now();
    let mut ping_outstanding = false;
    loop {
        tokio::select! {
            () = token.cancelled() => break,
            frame = reader.next() => match frame {
                Some(Ok(frame)) => {
                    last_received = Instant::now();
                    ping_outstanding = false;
                    let effects = shared.broker.lock().handle(conn, frame);
                    if let Some((txn, after)) = effects.txn_timeout {
                        spawn_txn_timeout(&shared, txn, after);
                    }
                    if let Some(wake) = effects.wake {
                        spawn_wake(&shared, wake);
                    }
                    if effects.close_now {
                        break;
                    }
                }
                Some(Err(error)) => {
                    tracing::debug!(conn, %error, "closing a connection that sent a bad frame");
                    shared.broker.lock().malformed_frame();
                    break;
                }
                None => break,
            },
            () = tick(&mut keep_alive) => {
                let Some(period) = shared.keep_alive else { continue };
                if last_received.elapsed() < period {
                    continue;
                }
                if ping_outstanding {
                    tracing::debug!(conn, "closing a connection that did not answer a PING");
                    shared.broker.lock().keep_alive_expired();
                    break;
                }
                ping_outstanding = true;
                shared.broker.lock().send_ping(conn);
            }
        }
    }
    // Whatever ended the connection, nothing more is written: the writer already flushed a
    // graceful close (it cancels the token when done).
    writer.abort();
    drop(reader);
    shared.broker.lock().disconnect(conn);
}

async fn write_loop(
    mut sink: FramedWrite<OwnedWriteHalf, ServerEncoder>,
    mut rx: mpsc::UnboundedReceiver<Out>,
    token: CancellationToken,
) {
    while let Some(out) = rx.recv().await {
        match out {
            Out::Close => {
                let _ = sink.flush().await;
                break;
            }
            Out::Frame {
                frame,
                delay,
                corrupt,
            } => {
                if !delay.is_zero() {
                    let _ = sink.flush().await;
                    tokio::time::sleep(delay).await;
                }
                if sink.feed(Outbound { frame, corrupt }).await.is_err() {
                    break;
                }
                if rx.is_empty() && sink.flush().await.is_err() {
                    break;
                }
            }
        }
    }
    token.cancel();
}

/// Wakes the subscriptions when delayed entries come due, as long as this wake-up's generation
/// is the one scheduled.
fn spawn_wake(shared: &Arc<Shared>, (mut at, mut generation): (i64, u64)) {
    let task = shared.clone();
    shared.tasks.spawn(async move {
        loop {
            let wait = task.broker.lock().until(at);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = task.shutdown.cancelled() => return,
            }
            match task.broker.lock().wake(generation) {
                Some(next) => (at, generation) = next,
                None => return,
            }
        }
    });
}

fn spawn_txn_timeout(shared: &Arc<Shared>, txn: TxnId, after: Duration) {
    let task = shared.clone();
    shared.tasks.spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(after) => task.broker.lock().expire(txn),
            () = task.shutdown.cancelled() => {}
        }
    });
}
