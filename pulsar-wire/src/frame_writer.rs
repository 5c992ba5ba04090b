//! [`FrameWriter`]: encodes frames onto the connection's byte stream. A payload's data of
//! at least [`BY_REFERENCE`] bytes (a batch) is sent from where it is, beside its encoded
//! head, by vectored writes: one copy less per message than encoding it into a buffer.
//! Streams that do not write vectored (some TLS streams) get every frame copied into one
//! buffer, as a codec would.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::Error;
use crate::codec::{Frame, OutgoingFrame, encode_frame_head};

/// The smallest payload data sent by reference rather than copied.
pub(crate) const BY_REFERENCE: usize = 16 * 1024;

/// Encoded bytes waiting past this are written before more frames are taken.
const BACKPRESSURE: usize = 256 * 1024;

/// The most buffers given to one vectored write (Linux takes 1,024).
const MAX_SLICES: usize = 64;

/// Frames onto a byte stream; see the module docs.
pub(crate) struct FrameWriter<W> {
    io: W,
    max_frame_size: usize,
    vectored: bool,
    /// Encoded bytes not yet moved to `chunks`.
    buffer: BytesMut,
    /// Bytes to write, in order.
    chunks: VecDeque<Bytes>,
    queued: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer to `io` that refuses frames above `max_frame_size` bytes.
    pub(crate) fn new(io: W, max_frame_size: usize) -> Self {
        let vectored = io.is_write_vectored();
        Self {
            io,
            max_frame_size,
            vectored,
            buffer: BytesMut::with_capacity(8 * 1024),
            chunks: VecDeque::new(),
            queued: 0,
        }
    }

