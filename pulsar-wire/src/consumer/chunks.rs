//! Reassembling chunked messages.
//!
//! A producer with chunking splits a message whose (compressed) payload is larger than the
//! broker's `max_message_size` into entries of its own, each with the message's `uuid`, its
//! `chunk_id` (0, 1, …), `num_chunks_from_msg` and `total_chunk_msg_size` (the bytes of the
//! whole compressed payload); every chunk carries the message's metadata (codec,
//! `uncompressed_size`, key, properties). Chunks are never batched, and other messages may
//! sit between them on the topic. The consumer collects a message's chunks in order, then
//! decompresses the whole payload and delivers one message whose id is the last chunk's (as
//! the Java client's `ChunkMessageIdImpl`); acknowledging it acknowledges every chunk.
//!
//! Nothing is acknowledged here. Memory is bounded by [`ChunkLimits`]: at most
//! `max_pending` incomplete messages and `max_bytes` buffered per partition (a declared
//! size above `max_bytes` is refused before anything is allocated); the oldest incomplete
//! message makes room for a new one and is redelivered (never acked: the application did
//! not get it), as is one whose chunks arrive out of order. An incomplete message that
//! gets no chunk for `expire_after`, and a chunk that cannot join a message (its earlier
//! chunks were never received, for example on a subscription that started in the middle of
//! the message), reach the application as undecodable, with their ids.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use txn_ack::MessagePosition;

use crate::Error;
use crate::pb::MessageMetadata;

/// Bounds on the chunked messages a consumer holds while their chunks arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimits {
    pub(crate) max_pending: usize,
    pub(crate) max_bytes: usize,
    pub(crate) expire_after: Duration,
}

impl Default for ChunkLimits {
    /// 10 incomplete messages (the Java client's `maxPendingChunkedMessage`), 128 MiB, and
    /// 60 s (its `expireTimeOfIncompleteChunkedMessage`).
    fn default() -> Self {
        Self {
            max_pending: 10,
            max_bytes: 128 * 1024 * 1024,
            expire_after: Duration::from_secs(60),
        }
    }
}

impl ChunkLimits {
    /// The most incomplete chunked messages held per partition; when a new one starts
    /// beyond it, the oldest is dropped and redelivered later (default 10).
    #[must_use]
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = max_pending;
        self
    }

    /// The most bytes of chunks held per partition, which is also the largest chunked
    /// message accepted, compressed and decompressed (default 128 MiB).
    #[must_use]
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// How long an incomplete message waits for its next chunk before it is dropped and
    /// redelivered later (default 60 s).
    #[must_use]
    pub fn expire_after(mut self, expire_after: Duration) -> Self {
        self.expire_after = expire_after;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Error::Invalid {
            what: "chunk limits",
            reason,
        };
        if self.max_pending == 0 {
            return Err(invalid("max_pending must be at least 1".into()));
        }
        if self.max_bytes == 0 {
            return Err(invalid("max_bytes must be positive".into()));
        }
        if self.expire_after.is_zero() {
            return Err(invalid("expire_after must be positive".into()));
        }
        Ok(())
    }
}

/// One chunk as it arrived.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    /// Its entry.
    pub(crate) position: MessagePosition,
    /// The message's metadata, as this chunk carries it.
    pub(crate) metadata: MessageMetadata,
    /// Its piece of the compressed payload.
    pub(crate) data: Bytes,
    /// How often the broker delivered this entry before.
    pub(crate) redelivery_count: u32,
}

impl Chunk {
    fn uuid(&self) -> &str {
        self.metadata.uuid.as_deref().unwrap_or("")
    }

    fn id(&self) -> i32 {
        self.metadata.chunk_id.unwrap_or(0)
    }
}

/// Whether an entry's metadata makes it a chunk of a larger message.
pub(crate) fn is_chunk(metadata: &MessageMetadata) -> bool {
    metadata.num_messages_in_batch.is_none() && metadata.num_chunks_from_msg.is_some_and(|n| n > 1)
}

/// A message whose chunks are all in.
#[derive(Debug)]
pub(crate) struct Assembled {
    /// The last chunk's metadata (the message's).
    pub(crate) metadata: MessageMetadata,
    /// The whole compressed payload.
    pub(crate) data: Bytes,
    /// The last chunk's entry: the message's id.
    pub(crate) last: MessagePosition,
    /// Every other entry of the message (earlier chunks, and copies of chunks received
    /// twice), acknowledged with it.
    pub(crate) others: Vec<MessagePosition>,
    /// The highest redelivery count of its chunks.
    pub(crate) redelivery_count: u32,
}

