//! A consumer interceptor interface, for clients that expose interceptor hooks, and an
//! implementation that drives a [`Gate`].

use parking_lot::Mutex;

use crate::{Clock, Gate, GateStats, PartitionControl, SystemClock};

/// What an interceptor hook sees of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageInfo<'a> {
    /// The partition index the message came from (from the topic's `-partition-N` suffix).
    pub partition: u32,
    /// The value of the policy's priority property, if the message has it.
    pub priority: Option<&'a str>,
    /// How many times the message was delivered before (0 on first delivery).
    pub redelivery_count: u32,
}

/// Hooks a consumer calls as messages move through it. Object safe: a client can hold a
/// `Box<dyn ConsumerInterceptor>` or `Arc<dyn ConsumerInterceptor>`.
///
/// The order on one message is `on_arrival` (when the client buffers it, if the client has
/// such a hook, like Pulsar's `onArrival` of PIP-374), then `before_consume` (when the
/// application receives it), then `on_ack` or `on_nack`.
pub trait ConsumerInterceptor: Send + Sync {
    /// A message was buffered by the client. The default does nothing.
    fn on_arrival(&self, message: &MessageInfo<'_>) {
        let _ = message;
    }

    /// A message is about to be handed to the application.
    fn before_consume(&self, message: &MessageInfo<'_>);

    /// A message of `partition` was acknowledged.
    fn on_ack(&self, partition: u32);

    /// A message of `partition` was negatively acknowledged (it will be redelivered).
    fn on_nack(&self, partition: u32);

    /// The topic now has `partitions` partitions. The default does nothing.
    fn on_partitions_change(&self, partitions: u32) {
        let _ = partitions;
    }
}

/// A [`ConsumerInterceptor`] that feeds a [`Gate`] and lets it pause and resume partitions
/// through a [`PartitionControl`]. Thread safe (one lock around the gate and the control);
/// time comes from a [`Clock`].
///
/// The gate needs to know what is buffered: either the client calls `on_arrival`, or the
/// adapter reports queue sizes with [`GateInterceptor::observe_buffered`]. With
/// `before_consume` alone the gate only sees deliveries and cannot tell when a level is under
/// pressure. Errors for partitions outside the layout are counted in
/// [`GateStats::unknown_partitions`], never raised into the client.
///
/// ```
/// use std::time::Instant;
/// use mq_priority::{
///     ConsumerInterceptor, Gate, GateConfig, GateInterceptor, LayoutSpec, ManualClock,
///     MessageInfo, PriorityPolicy, RecordingControl, Strategy,
/// };
///
/// let policy = PriorityPolicy::new(2)?;
/// let config = GateConfig::default()
///     .with_strategy(Strategy::Strict)
///     .with_receiver_queue_size(4)
///     .with_min_queue_size(4);
/// let gate = Gate::new(policy, LayoutSpec::partition_shares([1, 1]), 2, config)?;
/// let hooks = GateInterceptor::with_clock(gate, RecordingControl::new(), ManualClock::new(Instant::now()));
/// let interceptor: &dyn ConsumerInterceptor = &hooks;
///
/// // Two high messages buffered: half of the high level's queue of 4, so the low level pauses.
/// for _ in 0..2 {
///     interceptor.on_arrival(&MessageInfo { partition: 0, priority: Some("0"), redelivery_count: 0 });
/// }
/// assert!(hooks.with(|_, control| control.is_paused(1)));
/// # Ok::<(), mq_priority::Error>(())
/// ```
#[derive(Debug)]
pub struct GateInterceptor<C, K = SystemClock> {
    inner: Mutex<(Gate, C)>,
    clock: K,
}

impl<C: PartitionControl + Send> GateInterceptor<C, SystemClock> {
    /// An interceptor reading the system clock.
    pub fn new(gate: Gate, control: C) -> Self {
        GateInterceptor::with_clock(gate, control, SystemClock)
    }
}

impl<C: PartitionControl + Send, K: Clock> GateInterceptor<C, K> {
    /// An interceptor reading `clock`.
    pub fn with_clock(gate: Gate, control: C, clock: K) -> Self {
        GateInterceptor {
            inner: Mutex::new((gate, control)),
            clock,
        }
    }

    /// Runs `f` with the gate and the control under the lock (to read state, call
    /// [`Gate::tick`] from a timer, or update backlogs).
    pub fn with<R>(&self, f: impl FnOnce(&mut Gate, &mut C) -> R) -> R {
        let mut guard = self.inner.lock();
        let (gate, control) = &mut *guard;
        f(gate, control)
    }

