//! The buffers of receipted batches, kept for the next batches of the same producer.
//!
//! A batch of 1,000 messages of 1 KiB takes a buffer of about 1 MiB: above the allocator's
//! threshold for mapping memory, so that each batch's buffer was mapped, zeroed page by page
//! and unmapped again (measured: 3-5 % of a producer's CPU at 400,000 messages a second). A
//! batch's buffer is free again once its receipt has come and the connection's writer has
//! sent it; a partition producer keeps [`KEPT`] of them for its next batches.

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// Buffers kept per partition producer: a receipt frees one as the next batch needs one.
pub(super) const KEPT: usize = 2;

/// Buffers smaller than this are not worth keeping (the allocator serves them from its heap).
pub(super) const SMALLEST: usize = 64 * 1024;

/// Buffers larger than this are given back to the allocator (a producer that once sent a
/// huge batch does not hold its memory for good).
pub(super) const LARGEST: usize = 8 * 1024 * 1024;

/// The spare batch buffers of one partition producer.
#[derive(Debug, Default)]
pub(super) struct SpareBuffers {
    spare: Mutex<Vec<BytesMut>>,
}

impl SpareBuffers {
    /// An empty buffer with room for at least `size` bytes: a spare one if one is large
    /// enough, else a new one.
    pub(super) fn take(&self, size: usize) -> BytesMut {
        let reused = {
            let mut spare = self.spare.lock();
            spare
                .iter()
                .position(|buffer| buffer.capacity() >= size)
                .map(|at| spare.swap_remove(at))
        };
        reused.unwrap_or_else(|| BytesMut::with_capacity(size))
    }

    /// Keeps the memory of `data` (a receipted batch's payload) when nothing else holds it,
    /// its size is worth keeping and fewer than [`KEPT`] are kept.
    pub(super) fn give_back(&self, data: Bytes) {
        if !(SMALLEST..=LARGEST).contains(&data.len()) || self.spare.lock().len() >= KEPT {
            return;
        }
        // Fails (and drops this reference) while another part of the client holds the bytes.
        let Ok(mut buffer) = data.try_into_mut() else {
            return;
        };
        if buffer.capacity() > LARGEST {
            return;
        }
        buffer.clear();
        let mut spare = self.spare.lock();
        if spare.len() < KEPT {
            spare.push(buffer);
        }
    }

    /// How many buffers are kept now.
    #[cfg(test)]
    pub(super) fn kept(&self) -> usize {
        self.spare.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;

    fn batch(spares: &SpareBuffers, size: usize) -> Bytes {
        let mut buffer = spares.take(size);
        buffer.put_bytes(7, size);
        buffer.freeze()
    }

    #[test]
    fn a_receipted_batch_buffer_is_the_next_batch_buffer() {
        let spares = SpareBuffers::default();
        let first = batch(&spares, 1 << 20);
        let at = first.as_ptr();
        spares.give_back(first);
        assert_eq!(spares.kept(), 1);
        let next = spares.take(1 << 20);
        assert_eq!(next.as_ptr(), at, "the same memory, not a copy");
        assert!(next.is_empty());
        assert_eq!(spares.kept(), 0);
    }

    #[test]
    fn a_buffer_still_held_elsewhere_is_not_kept() {
        let spares = SpareBuffers::default();
        let data = batch(&spares, 1 << 20);
        let held = data.clone();
        spares.give_back(data);
        assert_eq!(spares.kept(), 0);
        // The holder's bytes are untouched.
        assert!(held.iter().all(|&b| b == 7));
    }

    #[test]
    fn small_huge_and_surplus_buffers_go_back_to_the_allocator() {
        let spares = SpareBuffers::default();
        spares.give_back(batch(&spares, SMALLEST - 1));
        spares.give_back(batch(&spares, LARGEST + 1));
        assert_eq!(spares.kept(), 0);
        for _ in 0..KEPT + 1 {
            spares.give_back(Bytes::from(vec![1u8; SMALLEST]));
        }
        assert_eq!(spares.kept(), KEPT);
        // A spare too small for the batch asked for stays, and a new buffer is made.
        let larger = spares.take(SMALLEST * 4);
        assert!(larger.capacity() >= SMALLEST * 4);
        assert_eq!(spares.kept(), KEPT);
    }
}