/// What one chunk did.
#[derive(Debug)]
pub(crate) enum Added {
    /// Held until the message's other chunks arrive.
    Held,
    /// The message is complete.
    Complete(Box<Assembled>),
    /// The chunk cannot join a message: why (the application gets it as undecodable), and
    /// the other entries that go with it (acknowledged or redelivered with it).
    Orphan(String, Vec<MessagePosition>),
    /// The chunk arrived out of order: its message is dropped, and this chunk with it, to be
    /// redelivered.
    Dropped,
}

/// A chunked message whose chunks are arriving.
#[derive(Debug)]
struct Partial {
    num_chunks: i32,
    total: usize,
    /// The next chunk id expected.
    next: i32,
    data: BytesMut,
    entries: Vec<MessagePosition>,
    redelivery_count: u32,
    /// When its last chunk arrived.
    touched: Instant,
}

/// A partition's incomplete chunked messages, by `uuid`.
#[derive(Debug)]
pub(crate) struct Assembler {
    limits: ChunkLimits,
    pending: HashMap<String, Partial>,
    bytes: usize,
}

impl Assembler {
    pub(crate) fn new(limits: ChunkLimits) -> Self {
        Self {
            limits,
            pending: HashMap::new(),
            bytes: 0,
        }
    }

    /// Incomplete messages held.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes one chunk; `dropped` receives the entries of messages dropped to make room
    /// (to be redelivered).
    pub(crate) fn add(&mut self, chunk: Chunk, dropped: &mut Vec<MessagePosition>) -> Added {
        let uuid = chunk.uuid().to_owned();
        let chunk_id = chunk.id();
        let num_chunks = chunk.metadata.num_chunks_from_msg.unwrap_or(0);
        let declared = chunk.metadata.total_chunk_msg_size.unwrap_or(-1);
        let describe = || {
            format!(
                "chunk {chunk_id} of {num_chunks} of message {uuid:?} (entry {})",
                chunk.position.entry()
            )
        };
        let Ok(total) = usize::try_from(declared) else {
            return Added::Orphan(
                format!(
                    "{}: total_chunk_msg_size {declared} is not a size",
                    describe()
                ),
                Vec::new(),
            );
        };
        if uuid.is_empty() || !(0..num_chunks).contains(&chunk_id) {
            return Added::Orphan(
                format!(
                    "{}: a chunk needs a uuid and a chunk_id below num_chunks_from_msg",
                    describe()
                ),
                Vec::new(),
            );
        }
        if total > self.limits.max_bytes {
            return Added::Orphan(
                format!(
                    "{}: the message declares {total} bytes, above the consumer's chunk limit \
                     of {} bytes (ConsumerOptions::chunk_limits)",
                    describe(),
                    self.limits.max_bytes
                ),
                Vec::new(),
            );
        }
        if chunk_id == 0 {
            // A first chunk starts the message again (a redelivery after a drop, or the
            // producer sending it again); entries already held stay to be acknowledged.
            let mut entries = Vec::new();
            if let Some(old) = self.remove(&uuid) {
                entries = old.entries;
            }
            while self.pending.len() >= self.limits.max_pending
                || self.bytes + total > self.limits.max_bytes
            {
                let Some(oldest) = self.oldest() else {
                    break;
                };
                if let Some(old) = self.remove(&oldest) {
                    tracing::info!(uuid = %oldest, "an incomplete chunked message dropped for room: redelivered later");
                    dropped.extend(old.entries);
                }
            }
            if chunk.data.len() > total {
                return Added::Orphan(
                    format!(
                        "{}: {} bytes, more than the message's total of {total}",
                        describe(),
                        chunk.data.len()
                    ),
                    entries,
                );
            }
            entries.push(chunk.position);
            let mut data = BytesMut::with_capacity(total);
            data.extend_from_slice(&chunk.data);
            self.bytes += total;
            self.pending.insert(
                uuid.clone(),
                Partial {
                    num_chunks,
                    total,
                    next: 1,
                    data,
                    entries,
                    redelivery_count: chunk.redelivery_count,
                    touched: Instant::now(),
                },
            );
            return self.complete_if_done(&uuid, chunk);
        }
        let Some(partial) = self.pending.get_mut(&uuid) else {
            return Added::Orphan(
                format!(
                    "{}: its earlier chunks were not received (ack_id drops it, nack_id has \
                     it delivered again)",
                    describe()
                ),
                Vec::new(),
            );
        };
        if partial.num_chunks != num_chunks || partial.total != total {
            let first = (partial.num_chunks, partial.total);
            let old = self.remove(&uuid);
            return Added::Orphan(
                format!(
                    "{}: the message's first chunk said {} chunks of {} bytes in all",
                    describe(),
                    first.0,
                    first.1
                ),
                old.map(|p| p.entries).unwrap_or_default(),
            );
        }
        if chunk_id < partial.next {
            // A copy of a chunk already held (the producer sent it again): acknowledged
            // with the message.
            partial.entries.push(chunk.position);
            partial.touched = Instant::now();
            return Added::Held;
        }
        if chunk_id > partial.next {
            // A chunk is missing (delivered elsewhere, or to come again): the message starts
            // over when its first chunk comes again.
            tracing::info!(
                "{}: chunk {} was expected next; the message is redelivered",
                describe(),
                partial.next
            );
            let old = self.remove(&uuid);
            dropped.extend(old.map(|p| p.entries).unwrap_or_default());
            dropped.push(chunk.position);
            return Added::Dropped;
        }
        if partial.data.len() + chunk.data.len() > partial.total {
            let old = self.remove(&uuid);
            return Added::Orphan(
                format!(
                    "{}: the chunks so far hold more than the message's total of {total} bytes",
                    describe()
                ),
                old.map(|p| p.entries).unwrap_or_default(),
            );
        }
        partial.data.extend_from_slice(&chunk.data);
        partial.entries.push(chunk.position);
        partial.next += 1;
        partial.redelivery_count = partial.redelivery_count.max(chunk.redelivery_count);
        partial.touched = Instant::now();
        self.complete_if_done(&uuid, chunk)
    }

