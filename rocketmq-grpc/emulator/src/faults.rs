//! Fault injection: what can go wrong, at which rates, drawn from a seeded generator so that a run
//! with the same seed and the same sequence of calls makes the same choices.

use std::time::Duration;

use super::counters::Rpc;
use rocketmq_grpc::pb::Code;

/// Faults the emulator injects, adjustable at run time with
/// [`Emulator::set_faults`](super::Emulator::set_faults).
///
/// Rates are probabilities in `0.0..=1.0` (values outside are clamped; NaN counts as 0).
/// Request-level faults (`unavailable_rate`, `delay_*`, `too_many_requests_rate`) apply only
/// to the RPCs listed in [`rpcs`](Self::rpcs); per-entry faults apply to `AckMessage` entries.
///
/// The order inside one call is: connection drop, then authentication and the client-id check,
/// then the delay, then `TOO_MANY_REQUESTS`, then normal processing with per-entry faults.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FaultConfig {
    /// RPCs the request-level faults apply to. Default: `[Rpc::AckMessage]`.
    pub rpcs: Vec<Rpc>,
    /// Rate of calls aborted with the gRPC status `UNAVAILABLE` before anything is processed
    /// (a dropped connection as the client sees it; nothing is acknowledged).
    pub unavailable_rate: f64,
    /// Rate of calls answered with the top-level code `TOO_MANY_REQUESTS` ("flow limit"), as
    /// the proxy does when its consumer thread pool rejects the request; nothing is processed.
    /// On `ReceiveMessage` this is a single status frame.
    pub too_many_requests_rate: f64,
    /// Rate of calls delayed before processing.
    pub delay_rate: f64,
    /// Shortest injected delay.
    pub delay_min: Duration,
    /// Longest injected delay (uniform between `delay_min` and this).
    pub delay_max: Duration,
    /// Rate of `AckMessage` entries answered with
    /// [`ack_entry_error_code`](Self::ack_entry_error_code) instead of being acknowledged. The message stays in flight (it is **not** acknowledged)
    /// and the receipt handle stays valid, as after a failed broker ack.
    pub ack_entry_error_rate: f64,
    /// The code of injected per-entry ack errors. Default `INTERNAL_SERVER_ERROR` (50001).
    pub ack_entry_error_code: Code,
    /// Rate of `AckMessage` result entries left out of the response. The message **is**
    /// acknowledged (the proxy processed it; only the answer is lost), so a retry with the same
    /// handle is answered `OK` again and shows up in the ledger as an extra OK answer with
    /// `dropped_results` set.
    pub ack_missing_result_rate: f64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            rpcs: vec![Rpc::AckMessage],
            unavailable_rate: 0.0,
            too_many_requests_rate: 0.0,
            delay_rate: 0.0,
            delay_min: Duration::ZERO,
            delay_max: Duration::ZERO,
            ack_entry_error_rate: 0.0,
            ack_entry_error_code: Code::InternalServerError,
            ack_missing_result_rate: 0.0,
        }
    }
}

impl FaultConfig {
    /// No faults (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// Sets the RPCs request-level faults apply to.
    #[must_use]
    pub fn on_rpcs(mut self, rpcs: impl IntoIterator<Item = Rpc>) -> Self {
        self.rpcs = rpcs.into_iter().collect();
        self
    }

    /// Sets the rate of calls aborted with gRPC `UNAVAILABLE`.
    #[must_use]
    pub fn unavailable(mut self, rate: f64) -> Self {
        self.unavailable_rate = rate;
        self
    }

    /// Sets the rate of calls answered `TOO_MANY_REQUESTS`.
    #[must_use]
    pub fn too_many_requests(mut self, rate: f64) -> Self {
        self.too_many_requests_rate = rate;
        self
    }

    /// Delays a fraction `rate` of calls by a uniform duration in `min..=max`.
    #[must_use]
    pub fn delay(mut self, rate: f64, min: Duration, max: Duration) -> Self {
        self.delay_rate = rate;
        self.delay_min = min;
        self.delay_max = max.max(min);
        self
    }

    /// Fails a fraction `rate` of ack entries with `code` (the message is not acknowledged).
    #[must_use]
    pub fn ack_entry_errors(mut self, rate: f64, code: Code) -> Self {
        self.ack_entry_error_rate = rate;
        self.ack_entry_error_code = code;
        self
    }

    /// Leaves a fraction `rate` of ack result entries out (the message is acknowledged).
    #[must_use]
    pub fn ack_missing_results(mut self, rate: f64) -> Self {
        self.ack_missing_result_rate = rate;
        self
    }

