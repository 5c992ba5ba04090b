//! A counting Pulsar binary-protocol forwarder: frames go unchanged to the broker, except that
//! lookup answers name the forwarder instead of the broker (so that clients stay on it); it
//! counts the commands clients send and the message ids in their `ACK` frames.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use pulsar_wire::pb::base_command::Type;
use pulsar_wire::wire::{decode_frame, encode_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What clients sent through the forwarder.
#[derive(Debug, Default, Clone)]
pub(crate) struct PulsarCounts {
    /// Frames per command type.
    pub(crate) commands: BTreeMap<String, u64>,
    /// Message ids in all `ACK` frames.
    pub(crate) acked_ids: u64,
}

impl PulsarCounts {
    pub(crate) fn frames_of(&self, command: Type) -> u64 {
        self.commands
            .get(command.as_str_name())
            .copied()
            .unwrap_or(0)
    }
}

/// Listens on 127.0.0.1 (any port) and forwards every connection to `upstream`.
pub(crate) async fn start(
    upstream: SocketAddr,
) -> std::io::Result<(SocketAddr, Arc<Mutex<PulsarCounts>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let counts = Arc::new(Mutex::new(PulsarCounts::default()));
    let shared = Arc::clone(&counts);
    let url = format!("pulsar://{address}");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counts = Arc::clone(&shared);
            let url = url.clone();
            tokio::spawn(async move {
                let Ok(broker) = TcpStream::connect(upstream).await else {
                    eprintln!("pulsar forwarder: cannot reach {upstream}");
                    return;
                };
                let (client_read, client_write) = client.into_split();
                let (broker_read, broker_write) = broker.into_split();
                tokio::select! {
                    _ = to_broker(client_read, broker_write, counts) => {}
                    _ = to_client(broker_read, client_write, url) => {}
                }
            });
        }
    });
    Ok((address, counts))
}

/// One whole frame, size prefix included; `None` at the end of the stream.
async fn read_frame(from: &mut OwnedReadHalf) -> std::io::Result<Option<Bytes>> {
    let mut size = [0u8; 4];
    if from.read_exact(&mut size).await.is_err() {
        return Ok(None);
    }
    let len = u32::from_be_bytes(size) as usize;
    let mut frame = BytesMut::zeroed(4 + len);
    frame[..4].copy_from_slice(&size);
    from.read_exact(&mut frame[4..]).await?;
    Ok(Some(frame.freeze()))
}

async fn to_broker(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    counts: Arc<Mutex<PulsarCounts>>,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        if let Ok(decoded) = decode_frame(frame.slice(4..)) {
            let command = &decoded.command;
            let mut counts = counts.lock();
            let name = Type::try_from(command.r#type).map_or_else(
                |_| format!("type {}", command.r#type),
                |t| t.as_str_name().to_owned(),
            );
            *counts.commands.entry(name).or_default() += 1;
            if let Some(ack) = &command.ack {
                counts.acked_ids += ack.message_id.len() as u64;
            }
        }
        to.write_all(&frame).await?;
    }
    Ok(())
}

async fn to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    url: String,
) -> std::io::Result<()> {
    while let Some(frame) = read_frame(&mut from).await? {
        let rewritten = decode_frame(frame.slice(4..)).ok().and_then(|mut decoded| {
            let lookup = decoded.command.lookup_topic_response.as_mut()?;
            lookup.broker_service_url = Some(url.clone());
            let mut out = BytesMut::new();
            encode_frame(&decoded, &mut out);
            Some(out.freeze())
        });
        to.write_all(rewritten.as_ref().unwrap_or(&frame)).await?;
    }
    Ok(())
}