    fn complete_if_done(&mut self, uuid: &str, last: Chunk) -> Added {
        let Some(partial) = self.pending.get(uuid) else {
            return Added::Held;
        };
        if partial.next < partial.num_chunks {
            return Added::Held;
        }
        let Some(mut partial) = self.remove(uuid) else {
            return Added::Held;
        };
        if partial.data.len() != partial.total {
            let got = partial.data.len();
            partial.entries.retain(|p| *p != last.position);
            return Added::Orphan(
                format!(
                    "message {uuid:?}: its {} chunks hold {got} bytes, not the declared {}",
                    partial.num_chunks, partial.total
                ),
                partial.entries,
            );
        }
        partial.entries.retain(|p| *p != last.position);
        Added::Complete(Box::new(Assembled {
            metadata: last.metadata,
            data: partial.data.freeze(),
            last: last.position,
            others: partial.entries,
            redelivery_count: partial.redelivery_count,
        }))
    }

    /// Takes out the messages that waited longer than `expire_after` for a chunk (their
    /// missing chunks may never come: the producer failed mid-message, or they went to
    /// another consumer). Each comes back as its first entry, why, and its other entries:
    /// the application gets it as undecodable and decides (`ack_id` drops it, `nack_id` has
    /// it delivered again).
    pub(crate) fn expire(&mut self) -> Vec<(MessagePosition, String, Vec<MessagePosition>)> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.touched) >= self.limits.expire_after)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        let mut out = Vec::new();
        for uuid in expired {
            if let Some(mut old) = self.remove(&uuid) {
                let first = old.entries.remove(0);
                let reason = format!(
                    "chunked message {uuid:?}: {} of its {} chunks arrived, none for {:?} \
                     (ConsumerOptions::chunk_limits)",
                    old.next, old.num_chunks, self.limits.expire_after
                );
                out.push((first, reason, old.entries));
            }
        }
        out
    }

    fn oldest(&self) -> Option<String> {
        self.pending
            .iter()
            .min_by_key(|(_, p)| p.touched)
            .map(|(uuid, _)| uuid.clone())
    }

    fn remove(&mut self, uuid: &str) -> Option<Partial> {
        let partial = self.pending.remove(uuid)?;
        self.bytes = self.bytes.saturating_sub(partial.total);
        Some(partial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use txn_ack::EntryId;

    fn chunk(uuid: &str, id: i32, n: i32, total: i32, entry: u64, data: &[u8]) -> Chunk {
        Chunk {
            position: MessagePosition::single(1, entry, -1),
            metadata: MessageMetadata {
                uuid: Some(uuid.into()),
                chunk_id: Some(id),
                num_chunks_from_msg: Some(n),
                total_chunk_msg_size: Some(total),
                ..MessageMetadata::default()
            },
            data: Bytes::copy_from_slice(data),
            redelivery_count: 0,
        }
    }

    fn entries(positions: &[MessagePosition]) -> Vec<u64> {
        positions.iter().map(|p| p.entry().entry_id).collect()
    }

    #[test]
    fn chunks_in_order_make_the_message_with_every_entry() {
        let mut a = Assembler::new(ChunkLimits::default());
        let mut dropped = Vec::new();
        assert!(matches!(
            a.add(chunk("u", 0, 3, 6, 10, b"ab"), &mut dropped),
            Added::Held
        ));
        // Another message's entry between the chunks changes nothing.
        assert!(matches!(
            a.add(chunk("v", 0, 2, 2, 11, b"x"), &mut dropped),
            Added::Held
        ));
        assert!(matches!(
            a.add(chunk("u", 1, 3, 6, 12, b"cd"), &mut dropped),
            Added::Held
        ));
        let Added::Complete(done) = a.add(chunk("u", 2, 3, 6, 13, b"ef"), &mut dropped) else {
            panic!("not complete");
        };
        assert_eq!(&done.data[..], b"abcdef");
        assert_eq!(
            done.last.entry(),
            EntryId {
                ledger_id: 1,
                entry_id: 13
            }
        );
        assert_eq!(entries(&done.others), [10, 12]);
        assert!(dropped.is_empty());
        assert_eq!(a.pending(), 1);
    }

    #[test]
    fn a_chunk_without_its_first_is_an_orphan_and_a_copy_is_kept_for_the_ack() {
        let mut a = Assembler::new(ChunkLimits::default());
        let mut dropped = Vec::new();
        assert!(matches!(
            a.add(chunk("u", 1, 2, 4, 10, b"cd"), &mut dropped),
            Added::Orphan(reason, others) if reason.contains("earlier chunks were not received") && others.is_empty()
        ));
        a.add(chunk("u", 0, 2, 4, 11, b"ab"), &mut dropped);
        // The producer sent chunk 0 again.
        assert!(matches!(
            a.add(chunk("u", 0, 2, 4, 12, b"ab"), &mut dropped),
            Added::Held
        ));
        let Added::Complete(done) = a.add(chunk("u", 1, 2, 4, 13, b"cd"), &mut dropped) else {
            panic!("not complete");
        };
        assert_eq!(&done.data[..], b"abcd");
        assert_eq!(entries(&done.others), [11, 12]);
    }

    #[test]
    fn a_gap_drops_the_message_for_redelivery() {
        let mut a = Assembler::new(ChunkLimits::default());
        let mut dropped = Vec::new();
        a.add(chunk("u", 0, 3, 6, 10, b"ab"), &mut dropped);
        assert!(matches!(
            a.add(chunk("u", 2, 3, 6, 12, b"ef"), &mut dropped),
            Added::Dropped
        ));
        assert_eq!(entries(&dropped), [10, 12]);
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn limits_drop_the_oldest_and_refuse_oversized_declarations() {
        let limits = ChunkLimits::default().max_pending(2).max_bytes(10);
        let mut a = Assembler::new(limits);
        let mut dropped = Vec::new();
        assert!(matches!(
            a.add(chunk("big", 0, 2, 11, 1, b"x"), &mut dropped),
            Added::Orphan(reason, _) if reason.contains("above the consumer's chunk limit")
        ));
        a.add(chunk("a", 0, 2, 4, 2, b"ab"), &mut dropped);
        a.add(chunk("b", 0, 2, 4, 3, b"ab"), &mut dropped);
        a.add(chunk("c", 0, 2, 4, 4, b"ab"), &mut dropped);
        assert_eq!(entries(&dropped), [2]);
        assert_eq!(a.pending(), 2);
        // Bytes: b and c hold 8 of 10; d needs 4, so b goes too.
        dropped.clear();
        a.add(chunk("d", 0, 2, 4, 5, b"ab"), &mut dropped);
        assert_eq!(entries(&dropped), [3]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_incomplete_message_expires_to_the_application() {
        let mut a = Assembler::new(ChunkLimits::default().expire_after(Duration::from_secs(5)));
        let mut dropped = Vec::new();
        a.add(chunk("u", 0, 3, 6, 10, b"ab"), &mut dropped);
        a.add(chunk("u", 1, 3, 6, 11, b"cd"), &mut dropped);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(a.expire().is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let expired = a.expire();
        assert_eq!(expired.len(), 1);
        let (first, reason, others) = &expired[0];
        assert_eq!(first.entry().entry_id, 10);
        assert!(reason.contains("2 of its 3 chunks"), "{reason}");
        assert_eq!(entries(others), [11]);
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn bad_chunk_metadata_is_an_orphan() {
        let mut a = Assembler::new(ChunkLimits::default());
        let mut dropped = Vec::new();
        for bad in [
            chunk("", 0, 2, 4, 1, b"ab"),
            chunk("u", 2, 2, 4, 1, b"ab"),
            chunk("u", -1, 2, 4, 1, b"ab"),
            chunk("u", 0, 2, -4, 1, b"ab"),
            chunk("u", 0, 2, 1, 1, b"ab"),
        ] {
            assert!(matches!(a.add(bad, &mut dropped), Added::Orphan(..)));
        }
        assert_eq!(a.pending(), 0);
    }
}