    pub(crate) fn applies_to(&self, rpc: Rpc) -> bool {
        self.rpcs.contains(&rpc)
    }
}

/// A failure scripted with [`Emulator::fail_next`](super::Emulator::fail_next): the next
/// calls of one RPC fail this way, whatever the rates of [`FaultConfig`] say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScriptedFailure {
    /// The call is aborted with the gRPC status `UNAVAILABLE` (a dropped connection).
    Unavailable,
    /// The call is answered with this top-level code and nothing is processed (for example
    /// `INTERNAL_SERVER_ERROR` as the proxy answers when the broker it forwards to is down).
    Code(Code),
}

/// The seeded generator of the faults: `fastrand`'s (wyrand), with the draws the faults need.
#[derive(Debug, Clone)]
pub(crate) struct Prng(fastrand::Rng);

impl Prng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    /// A uniform float in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        self.0.f64()
    }

    /// True with probability `rate`. Draws nothing when the rate is 0, so enabling one fault
    /// does not shift the draws of the others.
    pub(crate) fn chance(&mut self, rate: f64) -> bool {
        if rate.is_nan() || rate <= 0.0 {
            return false;
        }
        if rate >= 1.0 {
            return true;
        }
        self.next_f64() < rate
    }

    /// A uniform duration in `min..=max` (millisecond resolution).
    pub(crate) fn duration_between(&mut self, min: Duration, max: Duration) -> Duration {
        if max <= min {
            return min;
        }
        let span = u64::try_from((max - min).as_millis()).unwrap_or(u64::MAX);
        min + Duration::from_millis(self.0.u64(0..=span))
    }
}

/// The current configuration and the generator, behind one lock in the shared state.
#[derive(Debug)]
pub(crate) struct FaultState {
    pub(crate) config: FaultConfig,
    pub(crate) prng: Prng,
    /// Scripted failures per RPC, consumed one per call, in order.
    pub(crate) scripted: Vec<(Rpc, ScriptedFailure)>,
}

impl FaultState {
    pub(crate) fn new(config: FaultConfig, seed: u64) -> Self {
        Self {
            config,
            prng: Prng::new(seed),
            scripted: Vec::new(),
        }
    }

    /// Takes the next scripted failure of `rpc`, if any.
    pub(crate) fn take_scripted(&mut self, rpc: Rpc) -> Option<ScriptedFailure> {
        let index = self.scripted.iter().position(|(r, _)| *r == rpc)?;
        Some(self.scripted.remove(index).1)
    }

    /// Rolls the fault for a rate read from the current configuration.
    pub(crate) fn roll(&mut self, rate: impl Fn(&FaultConfig) -> f64) -> bool {
        let r = rate(&self.config);
        self.prng.chance(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic_and_seed_dependent() {
        let mut a = Prng::new(42);
        let mut b = Prng::new(42);
        let mut c = Prng::new(43);
        let xs: Vec<f64> = (0..8).map(|_| a.next_f64()).collect();
        let ys: Vec<f64> = (0..8).map(|_| b.next_f64()).collect();
        let zs: Vec<f64> = (0..8).map(|_| c.next_f64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn chance_matches_rate_roughly() {
        let mut p = Prng::new(7);
        let hits = (0..100_000).filter(|_| p.chance(0.05)).count();
        assert!((4_500..5_500).contains(&hits), "{hits}");
        assert!(!p.chance(0.0));
        assert!(!p.chance(f64::NAN));
        assert!(p.chance(1.0));
        assert!(p.chance(7.0));
    }

    #[test]
    fn floats_and_durations_stay_in_range() {
        let mut p = Prng::new(1);
        for _ in 0..10_000 {
            let f = p.next_f64();
            assert!((0.0..1.0).contains(&f));
            let d = p.duration_between(Duration::from_millis(5), Duration::from_millis(9));
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(9));
        }
        assert_eq!(
            p.duration_between(Duration::from_secs(2), Duration::from_secs(1)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn builder_methods_set_fields() {
        let f = FaultConfig::none()
            .on_rpcs([Rpc::AckMessage, Rpc::SendMessage])
            .unavailable(0.1)
            .too_many_requests(0.2)
            .delay(0.3, Duration::from_millis(9), Duration::from_millis(3))
            .ack_entry_errors(0.05, Code::ProxyTimeout)
            .ack_missing_results(0.01);
        assert!(f.applies_to(Rpc::SendMessage));
        assert!(!f.applies_to(Rpc::ReceiveMessage));
        assert_eq!(f.delay_max, Duration::from_millis(9));
        assert_eq!(f.ack_entry_error_code, Code::ProxyTimeout);
    }
}