    /// Queues `outgoing`, writing what is queued once it passes [`BACKPRESSURE`] bytes. The
    /// frame is encoded before the returned future is first polled, so the future does not
    /// hold it (a `BaseCommand` is kilobytes, and this future lives in the connection's task).
    ///
    /// # Errors
    /// [`Error::FrameTooLarge`] for a frame above the limit (nothing of it is queued);
    /// the stream's write error.
    pub(crate) fn feed(
        &mut self,
        outgoing: OutgoingFrame,
    ) -> impl Future<Output = Result<(), Error>> + '_ {
        let encoded = self.encode(outgoing);
        async move {
            encoded?;
            if self.queued >= BACKPRESSURE {
                self.write_queued().await?;
            }
            Ok(())
        }
    }

    /// Encodes `outgoing` into the queue: its payload's data by reference when large and the
    /// stream writes vectored, else copied.
    fn encode(&mut self, outgoing: OutgoingFrame) -> Result<(), Error> {
        let OutgoingFrame { frame, checksum } = outgoing;
        let start = self.buffer.len();
        let by_reference = self.vectored
            && frame
                .payload
                .as_ref()
                .is_some_and(|p| p.data.len() >= BY_REFERENCE);
        encode_frame_head(&frame, checksum, &mut self.buffer);
        let mut data = frame.payload.map(|p| p.data);
        if !by_reference && let Some(data) = data.take() {
            self.buffer.extend_from_slice(&data);
        }
        let size = self.buffer.len() - start - 4 + data.as_ref().map_or(0, Bytes::len);
        if size > self.max_frame_size {
            self.buffer.truncate(start);
            return Err(Error::FrameTooLarge {
                size,
                max: self.max_frame_size,
            });
        }
        self.queued += size + 4;
        if let Some(data) = data {
            self.chunks.push_back(self.buffer.split().freeze());
            self.chunks.push_back(data);
        }
        Ok(())
    }

    /// Writes everything queued and flushes the stream.
    ///
    /// # Errors
    /// The stream's write or flush error.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        self.write_queued().await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Queues `frame` and flushes (the frame encoded before the first poll, as
    /// [`Self::feed`]).
    ///
    /// # Errors
    /// As [`Self::feed`] and [`Self::flush`].
    pub(crate) fn send(&mut self, frame: Frame) -> impl Future<Output = Result<(), Error>> + '_ {
        let encoded = self.encode(frame.into());
        async move {
            encoded?;
            self.flush().await
        }
    }

    /// Flushes, then shuts the stream's write side down.
    ///
    /// # Errors
    /// The stream's error.
    pub(crate) async fn close(&mut self) -> Result<(), Error> {
        self.flush().await?;
        self.io.shutdown().await?;
        Ok(())
    }

    async fn write_queued(&mut self) -> Result<(), Error> {
        if !self.buffer.is_empty() {
            self.chunks.push_back(self.buffer.split().freeze());
        }
        while !self.chunks.is_empty() {
            let written = if self.chunks.len() == 1 {
                self.io.write(&self.chunks[0]).await?
            } else {
                let slices: Vec<IoSlice<'_>> = self
                    .chunks
                    .iter()
                    .take(MAX_SLICES)
                    .map(|chunk| IoSlice::new(chunk))
                    .collect();
                self.io.write_vectored(&slices).await?
            };
            if written == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            self.advance(written);
        }
        self.queued = 0;
        Ok(())
    }

    /// Drops `written` bytes from the front of the chunks.
    fn advance(&mut self, mut written: usize) {
        while written > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if written < front.len() {
                front.advance(written);
                return;
            }
            written -= front.len();
            self.chunks.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use prost::Message;

    use super::*;
    use crate::codec::{PulsarCodec, encode_frame};
    use crate::pb::base_command::Type;
    use crate::pb::{BaseCommand, CommandSend, MessageMetadata};

    /// A stream that takes at most `step` bytes per write, vectored or not, and keeps them.
    struct Trickle {
        written: Vec<u8>,
        step: usize,
        vectored: bool,
        writes: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.step);
            self.written.extend_from_slice(&buf[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut left = self.step;
            for buf in bufs {
                let n = buf.len().min(left);
                self.written.extend_from_slice(&buf[..n]);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            self.writes += 1;
            Poll::Ready(Ok(self.step - left))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn send(sequence_id: u64, data_len: usize) -> Frame {
        let command = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend {
                producer_id: 1,
                sequence_id,
                ..CommandSend::default()
            }),
            ..BaseCommand::default()
        };
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            sequence_id,
            ..MessageMetadata::default()
        };
        let data = Bytes::from((0..data_len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        Frame::with_payload(command, metadata, data)
    }

    fn ping() -> Frame {
        Frame::command(BaseCommand {
            r#type: Type::Ping as i32,
            ping: Some(crate::pb::CommandPing {}),
            ..BaseCommand::default()
        })
    }

    /// What a codec writes for `frames`, one after the other.
    fn encoded(frames: &[Frame]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for frame in frames {
            encode_frame(frame, &mut out);
        }
        out.to_vec()
    }

    async fn written(frames: &[Frame], step: usize, vectored: bool) -> Trickle {
        let io = Trickle {
            written: Vec::new(),
            step,
            vectored,
            writes: 0,
        };
        let mut writer = FrameWriter::new(io, crate::codec::DEFAULT_MAX_FRAME_SIZE);
        for frame in frames {
            writer.feed(frame.clone().into()).await.unwrap();
        }
        writer.flush().await.unwrap();
        writer.io
    }

    #[tokio::test]
    async fn frames_reach_the_stream_as_a_codec_encodes_them_whatever_the_write_sizes() {
        let frames = vec![
            ping(),
            send(1, 100),
            send(2, BY_REFERENCE),
            ping(),
            send(3, 300_000),
            send(4, BY_REFERENCE - 1),
            send(5, 70_000),
        ];
        for step in [1, 7, 4096, 65_536, usize::MAX] {
            for vectored in [true, false] {
                let io = written(&frames, step, vectored).await;
                assert_eq!(io.written, encoded(&frames), "step {step}, {vectored}");
            }
        }
    }

    #[tokio::test]
    async fn a_batch_is_sent_from_where_it_is_and_decodes_with_its_checksum() {
        let frame = send(9, 1 << 20);
        let io = written(std::slice::from_ref(&frame), usize::MAX, true).await;
        // One vectored write of the head and the data: nothing was copied into a buffer.
        assert_eq!(io.writes, 1);
        assert_decodes_to(&io.written, &frame);
    }

    #[tokio::test]
    async fn the_checksum_a_producer_computed_is_the_one_sent() {
        let frame = send(9, 300_000);
        let payload = frame.payload.as_ref().unwrap();
        let checksum = Some(crate::codec::payload_checksum(
            &payload.metadata,
            &payload.data,
        ));
        for vectored in [true, false] {
            let io = Trickle {
                written: Vec::new(),
                step: 4096,
                vectored,
                writes: 0,
            };
            let mut writer = FrameWriter::new(io, crate::codec::DEFAULT_MAX_FRAME_SIZE);
            let outgoing = OutgoingFrame {
                frame: frame.clone(),
                checksum,
            };
            writer.feed(outgoing).await.unwrap();
            writer.flush().await.unwrap();
            assert_eq!(writer.io.written, encoded(std::slice::from_ref(&frame)));
            assert_decodes_to(&writer.io.written, &frame);
        }
    }

    /// Once written, a batch's bytes are no longer held by the writer: the producer takes its
    /// buffer back for the next batch when the receipt comes (`producer::spare_buffers`).
    #[tokio::test]
    async fn a_written_batch_is_no_longer_held() {
        for vectored in [true, false] {
            let frame = send(9, 1 << 20);
            let data = frame.payload.as_ref().unwrap().data.clone();
            let io = Trickle {
                written: Vec::new(),
                step: 65_536,
                vectored,
                writes: 0,
            };
            let mut writer = FrameWriter::new(io, crate::codec::DEFAULT_MAX_FRAME_SIZE);
            writer.feed(frame.into()).await.unwrap();
            writer.flush().await.unwrap();
            assert!(data.try_into_mut().is_ok(), "still held ({vectored})");
        }
    }

    fn assert_decodes_to(written: &[u8], frame: &Frame) {
        let mut src = BytesMut::from(written);
        let decoded = tokio_util::codec::Decoder::decode(&mut PulsarCodec::default(), &mut src)
            .unwrap()
            .unwrap();
        let payload = decoded.payload.unwrap();
        assert!(payload.checksum_ok);
        assert_eq!(payload.data, frame.payload.as_ref().unwrap().data);
        assert_eq!(
            decoded.command.encode_to_vec(),
            frame.command.encode_to_vec()
        );
    }

    #[tokio::test]
    async fn a_frame_above_the_limit_is_refused_and_the_rest_still_written() {
        let io = Trickle {
            written: Vec::new(),
            step: usize::MAX,
            vectored: true,
            writes: 0,
        };
        let mut writer = FrameWriter::new(io, 64 * 1024);
        writer.feed(ping().into()).await.unwrap();
        for big in [send(1, 70_000), send(2, 10_000_000)] {
            assert!(matches!(
                writer.feed(big.into()).await,
                Err(Error::FrameTooLarge { max: 65_536, .. })
            ));
        }
        writer.feed(send(3, 20_000).into()).await.unwrap();
        writer.flush().await.unwrap();
        assert_eq!(writer.io.written, encoded(&[ping(), send(3, 20_000)]));
    }
}
