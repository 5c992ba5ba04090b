//! How the gate acts on a consumer: pausing and resuming partitions.

/// What the gate asks of a consumer. An adapter implements it for its per-partition consumers.
///
/// - `pause(p)`: stop asking the broker for messages on partition `p`. On Pulsar this means
///   withholding FLOW permits (messages the broker already has permits for still arrive, at
///   most one receiver queue, which is why lower levels get smaller queues; see
///   [`crate::Gate::suggested_queue_size`]). Messages already buffered stay buffered: pausing
///   must not drop them (unlike librdkafka's pause).
/// - `resume(p)`: ask for messages again (on Pulsar: send the permits withheld meanwhile).
///
/// The gate calls these only on a change of state, never twice in a row with the same call for
/// one partition, and never for a partition outside its layout. Every partition starts
/// resumed. [`crate::Gate::sync`] repeats the current state of every partition (after a
/// reconnect, for example).
pub trait PartitionControl {
    /// Stop fetching partition `partition`.
    fn pause(&mut self, partition: u32);
    /// Fetch partition `partition` again.
    fn resume(&mut self, partition: u32);
}

impl<T: PartitionControl + ?Sized> PartitionControl for &mut T {
    fn pause(&mut self, partition: u32) {
        (**self).pause(partition);
    }
    fn resume(&mut self, partition: u32) {
        (**self).resume(partition);
    }
}

impl<T: PartitionControl + ?Sized> PartitionControl for Box<T> {
    fn pause(&mut self, partition: u32) {
        (**self).pause(partition);
    }
    fn resume(&mut self, partition: u32) {
        (**self).resume(partition);
    }
}

/// A control that does nothing (when only the gate's selection is used).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoControl;

impl PartitionControl for NoControl {
    fn pause(&mut self, _partition: u32) {}
    fn resume(&mut self, _partition: u32) {}
}

/// One call the gate made on a [`PartitionControl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlEvent {
    /// `pause(partition)`.
    Pause(u32),
    /// `resume(partition)`.
    Resume(u32),
}

/// A control that records the gate's calls (for tests and simulators) and keeps the
/// resulting paused state per partition.
#[derive(Debug, Clone, Default)]
pub struct RecordingControl {
    /// Every call, oldest first. Clear it whenever convenient.
    pub events: Vec<ControlEvent>,
    paused: Vec<bool>,
}

impl RecordingControl {
    /// An empty recording.
    pub fn new() -> RecordingControl {
        RecordingControl::default()
    }

    /// Whether the last call for `partition` was a pause.
    pub fn is_paused(&self, partition: u32) -> bool {
        self.paused
            .get(partition as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The events recorded since the last call, emptying the record.
    pub fn take(&mut self) -> Vec<ControlEvent> {
        std::mem::take(&mut self.events)
    }

    fn set(&mut self, partition: u32, paused: bool) {
        let i = partition as usize;
        if self.paused.len() <= i {
            self.paused.resize(i + 1, false);
        }
        if let Some(slot) = self.paused.get_mut(i) {
            *slot = paused;
        }
    }
}

impl PartitionControl for RecordingControl {
    fn pause(&mut self, partition: u32) {
        self.events.push(ControlEvent::Pause(partition));
        self.set(partition, true);
    }
    fn resume(&mut self, partition: u32) {
        self.events.push(ControlEvent::Resume(partition));
        self.set(partition, false);
    }
}