    /// Reports that `partition`'s client queue holds `buffered` messages.
    pub fn observe_buffered(&self, partition: u32, buffered: u64) {
        let now = self.clock.now();
        self.with(|gate, control| {
            let _ = gate.set_buffered(partition, buffered, now, control);
        });
    }

    /// Re-evaluates time-dependent decisions (call from a timer when using aging).
    pub fn tick(&self) {
        let now = self.clock.now();
        self.with(|gate, control| gate.tick(now, control));
    }

    /// The gate's counters.
    pub fn stats(&self) -> GateStats {
        self.inner.lock().0.stats()
    }

    /// Gives back the gate and the control.
    pub fn into_inner(self) -> (Gate, C) {
        self.inner.into_inner()
    }
}

impl<C: PartitionControl + Send, K: Clock> ConsumerInterceptor for GateInterceptor<C, K> {
    fn on_arrival(&self, message: &MessageInfo<'_>) {
        let now = self.clock.now();
        self.with(|gate, control| {
            let claimed = gate.policy().parse(message.priority).level;
            let _ = gate.on_arrival(message.partition, Some(claimed), now, control);
        });
    }

    fn before_consume(&self, message: &MessageInfo<'_>) {
        let now = self.clock.now();
        self.with(|gate, control| {
            let _ = gate.on_delivered(message.partition, now, control);
        });
    }

    fn on_ack(&self, partition: u32) {
        let now = self.clock.now();
        self.with(|gate, control| gate.on_ack(partition, now, control));
    }

    fn on_nack(&self, partition: u32) {
        let now = self.clock.now();
        self.with(|gate, control| gate.on_nack(partition, now, control));
    }

    fn on_partitions_change(&self, partitions: u32) {
        let now = self.clock.now();
        self.with(|gate, control| {
            let _ = gate.set_partitions(partitions, now, control);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{GateConfig, LayoutSpec, ManualClock, PriorityPolicy, RecordingControl, Strategy};

    fn hooks() -> GateInterceptor<RecordingControl, Arc<ManualClock>> {
        let policy = PriorityPolicy::new(2).unwrap();
        let config = GateConfig::default()
            .with_strategy(Strategy::StrictAging {
                max_wait: Duration::from_secs(1),
            })
            .with_receiver_queue_size(4)
            .with_min_queue_size(4)
            .with_cold_start(None);
        let gate = Gate::new(policy, LayoutSpec::partition_shares([1, 1]), 2, config).unwrap();
        GateInterceptor::with_clock(
            gate,
            RecordingControl::new(),
            Arc::new(ManualClock::new(Instant::now())),
        )
    }

    #[test]
    fn is_object_safe_and_drives_the_gate_without_acks() {
        let hooks = hooks();
        let dyn_hooks: &dyn ConsumerInterceptor = &hooks;
        let msg = |partition, priority| MessageInfo {
            partition,
            priority,
            redelivery_count: 0,
        };
        dyn_hooks.on_arrival(&msg(1, Some("1")));
        dyn_hooks.on_arrival(&msg(0, Some("0")));
        dyn_hooks.on_arrival(&msg(0, None)); // missing property: counted as a mismatch
        assert!(hooks.with(|g, c| g.is_paused(1) == Some(true) && c.is_paused(1)));
        let stats = hooks.stats();
        assert_eq!(stats.levels[0].mismatches, 1);
        assert_eq!(hooks.with(|g, _| g.policy().stats().missing), 1);
        dyn_hooks.before_consume(&msg(0, Some("0")));
        dyn_hooks.before_consume(&msg(0, Some("0")));
        // Relieved by deliveries alone; no ack was ever sent.
        assert!(hooks.with(|g, _| g.is_paused(1) == Some(false)));
        dyn_hooks.on_nack(0);
        dyn_hooks.on_ack(7); // unknown partition: counted, ignored
        assert_eq!(hooks.stats().unknown_partitions, 1);
        dyn_hooks.on_partitions_change(4);
        assert_eq!(hooks.with(|g, _| g.partitions()), 4);
    }

    #[test]
    fn observe_buffered_replaces_arrival_hooks() {
        let hooks = hooks();
        hooks.observe_buffered(0, 3);
        assert!(hooks.with(|_, c| c.is_paused(1)));
        hooks.observe_buffered(0, 0);
        assert!(!hooks.with(|_, c| c.is_paused(1)));
        hooks.tick();
        let (gate, _) = hooks.into_inner();
        assert_eq!(gate.buffered(0), Some(0));
    }
}
